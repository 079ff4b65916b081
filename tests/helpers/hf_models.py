"""Tiny random HF `transformers` models shared by the model tests (PyTorch CPU, float32)."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from openclaw_jax.models.config import ModelConfig

_CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def make_hf_model(family: str, *, tie: bool, num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16,
                  hidden: int = 32, vocab: int = 256, layers: int = 2, rope_theta: float = 10000.0,
                  seed: int = 0, rope_scaling: dict | None = None,
                  max_position_embeddings: int = 128) -> tuple[torch.nn.Module, ModelConfig]:
    """A random HF model with *every* weight randomised (norms around 1, not all ones; biases
    non-zero) and the ModelConfig parsed from its HF config dict. `rope_scaling`: an HF scaling
    dict (e.g. `{"rope_type": "yarn", ...}`), given to the HF config as `rope_scaling`."""
    config_cls, model_cls = _CLASSES[family]
    kwargs = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
                  rope_theta=rope_theta, tie_word_embeddings=tie, max_position_embeddings=max_position_embeddings,
                  rms_norm_eps=1e-6, attn_implementation="eager")
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    if family == "qwen2":
        kwargs.pop("head_dim")  # Qwen2 derives head_dim = hidden / heads
    hf_config = config_cls(**kwargs)
    torch.manual_seed(seed)
    model = model_cls(hf_config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * noise)
            else:
                param.copy_(0.15 * noise)
    cfg = ModelConfig.from_hf_dict(model.config.to_dict())
    return model, cfg


def hf_state_dict(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def hf_logits(model: torch.nn.Module, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
    with torch.no_grad():
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = torch.tensor(attention_mask, dtype=torch.long)
        return model(torch.tensor(ids, dtype=torch.long), **kwargs).logits.float().numpy()
