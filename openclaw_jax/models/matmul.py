"""Matmuls in a low-precision compute dtype, accumulated and produced in float32, rounded once.

`contract(x, w, n, dtype)` is `tensordot(x, w, n)` with both operands in `dtype`. For bfloat16 it
asks XLA for a float32 result (`preferred_element_type`) and rounds that to bfloat16 afterwards.
The value is what a bfloat16 matmul means anyway (products summed in float32, the sum rounded), but
on CPU the two forms run very differently: XLA:CPU hands a bf16 x bf16 -> f32 dot to its fast
library kernels (AVX512-BF16 where the CPU has it) and runs bf16 -> bf16 on a slow path. Measured
on a 2-core AVX-512 EPYC, [2048, 576] x [576, 1536]: float32 33.6 ms, bf16 -> bf16 20.2 ms,
bf16 -> f32 -> bf16 10.3 ms (see docs/performance.md for the prefill and decode it gives).

Only where the matmuls run on CPU: a GPU's bf16 -> bf16 matmul already sums in float32 on its fast units, and
an extra float32 result there would cost memory. The memory planner compiles on CPU for GPUs, so it traces
under `matmuls_as_on("gpu")`.

Differentiating the float32-result dot the plain way would make its transposes float32 matmuls of
upcast operands (JAX's rule for `preferred_element_type`), so the backward has its own rule: the same
mixed-precision matmuls, the cotangent rounded to `dtype` first. With `dtype` float32 this is plain
`tensordot`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator

import jax
import jax.numpy as jnp

_F32 = jnp.dtype(jnp.float32)
# the platform the traced matmuls are for, when it is not the one tracing them (None: jax.default_backend())
_TARGET = contextvars.ContextVar("matmul_target_platform", default=None)


@contextlib.contextmanager
def matmuls_as_on(platform: str) -> Iterator[None]:
    """Trace `contract` as it runs on `platform` ("cpu", "gpu", ...) inside the block."""
    token = _TARGET.set(platform)
    try:
        yield
    finally:
        _TARGET.reset(token)


def _float32_results(dtype) -> bool:
    return dtype != _F32 and (_TARGET.get() or jax.default_backend()) == "cpu"


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """`jnp.einsum(spec, a, b)` of two operands in `dtype`, the float32-result form on CPU as `contract`'s.
    For inference paths (not differentiated on a hot path: JAX's own rule then upcasts the backward)."""
    dtype = jnp.dtype(dtype)
    a, b = a.astype(dtype), b.astype(dtype)
    if not _float32_results(dtype):
        return jnp.einsum(spec, a, b)
    return jnp.einsum(spec, a, b, preferred_element_type=_F32).astype(dtype)


def contract(x: jax.Array, w: jax.Array, n: int, dtype) -> jax.Array:
    """`tensordot(x, w, n)` (the last n axes of x with the first n of w) in `dtype`: float32
    accumulation, one rounding of the result to `dtype` (on CPU as a float32-result dot, elsewhere as
    the platform's own `dtype` matmul)."""
    dtype = jnp.dtype(dtype)
    x, w = x.astype(dtype), w.astype(dtype)
    if not _float32_results(dtype):
        return jnp.tensordot(x, w, axes=n)
    return _mixed(x, w, n)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mixed(x, w, n):
    return _dot(x, w, n)


def _dot(x, w, axes):
    return jnp.tensordot(x, w, axes=axes, preferred_element_type=_F32).astype(x.dtype)


def _mixed_fwd(x, w, n):
    return _dot(x, w, n), (x, w)


def _mixed_bwd(n, residuals, g):
    x, w = residuals
    g = g.astype(x.dtype)
    out_axes = w.ndim - n          # w: [*in (n), *out]; g: [*batch, *out]
    batch_axes = x.ndim - n        # x: [*batch, *in]
    dx = _dot(g, w, (tuple(range(g.ndim - out_axes, g.ndim)), tuple(range(n, w.ndim))))
    dw = _dot(x, g, (tuple(range(batch_axes)), tuple(range(batch_axes))))
    return dx, dw


_mixed.defvjp(_mixed_fwd, _mixed_bwd)
