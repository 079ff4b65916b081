"""Chunked vocabulary kernels and the chunked hybrid loss against the dense definitions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from openclaw_jax import ops
from openclaw_jax.losses import HybridBatch, LossConfig, chunked_hybrid_loss, get_loss, hybrid_loss
from tests.helpers.loss_reference import batch_arrays, log_softmax, make_case


def _rand(seed, *shape, scale=1.0):
    return np.random.default_rng(seed).normal(0.0, scale, shape).astype(np.float32)


def _assert_rel(got, want, rtol=1e-5, what=""):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.max(np.abs(got - want))
    scale = max(np.max(np.abs(want)), 1e-30)
    assert err <= rtol * scale, f"{what}: max err {err:.3e} > {rtol:g} * {scale:.3e}"


# ------------------------------------------------------------------ kernels vs float64


@pytest.mark.parametrize("chunk", [4, 64])
def test_kernels_match_float64_reference(chunk):
    lead, T, H, V, J, k = (2, 3), 13, 16, 97, 5, 4
    hidden = _rand(0, *lead, T, H)
    w = _rand(1, H, V, scale=0.5)
    ids = np.random.default_rng(2).integers(0, V, (*lead, T, J)).astype(np.int32)
    tau = 0.7
    z = (hidden.astype(np.float64) @ w.astype(np.float64)) / tau
    lsm = log_softmax(z)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    ent = -(np.exp(lsm) * lsm).sum(-1)

    f = jax.jit(lambda h, w, i: ops.lse_logprobs_entropy(h, w, i, temperature=tau, chunk_size=chunk))
    got_lse, got_lp, got_ent = f(hidden, w, ids)
    np.testing.assert_allclose(got_lse, lse, rtol=1e-5)
    np.testing.assert_allclose(got_lp, np.take_along_axis(lsm, ids, -1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_ent, ent, rtol=1e-5, atol=1e-6)

    np.testing.assert_allclose(ops.token_logprobs(hidden, w, ids[..., 0], temperature=tau, chunk_size=chunk),
                               np.take_along_axis(lsm, ids[..., :1], -1)[..., 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ops.logsumexp(hidden, w, temperature=tau, chunk_size=chunk), lse, rtol=1e-5)
    np.testing.assert_allclose(ops.entropy(hidden, w, temperature=tau, chunk_size=chunk), ent, rtol=1e-5, atol=1e-6)

    top_ids, top_lp = ops.topk_logprobs(hidden, w, k, temperature=tau, chunk_size=chunk)
    want_ids = np.argsort(-z, axis=-1, kind="stable")[..., :k]
    np.testing.assert_array_equal(top_ids, want_ids)
    np.testing.assert_allclose(top_lp, np.take_along_axis(lsm, want_ids, -1), rtol=1e-5, atol=1e-5)

    stats = ops.vocab_stats(hidden, w, ids=ids, top_k=k, with_entropy=True, temperature=tau, chunk_size=chunk)
    np.testing.assert_array_equal(stats.topk_ids, want_ids)
    np.testing.assert_allclose(stats.logprobs_at_ids, np.take_along_axis(lsm, ids, -1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.entropy, ent, rtol=1e-5, atol=1e-6)


def test_topk_ties_go_to_the_lower_id():
    hidden = np.ones((1, 2, 4), np.float32)
    w = np.zeros((4, 10), np.float32)
    w[:, [3, 7, 8]] = 1.0  # three equal top logits
    ids, _ = ops.topk_logprobs(hidden, w, 2, chunk_size=1)
    np.testing.assert_array_equal(ids, [[[3, 7], [3, 7]]])


def test_kernel_gradients_match_dense_autodiff():
    T, H, V, J = 11, 8, 50, 3
    hidden = jnp.asarray(_rand(3, 2, T, H))
    w = jnp.asarray(_rand(4, H, V, scale=0.7))
    ids = jnp.asarray(np.random.default_rng(5).integers(0, V, (2, T, J)), jnp.int32)
    a, b, c = (jnp.asarray(_rand(s, *shape)) for s, shape in ((6, (2, T)), (7, (2, T, J)), (8, (2, T))))
    tau = 1.3

    def chunked(h, w):
        lse, lp, ent = ops.lse_logprobs_entropy(h, w, ids, temperature=tau, chunk_size=4)
        return jnp.sum(a * lse) + jnp.sum(b * lp) + jnp.sum(c * ent)

    def dense(h, w):
        z = jnp.einsum("bth,hv->btv", h, w) / tau
        lse = jax.nn.logsumexp(z, -1)
        lsm = jax.nn.log_softmax(z, -1)
        ent = -jnp.sum(jnp.exp(lsm) * lsm, -1)
        return jnp.sum(a * lse) + jnp.sum(b * jnp.take_along_axis(lsm, ids, -1)) + jnp.sum(c * ent)

    got = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1)))(hidden, w)
    want = jax.jit(jax.value_and_grad(dense, argnums=(0, 1)))(hidden, w)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    _assert_rel(got[1][0], want[1][0], what="d hidden")
    _assert_rel(got[1][1], want[1][1], what="d lm_head")

    # entropy_grad=False drops exactly the entropy path
    def chunked_no_ent(h, w):
        lse, lp, ent = ops.lse_logprobs_entropy(h, w, ids, temperature=tau, chunk_size=4, entropy_grad=False)
        return jnp.sum(a * lse) + jnp.sum(b * lp) + jnp.sum(c * jax.lax.stop_gradient(ent))

    def dense_no_ent(h, w):
        z = jnp.einsum("bth,hv->btv", h, w) / tau
        return jnp.sum(a * jax.nn.logsumexp(z, -1)) + jnp.sum(b * jnp.take_along_axis(jax.nn.log_softmax(z, -1), ids, -1))

    g1 = jax.jit(jax.grad(chunked_no_ent, argnums=(0, 1)))(hidden, w)
    g2 = jax.jit(jax.grad(dense_no_ent, argnums=(0, 1)))(hidden, w)
    _assert_rel(g1[0], g2[0], what="d hidden (no entropy)")
    _assert_rel(g1[1], g2[1], what="d lm_head (no entropy)")



@pytest.mark.parametrize("entropy_grad", [True, False])
def test_dense_kernel_matches_float64_autodiff(entropy_grad):
    """``ops.dense_lse_logprobs_entropy`` (custom VJP on full logits) against float64 autodiff of
    the textbook definitions, values and the gradient, with -inf logits (masked vocabulary
    entries), repeated ids and out-of-range ids (clipped) in the mix."""
    B, T, V, J = 2, 7, 40, 4
    z = _rand(11, B, T, V, scale=3.0)
    z[0, 1, :5] = -np.inf
    ids = np.random.default_rng(12).integers(-2, V + 2, (B, T, J)).astype(np.int32)
    ids[0, 2, 1] = ids[0, 2, 0]
    ids[0, 1] = np.maximum(ids[0, 1], 5)   # a log-prob of -inf would make the comparison inf - inf
    a, b, c = (_rand(s, *shape) for s, shape in ((13, (B, T)), (14, (B, T, J)), (15, (B, T))))

    def ours(z):
        lse, lp, ent = ops.dense_lse_logprobs_entropy(z, ids, entropy_grad=entropy_grad)
        ent = ent if entropy_grad else jax.lax.stop_gradient(ent)
        return jnp.sum(a * lse) + jnp.sum(b * lp) + jnp.sum(c * ent), (lse, lp, ent)

    def textbook(z):
        lse = jax.nn.logsumexp(z, -1)
        lsm = jax.nn.log_softmax(z, -1)
        ent = -jnp.sum(jnp.exp(lsm) * jnp.where(jnp.isfinite(lsm), lsm, 0.0), -1)   # 0 log 0 = 0, NaN-free grad
        ent = ent if entropy_grad else jax.lax.stop_gradient(ent)
        lp = jnp.take_along_axis(lsm, jnp.clip(ids, 0, V - 1), -1)
        return jnp.sum(a * lse) + jnp.sum(b * lp) + jnp.sum(c * ent), (lse, lp, ent)

    (got, got_parts), got_grad = jax.jit(jax.value_and_grad(ours, has_aux=True))(jnp.asarray(z))
    (want, _), want_grad = jax.jit(jax.value_and_grad(textbook, has_aux=True))(jnp.asarray(z))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    z64 = z.astype(np.float64)
    lsm64 = log_softmax(z64)
    p64 = np.exp(lsm64)
    want_parts = (np.log(np.sum(np.exp(z64 - z64.max(-1, keepdims=True)), -1)) + z64.max(-1),
                  np.take_along_axis(lsm64, np.clip(ids, 0, V - 1), -1),
                  -np.sum(np.where(p64 > 0, p64 * np.where(p64 > 0, lsm64, 0.0), 0.0), -1))
    for g, w, what in zip(got_parts, want_parts, ("lse", "logprobs", "entropy")):
        _assert_rel(g, w, what=what)
    assert np.all(np.isfinite(np.asarray(got_grad)))
    _assert_rel(got_grad, want_grad, what="d logits")

def test_bfloat16_inputs_keep_float32_statistics():
    hidden = _rand(9, 2, 16, 32)
    w = _rand(10, 32, 300, scale=0.3)
    hb, wb = jnp.asarray(hidden, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    z = np.asarray(hb, np.float64) @ np.asarray(wb, np.float64)
    lse, _, ent = ops.lse_logprobs_entropy(hb, wb, None, chunk_size=5)
    assert lse.dtype == jnp.float32 and ent.dtype == jnp.float32
    np.testing.assert_allclose(lse, np.log(np.exp(z).sum(-1)), rtol=1e-4)
    g = jax.grad(lambda h, w: jnp.sum(ops.logsumexp(h, w, chunk_size=5)), argnums=(0, 1))(hb, wb)
    assert g[0].dtype == jnp.bfloat16 and g[1].dtype == jnp.bfloat16


# ------------------------------------------------------------------ chunked loss vs dense


def _hidden_case(seed, **kw):
    case = make_case(seed, **kw)
    B, T = case["response_ids"].shape
    V = case["logits"].shape[-1]
    H = 24
    hidden = _rand(seed + 100, B, T, H)
    w = _rand(seed + 200, H, V, scale=0.8)
    batch = HybridBatch(**{k: (None if v is None else jnp.asarray(v)) for k, v in batch_arrays(case).items()})
    return jnp.asarray(hidden), jnp.asarray(w), batch


@pytest.mark.parametrize("name,cfg,segments", [
    ("combine", LossConfig(), False),
    ("combine", LossConfig(hint_selection="token_optimal", subset_mode="overlap", entropy_coef=0.02, kl_coef=0.1), False),
    ("combine", LossConfig(subset_mode="teacher", adv_diff_clip=0.0), True),
    ("token_combine", LossConfig(name="token_combine", w_opd=0.5), False),
    ("tail_kl", LossConfig(name="tail_kl", hint_selection="token_optimal"), False),
    ("combine", LossConfig(sample_norm_tokens=16, entropy_coef=0.02, kl_coef=0.1), False),
])
def test_chunked_loss_equals_dense(name, cfg, segments):
    hidden, w, batch = _hidden_case(11, segments=segments)
    tau = 0.8
    loss_fn = get_loss(name)

    def dense(h, w):
        logits = jnp.einsum("bth,hv->btv", h, w) / tau
        return loss_fn.dense(logits, batch, cfg)

    def chunked(h, w):
        return loss_fn.chunked(h, w, batch, cfg, temperature=tau, chunk_size=3)

    (l1, m1), g1 = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True))(hidden, w)
    (l2, m2), g2 = jax.jit(jax.value_and_grad(dense, argnums=(0, 1), has_aux=True))(hidden, w)
    np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-7)
    assert set(m1) == set(m2)
    for key in m1:
        np.testing.assert_allclose(m1[key], m2[key], rtol=1e-5, atol=1e-6, err_msg=key)
    _assert_rel(g1[0], g2[0], what="d hidden")
    _assert_rel(g1[1], g2[1], what="d lm_head")


def test_chunked_hybrid_loss_is_the_public_entry():
    hidden, w, batch = _hidden_case(12)
    loss, metrics = jax.jit(lambda h, w: chunked_hybrid_loss(h, w, batch, LossConfig(), chunk_size=4))(hidden, w)
    dense_loss, _ = jax.jit(lambda h, w: hybrid_loss(jnp.einsum("bth,hv->btv", h, w), batch, LossConfig()))(hidden, w)
    np.testing.assert_allclose(loss, dense_loss, rtol=1e-5)
    assert not hasattr(ops, "chunked_hybrid_loss")  # ops is a leaf: the loss lives in losses/
    with pytest.raises(ValueError, match="hidden must be"):
        chunked_hybrid_loss(hidden[:, :-1], w, batch)


# ------------------------------------------------------------------ memory


def _grad_temp_bytes(fn, *args) -> int:
    compiled = jax.jit(jax.grad(fn, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def _synthetic_batch(B, T, K, C, V, seed=0):
    rng = np.random.default_rng(seed)
    ids = lambda *s: jnp.asarray(rng.integers(0, V, s), jnp.int32)  # noqa: E731
    lp = lambda *s: jnp.asarray(-rng.random(s) * 5, jnp.float32)  # noqa: E731
    return HybridBatch(
        response_ids=ids(B, T), response_mask=jnp.ones((B, T)), old_logprobs=lp(B, T), advantages=jnp.ones((B, T)),
        student_topk_ids=ids(B, T, K), student_topk_logprobs=lp(B, T, K),
        teacher_topk_ids=ids(B, C, T, K), teacher_topk_logprobs=lp(B, C, T, K),
        teacher_logprobs_at_student_ids=lp(B, C, T, K), old_logprobs_at_teacher_ids=lp(B, C, T, K),
        candidate_mask=jnp.ones((B, C)), sample_mask=jnp.ones((B,)),
    )


def test_chunked_peak_memory_does_not_scale_with_tokens_times_vocab():
    """XLA's compiled memory analysis of loss+grad: the chunked path's temporaries stay
    flat as T grows 8x, the dense path's grow with [B, T, V] (so the measurement can see it)."""
    B, H, V, K, C, chunk = 2, 32, 8192, 4, 3, 16
    cfg = LossConfig()
    temps, dense_temps = {}, {}
    for T in (64, 512):
        batch = _synthetic_batch(B, T, K, C, V)
        hidden = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
        w = jax.ShapeDtypeStruct((H, V), jnp.float32)
        temps[T] = _grad_temp_bytes(
            lambda h, w: chunked_hybrid_loss(h, w, batch, cfg, chunk_size=chunk)[0], hidden, w)
        dense_temps[T] = _grad_temp_bytes(
            lambda h, w: hybrid_loss(jnp.einsum("bth,hv->btv", h, w), batch, cfg)[0], hidden, w)
    full = lambda T: B * T * V * 4  # noqa: E731  one float32 [B*T, V] array
    # chunked: growth from T=64 to 512 is a small fraction of one extra [B*448, V] array
    assert temps[512] - temps[64] < 0.05 * (full(512) - full(64)), temps
    assert temps[512] < 0.25 * full(512), (temps, full(512))
    # dense: needs at least one full [B*T, V] float32 buffer and grows with it
    assert dense_temps[512] >= full(512), dense_temps
    assert dense_temps[512] - dense_temps[64] >= full(512) - full(64), dense_temps


