"""A LoRA adapter as a directory of its own, in PEFT's layout (docs/household.md, "Each person's adapter").

    <directory>/adapter_config.json          PEFT's LoRA config: r, lora_alpha, target_modules (HF names), ...
    <directory>/adapter_model.safetensors    per layer i and target: base_model.model.model.layers.{i}.
                                             {self_attn|mlp}.{q,k,v,o,gate,up,down}_proj.lora_{A,B}.weight
    <directory>/openclaw_adapter.json        ours, apart from PEFT's file: our target names, and what the
                                             writer adds (the person, their steps, ...)

`lora_A.weight` is [rank, in_features] and `lora_B.weight` [out_features, rank] (HF Linear's order), so
the HF weight of a projection becomes W + (lora_alpha / r) * lora_B @ lora_A: the same delta as our
`merge_lora` (our stacked `lora_a` [L, *in, r] and `lora_b` [L, r, *out], flattened in C order as
models/weights.py flattens the kernels). It is the layout PEFT writes and SGLang's multi-LoRA serving reads;
tests/trainer/test_per_person.py checks it against our merged model (PEFT itself is not a dependency).

    save_adapter(directory, trainable, lora, base_model=..., extra={...})   # atomic: a new directory
    config, state = load_adapter(directory, template)     # (PEFT's config + ours under "openclaw", our layout)
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx

from openclaw_jax.models.config import LoRAConfig
from openclaw_jax.models.weights import read_safetensors_header, write_safetensors

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_EXTRA = "openclaw_adapter.json"
_PREFIX = "base_model.model.model.layers"
_HF_TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
               "down": "down_proj"}


def _lora_leaves(trainable: nnx.State) -> dict[tuple[str, str], tuple[nnx.Variable, nnx.Variable]]:
    """{(block, projection): (lora_a, lora_b)} of an adapter state (paths `layers.<block>.<proj>.lora_a|b`)."""
    flat = {tuple(str(k) for k in path): var for path, var in nnx.to_flat_state(trainable)}
    out = {}
    for path, var in flat.items():
        if path[-1] != "lora_a":
            continue
        if len(path) != 4 or path[0] != "layers":
            raise ValueError(f"adapter param {'.'.join(path)} is not a decoder layer's projection adapter")
        b = flat[path[:-1] + ("lora_b",)]
        out[(path[1], path[2])] = (var, b)
    return out


def adapter_tensors(trainable: nnx.State) -> dict[str, np.ndarray]:
    """PEFT's tensors (module doc) of an adapter state, float32, on the host."""
    tensors = {}
    for (block, proj), (a_var, b_var) in _lora_leaves(trainable).items():
        a = np.asarray(jax.device_get(a_var.get_value()), np.float32)
        b = np.asarray(jax.device_get(b_var.get_value()), np.float32)
        layers, rank = a.shape[0], a.shape[-1]
        for i in range(layers):
            name = f"{_PREFIX}.{i}.{block}.{proj}"
            tensors[f"{name}.lora_A.weight"] = np.ascontiguousarray(a[i].reshape(-1, rank).T)
            tensors[f"{name}.lora_B.weight"] = np.ascontiguousarray(b[i].reshape(rank, -1).T)
    return tensors


def adapter_config(lora: LoRAConfig, *, base_model: str) -> dict[str, Any]:
    """PEFT's `adapter_config.json` for `lora` on `base_model` (PEFT's keys only: readers refuse others)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
            "target_modules": [_HF_TARGETS[t] for t in lora.targets], "lora_dropout": 0.0, "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "base_model_name_or_path": base_model}


def save_adapter(directory: str | os.PathLike, trainable: nnx.State, lora: LoRAConfig, *, base_model: str,
                 extra: Mapping[str, Any] | None = None) -> Path:
    """Write the adapter `trainable` (its LoRA params) to `directory`, replacing what was there: the files go
    into a temporary directory renamed into place, so a reader sees the old adapter or the new, never half."""
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write_safetensors(tmp / ADAPTER_WEIGHTS, adapter_tensors(trainable))
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(lora, base_model=base_model), indent=2,
                                                     sort_keys=True) + "\n")
        (tmp / ADAPTER_EXTRA).write_text(json.dumps({"targets": list(lora.targets), **dict(extra or {})}, indent=2,
                                                    sort_keys=True) + "\n")
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_adapter(directory: str | os.PathLike, template: nnx.State) -> tuple[dict[str, Any], nnx.State]:
    """(adapter_config.json with openclaw_adapter.json's fields under "openclaw" (when it exists), the adapter
    as a state shaped like `template`, an adapter state of the same model and LoRA config, as host arrays).
    Raises ValueError naming a tensor that is missing."""
    directory = Path(directory)
    config = json.loads((directory / ADAPTER_CONFIG).read_text())
    if (directory / ADAPTER_EXTRA).exists():
        config["openclaw"] = json.loads((directory / ADAPTER_EXTRA).read_text())
    infos = read_safetensors_header(directory / ADAPTER_WEIGHTS)
    with open(directory / ADAPTER_WEIGHTS, "rb") as f:
        raw = f.read()

    def tensor(name: str) -> np.ndarray:
        if name not in infos:
            raise ValueError(f"{directory / ADAPTER_WEIGHTS} has no tensor {name!r}")
        info = infos[name]
        return np.frombuffer(raw[info.start:info.end], info.dtype).reshape(info.shape)

    leaves = _lora_leaves(template)
    values = {}
    for (block, proj), (a_var, b_var) in leaves.items():
        a_shape, b_shape = a_var.get_value().shape, b_var.get_value().shape
        a = [tensor(f"{_PREFIX}.{i}.{block}.{proj}.lora_A.weight").T.reshape(a_shape[1:]) for i in range(a_shape[0])]
        b = [tensor(f"{_PREFIX}.{i}.{block}.{proj}.lora_B.weight").T.reshape(b_shape[1:]) for i in range(b_shape[0])]
        values[("layers", block, proj, "lora_a")] = np.stack(a).astype(a_var.get_value().dtype)
        values[("layers", block, proj, "lora_b")] = np.stack(b).astype(b_var.get_value().dtype)
    flat = [(path, var.replace(values[tuple(str(k) for k in path)])) for path, var in nnx.to_flat_state(template)]
    return config, nnx.from_flat_state(flat)
