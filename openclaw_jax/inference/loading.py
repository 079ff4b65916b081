"""Loading a model for the embedded server, and the weight loader of `/update_weights_from_disk`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from flax import nnx

from openclaw_jax.inference.engine import Engine
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.hub import load_pretrained
from openclaw_jax.models.weights import load_hf_checkpoint
from openclaw_jax.models.qwen_vl import is_vl_config, load_qwen_vl_checkpoint
from openclaw_jax.models.tokenizer.sources import load_tokenizer

WeightLoader = Callable[[str, "str | None"], Any]  # (path, load_format) -> nnx.State


def _checkpoint_dir(path: str, load_format: str | None) -> Path:
    """The HF directory of a weight update, refused unless it is one in a format we read."""
    if load_format not in (None, "auto", "safetensors", "hf"):
        raise ValueError(f"load_format={load_format!r} is not supported; use 'auto' (HF safetensors)")
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model_path {path} is not a directory")
    return p


def default_weight_loader(engine: Engine) -> WeightLoader:
    """HF safetensors directory -> params with the served model's structure and dtypes."""

    def load(path: str, load_format: str | None):
        p = _checkpoint_dir(path, load_format)
        served: ModelConfig = engine.model_config
        model, cfg = load_hf_checkpoint(p, dtype=served.param_dtype)
        for name in ("family", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "tie_word_embeddings", "attention_bias", "qk_norm"):
            if getattr(cfg, name) != getattr(served, name):
                raise ValueError(f"checkpoint {path} has {name}={getattr(cfg, name)!r}, the served model has "
                                 f"{getattr(served, name)!r}")
        return nnx.split(model)[1]

    return load


def vl_weight_loader(vision: Any) -> WeightLoader:
    """A Qwen2.5-VL HF directory -> the whole QwenVL's params (the structure of the image path's model,
    `inference/vision.py`), read in the served param dtype; a checkpoint of another shape is refused."""

    def load(path: str, load_format: str | None):
        p = _checkpoint_dir(path, load_format)
        served = vision.vl_cfg
        model, cfg = load_qwen_vl_checkpoint(p, dtype=served.text.dtype, param_dtype=served.text.param_dtype)
        for part, name_list in (("text", ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                          "num_heads", "num_kv_heads", "head_dim", "tie_word_embeddings",
                                          "mrope_section")),
                                ("vision", ("depth", "hidden_size", "intermediate_size", "num_heads",
                                            "out_hidden_size", "patch_size", "temporal_patch_size",
                                            "spatial_merge_size", "window_size", "fullatt_block_indexes"))):
            for name in name_list:
                got, want = getattr(getattr(cfg, part), name), getattr(getattr(served, part), name)
                if got != want:
                    raise ValueError(f"checkpoint {path} has {part} {name}={got!r}, the served model has {want!r}")
        for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
            if getattr(cfg, name) != getattr(served, name):
                raise ValueError(f"checkpoint {path} has {name}={getattr(cfg, name)}, the served model has "
                                 f"{getattr(served, name)}")
        return nnx.split(model)[1]

    return load


def load_for_serving(model: str, *, dtype: str | None = None):
    """(Decoder, Tokenizer, hf_config, model_path) for `--model` (an HF directory or 'smollm2')."""
    pre = load_pretrained(model, dtype=dtype)
    return pre.model, pre.tokenizer, pre.hf_config, str(pre.source)


def context_length_from(hf_config: dict | None, model_cfg, override: int | None) -> int:
    if override is not None:
        if override < 2:
            raise ValueError(f"--context-length={override} must be >= 2")
        return int(override)
    for key in ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"):
        if hf_config and isinstance(hf_config.get(key), int):
            return int(hf_config[key])
    return int(model_cfg.max_position_embeddings)


def load_vl_for_serving(model: str, *, dtype: str | None = None):
    """(QwenVL, Tokenizer, hf_config, model_path) for a Qwen2.5-VL HF directory, else None: the server
    then runs the text decoder in its engine and image prompts through `inference/vision.py`."""
    import json


    path = Path(model)
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(hf, dict) and is_vl_config(hf)):
        return None
    vl_model, _ = load_qwen_vl_checkpoint(path, dtype=dtype)
    return vl_model, load_tokenizer(path), hf, str(path)
