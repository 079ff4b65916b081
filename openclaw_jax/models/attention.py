"""Attention kernels: a dense reference, a blockwise (flash-style) pure-JAX kernel, the fused GPU kernel.

All take q `[B, L, N, D]`, k/v `[B, S, K, D]` (grouped-query attention: query head n uses KV head
n // (N/K), HF `repeat_kv` order) and return `[B, L, N, D]` in q's dtype. Scores, softmax and all
accumulators are float32; matmul inputs stay in the input dtype (bfloat16 allowed).

Masking (one rule for every implementation, computed from indices, never passed as `[B, L, S]`):
query i of row b sees key j when
  * `causal`: j <= i + (S - L) (the queries are the last L of the S keys; L == S for self-attention);
  * `kv_mask[b, j]` is True (padding, `[B, S]`, optional);
  * `segment_ids[b, i] == kv_segment_ids[b, j]` (packing, `[B, L]` / `[B, S]`, optional; the
    keys' ids default to the queries' when L == S): attention never crosses a segment. A key of
    segment `SHARED_SEGMENT` (negative) is seen by every segment: a cached prefix that several
    packed continuations share.
A query that sees no key outputs zeros.

Implementations
- `dense`: the reference; holds float32 scores `[B, K, G, L, S]` (quadratic memory).
- `blockwise`: query blocks x key blocks with an online softmax and a custom VJP that implements
  the flash-attention backward (recomputes each block's probabilities from the saved row
  log-sum-exp), so neither the forward nor the backward holds more than one
  `[B, K, G, block_q, block_k]` score block: temporaries are linear in L. With `causal`, key
  blocks entirely in a query block's future are skipped (about half the FLOPs of dense). A
  sequence that fits in one block runs the dense formula (same memory, no loops to compile).
- `fused`: `jax.nn.dot_product_attention(implementation="cudnn")` (cuDNN flash attention);
  needs a GPU, bfloat16/float16 inputs, head_dim a multiple of 8 (<= 128, 256 on Hopper), and
  supports the causal mask only (no `kv_mask` / segment ids: right padding needs no mask under
  a causal mask, since padding keys sit after every real query).
- `auto`: `fused` when it applies (GPU backend, supported dtype/head_dim, no padding/segment
  mask), `blockwise` otherwise (e.g. on CPU).

Inference (`forward_only=True`: a prompt's prefill, no gradient) of plain causal self-attention (no
padding or segment mask) runs `causal_forward_attention` where `blockwise` would: the same online
softmax, laid out so that no block is transposed or copied inside the loops, and key blocks wholly in
the past of a query block are not masked (only the diagonal block is). About half the time of the
blockwise forward on a 2-core CPU at 2048 tokens. An extend prefill (`cached_attention`) runs it too,
with the cached prefix read as further key blocks before the call's own.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from openclaw_jax.models.segments import SHARED_SEGMENT

IMPLEMENTATIONS = ("dense", "blockwise", "fused", "auto")

# Block size (tokens, queries and keys) of the blockwise kernel when none is given (0): on CPU
# 128 is both the fastest and the smallest in bench/attention.py (2 cores, L 512-2048); on an
# accelerator larger blocks amortise the per-iteration loop overhead (512: a guess, not measured
# here; `auto` runs the fused kernel there anyway unless a padding/segment mask is needed).
CPU_BLOCK = 128
ACCELERATOR_BLOCK = 512
# Query and key block of `causal_forward_attention` on CPU: 256 took 0.5-0.8x the time of 128 and 512 at
# 2048 tokens (9 query heads over 3 kv heads of 64, 2 cores); on an accelerator, ACCELERATOR_BLOCK.
CPU_FORWARD_BLOCK = 256
# Key block over a cached prefix in `causal_forward_attention` (an extend prefill)
PREFIX_BLOCK = 1024
# `cached_attention` calls with at least this many queries run a blocked kernel (decode steps, a few
# tokens, stay dense over the cache; at 16-32 queries over 4096 cached tokens both took the same time)
CACHED_BLOCKWISE_MIN = 64

_NEG = -1e30  # finite "minus infinity" for masked scores (exp underflows to exactly 0)


class AttentionConfigError(ValueError):
    """An attention implementation was asked for something it cannot do."""


class AttentionMask(NamedTuple):
    """What the decoder's full forward passes to its attention layers (closed over, not scanned)."""

    kv_mask: jax.Array | None = None      # [B, S] bool: False hides key j (padding)
    segment_ids: jax.Array | None = None  # [B, L] int: attention never crosses a segment (packing)
    implementation: str = "auto"          # one of IMPLEMENTATIONS
    block_size: int = 0                   # blockwise: query and key block (tokens); 0: by backend
    return_kv: bool = False               # the layer also returns its k, v (prefill into a cache)


