"""The `Tokenizer`: a HF `tokenizers.Tokenizer` (the Rust BPE engine) plus what lives outside
`tokenizer.json` (special tokens, end-of-sequence ids, the chat template), an incremental decoder
for streaming, and the byte-level BPE building blocks the tokenizer sources share.
"""

from __future__ import annotations

import codecs
import functools
import json
import logging
import numbers
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from openclaw_jax.models.tokenizer.chat_template import TokenizerError, render_chat_template

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Byte-level alphabet (GPT-2): each byte is spelled as one printable character in vocab strings.
# ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """Bytes that are printable Latin-1 keep their character; the rest take code points 256, 257, ..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping: dict[int, str] = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


@functools.lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    return {char: byte for byte, char in byte_to_unicode().items()}


def bytes_to_token_string(data: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in data)


# Qwen2/Qwen3 pre-tokenisation regex (also in Qwen's tokenizer.json): contractions, letters with one
# optional leading non-letter, single digits, punctuation runs with trailing newlines, whitespace.
QWEN_PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama-3 style (digits in runs of up to three); used by GGUF files declaring a llama-bpe pre-tokeniser.
LLAMA3_PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# ----------------------------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------------------------

_SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores a special token as a string or an AddedToken dict."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value.get("content")
    return str(value)


def _ids_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


class Tokenizer:
    """Text <-> ids, chat templates and special tokens for one model.

    `encode` adds no special tokens unless `add_special_tokens=True`; special tokens written in the
    text (e.g. `<|im_start|>`) are recognised as single ids, as HF tokenizers do.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, chat_template: str | Mapping[str, str] | None = None,
                 bos_token: str | None = None, eos_token: str | None = None, pad_token: str | None = None,
                 unk_token: str | None = None, extra_eos_token_ids: Iterable[int] = (),
                 add_bos_token: bool = False, add_eos_token: bool = False, model_max_length: int | None = None,
                 name: str = ""):
        self.backend = backend
        if isinstance(chat_template, Mapping):
            self.chat_templates = dict(chat_template)
        elif chat_template is not None:
            self.chat_templates = {"default": chat_template}
        else:
            self.chat_templates = {}
        self.special_tokens_map = {attr: tok for attr, tok in zip(
            _SPECIAL_ATTRS, (bos_token, eos_token, unk_token, pad_token)) if tok is not None}
        for attr, token in list(self.special_tokens_map.items()):
            if backend.token_to_id(token) is None:
                message = f"{attr}={token!r} is not in the vocabulary of tokenizer {name or '(unnamed)'}"
                if attr == "eos_token":
                    raise TokenizerError(message + "; generation could never stop")
                logger.warning("%s; ignoring it", message)
                del self.special_tokens_map[attr]
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.model_max_length = model_max_length
        self.name = name
        eos = [self.eos_token_id] if self.eos_token_id is not None else []
        self._eos_token_ids = tuple(dict.fromkeys([*eos, *(int(i) for i in extra_eos_token_ids)]))
        self._added = backend.get_added_tokens_decoder()  # id -> AddedToken
        self._special_ids = frozenset(i for i, tok in self._added.items() if tok.special)
        self._token_bytes: list[bytes] | None = None

    # -- special tokens ------------------------------------------------------------------------
    def _special_id(self, attr: str) -> int | None:
        token = self.special_tokens_map.get(attr)
        return None if token is None else self.backend.token_to_id(token)

    bos_token = property(lambda self: self.special_tokens_map.get("bos_token"))
    eos_token = property(lambda self: self.special_tokens_map.get("eos_token"))
    pad_token = property(lambda self: self.special_tokens_map.get("pad_token"))
    unk_token = property(lambda self: self.special_tokens_map.get("unk_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the eos token plus those from generation_config/config."""
        return self._eos_token_ids

    @property
    def pad_token_id(self) -> int | None:
        pad = self._special_id("pad_token")
        return pad if pad is not None else self.eos_token_id

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce (base vocabulary plus added tokens)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of added tokens marked special (skipped by `decode(skip_special_tokens=True)`)."""
        return self._special_ids

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # -- encode / decode -----------------------------------------------------------------------
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens:
            bos, eos = self.bos_token_id, self.eos_token_id
            if self.add_bos_token and bos is not None and (not ids or ids[0] != bos):
                ids = [bos, *ids]
            if self.add_eos_token and eos is not None and (not ids or ids[-1] != eos):
                ids = [*ids, eos]
        return ids

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = False) -> list[list[int]]:
        if add_special_tokens:
            return [self.encode(t, add_special_tokens=True) for t in texts]
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    @property
    def is_byte_level(self) -> bool:
        return type(self.backend.decoder).__name__ == "ByteLevel"

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token contributes to decoded text (byte-level tokenizers only)."""
        if self._token_bytes is None:
            if not self.is_byte_level:
                raise TokenizerError(f"token_bytes needs a byte-level tokenizer; {self.name!r} decodes with "
                                     f"{type(self.backend.decoder).__name__}")
            lookup = unicode_to_byte()
            table = []
            for i in range(self.vocab_size):
                token = self.backend.id_to_token(i) or ""
                # Mirrors the ByteLevel decoder: a token spelled in the byte alphabet maps to those bytes;
                # anything else (added tokens such as "<|im_start|>" with a non-alphabet char) is UTF-8.
                try:
                    table.append(bytes(lookup[c] for c in token))
                except KeyError:
                    table.append(token.encode("utf-8"))
            self._token_bytes = table
        return self._token_bytes[int(token_id)]

    def incremental_decoder(self, skip_special_tokens: bool = False) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)

    # -- chat templates ------------------------------------------------------------------------
    @property
    def chat_template(self) -> str | None:
        return self.chat_templates.get("default") or next(iter(self.chat_templates.values()), None)

    def get_chat_template(self, chat_template: str | None = None, tools: Any = None) -> str:
        if chat_template is not None:
            return self.chat_templates.get(chat_template, chat_template)
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        template = self.chat_template
        if template is None:
            raise TokenizerError(f"tokenizer {self.name or '(unnamed)'} has no chat template; pass chat_template= "
                                 "or use a model directory whose tokenizer_config.json defines one")
        return template

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            tools: Sequence[Mapping[str, Any]] | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True, *,
                            chat_template: str | None = None, documents: Sequence[Mapping[str, Any]] | None = None,
                            **template_kwargs: Any) -> list[int] | str:
        """Render `messages` (OpenAI-style dicts) with the chat template; ids when `tokenize`, else text.

        Extra keyword arguments reach the template (e.g. `enable_thinking=False` for Qwen3); the special
        token strings (`bos_token`, `eos_token`, ...) are available to it as in transformers.
        """
        template = self.get_chat_template(chat_template, tools)
        kwargs = {**self.special_tokens_map, **template_kwargs}
        text = render_chat_template(template, messages, tools=tools, documents=documents,
                                    add_generation_prompt=add_generation_prompt, **kwargs)
        return self.encode(text) if tokenize else text

    # -- saving ----------------------------------------------------------------------------------
    def tokenizer_config(self) -> dict[str, Any]:
        added = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                          "single_word": t.single_word, "special": t.special} for i, t in sorted(self._added.items())}
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "bos_token": self.bos_token, "eos_token": self.eos_token, "pad_token": self.pad_token,
            "unk_token": self.unk_token,
            "add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token,
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
        }
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        if self.chat_templates:
            if set(self.chat_templates) == {"default"}:
                config["chat_template"] = self.chat_templates["default"]
            else:
                config["chat_template"] = [{"name": k, "template": v} for k, v in self.chat_templates.items()]
        return config

    def save_pretrained(self, out_dir: str | os.PathLike) -> list[Path]:
        """Write `tokenizer.json` and `tokenizer_config.json` (HF format) into `out_dir`."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tokenizer_json = out / "tokenizer.json"
        self.backend.save(str(tokenizer_json), pretty=False)
        config_json = out / "tokenizer_config.json"
        config_json.write_text(json.dumps(self.tokenizer_config(), indent=2, ensure_ascii=False) + "\n",
                               encoding="utf-8")
        return [tokenizer_json, config_json]

    def __repr__(self) -> str:
        return (f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos={self.eos_token!r}, "
                f"chat_template={'yes' if self.chat_templates else 'no'})")


class IncrementalDecoder:
    """Turns a stream of ids into text pieces whose concatenation equals `decode(all ids)`.

    A multi-byte UTF-8 character split across tokens is held back until its last byte arrives (a
    byte-level tokenizer is decoded byte-exactly with an incremental UTF-8 decoder); `finish()`
    flushes what is left (an unfinished character becomes U+FFFD, as `decode` would give).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._byte_level = tokenizer.is_byte_level
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._emitted = ""  # generic path only
        self.text = ""

    def _keep(self, token_id: int) -> bool:
        return not (self.skip_special_tokens and token_id in self.tokenizer.special_token_ids)

    def add(self, ids: int | Iterable[int]) -> str:
        """Feed one id or several; returns the newly completed text (may be empty)."""
        new_ids = [int(ids)] if isinstance(ids, numbers.Integral) else [int(i) for i in ids]
        self.ids.extend(new_ids)
        if self._byte_level:
            data = b"".join(self.tokenizer.token_bytes(i) for i in new_ids if self._keep(i))
            piece = self._utf8.decode(data)
        else:
            full = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special_tokens)
            # A trailing replacement character may be an incomplete character: wait for more ids.
            stable = full.rstrip("\ufffd")
            piece = stable[len(self._emitted):] if stable.startswith(self._emitted) else ""
            if stable.startswith(self._emitted):
                self._emitted = stable
        self.text += piece
        return piece

    def finish(self) -> str:
        """Flush at end of stream."""
        if self._byte_level:
            piece = self._utf8.decode(b"", final=True)
        else:
            full = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special_tokens)
            piece = full[len(self._emitted):] if full.startswith(self._emitted) else ""
            self._emitted = full
        self.text += piece
        return piece