# ------------------------------------------------------------------ dense kernel: shift, donation


@pytest.mark.parametrize("gap", [25.0, 300.0])
def test_dense_kernel_when_the_max_logit_is_not_at_the_ids(gap):
    """The dense kernel shifts by the largest logit at ``ids``; a logit ``gap`` above it (25: still
    the shifted fast path; 300: its sum overflows and the exact max is used) changes nothing."""
    B, T, V, J = 2, 5, 64, 3
    z = _rand(21, B, T, V, scale=2.0)
    ids = np.random.default_rng(22).integers(0, V // 2, (B, T, J)).astype(np.int32)
    z[:, :, V - 1] = np.take_along_axis(z, ids, -1).max(-1) + gap   # never gathered: ids < V / 2
    a, b = _rand(23, B, T), _rand(24, B, T, J)

    def ours(z):
        lse, lp, ent = ops.dense_lse_logprobs_entropy(z, ids)
        return jnp.sum(a * lse) + jnp.sum(b * lp) + jnp.sum(a * ent), (lse, lp, ent)

    (_, got), got_grad = jax.jit(jax.value_and_grad(ours, has_aux=True))(jnp.asarray(z))
    z64 = z.astype(np.float64)
    lsm = log_softmax(z64)
    p = np.exp(lsm)
    ent = -np.sum(p * lsm, -1)
    _assert_rel(got[0], np.log(np.sum(np.exp(z64 - z64.max(-1, keepdims=True)), -1)) + z64.max(-1), what="lse")
    _assert_rel(got[1], np.take_along_axis(lsm, ids, -1), what="logprobs")
    np.testing.assert_allclose(got[2], ent, rtol=1e-4, atol=1e-5)   # tiny entropies: an absolute bound
    # float64 gradient of sum(a lse + b logp + a H): p (a - sum_j b_j) + scatter(b) - a p (log p + H)
    want = p * (a - b.sum(-1))[..., None] - a[..., None] * p * (lsm + ent[..., None])
    for j in range(J):
        np.add.at(want, (np.arange(B)[:, None], np.arange(T)[None, :], ids[..., j]), b[..., j])
    _assert_rel(got_grad, want, rtol=1e-4, what="d logits")


def test_dense_gradient_is_written_into_donated_logits():
    """With the logits donated, value_and_grad(hybrid_loss) allocates nothing [B,T,V]: XLA aliases
    the gradient to the logits' buffer (no fresh, page-faulted array per call)."""
    B, T, V = 2, 32, 4096
    batch = _synthetic_batch(B, T, 4, 3, V)
    f = jax.value_and_grad(lambda z: hybrid_loss(z, batch, LossConfig()), has_aux=True)
    logits = jax.ShapeDtypeStruct((B, T, V), jnp.float32)
    donated = jax.jit(f, donate_argnums=0).lower(logits).compile().memory_analysis()
    kept = jax.jit(f).lower(logits).compile().memory_analysis()
    full = B * T * V * 4
    assert donated.alias_size_in_bytes == full, donated
    assert donated.temp_size_in_bytes < 0.05 * full, donated
    assert kept.temp_size_in_bytes < 0.05 * full, kept   # kept: the gradient is the one output, no temporaries


def test_chunked_path_of_a_kind_that_is_not_per_position():
    """A kind that leaves ``per_position`` False takes the two-scan custom VJP (backward recomputes
    the logits) and agrees with the fused path and with the dense definition."""
    from openclaw_jax.losses import loss_kind, register_loss
    from openclaw_jax.losses.hybrid import HybridKind

    @loss_kind("test_hybrid_two_scan", overwrite=True)
    class TwoScan(HybridKind):
        per_position = False

    register_loss("test_hybrid_two_scan", "test_hybrid_two_scan", None, "test only", overwrite=True)
    hidden, w, batch = _hidden_case(13)
    cfg = LossConfig(entropy_coef=0.05)
    two = get_loss("test_hybrid_two_scan")
    two_cfg = LossConfig(name="test_hybrid_two_scan", entropy_coef=0.05)

    def grads(fn):
        return jax.jit(jax.value_and_grad(lambda h, w: fn(h, w)[0], argnums=(0, 1)))(hidden, w)

    l1, g1 = grads(lambda h, w: two.chunked(h, w, batch, two_cfg, chunk_size=4))
    l2, g2 = grads(lambda h, w: chunked_hybrid_loss(h, w, batch, cfg, chunk_size=4))
    l3, g3 = grads(lambda h, w: hybrid_loss(jnp.einsum("bth,hv->btv", h, w), batch, cfg))
    np.testing.assert_allclose(l1, l3, rtol=1e-5)
    np.testing.assert_allclose(l2, l3, rtol=1e-5)
    for got in (g1, g2):
        _assert_rel(got[0], g3[0], what="d hidden")
        _assert_rel(got[1], g3[1], what="d lm_head")