def check_implementation(name: str) -> str:
    if name not in IMPLEMENTATIONS:
        raise AttentionConfigError(f"model.attention={name!r} is not one of {IMPLEMENTATIONS}")
    return name


def fused_unsupported_reason(q: jax.Array, *, has_mask: bool) -> str | None:
    """Why the fused cuDNN kernel cannot run this call (None when it can)."""
    backend = jax.default_backend()
    if backend != "gpu":
        return f"the fused kernel (cuDNN) needs a GPU backend; this one is {backend!r}"
    capability = getattr(jax.devices()[0], "compute_capability", None)
    if capability is not None and float(capability) < 8.0:
        return f"the fused kernel (cuDNN flash attention) needs compute capability >= 8.0, got {capability}"
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"the fused kernel needs bfloat16/float16 inputs, got {q.dtype} (set model.dtype=bfloat16)"
    head_dim = q.shape[-1]
    if head_dim % 8 or head_dim > 256:
        return f"the fused kernel needs head_dim a multiple of 8 and <= 256, got {head_dim}"
    if has_mask:
        return "the fused kernel supports the causal mask only, not a padding mask or segment ids"
    return None


def resolve_implementation(name: str, q: jax.Array, *, has_mask: bool) -> str:
    """The implementation that runs: `auto` -> fused where it applies, else blockwise."""
    check_implementation(name)
    if name == "auto":
        return "fused" if fused_unsupported_reason(q, has_mask=has_mask) is None else "blockwise"
    if name == "fused":
        reason = fused_unsupported_reason(q, has_mask=has_mask)
        if reason is not None:
            raise AttentionConfigError(f"model.attention='fused' cannot run here: {reason}; "
                                       "use model.attention=auto (fused where possible, else blockwise) or blockwise")
    return name


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool = True, kv_mask: jax.Array | None = None,
              segment_ids: jax.Array | None = None, kv_segment_ids: jax.Array | None = None,
              implementation: str = "auto", block_q: int = 0, block_k: int = 0,
              forward_only: bool = False) -> jax.Array:
    """Masked grouped-query attention (see the module docstring for the mask rule). `forward_only`: the
    result is never differentiated (a prefill), so plain causal self-attention may run
    `causal_forward_attention` instead of the blockwise kernel."""
    _check_shapes(q, k, v)
    segment_ids, kv_segment_ids = _segments(q, k, segment_ids, kv_segment_ids)
    has_mask = kv_mask is not None or segment_ids is not None
    impl = resolve_implementation(implementation, q, has_mask=has_mask)
    if impl == "blockwise" and forward_only and causal and not has_mask and q.shape[1] == k.shape[1]:
        return causal_forward_attention(q, k, v, block=block_q)
    if impl == "dense":
        return dense_attention(q, k, v, causal=causal, kv_mask=kv_mask, segment_ids=segment_ids,
                               kv_segment_ids=kv_segment_ids)
    if impl == "fused":
        return jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), is_causal=causal,
                                            implementation="cudnn")
    return blockwise_attention(q, k, v, causal=causal, kv_mask=kv_mask, segment_ids=segment_ids,
                               kv_segment_ids=kv_segment_ids, block_q=block_q, block_k=block_k)


