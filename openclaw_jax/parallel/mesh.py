"""Device mesh with axes ("data", "fsdp", "tp") and multi-host start-up.

    maybe_initialize_distributed()            # first thing in a multi-host process
    mesh = make_mesh((1, -1, 2))              # data=1, tp=2, fsdp = the rest
    shard_model(student, mesh); shard_model(teacher, mesh)
    with jax.set_mesh(mesh):                  # activates activation sharding constraints
        ...jitted steps...
"""

from __future__ import annotations

import logging
import math
import os
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from openclaw_jax.parallel.sharding import (  # re-exported: one import for mesh users
    MESH_AXES,
    constrain,
    model_shardings,
    partition_rules,
    shard_model,
    state_partition_specs,
    state_shardings,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MESH_AXES", "MeshShapeError", "resolve_mesh_shape", "make_mesh", "maybe_initialize_distributed",
    "shard_model", "model_shardings", "state_shardings", "state_partition_specs", "partition_rules", "constrain",
]


class MeshShapeError(ValueError):
    """The requested mesh shape does not fit the visible devices."""


def resolve_mesh_shape(shape: Sequence[int] | Mapping[str, int], num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tp) sizes; one entry may be -1 meaning "all remaining devices".

    `shape` is a 3-sequence in MESH_AXES order or a mapping with those keys (missing keys = 1).
    """
    if isinstance(shape, Mapping):
        unknown = set(shape) - set(MESH_AXES)
        if unknown:
            raise MeshShapeError(f"mesh shape has unknown axes {sorted(unknown)}; the axes are {MESH_AXES}")
        sizes = [int(shape.get(axis, 1)) for axis in MESH_AXES]
    else:
        sizes = [int(s) for s in shape]
        if len(sizes) != len(MESH_AXES):
            raise MeshShapeError(f"mesh shape {tuple(shape)} must have {len(MESH_AXES)} entries {MESH_AXES}")
    if any(s == 0 or s < -1 for s in sizes):
        raise MeshShapeError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: sizes must be positive or -1 (the rest)")
    rest = [i for i, s in enumerate(sizes) if s == -1]
    if len(rest) > 1:
        raise MeshShapeError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
    known = math.prod(s for s in sizes if s != -1)
    if rest:
        if num_devices % known:
            raise MeshShapeError(f"mesh shape {dict(zip(MESH_AXES, sizes))}: the fixed axes multiply to {known}, "
                                 f"which does not divide the {num_devices} visible devices")
        sizes[rest[0]] = num_devices // known
    elif known != num_devices:
        raise MeshShapeError(f"mesh shape {dict(zip(MESH_AXES, sizes))} needs {known} devices but {num_devices} are "
                             f"visible; make the product equal {num_devices} or use -1 for one axis")
    return tuple(sizes)  # type: ignore[return-value]


def make_mesh(shape: Sequence[int] | Mapping[str, int] = (1, -1, 1),
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh over `devices` (default: all devices of all processes) with axes MESH_AXES.

    Axis types are Auto: params carry NamedShardings and XLA's partitioner propagates the rest
    (plus our constraints at block boundaries).
    """
    devices = list(devices if devices is not None else jax.devices())
    sizes = resolve_mesh_shape(shape, len(devices))
    try:
        mesh = jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
        # jax.make_mesh wants physical-topology-friendly device orders; fall back to the given order.
        mesh = Mesh(np.asarray(devices, dtype=object).reshape(sizes), MESH_AXES,
                    axis_types=(AxisType.Auto,) * len(MESH_AXES))
    logger.info("mesh %s over %d %s devices", dict(zip(MESH_AXES, sizes)), len(devices), devices[0].platform)
    return mesh


_DISTRIBUTED_INITIALIZED = False


def _env_process_count() -> int:
    """Processes the launcher says there are (our env, SLURM, Open MPI), or 1."""
    for var in ("JAX_NUM_PROCESSES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        value = os.environ.get(var)
        if value:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment {var}={value!r} is not an integer process count") from None
    return 1


def maybe_initialize_distributed() -> bool:
    """Call `jax.distributed.initialize()` when the environment says several processes; idempotent.

    Reads JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (our launch scripts) or lets JAX
    auto-detect SLURM / Open MPI. Must run before any other JAX call creates a backend.
    Returns True when running multi-process.
    """
    global _DISTRIBUTED_INITIALIZED
    count = _env_process_count()
    if count <= 1:
        return False
    if _DISTRIBUTED_INITIALIZED:
        return True
    kwargs = {}
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        kwargs["coordinator_address"] = os.environ["JAX_COORDINATOR_ADDRESS"]
        kwargs["num_processes"] = count
        if os.environ.get("JAX_PROCESS_ID") is None:
            raise ValueError("JAX_COORDINATOR_ADDRESS is set but JAX_PROCESS_ID is not; set it to this process's "
                             "rank (0..JAX_NUM_PROCESSES-1)")
        kwargs["process_id"] = int(os.environ["JAX_PROCESS_ID"])
    logger.info("initialising jax.distributed for %d processes (%s)", count, kwargs or "auto-detected cluster")
    # CPU processes (the multi-host stand-in on one machine) need a collectives backend; GPUs use NCCL
    # and ignore this option.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs)
    _DISTRIBUTED_INITIALIZED = True
    return True
