"""Attention kernels: blockwise (flash-style, custom VJP) equals the dense reference in values and
gradients; both equal a NumPy float64 loop; blockwise memory is linear in length (compiled temp
bytes); `auto`/`fused` resolve clearly on CPU; the decoder gives the same logits and gradients
with either kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.models import attention as A
from openclaw_jax.models.config import ModelConfig, ModelConfigError
from openclaw_jax.models.decoder import Decoder


def _np_attention(q, k, v, causal, kv_mask, seg):
    """float64 loop reference of the mask rule in the attention module docstring."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, L, N, D = q.shape
    S, K = k.shape[1], k.shape[2]
    out = np.zeros((B, L, N, D))
    for b in range(B):
        for n in range(N):
            kh = n // (N // K)
            for i in range(L):
                vis = np.ones(S, bool)
                if causal:
                    vis &= np.arange(S) <= i + (S - L)
                if kv_mask is not None:
                    vis &= kv_mask[b]
                if seg is not None:
                    vis &= seg[b] == seg[b, i]
                if not vis.any():
                    continue
                s = k[b, vis, kh] @ q[b, i, n] / np.sqrt(D)
                p = np.exp(s - s.max())
                out[b, i, n] = (p / p.sum()) @ v[b, vis, kh]
    return out


def _inputs(rng, B, L, N, K, D, dtype, *, mask: bool, segments: bool):
    q, k, v = (rng.standard_normal((B, L, h, D)).astype(np.float32) for h in (N, K, K))
    kv_mask = None
    if mask:
        kv_mask = rng.random((B, L)) > 0.25
        kv_mask[:, 0] = True
        kv_mask[0, :3] = False  # row 0: left padding (its first queries see nothing -> zeros)
    seg = np.sort(rng.integers(0, 3, (B, L)), axis=1).astype(np.int32) if segments else None
    return q, k, v, kv_mask, seg


CASES = [  # (dtype, B, L, heads, kv heads, head_dim, causal, padding mask, segments, block)
    ("float32", 2, 37, 4, 2, 16, True, True, True, 8),     # odd length, several blocks, GQA 2
    ("float32", 1, 50, 4, 1, 8, False, True, False, 16),   # not causal, MQA
    ("bfloat16", 2, 33, 4, 2, 16, True, True, True, 8),
]


@pytest.mark.parametrize("dtype,B,L,N,K,D,causal,mask,segments,block", CASES,
                         ids=[f"{c[0]}-L{c[2]}-gqa{c[3] // c[4]}-{'causal' if c[6] else 'full'}"
                              f"{'-pad' if c[7] else ''}{'-seg' if c[8] else ''}-blk{c[9]}" for c in CASES])
def test_blockwise_equals_dense_values_and_grads(dtype, B, L, N, K, D, causal, mask, segments, block):
    rng = np.random.default_rng(L)
    q, k, v, kv_mask, seg = _inputs(rng, B, L, N, K, D, dtype, mask=mask, segments=segments)
    cot = rng.standard_normal((B, L, N, D)).astype(np.float32)
    ref = _np_attention(q, k, v, causal, kv_mask, seg)
    dt = jnp.dtype(dtype)
    kw = dict(causal=causal, kv_mask=None if kv_mask is None else jnp.asarray(kv_mask),
              segment_ids=None if seg is None else jnp.asarray(seg))

    @jax.jit
    def run(q, k, v, cot):
        def loss(fn):
            return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * cot)
        dense = lambda q, k, v: A.attention(q, k, v, implementation="dense", **kw)  # noqa: E731
        blockwise = lambda q, k, v: A.attention(q, k, v, implementation="blockwise", block_q=block,  # noqa: E731
                                                block_k=block, **kw)
        out_d, out_b = dense(q, k, v), blockwise(q, k, v)
        g_d = jax.grad(loss(dense), argnums=(0, 1, 2))(q, k, v)
        g_b = jax.grad(loss(blockwise), argnums=(0, 1, 2))(q, k, v)
        return out_d, out_b, g_d, g_b

    out_d, out_b, g_d, g_b = run(*(jnp.asarray(x, dt) for x in (q, k, v)), jnp.asarray(cot))
    assert out_b.dtype == dt and out_b.shape == (B, L, N, D)
    out_d, out_b = np.asarray(out_d, np.float64), np.asarray(out_b, np.float64)
    if dtype == "float32":
        assert np.abs(out_d - ref).max() < 1e-5
        assert np.abs(out_b - ref).max() < 1e-5
        for a, b in zip(g_d, g_b):
            a, b = np.asarray(a), np.asarray(b)
            assert np.abs(a - b).max() < 1e-5 * max(1.0, np.abs(a).max()), np.abs(a - b).max()
    else:
        # bf16 inputs: the blockwise kernel is as close to the float64 truth as the dense one.
        err_d, err_b = np.abs(out_d - ref).max(), np.abs(out_b - ref).max()
        assert err_b < 0.05 and err_b <= 2 * err_d + 1e-2, (err_d, err_b)
        for a, b in zip(g_d, g_b):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            assert np.abs(a - b).max() < 0.05 * np.abs(a).max(), (np.abs(a - b).max(), np.abs(a).max())
    if mask and causal:  # row 0's left padding: its first queries see no key at all -> zeros in both
        assert np.all(out_b[0, :3] == 0) and np.all(out_d[0, :3] == 0)


