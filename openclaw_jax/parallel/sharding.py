"""Sharding rules: logical axis names on params/activations -> mesh axes ("data", "fsdp", "tp").

Every decoder param carries its *logical* axis names as the flax `out_sharding` metadata
(e.g. the q projection kernel is ("layers", "embed", "heads", "head_dim")). A per-family rule
table maps logical names to mesh axes; `param_partition_spec` turns a param's names + shape
into a concrete `PartitionSpec` for a mesh, dropping a mesh axis when the dimension is not a
multiple of its size (e.g. 2 KV heads on tp=4 stay replicated) so every model fits every mesh.

The same tables work with flax's own tools for divisible shapes:
`with nnx.logical_axis_rules(partition_rules(family)): nnx.get_partition_spec(state)`.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from openclaw_jax.parallel.multihost import place

logger = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tp")

# Param logical axes. Vocab, attention heads and MLP hidden go over tensor parallelism; the
# model dimension ("embed") over fsdp; the stacked-layer axis, head_dim and norms replicated.
_PARAM_RULES: tuple[tuple[str, Any], ...] = (
    ("layers", None),
    ("vocab", "tp"),
    ("embed", "fsdp"),
    ("heads", "tp"),
    ("kv_heads", "tp"),
    ("head_dim", None),
    ("mlp", "tp"),
    ("norm", None),
    ("lora_rank", None),
)

# Activation logical axes (used by `constrain`). Batch over data x fsdp (FSDP shards the batch
# too); sequence and model dim replicated at block boundaries; vocab/heads over tp.
_ACTIVATION_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("act_embed", None),
    ("act_vocab", "tp"),
    ("act_heads", "tp"),
    ("act_kv_heads", "tp"),
    ("act_head_dim", None),
    ("cache_layers", None),
    ("cache_seq", None),
)

# Per-family tables. The three families share one layout today (Qwen2 biases follow their
# heads, Qwen3 q/k norms are per head_dim and replicated); they are separate entries so a
# family with a different layout can change its rules without touching the others.
_FAMILY_RULES: dict[str, tuple[tuple[str, Any], ...]] = {
    "llama": _PARAM_RULES + _ACTIVATION_RULES,
    "qwen2": _PARAM_RULES + _ACTIVATION_RULES,
    "qwen3": _PARAM_RULES + _ACTIVATION_RULES,
}


def partition_rules(family: str = "llama") -> tuple[tuple[str, Any], ...]:
    """(logical axis, mesh axis or tuple of mesh axes or None) pairs for a model family."""
    try:
        return _FAMILY_RULES[family]
    except KeyError:
        raise ValueError(f"no sharding rules for model family {family!r}; known: {sorted(_FAMILY_RULES)}") from None


def _mesh_axes_for(logical: str | None, rules: Mapping[str, Any]) -> tuple[str, ...]:
    if logical is None:
        return ()
    if logical not in rules:
        raise ValueError(f"logical axis {logical!r} has no sharding rule; known: {sorted(rules)}")
    target = rules[logical]
    if target is None:
        return ()
    return (target,) if isinstance(target, str) else tuple(target)


def logical_to_partition_spec(
    logical_axes: Sequence[str | None],
    shape: Sequence[int],
    axis_sizes: Mapping[str, int],
    rules: Iterable[tuple[str, Any]] | None = None,
) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dims have these logical names.

    A mesh axis is used for a dim only while the running product of the mesh-axis sizes divides
    the dim (so shapes that do not split evenly fall back to replication on that axis), and each
    mesh axis is used at most once per array.
    """
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match array rank {len(shape)} (shape {tuple(shape)})")
    rule_map = dict(rules if rules is not None else partition_rules())
    used: set[str] = set()
    spec: list[Any] = []
    for name, dim in zip(logical_axes, shape):
        chosen: list[str] = []
        product = 1
        for axis in _mesh_axes_for(name, rule_map):
            size = axis_sizes.get(axis)
            if size is None or axis in used:
                continue
            if dim % (product * size) == 0:
                chosen.append(axis)
                product *= size
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def _axis_sizes(mesh: Mesh | jax.sharding.AbstractMesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.axis_sizes))


def variable_logical_axes(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axis names a param was annotated with, or None."""
    metadata = variable.get_metadata()
    names = metadata.get("out_sharding")
    return None if names is None else tuple(names)


def state_partition_specs(state: nnx.State, mesh: Mesh, family: str = "llama") -> nnx.State:
    """A State of PartitionSpecs (same structure as `state`) for this mesh.

    Variables without logical-axis metadata (e.g. RNG state) are replicated.
    """
    rules = partition_rules(family)
    sizes = _axis_sizes(mesh)

    def spec_of(variable: nnx.Variable) -> PartitionSpec:
        names = variable_logical_axes(variable)
        shape = np.shape(variable.get_value())
        if names is None:
            return PartitionSpec()
        return logical_to_partition_spec(names, shape, sizes, rules)

    return jax.tree.map(spec_of, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def state_shardings(state: nnx.State, mesh: Mesh, family: str = "llama") -> nnx.State:
    """A State of NamedShardings for `state` on `mesh`."""
    specs = state_partition_specs(state, mesh, family)
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def _family_of(model: nnx.Module) -> str:
    cfg = getattr(model, "cfg", None)
    return getattr(cfg, "family", "llama")


def model_shardings(model: nnx.Module, mesh: Mesh) -> nnx.State:
    """NamedShardings for every variable of `model` (a Decoder, or any module annotated the same way)."""
    return state_shardings(nnx.state(model), mesh, _family_of(model))


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Move `model`'s variables onto `mesh` following the family's rules; returns the same model.

    Use it for the trained student and for the frozen teacher alike so both live on one mesh
    (callers wrap the teacher forward in `jax.lax.stop_gradient` and keep it out of the optimizer).
    """
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, _family_of(model))
    sharded = jax.tree.map(
        lambda variable, sharding: variable.replace(place(variable.get_value(), sharding)),
        state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    nnx.update(model, sharded)
    return model


def constrain(x: jax.Array, logical_axes: Sequence[str | None], family: str = "llama") -> jax.Array:
    """`with_sharding_constraint` on activations when a mesh is active (`jax.set_mesh`); else x.

    Applied on every platform (CPU included) so the tests exercise the same code as the GPUs.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) & set(mesh.axis_names):
        return x
    spec = logical_to_partition_spec(logical_axes, x.shape, _axis_sizes(mesh), partition_rules(family))
    return jax.lax.with_sharding_constraint(x, spec)