def _check_shapes(q, k, v) -> None:
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise AttentionConfigError(f"attention wants q [B,L,N,D], k/v [B,S,K,D]; got {q.shape}, {k.shape}, {v.shape}")
    B, _, N, D = q.shape
    if k.shape[0] != B or k.shape[3] != D or N % k.shape[2]:
        raise AttentionConfigError(f"attention: q {q.shape} and k {k.shape} disagree (batch, head_dim, or "
                                   "query heads not a multiple of KV heads)")


def _segments(q, k, segment_ids, kv_segment_ids):
    if segment_ids is not None and kv_segment_ids is None:
        if q.shape[1] != k.shape[1]:
            raise AttentionConfigError("kv_segment_ids is required when queries and keys differ in length")
        kv_segment_ids = segment_ids
    if (segment_ids is None) != (kv_segment_ids is None):
        raise AttentionConfigError("give both segment_ids and kv_segment_ids, or neither")
    return segment_ids, kv_segment_ids


def _visible(q_idx, k_idx, offset, causal, kv_valid, seg_q, seg_k):
    """Boolean visibility `[B|1, Lq, Sk]` of one (block of) queries x keys, from indices."""
    vis = jnp.ones((1, q_idx.shape[0], k_idx.shape[0]), bool)
    if causal:
        vis = vis & (k_idx[None, None, :] <= q_idx[None, :, None] + offset)
    if kv_valid is not None:
        vis = vis & kv_valid[:, None, :]
    if seg_q is not None:
        vis = vis & ((seg_q[:, :, None] == seg_k[:, None, :]) | (seg_k[:, None, :] < 0))
    return vis


# -- dense reference ----------------------------------------------------------------------------------