def _fwd_bwd_temp_bytes(impl: str, L: int, block: int) -> int:
    B, N, K, D = 1, 4, 2, 32
    q = jax.ShapeDtypeStruct((B, L, N, D), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, L, K, D), jnp.float32)

    def loss(q, k, v):
        return jnp.sum(A.attention(q, k, v, implementation=impl, block_q=block, block_k=block) ** 2)

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_memory_is_linear_in_length_dense_is_quadratic():
    """Forward+backward of one attention layer compiled at L and 4L: the temporaries of the
    blockwise kernel grow about 4x (linear; the block scratch is a constant), dense ~16x."""
    L, block = 512, 128
    dense = [_fwd_bwd_temp_bytes("dense", n, block) for n in (L, 4 * L)]
    blockwise = [_fwd_bwd_temp_bytes("blockwise", n, block) for n in (L, 4 * L)]
    assert dense[1] / dense[0] > 12, dense  # quadratic: [B, N, L, L] float32 scores/probabilities
    assert blockwise[1] / blockwise[0] < 5, blockwise  # a quadratic kernel would give ~16
    # and at 4L the blockwise kernel holds far less than the [N, 4L, 4L] float32 score matrix
    assert blockwise[1] < 4 * (4 * L) ** 2 * 4 / 8, blockwise


def test_auto_resolves_to_blockwise_and_fused_errors_clearly_on_cpu():
    assert jax.default_backend() == "cpu"
    q = jnp.zeros((1, 8, 2, 8), jnp.bfloat16)
    assert A.resolve_implementation("auto", q, has_mask=False) == "blockwise"
    assert A.resolve_implementation("dense", q, has_mask=True) == "dense"
    with pytest.raises(A.AttentionConfigError, match="needs a GPU backend.*use model.attention=auto"):
        A.attention(q, q, q, implementation="fused")
    with pytest.raises(A.AttentionConfigError, match="not one of"):
        A.attention(q, q, q, implementation="flash")
    with pytest.raises(ModelConfigError, match="model.attention='flash' is not one of"):
        ModelConfig(family="qwen3", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
                    num_kv_heads=1, head_dim=4, attention="flash")


