"""References for served LoRA adapters: random adapters of a model's shapes, an adapter directory in PEFT's
layout written with the `safetensors` package (as PEFT writes one), and HF `transformers` in float64 with an
adapter merged into its weights (W + (alpha / r) * A B, the product in NumPy float64)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

from openclaw_jax.inference.adapters import Adapter

# float32 engine against a float64 reference
ATOL = 2e-4

# HF module of each adapter target, per layer
_HF_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
               "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def random_adapter(model_cfg, seed: int, rank: int, alpha: float, targets) -> Adapter:
    """Random A and B (both non-zero, unlike a fresh training init) of the served model's shapes."""
    rng = np.random.default_rng(seed)
    L, H, N, K, D, I = (model_cfg.num_layers, model_cfg.hidden_size, model_cfg.num_heads, model_cfg.num_kv_heads,
                        model_cfg.head_dim, model_cfg.intermediate_size)
    shapes = {"q": ((H,), (N, D)), "k": ((H,), (K, D)), "v": ((H,), (K, D)), "o": ((N, D), (H,)),
              "gate": ((H,), (I,)), "up": ((H,), (I,)), "down": ((I,), (H,))}
    weights = {}
    for t in targets:
        inp, out = shapes[t]
        a = rng.normal(0, 0.25, (L,) + inp + (rank,)).astype(np.float32)
        b = rng.normal(0, 0.25, (L, rank) + out).astype(np.float32)
        weights[t] = (a, b)
    return Adapter(rank=rank, alpha=alpha, weights=weights)


def merged_hf(model_dir, adapter: Adapter | None):
    """HF float64 model with W + scale * A B merged in (NumPy float64), or the base model."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval().to(torch.float64)
    if adapter is None:
        return hf
    with torch.no_grad():
        for t, (a, b) in adapter.weights.items():
            for layer in range(a.shape[0]):
                delta = a[layer].astype(np.float64).reshape(-1, adapter.rank) @ \
                    b[layer].astype(np.float64).reshape(adapter.rank, -1)           # [in, out]
                weight = hf.model.layers[layer].get_submodule(_HF_MODULES[t]).weight  # [out, in]
                weight += torch.from_numpy(adapter.scale * delta.T)
    return hf


def ref_log_probs(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0], dim=-1).numpy()


def check_row(out, prompt, hf):
    """The row's greedy tokens, prompt and output log-probs equal the reference model's."""
    ids = list(prompt) + out.output_ids
    lp = ref_log_probs(hf, ids)
    assert out.input_logprobs[0] is None
    np.testing.assert_allclose(out.input_logprobs[1:], [lp[t - 1, ids[t]] for t in range(1, len(prompt))], atol=ATOL)
    for step, token in enumerate(out.output_ids):
        pos = len(prompt) - 1 + step
        assert token == int(np.argmax(lp[pos])), (prompt, step)
        np.testing.assert_allclose(out.output_logprobs[step], lp[pos, token], atol=ATOL)
        top = out.output_top_logprobs[step]
        np.testing.assert_allclose([v for v, _ in top], [lp[pos, t] for _, t in top], atol=ATOL)


def write_peft_adapter(directory, name: str, adapter: Adapter) -> Path:
    """`directory/name/` as PEFT saves a LoRA adapter of an HF causal LM: adapter_config.json and
    adapter_model.safetensors with lora_A [r, in_features] and lora_B [out_features, r] per layer."""
    out = Path(directory) / name
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for t, (a, b) in adapter.weights.items():
        for layer in range(a.shape[0]):
            key = f"base_model.model.model.layers.{layer}.{_HF_MODULES[t]}"
            tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(a[layer].reshape(-1, adapter.rank).T)
            tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(b[layer].reshape(adapter.rank, -1).T)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": adapter.rank, "lora_alpha": adapter.alpha,
              "target_modules": [_HF_MODULES[t].split(".")[1] for t in adapter.weights], "lora_dropout": 0.0,
              "bias": "none", "fan_in_fan_out": False, "use_rslora": False}
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out

