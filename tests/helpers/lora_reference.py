"""The independent reference of a served LoRA adapter: HF `transformers` in float64 on the base weights, with
the adapter (a PEFT-layout directory, read with the `safetensors` package) merged into each adapted weight in
NumPy float64: W + (lora_alpha / r) lora_B @ lora_A."""

from __future__ import annotations

import json
from pathlib import Path


def merged_hf_model(model_dir: str | Path, adapter_dir: str | Path | None):
    """The HF causal LM of `model_dir` in float64 (eval mode), with `adapter_dir`'s adapter merged when given."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    if adapter_dir is None:
        return model
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in tensors.items():
            if name.endswith(".lora_A.weight"):
                stem = name.removesuffix(".lora_A.weight")
                b = tensors[stem + ".lora_B.weight"].astype(np.float64)
                weight = params[stem.removeprefix("base_model.model.") + ".weight"]
                weight.copy_(torch.from_numpy(weight.numpy() + scale * (b @ a.astype(np.float64))))
    return model