def test_decoder_blockwise_equals_dense_logits_and_grads():
    """The whole decoder (several blocks: block 8, L 21, left padding and segments) gives the same
    logits and parameter gradients with attention=blockwise as with attention=dense."""
    cfg = ModelConfig(family="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, attention_block_size=8)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 64, (2, 21)), jnp.int32)
    mask = np.ones((2, 21), bool)
    mask[1, :5] = False
    seg = np.zeros((2, 21), np.int32)
    seg[0, 12:] = 1  # row 0 packs two samples
    positions = np.where(seg == 1, np.arange(21) - 12, np.maximum(np.cumsum(mask, 1) - 1, 0)).astype(np.int32)
    args = (ids, jnp.asarray(positions), jnp.asarray(mask), jnp.asarray(seg))

    def run(attention):
        model = Decoder(cfg.replace(attention=attention), rngs=nnx.Rngs(0))
        weights = jnp.asarray(mask, jnp.float32)[..., None]

        def loss(m):
            logits = m(*args)
            return jnp.sum(jax.nn.log_softmax(logits) * weights), logits

        @nnx.jit
        def go(m):
            (value, logits), grads = nnx.value_and_grad(loss, has_aux=True)(m)
            return logits, value, grads, m(ids[:1, 12:])

        return go(model)

    logits_d, loss_d, grads_d, _ = run("dense")
    logits_b, loss_b, grads_b, alone = run("blockwise")
    assert np.abs(np.asarray(logits_b)[mask] - np.asarray(logits_d)[mask]).max() < 1e-5
    assert abs(float(loss_b) - float(loss_d)) < 1e-5 * abs(float(loss_d))
    for (path, a), (_, b) in zip(nnx.to_flat_state(grads_d), nnx.to_flat_state(grads_b)):
        a, b = np.asarray(a.get_value()), np.asarray(b.get_value())
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max()), path
    # the packed second sample equals that sample run alone (attention never crosses a segment)
    assert np.abs(np.asarray(alone)[0] - np.asarray(logits_b)[0, 12:]).max() < 1e-5


FORWARD_CASES = [  # (dtype, B, L, heads, kv heads, head_dim, block): inference causal kernel
    ("float32", 2, 37, 6, 2, 16, 8),    # padded to 40: 5 blocks, GQA 3
    ("float32", 1, 64, 4, 4, 8, 16),    # a whole number of blocks, no GQA
    ("float32", 1, 300, 4, 1, 8, 0),    # the default block (256 on CPU): 2 blocks, the last padded
    ("bfloat16", 2, 33, 4, 2, 16, 8),
]


@pytest.mark.parametrize("dtype,B,L,N,K,D,block", FORWARD_CASES,
                         ids=[f"{c[0]}-B{c[1]}-L{c[2]}-gqa{c[3] // c[4]}-blk{c[6]}" for c in FORWARD_CASES])
def test_causal_forward_attention_equals_the_float64_reference(dtype, B, L, N, K, D, block):
    rng = np.random.default_rng(L)
    q, k, v, _, _ = _inputs(rng, B, L, N, K, D, dtype, mask=False, segments=False)
    cast = lambda x: jnp.asarray(x, dtype)
    got = jax.jit(lambda q, k, v: A.causal_forward_attention(q, k, v, block=block))(cast(q), cast(k), cast(v))
    assert got.dtype == jnp.dtype(dtype) and got.shape == (B, L, N, D)
    ref = _np_attention(*(np.asarray(cast(x), np.float32) for x in (q, k, v)), True, None, None)
    tol = 2e-2 if dtype == "bfloat16" else 2e-5
    assert np.abs(np.asarray(got, np.float64) - ref).max() < tol
    # `attention` runs it only for plain causal self-attention of a forward-only call; the same call
    # with a padding mask still goes through the blockwise kernel, and both follow the mask rule
    assert np.array_equal(np.asarray(A.attention(cast(q), cast(k), cast(v), implementation="blockwise",
                                                 block_q=block, forward_only=True)), np.asarray(got))
    if dtype == "float32":
        kv_mask = np.ones((B, L), bool)
        kv_mask[:, 1] = False
        masked = A.attention(cast(q), cast(k), cast(v), kv_mask=jnp.asarray(kv_mask), implementation="blockwise",
                             block_q=block or 8, block_k=block or 8, forward_only=True)
        assert np.abs(np.asarray(masked, np.float64) - _np_attention(q, k, v, True, kv_mask, None)).max() < tol


