"""LoRA adapters on the decoder's attention (q, k, v, o) and MLP (gate, up, down) projections.

A projection W gets W + (alpha / rank) * A @ B with A random and B zero, so an adapted model
equals its base at init. Adapter params are `LoRAParam` (a subclass of `nnx.Param`), so
`nnx.Optimizer(model, tx, wrt=LoRAParam)` / `nnx.DiffState(0, LoRAParam)` train only them.

    lora_model = add_lora(base, LoRAConfig(rank=8, alpha=16), rngs=nnx.Rngs(1))
    plain = merge_lora(lora_model)        # a plain Decoder for export / serving
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

if TYPE_CHECKING:  # decoder imports this module; import it lazily at run time
    from openclaw_jax.models.decoder import Decoder

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# HF module names accepted as aliases in configs.
_TARGET_ALIASES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
                   "up_proj": "up", "down_proj": "down"}


class LoRAParam(nnx.Param):
    """A trainable low-rank adapter param (the base params stay plain `nnx.Param`)."""


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"lora.rank={self.rank!r} must be a positive integer")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha={self.alpha!r} must be > 0")
        targets = tuple(_TARGET_ALIASES.get(t, t) for t in ((self.targets,) if isinstance(self.targets, str)
                                                           else self.targets))
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown or not targets:
            raise ValueError(f"lora.targets={self.targets!r}: unknown {unknown}; use a non-empty subset of "
                             f"{LORA_TARGETS} (or the HF names {tuple(_TARGET_ALIASES)})")
        object.__setattr__(self, "targets", tuple(dict.fromkeys(targets)))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


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


def add_lora(model: "Decoder", lora: LoRAConfig, *, rngs: nnx.Rngs) -> "Decoder":
    """A new Decoder with adapters on `lora.targets`, sharing `model`'s base param arrays.

    The adapters are initialised fresh (A ~ N(0, 1/fan_in), B = 0); when the base is sharded on a
    mesh, the adapters are placed on the same mesh.
    """
    from openclaw_jax.models.decoder import Decoder, init_normal

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
        from openclaw_jax.parallel.sharding import shard_model

        shard_model(new_model, mesh)
    return new_model


def merge_lora(model: "Decoder") -> "Decoder":
    """A plain Decoder (no adapters) whose kernels are W + scale * A @ B, in the param dtype."""
    from openclaw_jax.models.decoder import Decoder

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


def lora_config_from_dict(values: dict | None) -> LoRAConfig | None:
    """LoRAConfig from a plain mapping (YAML); None or {"rank": 0} means no LoRA."""
    if not values or not values.get("rank"):
        return None
    fields = {f.name for f in dataclasses.fields(LoRAConfig)}
    unknown = set(values) - fields
    if unknown:
        raise ValueError(f"unknown lora config keys {sorted(unknown)}; known: {sorted(fields)}")
    kwargs = dict(values)
    if "targets" in kwargs and not isinstance(kwargs["targets"], str):
        kwargs["targets"] = tuple(kwargs["targets"])
    return LoRAConfig(**kwargs)
