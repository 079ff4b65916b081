"""Per-model architecture config for the decoder families (Llama, Qwen2, Qwen3).

One frozen dataclass describes every family; `from_hf_dict` / `to_hf_dict` translate the
HF `config.json` (both key styles: `rope_theta` or `rope_parameters.rope_theta`,
`torch_dtype` or `dtype`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

FAMILIES = ("llama", "qwen2", "qwen3")
DTYPES = ("float32", "bfloat16", "float16")

# HF `model_type` -> our family name.
_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama"}
_HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class ModelConfigError(ValueError):
    """A model config value is missing or not supported."""


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    # q/k/v projections carry a bias (Qwen2).
    attention_bias: bool = False
    # per-head RMSNorm on q and k before RoPE (Qwen3).
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    # dtype of activations and matmuls; norms, softmax and losses always run in float32.
    dtype: str = "float32"
    param_dtype: str = "float32"
    # rematerialise each decoder block in the backward pass (training memory).
    remat: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ModelConfigError(f"model family {self.family!r} is not supported; use one of {FAMILIES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"model.{name}={value!r} must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"model.num_heads={self.num_heads} must be a multiple of model.num_kv_heads={self.num_kv_heads} (GQA)")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ModelConfigError(f"model.{name}={getattr(self, name)!r} is not one of {DTYPES}")
        if self.rope_theta <= 0:
            raise ModelConfigError(f"model.rope_theta={self.rope_theta!r} must be > 0")

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **overrides: Any) -> "ModelConfig":
        """Build from a parsed HF `config.json`."""
        model_type = hf.get("model_type")
        if model_type not in _HF_MODEL_TYPES:
            raise ModelConfigError(
                f"config.json model_type={model_type!r} is not supported; use one of {sorted(_HF_MODEL_TYPES)}")
        family = _HF_MODEL_TYPES[model_type]
        rope_theta = hf.get("rope_theta")
        rope_params = hf.get("rope_parameters") or {}
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta", 10000.0)
        scaling = hf.get("rope_scaling") or {}
        rope_type = scaling.get("rope_type", scaling.get("type")) or rope_params.get("rope_type", "default")
        if rope_type not in ("default", None):
            raise ModelConfigError(
                f"config.json rope scaling type {rope_type!r} is not supported; only unscaled RoPE is")
        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        head_dim = hf.get("head_dim") or hidden // num_heads
        dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        if dtype not in DTYPES:
            dtype = "float32"
        eos = hf.get("eos_token_id")
        if isinstance(eos, list):
            eos = tuple(int(e) for e in eos)
        values = dict(
            family=family,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            dtype="float32",
            param_dtype=dtype,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
        )
        values.update(overrides)
        return cls(**values)

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF `config.json` for this architecture (new-style keys plus the legacy ones)."""
        hf: dict[str, Any] = {
            "architectures": [_HF_ARCHITECTURES[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": self.param_dtype,
            "attention_dropout": 0.0,
            "use_cache": True,
        }
        if self.family in ("llama", "qwen3"):
            hf["attention_bias"] = self.attention_bias
        if self.family == "llama":
            hf["mlp_bias"] = False
        if self.bos_token_id is not None:
            hf["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            hf["eos_token_id"] = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return hf
