"""Per-model architecture config for the decoder families (Llama, Qwen2, Qwen3).

One frozen dataclass describes every family; `from_hf_dict` / `to_hf_dict` translate the
HF `config.json` (both key styles: `rope_theta` or `rope_parameters.rope_theta`,
`torch_dtype` or `dtype`; RoPE scaling from the legacy `rope_scaling` dict or from
`rope_parameters`: types `llama3` (Llama-3.1/3.2) and `yarn` (YaRN-extended Qwen), others rejected).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

FAMILIES = ("llama", "qwen2", "qwen3")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION = ("dense", "blockwise", "fused", "auto")  # see openclaw_jax.models.attention
ROPE_SCALING_TYPES = ("llama3", "yarn")

# HF `model_type` -> our family name.
_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama"}
_HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class ModelConfigError(ValueError):
    """A model config value is missing or not supported."""


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# HF module names accepted as aliases (configs use them).
_LORA_TARGET_ALIASES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
                        "up_proj": "up", "down_proj": "down"}


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters W + (alpha / rank) * A @ B on the named projections (`models/lora.py`).

    The one LoRA config: the experiment's `model.lora` section and what `add_lora` / `Decoder(lora=...)`
    take. `enabled` is the experiment's switch (whether training adds adapters); `add_lora` adds them
    whatever its value. Targets are our names or the HF module names, stored as ours.
    """

    enabled: bool = False
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ModelConfigError(f"model.lora.rank={self.rank!r} must be a positive integer")
        if not self.alpha > 0:
            raise ModelConfigError(f"model.lora.alpha={self.alpha!r} must be > 0")
        targets = tuple(_LORA_TARGET_ALIASES.get(t, t) for t in ((self.targets,) if isinstance(self.targets, str)
                                                                else self.targets))
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown or not targets:
            raise ModelConfigError(f"model.lora.targets={self.targets!r}: unknown {unknown}; use a non-empty subset "
                                   f"of {LORA_TARGETS} (or the HF names {tuple(_LORA_TARGET_ALIASES)})")
        object.__setattr__(self, "targets", tuple(dict.fromkeys(targets)))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (HF `rope_parameters` / `rope_scaling`); maths in `models/rope.py`.

    `llama3`: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings.
    `yarn`: factor, original_max_position_embeddings, beta_fast/beta_slow (32/1), truncate (True),
    attention_factor (None: from factor, mscale, mscale_all_dim as HF does).
    """

    rope_type: str
    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ModelConfigError(f"rope scaling type {self.rope_type!r} is not supported; use one of "
                                   f"{ROPE_SCALING_TYPES} (or no scaling)")
        if not self.factor or self.factor < 1.0:
            raise ModelConfigError(f"rope scaling factor={self.factor!r} must be >= 1")
        if self.original_max_position_embeddings <= 0:
            raise ModelConfigError(f"rope scaling original_max_position_embeddings="
                                   f"{self.original_max_position_embeddings!r} must be > 0")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ModelConfigError(f"llama3 rope scaling needs high_freq_factor > low_freq_factor > 0, got "
                                   f"{self.high_freq_factor} and {self.low_freq_factor}")

    @classmethod
    def from_hf(cls, params: Mapping[str, Any], hf: Mapping[str, Any]) -> "RopeScaling | None":
        """From an HF scaling dict (`rope_scaling` or `rope_parameters`); None for unscaled RoPE."""
        rope_type = params.get("rope_type", params.get("type")) or "default"
        if rope_type == "default":
            return None
        if rope_type not in ROPE_SCALING_TYPES:
            raise ModelConfigError(
                f"config.json rope scaling type {rope_type!r} is not supported; supported: {ROPE_SCALING_TYPES} "
                "(or none)")
        if float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor")) or 1.0) != 1.0:
            raise ModelConfigError("config.json partial_rotary_factor != 1 is not supported")
        # As HF: a top-level original_max_position_embeddings wins, else the scaling dict's, else
        # max_position_embeddings.
        original = hf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") \
            or hf.get("max_position_embeddings")
        if original is None:
            raise ModelConfigError(f"config.json {rope_type} rope scaling needs original_max_position_embeddings")
        factor = params.get("factor")
        if factor is None and rope_type == "yarn" and hf.get("max_position_embeddings"):
            factor = hf["max_position_embeddings"] / original
        if factor is None:
            raise ModelConfigError(f"config.json {rope_type} rope scaling needs a factor")
        values: dict[str, Any] = dict(rope_type=rope_type, factor=float(factor),
                                      original_max_position_embeddings=int(original))
        if rope_type == "llama3":
            for key in ("low_freq_factor", "high_freq_factor"):
                if params.get(key) is None:
                    raise ModelConfigError(f"config.json llama3 rope scaling needs {key}")
                values[key] = float(params[key])
        else:
            values["beta_fast"] = float(params.get("beta_fast") or 32.0)
            values["beta_slow"] = float(params.get("beta_slow") or 1.0)
            values["truncate"] = bool(params.get("truncate", True))
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                if params.get(key) is not None:
                    values[key] = float(params[key])
        return cls(**values)

    def to_hf(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rope_type": self.rope_type, "factor": self.factor,
                               "original_max_position_embeddings": self.original_max_position_embeddings}
        if self.rope_type == "llama3":
            out.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor)
        else:
            out.update(beta_fast=self.beta_fast, beta_slow=self.beta_slow, truncate=self.truncate)
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                if getattr(self, key) is not None:
                    out[key] = getattr(self, key)
        return out


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
    rope_scaling: RopeScaling | None = None
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
    # attention kernel: dense (reference) | blockwise (memory linear in length) | fused (cuDNN) | auto.
    attention: str = "auto"
    # query/key block of the blockwise kernel (tokens); 0: by backend (models/attention.py).
    attention_block_size: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    # multimodal RoPE (Qwen2.5-VL): the rotary frequency pairs split into (temporal, height, width)
    # sections, each rotated by its own row of positions `[3, B, L]` (models/rope.py); None: 1-D RoPE.
    mrope_section: tuple[int, ...] | None = None

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
        if not isinstance(self.attention_block_size, int) or self.attention_block_size < 0:
            raise ModelConfigError(f"model.attention_block_size={self.attention_block_size!r} must be an integer "
                                   ">= 0 (0: by backend)")
        if self.attention not in ATTENTION:
            raise ModelConfigError(f"model.attention={self.attention!r} is not one of {ATTENTION}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ModelConfigError(f"model.rope_scaling={self.rope_scaling!r} must be a RopeScaling or None; "
                                   "parse HF dicts with RopeScaling.from_hf")
        if self.mrope_section is not None:
            section = tuple(int(s) for s in self.mrope_section)
            if len(section) != 3 or min(section) < 0 or 2 * sum(section) != self.head_dim:
                raise ModelConfigError(f"model.mrope_section={self.mrope_section!r} must be 3 non-negative sizes "
                                       f"summing to head_dim / 2 = {self.head_dim // 2}")
            if self.rope_scaling is not None:
                raise ModelConfigError("model.mrope_section with rope scaling is not supported")
            object.__setattr__(self, "mrope_section", section)

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
        if model_type == "qwen2_5_vl":
            raise ModelConfigError("config.json model_type='qwen2_5_vl' is a vision-language model: parse it with "
                                   "openclaw_jax.models.qwen_vl.QwenVLConfig.from_hf_dict (its .text is the decoder)")
        if model_type not in _HF_MODEL_TYPES:
            raise ModelConfigError(
                f"config.json model_type={model_type!r} is not supported; use one of {sorted(_HF_MODEL_TYPES)}")
        family = _HF_MODEL_TYPES[model_type]
        rope_theta = hf.get("rope_theta")
        rope_params = hf.get("rope_parameters") or {}
        if any(isinstance(value, Mapping) for value in rope_params.values()):
            raise ModelConfigError("config.json rope_parameters per layer type is not supported; "
                                   "one RoPE for all layers is")
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta", 10000.0)
        # The legacy `rope_scaling` dict, or the newer `rope_parameters` (which also holds rope_theta).
        rope_scaling = RopeScaling.from_hf(hf.get("rope_scaling") or rope_params, hf)
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
            rope_scaling=rope_scaling,
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
        if self.rope_scaling is not None:
            hf["rope_scaling"] = self.rope_scaling.to_hf()
        if self.mrope_section is not None:
            hf["rope_scaling"] = {"type": "mrope", "mrope_section": list(self.mrope_section)}
        if self.family in ("llama", "qwen3"):
            hf["attention_bias"] = self.attention_bias
        if self.family == "llama":
            hf["mlp_bias"] = False
        if self.bos_token_id is not None:
            hf["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            hf["eos_token_id"] = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return hf
