"""LoRA adapters on the decoder's attention (q, k, v, o) and MLP (gate, up, down) projections.

A projection W gets W + (alpha / rank) * A @ B with A random and B zero, so an adapted model
equals its base at init. Adapter params are `LoRAParam` (a subclass of `nnx.Param`), so
`nnx.Optimizer(model, tx, wrt=LoRAParam)` / `nnx.DiffState(0, LoRAParam)` train only them.

    lora_model = add_lora(base, LoRAConfig(rank=8, alpha=16), rngs=nnx.Rngs(1))
    plain = merge_lora(lora_model)        # a plain Decoder for export / serving
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.models.config import LORA_TARGETS, LoRAConfig
from openclaw_jax.models.decoder import Decoder, LoRAParam, init_normal
from openclaw_jax.parallel.sharding import shard_model

__all__ = ["LORA_TARGETS", "LoRAConfig", "LoRAParam", "add_lora", "lora_filter", "lora_state", "merge_lora"]

# Filter selecting the adapter params (for optimizers, grads, checkpoints of adapters only).
lora_filter = nnx.OfType(LoRAParam)


def lora_state(model: nnx.Module) -> nnx.State:
    """The adapter params of `model` (what a LoRA optimizer updates)."""
    return nnx.state(model, LoRAParam)


def _flat(state: nnx.State) -> dict[tuple, nnx.Variable]:
    return {tuple(path): var for path, var in nnx.to_flat_state(state)}


def _mesh_of(value) -> jax.sharding.Mesh | None:
    sharding = getattr(value, "sharding", None)
    return getattr(sharding, "mesh", None) if isinstance(sharding, jax.sharding.NamedSharding) else None


def add_lora(model: Decoder, lora: LoRAConfig, *, rngs: nnx.Rngs) -> Decoder:
    """A new Decoder with adapters on `lora.targets`, sharing `model`'s base param arrays.

    The adapters are initialised fresh (A ~ N(0, 1/fan_in), B = 0); when the base is sharded on a
    mesh, the adapters are placed on the same mesh.
    """
    if model.lora is not None:
        raise ValueError("model already has LoRA adapters; merge_lora() it first to stack another set")
    cfg = model.cfg
    # Only the adapter values of this freshly built model are used; building it abstractly first
    # keeps the base weights from being materialised twice.
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0), lora=lora)))
    base = _flat(nnx.state(model))
    flat = _flat(abstract)
    out = []
    mesh = _mesh_of(model.embed_tokens.get_value())
    for path, var in flat.items():
        if path in base:
            out.append((path, var.replace(base[path].get_value())))
            continue
        shape, dtype = var.get_value().shape, var.get_value().dtype
        if path[-1] == "lora_a":
            fan_in = int(np.prod(shape[1:-1]))
            value = init_normal(rngs, shape, dtype, fan_in ** -0.5)
        else:
            value = jnp.zeros(shape, dtype)
        out.append((path, var.replace(value)))
    new_model = nnx.merge(graphdef, nnx.from_flat_state(out))
    if mesh is not None:
        shard_model(new_model, mesh)
    return new_model


def merge_lora(model: Decoder) -> Decoder:
    """A plain Decoder (no adapters) whose kernels are W + scale * A @ B, in the param dtype."""
    if model.lora is None:
        raise ValueError("model has no LoRA adapters to merge")
    scale = model.lora.scale
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(model.cfg, rngs=nnx.Rngs(0))))
    adapted = _flat(nnx.state(model))
    out = []
    for path, var in _flat(abstract).items():
        value = adapted[path].get_value()
        parent = path[:-1]
        if path[-1] == "kernel" and parent + ("lora_a",) in adapted:
            a = adapted[parent + ("lora_a",)].get_value().astype(jnp.float32)
            b = adapted[parent + ("lora_b",)].get_value().astype(jnp.float32)
            # a: [L, *in, r], b: [L, r, *out] (stacked layers) -> delta [L, *in, *out]
            layers, rank = a.shape[0], a.shape[-1]
            in_shape, out_shape = a.shape[1:-1], b.shape[2:]
            delta = jnp.matmul(a.reshape(layers, -1, rank), b.reshape(layers, rank, -1))
            delta = delta.reshape((layers,) + in_shape + out_shape)
            value = (value.astype(jnp.float32) + scale * delta).astype(value.dtype)
        out.append((path, var.replace(value)))
    return nnx.merge(graphdef, nnx.from_flat_state(out))