@pytest.mark.parametrize("cache_len", [24, 21])
def test_prefill_hidden_equals_decode_into_an_empty_cache(cache_len):
    """The engine's prefill (the forward-only causal kernel, several blocks; into a longer cache or one
    of exactly the prompt's length) gives the hidden states and cache of the dense cached path, and
    decoding continues identically from it."""
    cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, attention="blockwise", attention_block_size=8)
    model = Decoder(cfg, rngs=nnx.Rngs(1))
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 21)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(21, dtype=jnp.int32), (2, 21))

    @nnx.jit
    def both(m):
        a, cache_a = m.prefill_hidden(ids, m.init_cache(2, cache_len))
        b, cache_b = m.decode_hidden(ids, positions, m.init_cache(2, cache_len))
        # the next token attends to the prompt's 21 slots (with a 21-slot cache its own write is dropped)
        nxt = jnp.full((2, 1), 5, jnp.int32), jnp.full((2, 1), 21, jnp.int32)
        return a, b, cache_a, cache_b, m.decode_hidden(*nxt, cache_a)[0], m.decode_hidden(*nxt, cache_b)[0]

    a, b, cache_a, cache_b, step_a, step_b = both(model)
    assert np.abs(np.asarray(a) - np.asarray(b)).max() < 1e-5
    for x, y in zip(cache_a, cache_b):
        assert x.shape == y.shape and np.abs(np.asarray(x) - np.asarray(y)).max() < 1e-5
    assert np.abs(np.asarray(step_a) - np.asarray(step_b)).max() < 1e-5


