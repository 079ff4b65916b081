"""Moving values between the host and a mesh that may span several processes.

One JAX process per node (or, for tests, several CPU processes on one machine with gloo
collectives) each see only their own devices. These helpers hide the difference:

    place(host_array, sharding)     every process passes the same full value; each keeps its shards
    to_host(array)                  the full value on every process (a collective when not local)
    agree(values)                   every process's small int vector, on every process (a collective)
    barrier(name)                   wait until every process gets here

With one process they reduce to `jax.device_put` / `np.asarray` and no-ops, so single-host
code pays nothing.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def place(value: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """`value` (host array or a local jax.Array, identical on every process) laid out as `sharding`."""
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:  # already global: reshard on device
        if value.sharding == sharding:
            return value
        return jax.jit(lambda x: x, out_shardings=sharding)(value)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def to_host(value: Any) -> np.ndarray:
    """The full value of `value` as a NumPy array on this process.

    Arrays whose shards live on other processes are gathered (every process must call this);
    fully replicated ones are read from a local shard without communication.
    """
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        if value.is_fully_replicated:
            return np.asarray(value.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return np.asarray(jax.device_get(value))


def tree_to_host(tree: Any) -> Any:
    return jax.tree.map(to_host, tree)


def agree(values: Sequence[int]) -> np.ndarray:
    """`[num_processes, len(values)]` int64: row p is process p's `values` (all processes call this)."""
    local = np.asarray(values, np.int64)
    if not is_multiprocess():
        return local[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local, tiled=False)).reshape(jax.process_count(), -1)


def barrier(name: str) -> None:
    """Block until every process reaches the barrier of the same name (no-op in one process)."""
    if is_multiprocess():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
