"""`models.matmul.contract`: bfloat16 matmuls with float32 accumulation, forward and backward, against
float64 NumPy on the same bfloat16-rounded operands."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from openclaw_jax.models.matmul import contract, matmuls_as_on

BF16_EPS = 2.0 ** -8  # half of bfloat16's spacing at 1: one rounding's relative error


def _bf16(rng, shape):
    """Random bfloat16 values and their exact float64 copy."""
    x = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    return x, np.asarray(x.astype(jnp.float32), np.float64)


def _within_one_rounding(got, want, scale):
    """Each element within one bfloat16 rounding of the float64 value (plus float32 accumulation noise,
    relative to the size of the terms summed)."""
    got = np.asarray(jnp.asarray(got).astype(jnp.float32), np.float64)
    bound = BF16_EPS * np.abs(want) + 1e-6 * scale
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


@pytest.mark.parametrize("x_shape, w_shape, n", [((3, 5, 64), (64, 48), 1),          # [B, L, H] x [H, out]
                                                  ((2, 7, 4, 16), (4, 16, 32), 2)])  # [B, L, N, D] x [N, D, H]
def test_bfloat16_forward_and_gradients_match_float64(x_shape, w_shape, n):
    rng = np.random.default_rng(0)
    x, x64 = _bf16(rng, x_shape)
    w, w64 = _bf16(rng, w_shape)
    out_shape = x_shape[:len(x_shape) - n] + w_shape[n:]
    c, c64 = _bf16(rng, out_shape)

    y = contract(x, w, n, jnp.bfloat16)
    assert y.dtype == jnp.bfloat16 and y.shape == out_shape
    y64 = np.tensordot(x64, w64, n)
    _within_one_rounding(y, y64, np.tensordot(np.abs(x64), np.abs(w64), n))

    # d/dx sum(c * y) = c . w^T over the output axes; d/dw = x^T . c over the batch axes
    dx, dw = jax.grad(lambda x, w: jnp.sum(contract(x, w, n, jnp.bfloat16).astype(jnp.float32)
                                           * c.astype(jnp.float32)), argnums=(0, 1))(x, w)
    assert dx.dtype == dw.dtype == jnp.bfloat16
    out_axes, batch_axes = len(w_shape) - n, len(x_shape) - n
    c_out = tuple(range(c64.ndim - out_axes, c64.ndim))
    dx64 = np.tensordot(c64, w64, (c_out, tuple(range(n, w64.ndim))))
    dw64 = np.tensordot(x64, c64, (tuple(range(batch_axes)), tuple(range(batch_axes))))
    _within_one_rounding(dx, dx64, np.tensordot(np.abs(c64), np.abs(w64), (c_out, tuple(range(n, w64.ndim)))))
    _within_one_rounding(dw, dw64, np.tensordot(np.abs(x64), np.abs(c64),
                                                (tuple(range(batch_axes)), tuple(range(batch_axes)))))


def test_bfloat16_backward_matmuls_take_bfloat16_operands():
    """The backward's matmuls stay bf16 x bf16 -> f32 (JAX's own rule for a float32-result dot would
    transpose it into float32 matmuls of upcast operands: half the speed on CPU)."""
    x = jnp.ones((2, 8, 16), jnp.bfloat16)
    w = jnp.ones((16, 12), jnp.bfloat16)
    grad = jax.grad(lambda x, w: jnp.sum(contract(x, w, 1, jnp.bfloat16).astype(jnp.float32) ** 2), argnums=(0, 1))
    dots = [e for e in jax.make_jaxpr(grad)(x, w).jaxpr.eqns if e.primitive.name == "dot_general"]
    inner = []
    for e in jax.make_jaxpr(grad)(x, w).jaxpr.eqns:  # the custom rule's body sits in a nested jaxpr
        for sub in jax.core.jaxprs_in_params(e.params):
            inner += [d for d in sub.eqns if d.primitive.name == "dot_general"]
    dots += inner
    assert len(dots) == 3, dots  # forward, d/dx, d/dw
    for d in dots:
        assert [v.aval.dtype for v in d.invars] == [jnp.bfloat16, jnp.bfloat16], d
        assert d.params["preferred_element_type"] == jnp.float32, d


def test_float32_is_plain_tensordot():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((4, 6, 32)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((32, 24)), jnp.float32)
    got = jax.jit(lambda x, w: contract(x, w, 1, jnp.float32))(x, w)
    want = jax.jit(lambda x, w: jnp.tensordot(x, w, axes=1))(x, w)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    gx = jax.grad(lambda x: jnp.sum(contract(x, w, 1, jnp.float32) ** 2))(x)
    gx_plain = jax.grad(lambda x: jnp.sum(jnp.tensordot(x, w, axes=1) ** 2))(x)
    np.testing.assert_array_equal(np.asarray(gx), np.asarray(gx_plain))


def test_traced_for_a_gpu_a_bfloat16_matmul_is_the_plain_one():
    """For another platform (the memory planner compiles on CPU for GPUs) the matmul is the platform's own
    bf16 x bf16 -> bf16, as before: no float32 result, no custom backward."""
    x, w = jnp.ones((4, 16), jnp.bfloat16), jnp.ones((16, 8), jnp.bfloat16)
    with matmuls_as_on("gpu"):
        eqns = jax.make_jaxpr(lambda x, w: contract(x, w, 1, jnp.bfloat16))(x, w).jaxpr.eqns
    assert [e.primitive.name for e in eqns] == ["dot_general"], eqns
    assert eqns[0].outvars[0].aval.dtype == jnp.bfloat16
    on_cpu = jax.make_jaxpr(lambda x, w: contract(x, w, 1, jnp.bfloat16))(x, w).jaxpr.eqns
    assert [e.primitive.name for e in on_cpu] != ["dot_general"]  # the float32-result form with its own rule