def dense_attention(q, k, v, *, causal=True, kv_mask=None, segment_ids=None, kv_segment_ids=None):
    """The reference: float32 scores `[B, K, G, L, S]`, masked softmax, fully masked rows -> 0."""
    segment_ids, kv_segment_ids = _segments(q, k, segment_ids, kv_segment_ids)
    B, L, N, D = q.shape
    S, K = k.shape[1], k.shape[2]
    qg = q.reshape(B, L, K, N // K, D)
    s = jnp.einsum("blkgd,bskd->bkgls", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * (D ** -0.5)
    vis = _visible(jnp.arange(L), jnp.arange(S), S - L, causal, kv_mask, segment_ids, kv_segment_ids)
    vis = vis[:, None, None]
    s = jnp.where(vis, s, _NEG)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    p = jnp.where(vis, jnp.exp(s - m), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    probs = p / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("bkgls,bskd->blkgd", probs.astype(q.dtype), v.astype(q.dtype))
    return out.reshape(B, L, N, D)


# -- blockwise (flash-style, custom VJP) ------------------------------------------------------------


def blockwise_attention(q, k, v, *, causal=True, kv_mask=None, segment_ids=None, kv_segment_ids=None,
                        block_q: int = 0, block_k: int = 0):
    """Flash-style attention in pure JAX; memory linear in L and S in forward and backward."""
    segment_ids, kv_segment_ids = _segments(q, k, segment_ids, kv_segment_ids)
    B, L, N, D = q.shape
    S, K = k.shape[1], k.shape[2]
    bq = _block(L, block_q)
    bk = _block(S, block_k)
    lp, sp = _round_up(L, bq), _round_up(S, bk)
    if lp == bq and sp == bk:
        # One block each way: the dense formula is the same computation with the same memory (one
        # [bq, bk] score block) and compiles faster (no loops).
        return dense_attention(q, k, v, causal=causal, kv_mask=kv_mask, segment_ids=segment_ids,
                               kv_segment_ids=kv_segment_ids)
    qg = _pad(q.reshape(B, L, K, N // K, D), 1, lp)
    kp, vp = _pad(k.astype(q.dtype), 1, sp), _pad(v.astype(q.dtype), 1, sp)
    kv_valid = jnp.broadcast_to(jnp.arange(sp) < S, (B, sp))
    if kv_mask is not None:
        kv_valid = kv_valid & _pad(kv_mask.astype(bool), 1, sp)
    if segment_ids is not None:
        seg_q = _pad(segment_ids.astype(jnp.int32), 1, lp)
        seg_k = _pad(kv_segment_ids.astype(jnp.int32), 1, sp)
    else:
        seg_q = seg_k = None
    out = _flash(qg, kp, vp, kv_valid, seg_q, seg_k, (causal, S - L, bq, bk))
    return out[:, :L].reshape(B, L, N, D)


def default_block_size() -> int:
    return CPU_BLOCK if jax.default_backend() == "cpu" else ACCELERATOR_BLOCK


def _block(n: int, block: int) -> int:
    if block < 0:
        raise AttentionConfigError(f"attention block size must be >= 0 (0: by backend), got {block}")
    return min(block or default_block_size(), _round_up(n, 8))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _pad(x, axis, size):
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _slice(x, start, size, axis):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def _block_vis(i, j, static, kv_valid, seg_q, seg_k):
    causal, offset, bq, bk = static
    q_idx = i * bq + jnp.arange(bq)
    k_idx = j * bk + jnp.arange(bk)
    valid = _slice(kv_valid, j * bk, bk, 1)
    sq = None if seg_q is None else _slice(seg_q, i * bq, bq, 1)
    sk = None if seg_k is None else _slice(seg_k, j * bk, bk, 1)
    return _visible(q_idx, k_idx, offset, causal, valid, sq, sk)[:, None, None]  # [B, 1, 1, bq, bk]


def _flash_forward(q, k, v, kv_valid, seg_q, seg_k, static):
    """q `[B, Lp, K, G, D]`, k/v `[B, Sp, K, D]` -> out `[B, Lp, K, G, D]`, lse `[B, K, G, Lp]` (f32)."""
    causal, offset, bq, bk = static
    B, lp, K, G, D = q.shape
    nq, nk = lp // bq, k.shape[1] // bk
    scale = D ** -0.5

    def q_block(_, i):
        qi = _slice(q, i * bq, bq, 1)

        def kv_step(j, carry):
            m, l, acc = carry
            kj, vj = _slice(k, j * bk, bk, 1), _slice(v, j * bk, bk, 1)
            vis = _block_vis(i, j, static, kv_valid, seg_q, seg_k)
            s = jnp.einsum("bqkgd,bskd->bkgqs", qi, kj, preferred_element_type=jnp.float32) * scale
            s = jnp.where(vis, s, _NEG)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.where(vis, jnp.exp(s - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            l = l * corr + jnp.sum(p, axis=-1)
            acc = acc * corr[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", p.astype(v.dtype), vj,
                                                     preferred_element_type=jnp.float32)
            return m_new, l, acc

        init = (jnp.full((B, K, G, bq), _NEG, jnp.float32), jnp.zeros((B, K, G, bq), jnp.float32),
                jnp.zeros((B, K, G, bq, D), jnp.float32))
        hi = nk if not causal else jnp.clip((i + 1) * bq - 1 + offset, -1, nk * bk - 1) // bk + 1
        m, l, acc = jax.lax.fori_loop(0, hi, kv_step, init)
        seen = l > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
        return None, (out.astype(q.dtype), lse)

    _, (out, lse) = jax.lax.scan(q_block, None, jnp.arange(nq))
    # out [nq, B, K, G, bq, D] -> [B, Lp, K, G, D]; lse [nq, B, K, G, bq] -> [B, K, G, Lp]
    out = jnp.transpose(out, (1, 0, 4, 2, 3, 5)).reshape(B, lp, K, G, D)
    lse = jnp.transpose(lse, (1, 2, 3, 0, 4)).reshape(B, K, G, lp)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, kv_valid, seg_q, seg_k, static):
    return _flash_forward(q, k, v, kv_valid, seg_q, seg_k, static)[0]


def _flash_fwd(q, k, v, kv_valid, seg_q, seg_k, static):
    out, lse = _flash_forward(q, k, v, kv_valid, seg_q, seg_k, static)
    return out, (q, k, v, kv_valid, seg_q, seg_k, out, lse)


def _flash_bwd(static, res, dout):
    """Flash-attention backward: per key block, loop over the query blocks that see it."""
    q, k, v, kv_valid, seg_q, seg_k, out, lse = res
    causal, offset, bq, bk = static
    B, lp, K, G, D = q.shape
    sp = k.shape[1]
    nq, nk = lp // bq, sp // bk
    scale = D ** -0.5
    dout = dout.astype(q.dtype)
    # delta_i = sum_d dO * O  [B, K, G, Lp]
    delta = jnp.einsum("blkgd,blkgd->bkgl", dout.astype(jnp.float32), out.astype(jnp.float32))

    def kv_block(dq, j):
        kj, vj = _slice(k, j * bk, bk, 1), _slice(v, j * bk, bk, 1)

        def q_step(i, carry):
            dq, dk, dv = carry
            qi, doi = _slice(q, i * bq, bq, 1), _slice(dout, i * bq, bq, 1)
            lse_i, delta_i = _slice(lse, i * bq, bq, 3), _slice(delta, i * bq, bq, 3)
            vis = _block_vis(i, j, static, kv_valid, seg_q, seg_k)
            s = jnp.einsum("bqkgd,bskd->bkgqs", qi, kj, preferred_element_type=jnp.float32) * scale
            p = jnp.where(vis, jnp.exp(s - lse_i[..., None]), 0.0)
            dv = dv + jnp.einsum("bkgqs,bqkgd->bskd", p.astype(q.dtype), doi, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqkgd,bskd->bkgqs", doi, vj, preferred_element_type=jnp.float32)
            ds = (p * (dp - delta_i[..., None]) * scale).astype(q.dtype)
            dq_i = jnp.einsum("bkgqs,bskd->bqkgd", ds, kj, preferred_element_type=jnp.float32)
            dq = jax.lax.dynamic_update_slice_in_dim(dq, _slice(dq, i * bq, bq, 1) + dq_i, i * bq, 1)
            dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qi, preferred_element_type=jnp.float32)
            return dq, dk, dv

        zeros = jnp.zeros((B, bk, K, D), jnp.float32)
        lo = 0 if not causal else jnp.clip(j * bk - offset, 0, lp) // bq
        dq, dk, dv = jax.lax.fori_loop(lo, nq, q_step, (dq, zeros, zeros))
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(kv_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(nk))
    dk = jnp.moveaxis(dk, 0, 1).reshape(B, sp, K, D)
    dv = jnp.moveaxis(dv, 0, 1).reshape(B, sp, K, D)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def causal_forward_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, block: int = 0,
                             prefix: tuple[jax.Array, jax.Array, jax.Array] | None = None) -> jax.Array:
    """Causal self-attention (key j visible to query i when j <= i; no padding or segment mask), forward
    only (its loops have data-dependent bounds: no reverse-mode gradient). q `[B, L, N, D]`, k/v `[B, L, K, D]`.

    `prefix = (cache_k, cache_v, starts)`: the call continues a cached prefix (an extend prefill); every
    query of row b also sees cache slots j < starts[b] of `cache_k/v [B, S, K, D]` (read in blocks of
    `PREFIX_BLOCK`, only as many as the longest row needs; blocks past every row's start are not computed).

    Per kv head the query rows are (position, group) pairs, `[B*K, L*G, D]`, so each score block is one
    plain batched matmul `[B*K, block*G, block]` and softmax runs over its contiguous last axis. Query
    block i runs an online softmax over the prefix's blocks (masked by the row's start), then over its own
    key blocks before it, unmasked, then its diagonal block under the causal mask. L is padded to a multiple
    of the block (padding keys follow every real query, so the causal mask hides them; padding queries are
    dropped). A block a row sees none of adds terms that the first visible block's rescaling zeroes (every
    query sees its own key), so no row needs a guard.
    """
    B, L, N, D = q.shape
    K = k.shape[2]
    G = N // K
    block = min(block or (CPU_FORWARD_BLOCK if jax.default_backend() == "cpu" else ACCELERATOR_BLOCK),
                _round_up(L, 8))
    lp = _round_up(L, block)
    nb = lp // block
    f32 = jnp.float32

    def heads(x, length, size):  # [B, S, K, D] -> [B*K, S / size, size, D]
        x = _pad(x.astype(q.dtype), 1, length).transpose(0, 2, 1, 3)
        return x.reshape(B * K, length // size, size, D)

    qh = _pad(q, 1, lp).reshape(B, lp, K, G, D).transpose(0, 2, 1, 3, 4).reshape(B * K, nb, block * G, D)
    qh = qh * jnp.asarray(D ** -0.5, q.dtype)
    kh, vh = heads(k, lp, block), heads(v, lp, block)
    diagonal = (jnp.arange(block * G) // G)[:, None] >= jnp.arange(block)[None, :]  # [block*G, block]

    def accumulate(carry, qi, kj, vj, mask):
        m, l, acc = carry
        s = jnp.einsum("nqd,nsd->nqs", qi, kj, preferred_element_type=f32)
        if mask is not None:
            s = jnp.where(mask, s, _NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        acc = acc * corr[..., None] + jnp.einsum("nqs,nsd->nqd", p.astype(vj.dtype), vj, preferred_element_type=f32)
        return m_new, l * corr + jnp.sum(p, axis=-1), acc

    if prefix is None:
        def past(carry, qi):
            return carry
    else:
        cache_k, cache_v, starts = prefix
        pb = min(PREFIX_BLOCK, _round_up(cache_k.shape[1], 8))
        sp = _round_up(cache_k.shape[1], pb)
        pk, pv = heads(cache_k, sp, pb), heads(cache_v, sp, pb)
        row_starts = jnp.repeat(starts.astype(jnp.int32), K)[:, None, None]  # [B*K, 1, 1]
        # blocks before every row's start need no mask (a select over every score costs a fifth of the time)
        n_whole = jnp.min(starts).astype(jnp.int32) // pb
        n_prefix = (jnp.max(starts).astype(jnp.int32) + pb - 1) // pb

        def past(carry, qi):
            def masked(j, c):
                visible = (j * pb + jnp.arange(pb, dtype=jnp.int32))[None, None, :] < row_starts
                return accumulate(c, qi, pk[:, j], pv[:, j], visible)
            carry = jax.lax.fori_loop(0, n_whole, lambda j, c: accumulate(c, qi, pk[:, j], pv[:, j], None), carry)
            return jax.lax.fori_loop(n_whole, n_prefix, masked, carry)

    def q_block(_, i):
        qi = qh[:, i]
        init = (jnp.full(qi.shape[:2], _NEG, f32), jnp.zeros(qi.shape[:2], f32), jnp.zeros(qi.shape, f32))
        carry = jax.lax.fori_loop(0, i, lambda j, c: accumulate(c, qi, kh[:, j], vh[:, j], None), past(init, qi))
        _, l, acc = accumulate(carry, qi, kh[:, i], vh[:, i], diagonal)
        return None, (acc / l[..., None]).astype(q.dtype)

    _, out = jax.lax.scan(q_block, None, jnp.arange(nb))  # [nb, B*K, block*G, D]
    out = out.reshape(nb, B, K, block, G, D).transpose(1, 0, 3, 2, 4, 5).reshape(B, lp, N, D)
    return out[:, :L]


def attention_flops(batch: int, q_len: int, kv_len: int, heads: int, head_dim: int, *, causal: bool = True,
                    implementation: str = "blockwise", block_q: int = 0, block_k: int = 0) -> dict[str, int]:
    """Matmul FLOPs the kernel executes: {"forward": ..., "backward": ...} (the backward alone).

    XLA's `cost_analysis()` counts a while-loop body once, whatever its trip count, so compiled
    FLOPs miss almost all of the blockwise kernel's work (and the layer scan's); a planner adds
    this count instead. Blockwise counts the (query block, key block) pairs it visits, padding
    and causal skipping included; dense, fused and one-block blockwise count the full L x S scores.
    Forward: QK^T and PV (4 flops per score per head_dim); backward: QK^T recomputed, dV, dP,
    dQ, dK for blockwise (10), dV, dP, dQ, dK for dense (8).
    """
    check_implementation(implementation)
    per_score = 2 * batch * heads * head_dim
    bq, bk = _block(q_len, block_q), _block(kv_len, block_k)
    nq, nk = _round_up(q_len, bq) // bq, _round_up(kv_len, bk) // bk
    if implementation != "blockwise" or nq == nk == 1:  # one block runs the dense formula
        scores = q_len * kv_len
        return {"forward": 2 * per_score * scores, "backward": 4 * per_score * scores}
    offset = kv_len - q_len
    pairs = 0
    for i in range(nq):
        hi = nk if not causal else min(max((i + 1) * bq - 1 + offset, -1), nk * bk - 1) // bk + 1
        pairs += hi
    scores = pairs * bq * bk
    return {"forward": 2 * per_score * scores, "backward": 5 * per_score * scores}


# -- decode over a KV cache ---------------------------------------------------------------------------


def cached_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, cache_k: jax.Array, cache_v: jax.Array,
                     positions: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """Attention of this call's queries over the cache and this call's own keys, in one softmax.

    q, k_new, v_new `[B, L, *, D]` at `positions [B, L]` (contiguous per row, or per segment);
    cache_k/v `[B, S, K, D]`, read in place (not concatenated). Cache slot j is visible when
    j < positions[b, 0] (written by earlier calls); new token i is visible to query l when
    positions[b, i] <= positions[b, l] and, with `segment_ids [B, L]` (several continuations of
    the same cached prefix packed in a row, each a contiguous segment whose positions start at the
    cache's length), when both are of the same segment. Dense over the cache (decode queries are short); the
    masks are comparisons of positions that XLA fuses into the score select. A long call (at least
    `CACHED_BLOCKWISE_MIN` queries) holds no `[L, S]` float32 scores: a prompt continuing a cached prefix
    (an extend prefill) runs `causal_forward_attention` over the cache as its prefix (forward only; the whole
    extend of 128-512 tokens over 2-4 k cached took 1.7-2.4x less time than with the blockwise kernel on a
    2-core AVX2 CPU, `bench/extend.py`), the
    shared-prefix teacher's segmented candidates the blockwise kernel over [cache; own keys] (the same
    visibility: cache slots masked, own keys causal).
    """
    B, L, N, D = q.shape
    S, K = cache_k.shape[1], cache_k.shape[2]
    dtype = q.dtype
    if L >= CACHED_BLOCKWISE_MIN and segment_ids is None:
        return causal_forward_attention(q, k_new, v_new, prefix=(cache_k, cache_v, positions[:, 0]))
    if L >= CACHED_BLOCKWISE_MIN:
        keys = jnp.concatenate([cache_k.astype(dtype), k_new.astype(dtype)], axis=1)
        values = jnp.concatenate([cache_v.astype(dtype), v_new.astype(dtype)], axis=1)
        # causal with the queries last: query l sees keys j <= l + S, i.e. every cache slot (then
        # masked: only those before this call's first position) and its own keys up to itself
        visible = jnp.concatenate([jnp.arange(S, dtype=jnp.int32)[None, :] < positions[:, :1],
                                   jnp.ones((B, L), bool)], axis=1)
        kv_segments = jnp.concatenate([jnp.full((B, S), SHARED_SEGMENT, jnp.int32), segment_ids.astype(jnp.int32)], 1)
        return blockwise_attention(q, keys, values, causal=True, kv_mask=visible, segment_ids=segment_ids,
                                   kv_segment_ids=kv_segments)
    qg = q.reshape(B, L, K, N // K, D)
    scale = D ** -0.5
    neg = jnp.finfo(jnp.float32).min
    old = jnp.einsum("blkgd,bskd->bkgls", qg, cache_k.astype(dtype), preferred_element_type=jnp.float32) * scale
    old_mask = jnp.arange(S, dtype=jnp.int32)[None, None, :] < positions[:, :1, None]          # [B, 1, S]
    old = jnp.where(old_mask[:, None, None, :, :], old, neg)
    new = jnp.einsum("blkgd,bikd->bkgli", qg, k_new.astype(dtype), preferred_element_type=jnp.float32) * scale
    new_mask = positions[:, None, :] <= positions[:, :, None]                                  # [B, L, L]
    if segment_ids is not None:
        new_mask = new_mask & (segment_ids[:, None, :] == segment_ids[:, :, None])
    new = jnp.where(new_mask[:, None, None, :, :], new, neg)
    probs = jax.nn.softmax(jnp.concatenate([old, new], axis=-1), axis=-1).astype(dtype)
    # both parts summed in float32, rounded once (bf16 x bf16 -> f32 is also XLA:CPU's fast dot)
    out = (jnp.einsum("bkgls,bskd->blkgd", probs[..., :S], cache_v.astype(dtype), preferred_element_type=jnp.float32)
           + jnp.einsum("bkgli,bikd->blkgd", probs[..., S:], v_new.astype(dtype), preferred_element_type=jnp.float32))
    return out.astype(dtype).reshape(B, L, N, D)


# -- query blocks under remat (the simpler alternative; kept for the bench) -------------------------


def remat_query_block_attention(q, k, v, *, causal=True, kv_mask=None, segment_ids=None, kv_segment_ids=None,
                                block_q: int = 0):
    """Dense attention of one query block at a time over all keys, each block under `jax.checkpoint`.

    Memory `[B, K, G, block_q, S]` per step (linear in S) in forward and backward; no causal block
    skipping (dense FLOPs) plus one recompute. Compared with `blockwise_attention` in
    bench/attention.py.
    """
    segment_ids, kv_segment_ids = _segments(q, k, segment_ids, kv_segment_ids)
    B, L, N, D = q.shape
    S = k.shape[1]
    bq = _block(L, block_q)
    lp = _round_up(L, bq)
    qp = _pad(q, 1, lp)
    seg_q = None if segment_ids is None else _pad(segment_ids, 1, lp)

    @jax.checkpoint
    def one(qi, i, seg_i):
        s_idx = jnp.arange(S)
        q_idx = i * bq + jnp.arange(bq)
        qg = qi.reshape(B, bq, k.shape[2], N // k.shape[2], D)
        s = jnp.einsum("blkgd,bskd->bkgls", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * D ** -0.5
        vis = _visible(q_idx, s_idx, S - L, causal, kv_mask, seg_i, kv_segment_ids)[:, None, None]
        s = jnp.where(vis, s, _NEG)
        m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
        p = jnp.where(vis, jnp.exp(s - m), 0.0)
        denom = jnp.sum(p, axis=-1, keepdims=True)
        probs = (p / jnp.where(denom > 0, denom, 1.0)).astype(q.dtype)
        return jnp.einsum("bkgls,bskd->blkgd", probs, v.astype(q.dtype)).reshape(B, bq, N, D)

    def step(_, i):
        qi = _slice(qp, i * bq, bq, 1)
        seg_i = None if seg_q is None else _slice(seg_q, i * bq, bq, 1)
        return None, one(qi, i, seg_i)

    _, out = jax.lax.scan(step, None, jnp.arange(lp // bq))
    return jnp.moveaxis(out, 0, 1).reshape(B, lp, N, D)[:, :L]