def test_attention_flops_counts_the_visited_blocks():
    """attention_flops against XLA's cost analysis, which counts a loop body once: one block (the
    dense formula, no loops) is counted exactly; one query block x two key blocks (not causal)
    runs the forward's key loop and the backward's key-block scan twice, so XLA sees half.
    The causal pair count equals a brute-force count of visible block pairs."""
    def xla_flops(L, S, causal, block):
        B, N, K, D = 1, 4, 2, 64
        shapes = [(B, L, N, D), (B, S, K, D), (B, S, K, D)]
        fn = lambda q, k, v: A.attention(q, k, v, causal=causal, implementation="blockwise",  # noqa: E731
                                         block_q=block, block_k=block)
        fwd = jax.jit(fn).lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)).compile()
        out, vjp = jax.vjp(fn, *(jnp.zeros(s, jnp.float32) for s in shapes))
        bwd = jax.jit(lambda f, ct: f(ct)).lower(vjp, out).compile()
        count = A.attention_flops(B, L, S, N, D, causal=causal, block_q=block, block_k=block)
        return fwd.cost_analysis()["flops"] / count["forward"], bwd.cost_analysis()["flops"] / count["backward"]

    fwd, bwd = xla_flops(64, 64, True, 64)
    assert 1.0 <= fwd < 1.1 and 1.0 <= bwd < 1.1, (fwd, bwd)  # elementwise ops add a few percent
    fwd, bwd = xla_flops(64, 128, False, 64)
    assert 0.5 <= fwd < 0.55 and 0.5 <= bwd < 0.55, (fwd, bwd)
    for Lq, S, bq, bk in [(37, 37, 8, 16), (100, 100, 32, 32), (20, 50, 8, 8)]:
        pairs = sum(any(j <= i + S - Lq for i in range(qb * bq, qb * bq + bq) for j in range(kb * bk, kb * bk + bk))
                    for qb in range(-(-Lq // bq)) for kb in range(-(-S // bk)))
        got = A.attention_flops(1, Lq, S, 1, 1, block_q=bq, block_k=bk)["forward"]
        assert got == 4 * pairs * bq * bk, (Lq, S, bq, bk)


@pytest.mark.parametrize("L", [5, A.CACHED_BLOCKWISE_MIN + 7])
def test_cached_attention_equals_the_reference_short_and_long_calls(L):
    """A call over a cache (rows filled to different lengths, stale slots beyond them) and its own
    keys: the dense path (short calls) and the blockwise one (long calls) both equal the float64
    loop over [the row's cached keys; the call's keys], causal."""
    rng = np.random.default_rng(3)
    B, N, K, D, S = 2, 4, 2, 8, 96
    q, k_new, v_new = (rng.standard_normal((B, L, h, D)).astype(np.float32) for h in (N, K, K))
    cache_k, cache_v = (rng.standard_normal((B, S, K, D)).astype(np.float32) for _ in range(2))
    start = np.array([70, 13])        # row b's cache holds slots < start[b]; the rest is stale
    positions = (start[:, None] + np.arange(L)[None, :]).astype(np.int32)
    out = np.asarray(jax.jit(A.cached_attention)(q, k_new, v_new, cache_k, cache_v, positions))
    for b in range(B):
        keys = np.concatenate([cache_k[b, :start[b]], k_new[b]])[None]
        values = np.concatenate([cache_v[b, :start[b]], v_new[b]])[None]
        ref = _np_attention(q[b:b + 1], keys, values, True, None, None)
        np.testing.assert_allclose(out[b], ref[0], atol=2e-5)


@pytest.mark.parametrize("start", [(70, 45), (96, 0), (33, 33)])
def test_a_long_call_reads_the_cached_prefix_in_blocks(monkeypatch, start):
    """A long call over a prefix of several key blocks (blocks before every row's start read unmasked, the
    rest masked per row; a row with nothing cached sees only its own keys; the cache's stale tail past the
    longest start never counts) equals the float64 loop over [the row's cached keys; the call's keys]."""
    monkeypatch.setattr(A, "PREFIX_BLOCK", 16)
    rng = np.random.default_rng(11)
    B, N, K, D, S, L = 2, 6, 2, 8, 100, A.CACHED_BLOCKWISE_MIN + 5
    q, k_new, v_new = (rng.standard_normal((B, L, h, D)).astype(np.float32) for h in (N, K, K))
    cache_k, cache_v = (rng.standard_normal((B, S, K, D)).astype(np.float32) * 3 for _ in range(2))
    start = np.array(start)
    positions = (start[:, None] + np.arange(L)[None, :]).astype(np.int32)
    out = np.asarray(jax.jit(A.cached_attention)(q, k_new, v_new, cache_k, cache_v, positions))
    for b in range(B):
        keys = np.concatenate([cache_k[b, :start[b]], k_new[b]])[None]
        values = np.concatenate([cache_v[b, :start[b]], v_new[b]])[None]
        np.testing.assert_allclose(out[b], _np_attention(q[b:b + 1], keys, values, True, None, None)[0], atol=2e-5)


@pytest.mark.parametrize("L", [12, A.CACHED_BLOCKWISE_MIN + 9])
def test_cached_attention_with_segments_is_each_continuation_alone(L):
    """Several continuations of a row's cached prefix packed into one call (segments 1, 2, ... and a
    padding tail of segment 0, positions restarting at the prefix length): each equals the float64
    loop over [the row's cached keys; that continuation's own keys], causal, short and long calls."""
    rng = np.random.default_rng(5)
    B, N, K, D, S = 2, 4, 2, 8, 40
    q, k_new, v_new = (rng.standard_normal((B, L, h, D)).astype(np.float32) for h in (N, K, K))
    cache_k, cache_v = (rng.standard_normal((B, S, K, D)).astype(np.float32) for _ in range(2))
    start = np.array([31, 6])
    cuts = [(0, L // 3, L - 2), (0, L // 2, L // 2 + 3)]   # row b: segments [cut_i, cut_i+1), tail padding
    segments = np.zeros((B, L), np.int32)
    positions = np.zeros((B, L), np.int32)
    for b, (c0, c1, c2) in enumerate(cuts):
        for sid, (lo, hi) in enumerate([(c0, c1), (c1, c2)], start=1):
            segments[b, lo:hi] = sid
            positions[b, lo:hi] = start[b] + np.arange(hi - lo)
        positions[b, c2:] = start[b] + np.arange(L - c2)
    out = np.asarray(jax.jit(A.cached_attention)(q, k_new, v_new, cache_k, cache_v, positions, segments))
    for b, (c0, c1, c2) in enumerate(cuts):
        for lo, hi in [(c0, c1), (c1, c2)]:
            keys = np.concatenate([cache_k[b, :start[b]], k_new[b, lo:hi]])[None]
            values = np.concatenate([cache_v[b, :start[b]], v_new[b, lo:hi]])[None]
            ref = _np_attention(q[b:b + 1, lo:hi], keys, values, True, None, None)
            np.testing.assert_allclose(out[b, lo:hi], ref[0], atol=2e-5)