def _byte_level_backend(vocab: Mapping[str, int], merges: Sequence[tuple[str, str]], split_regex: str | None, *,
                        nfc: bool = False, individual_digits: bool = False,
                        ignore_merges: bool = False) -> tokenizers.Tokenizer:
    """A byte-level BPE: optional NFC, regex split (or GPT-2's built-in one), bytes spelled as chars."""
    backend = tokenizers.Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges), ignore_merges=ignore_merges))
    if nfc:
        backend.normalizer = normalizers.NFC()
    steps = []
    if individual_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split_regex is not None:
        steps += [pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    else:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    backend.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    return backend


def _add_tokens_at_ids(backend: tokenizers.Tokenizer, tokens: Sequence[tuple[int, str, bool]]) -> None:
    """Add tokens (id, content, special) that must land on exactly these ids."""
    for token_id, content, special in sorted(tokens):
        existing = backend.token_to_id(content)
        if existing is None and backend.get_vocab_size(with_added_tokens=True) != token_id:
            raise TokenizerError(f"cannot place added token {content!r} at id {token_id}: the next free id is "
                                 f"{backend.get_vocab_size(with_added_tokens=True)}")
        token = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        got = backend.token_to_id(content)
        if got != token_id:
            raise TokenizerError(f"added token {content!r} got id {got}, expected {token_id}")

