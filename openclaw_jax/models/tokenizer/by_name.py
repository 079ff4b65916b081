"""`tokenizer_by_name(name_or_dir)`: the one lookup of a tokenizer by model name (no weights loaded)."""

from __future__ import annotations

import os
from typing import Callable

from openclaw_jax.models.tokenizer.core import Tokenizer
from openclaw_jax.models.tokenizer.sources import (load_tokenizer, qwen3_tokenizer, smollm2_tokenizer,
                                                   smollm2_vl_tokenizer)
from openclaw_jax.models.tokenizer.tiny import tiny_test_tokenizer, tiny_vl_tokenizer

NAMED_TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "smollm2": smollm2_tokenizer,   # the packaged SmolLM2-135M-Instruct (from its GGUF)
    "smollm2_vl": smollm2_vl_tokenizer,   # smollm2 + the Qwen2.5-VL vision tokens at ids 49152..49155
    "qwen3": qwen3_tokenizer,       # the Qwen3 vocabulary
    "tiny": tiny_test_tokenizer,    # the small test tokenizer
    "tiny_vl": tiny_vl_tokenizer,   # tiny + the Qwen2.5-VL vision tokens at ids 320..323
}


def tokenizer_by_name(name_or_dir: str | os.PathLike) -> Tokenizer:
    """The tokenizer + chat template of a model: one of `NAMED_TOKENIZERS` or an HF model directory."""
    name = str(name_or_dir)
    if name in NAMED_TOKENIZERS:
        return NAMED_TOKENIZERS[name]()
    if not os.path.isdir(name):
        raise FileNotFoundError(f"tokenizer {name!r} is neither an HF model directory nor one of "
                                f"{sorted(NAMED_TOKENIZERS)}")
    return load_tokenizer(name)
