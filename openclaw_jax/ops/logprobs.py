"""Chunked vocabulary kernels: log-probs, log-sum-exp, entropy and top-K from hidden states.

The LM head turns ``hidden [..., T, H]`` into logits ``hidden @ lm_head / temperature`` of
shape ``[..., T, V]``. With a 150k vocabulary, holding those logits (and their softmax and
gradient) in float32 for a whole batch costs gigabytes, so every function here walks the
position axis T in chunks of ``chunk_size`` positions (``lax.scan``), computing one
``[rows, V]`` float32 block at a time, where ``rows = prod(leading dims) * chunk_size``.
Peak live memory is O(rows x V) (plus O(H x V) for the LM-head gradient), independent of T.

Differentiable outputs (:func:`lse_logprobs_entropy` and the wrappers built on it) have a
custom VJP: the forward pass keeps only the per-position log-sum-exp and entropy; the
backward pass recomputes each logits block, forms its gradient

    d z = p * (g_lse - sum_j g_j) + scatter(ids, g) - g_H * p * (log p + H)

in float32 and immediately contracts it with ``lm_head`` / ``hidden``, so the full logits
gradient never exists either. When the caller can say, per chunk, what the cotangents are as
soon as the chunk's outputs exist (a loss that is a sum of per-position terms),
:func:`lse_logprobs_entropy_with_grads` forms that gradient in the forward scan instead,
saving the recomputation (one matmul and one exp per logit). Softmax statistics are always
float32, whatever the hidden/LM-head dtype; the matmuls run in that dtype with float32
accumulation.

Top-K (:func:`topk_logprobs`, :func:`vocab_stats`) is not differentiable (it feeds the old
policy and teacher passes, which run under ``stop_gradient``).

Ids outside ``[0, V)`` are clipped into range (so padding ids such as -1 give finite values
that the caller masks out).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

DEFAULT_CHUNK_SIZE = 128


class VocabStats(NamedTuple):
    """What one chunked pass over the vocabulary can return (fields not asked for are None).

    Shapes for ``hidden [..., T, H]``: ``logsumexp [..., T]``; ``logprobs_at_ids [..., T, J]``;
    ``topk_ids [..., T, k]`` int32 and ``topk_logprobs [..., T, k]`` (sorted descending, ties
    to the lower id); ``entropy [..., T]``. All log-probs are
    ``log_softmax(hidden @ lm_head / temperature)`` in float32.
    """

    logsumexp: jax.Array
    logprobs_at_ids: jax.Array | None
    topk_ids: jax.Array | None
    topk_logprobs: jax.Array | None
    entropy: jax.Array | None


def _check_inputs(hidden: jax.Array, lm_head: jax.Array, ids: jax.Array | None, chunk_size: int) -> None:
    if hidden.ndim < 2:
        raise ValueError(f"hidden must be [..., T, H], got shape {hidden.shape}")
    if lm_head.ndim != 2 or lm_head.shape[0] != hidden.shape[-1]:
        raise ValueError(
            f"lm_head must be [H, V] with H = hidden.shape[-1] = {hidden.shape[-1]}, got shape {lm_head.shape}"
        )
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int (positions per chunk), got {chunk_size!r}")
    if ids is not None and ids.shape[:-1] != hidden.shape[:-1]:
        raise ValueError(
            f"ids must be [..., T, J] with [..., T] = hidden.shape[:-1] = {hidden.shape[:-1]}, got shape {ids.shape}"
        )


def _to_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """``[L, T, ...] -> [n_chunks, L, chunk, ...]``, zero-padding T up to a multiple of chunk."""
    length = x.shape[1]
    n_chunks = -(-length // chunk)
    pad = n_chunks * chunk - length
    if pad:
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((x.shape[0], n_chunks, chunk) + x.shape[2:])
    return jnp.swapaxes(x, 0, 1)


def _from_chunks(x: jax.Array, length: int) -> jax.Array:
    """Inverse of :func:`_to_chunks`: ``[n_chunks, L, chunk, ...] -> [L, T, ...]``."""
    x = jnp.swapaxes(x, 0, 1)
    x = x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])
    return x[:, :length]


def _block_logits(h: jax.Array, w: jax.Array, temperature: jax.Array) -> jax.Array:
    """float32 logits of one chunk, ``[L, c, H] @ [H, V] / temperature -> [L, c, V]``."""
    return jnp.dot(h, w, preferred_element_type=jnp.float32) / temperature


def _block_stats(z: jax.Array, with_entropy: bool) -> tuple[jax.Array, jax.Array | None]:
    """Log-sum-exp and (optionally) entropy over the last axis of a float32 logits block."""
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    shifted = z - m
    e = jnp.exp(shifted)
    s = jnp.sum(e, axis=-1)
    lse = m[..., 0] + jnp.log(s)
    entropy = None
    if with_entropy:
        # H = log s - sum(e * (z - m)) / s: the shifted form avoids cancelling two large numbers.
        entropy = jnp.log(s) - jnp.sum(e * shifted, axis=-1) / s
    return lse, entropy


def _forward_scan(hc, w, idc, temperature, with_entropy: bool, top_k: int):
    """Scan the chunks; returns stacked ``(lse, logp_at_ids, entropy, topk_ids, topk_logp)``."""
    vocab = w.shape[-1]

    def body(_, xs):
        h, ids = xs
        z = _block_logits(h, w, temperature)
        lse, entropy = _block_stats(z, with_entropy)
        logp_ids = None
        if ids is not None:
            logp_ids = jnp.take_along_axis(z, jnp.clip(ids, 0, vocab - 1), axis=-1) - lse[..., None]
        top_ids = top_logp = None
        if top_k:
            top_vals, top_ids = jax.lax.top_k(z, top_k)
            top_logp = top_vals - lse[..., None]
            top_ids = top_ids.astype(jnp.int32)
        return None, (lse, logp_ids, entropy, top_ids, top_logp)

    _, out = jax.lax.scan(body, None, (hc, idc))
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _lse_logp_entropy_chunked(hc, w, idc, temperature, with_entropy: bool, entropy_grad: bool):
    lse, logp_ids, entropy, _, _ = _forward_scan(hc, w, idc, temperature, with_entropy, 0)
    return lse, logp_ids, entropy


def _lse_logp_entropy_fwd(hc, w, idc, temperature, with_entropy, entropy_grad):
    lse, logp_ids, entropy, _, _ = _forward_scan(hc, w, idc, temperature, with_entropy, 0)
    return (lse, logp_ids, entropy), (hc, w, idc, temperature, lse, entropy)


def _lse_logp_entropy_bwd(with_entropy, entropy_grad, residuals, cotangents):
    hc, w, idc, temperature, lse, entropy = residuals
    g_lse, g_ids, g_entropy = cotangents
    vocab = w.shape[-1]
    use_entropy_grad = with_entropy and entropy_grad
    compute_dtype = jnp.result_type(hc.dtype, w.dtype)

    def body(dw, xs):
        h, ids, lse_c, ent_c, g_lse_c, g_ids_c, g_ent_c = xs
        z = _block_logits(h, w, temperature)
        logp = z - lse_c[..., None]
        p = jnp.exp(logp)
        # Every output depends on z through the normaliser: d lse/dz = p, d logp_j/dz = e_j - p.
        coeff = g_lse_c
        if g_ids_c is not None:
            coeff = coeff - jnp.sum(g_ids_c, axis=-1)
        dz = p * coeff[..., None]
        if use_entropy_grad:
            # dH/dz = -p (log p + H)
            dz = dz - (g_ent_c[..., None] * p) * (logp + ent_c[..., None])
        if g_ids_c is not None:
            lead = jnp.indices(ids.shape[:-1], sparse=True)
            index = tuple(i[..., None] for i in lead) + (jnp.clip(ids, 0, vocab - 1),)
            dz = dz.at[index].add(g_ids_c)
        dz = (dz / temperature).astype(compute_dtype)
        dh = jnp.dot(dz, w.T, preferred_element_type=jnp.float32).astype(h.dtype)
        dw = dw + jnp.einsum("lch,lcv->hv", h, dz, preferred_element_type=jnp.float32)
        return dw, dh

    xs = (hc, idc, lse, entropy if use_entropy_grad else None, g_lse, g_ids,
          g_entropy if use_entropy_grad else None)
    dw, dhc = jax.lax.scan(body, jnp.zeros(w.shape, jnp.float32), xs)
    d_ids = None if idc is None else jnp.zeros(idc.shape, jax.dtypes.float0)
    return dhc, dw.astype(w.dtype), d_ids, jnp.zeros_like(temperature)


_lse_logp_entropy_chunked.defvjp(_lse_logp_entropy_fwd, _lse_logp_entropy_bwd)


def _flatten_leading(x: jax.Array, n_trailing: int) -> tuple[jax.Array, tuple[int, ...]]:
    """``[..., T, *trailing] -> [L, T, *trailing]``, returning the leading shape to restore."""
    lead = x.shape[: x.ndim - n_trailing - 1]
    flat = x.reshape((-1,) + x.shape[x.ndim - n_trailing - 1:]) if lead else x[None]
    return flat, lead


def _chunked_inputs(hidden: jax.Array, lm_head: jax.Array, ids, chunk_size: int):
    """Checked inputs cut into chunks of positions: ``(hidden, lm_head, hidden chunks, id chunks or None,
    restore)``, where ``restore`` turns a chunked per-position output back into ``[..., T, ...]``."""
    if ids is not None:
        ids = jnp.asarray(ids, jnp.int32)
    _check_inputs(hidden, lm_head, ids, chunk_size)
    length = hidden.shape[-2]
    flat_h, lead = _flatten_leading(hidden, 1)
    chunk = min(chunk_size, length)
    hc = _to_chunks(flat_h, chunk)
    idc = None if ids is None else _to_chunks(_flatten_leading(ids, 1)[0], chunk)

    def restore(x):
        if x is None:
            return None
        x = _from_chunks(x, length)
        return x.reshape(lead + x.shape[1:]) if lead else x[0]

    return hidden, lm_head, hc, idc, restore


def lse_logprobs_entropy(
    hidden: jax.Array,
    lm_head: jax.Array,
    ids: jax.Array | None = None,
    *,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """Differentiable chunked ``(logsumexp [...,T], logprobs_at_ids [...,T,J], entropy [...,T])``.

    ``logits = hidden @ lm_head / temperature``; ``logprobs_at_ids[..., t, j] =
    log_softmax(logits[..., t, :])[ids[..., t, j]]`` (the global normaliser, so gradients
    flow through the logit and the log-sum-exp); ``entropy`` is that of the full softmax.
    Gradients flow to ``hidden`` and ``lm_head`` (none to ``ids`` or ``temperature``).
    ``entropy_grad=False`` treats the entropy as a metric: its cotangent is ignored, which
    saves one elementwise pass in the backward. ``ids=None`` returns None in that slot, and so
    does ``with_entropy=False`` for the entropy.
    """
    hidden, lm_head, hc, idc, restore = _chunked_inputs(jnp.asarray(hidden), jnp.asarray(lm_head), ids, chunk_size)
    temperature = jnp.asarray(temperature, jnp.float32)
    lse, logp_ids, entropy = _lse_logp_entropy_chunked(hc, lm_head, idc, temperature, with_entropy, entropy_grad)
    return restore(lse), restore(logp_ids), restore(entropy)


def lse_logprobs_entropy_with_grads(
    hidden: jax.Array,
    lm_head: jax.Array,
    ids: jax.Array,
    cotangents,
    *,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    entropy_grad: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """:func:`lse_logprobs_entropy`'s forward and, in the same scan, the gradient of a loss whose
    derivative at a position depends on that position's outputs only (not differentiable itself).

    ``cotangents(index, logp_ids [L, c, J], entropy [L, c]) -> (g_ids [L, c, J], g_entropy [L, c] or
    None)`` gives the loss's derivative w.r.t. chunk ``index``'s outputs (positions ``index * c`` to
    ``index * c + c - 1`` of ``hidden [L, T, H]``; positions past T are padding, their values
    arbitrary). Returns ``(lse, logp_ids, entropy, d_hidden, d_lm_head)``.

    Why: the backward of :func:`lse_logprobs_entropy` has to recompute every logits block (one
    LM-head matmul and one exp per logit more than the forward); when the cotangent of a block is
    known as soon as the block's statistics are, its gradient ``dz`` is formed while the block is
    still in cache and contracted right away -- three matmuls per chunk instead of four.
    """
    hidden, lm_head, hc, idc, restore = _chunked_inputs(jnp.asarray(hidden), jnp.asarray(lm_head), ids, chunk_size)
    if hidden.ndim != 3:
        raise ValueError(f"hidden must be [L, T, H] here, got shape {hidden.shape}")
    temperature = jnp.asarray(temperature, jnp.float32)
    vocab = lm_head.shape[-1]
    compute_dtype = jnp.result_type(hc.dtype, lm_head.dtype)

    def body(dw, xs):
        index, h, idx = xs
        z = _block_logits(h, lm_head, temperature)
        m = jnp.max(z, axis=-1, keepdims=True)
        e = jnp.exp(z - m)
        s = jnp.sum(e, axis=-1)
        log_s = jnp.log(s)
        lse = m[..., 0] + log_s
        ent = log_s - jnp.sum(e * jnp.maximum(z - m, _F32_MIN), axis=-1) / s
        clipped = jnp.clip(idx, 0, vocab - 1)
        logp_ids = jnp.take_along_axis(z, clipped, axis=-1) - lse[..., None]
        g_ids, g_ent = cotangents(index, logp_ids, ent)
        g_ids = g_ids.astype(jnp.float32)
        # d lse/dz = p and d logp_j/dz = e_j - p, with p = e / s
        dz = e * (-jnp.sum(g_ids, axis=-1) / s)[..., None]
        if entropy_grad and g_ent is not None:
            # dH/dz = -p (log p + H), log p floored so a -inf logit gives 0 * finite = 0
            logp = jnp.maximum(z - lse[..., None], 0.5 * _F32_MIN)
            dz = dz - (e * (g_ent.astype(jnp.float32) / s)[..., None]) * (logp + ent[..., None])
        lead = jnp.indices(idx.shape[:-1], sparse=True)
        dz = dz.at[tuple(i[..., None] for i in lead) + (clipped,)].add(g_ids)
        dz = (dz / temperature).astype(compute_dtype)
        dh = jnp.dot(dz, lm_head.T, preferred_element_type=jnp.float32).astype(h.dtype)
        dw = dw + jnp.einsum("lch,lcv->hv", h, dz, preferred_element_type=jnp.float32)
        return dw, (lse, logp_ids, ent, dh)

    index = jnp.arange(hc.shape[0], dtype=jnp.int32)
    dw, (lse, logp_ids, ent, dhc) = jax.lax.scan(body, jnp.zeros(lm_head.shape, jnp.float32), (index, hc, idc))
    return restore(lse), restore(logp_ids), restore(ent), restore(dhc), dw.astype(lm_head.dtype)


def token_logprobs(hidden, lm_head, ids, *, temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
    """Differentiable log-prob of the given token ids: ``ids [..., T] -> [..., T]`` float32."""
    ids = jnp.asarray(ids, jnp.int32)
    _, logp, _ = lse_logprobs_entropy(hidden, lm_head, ids[..., None], temperature=temperature,
                                      chunk_size=chunk_size, with_entropy=False)
    return logp[..., 0]


def logprobs_at_ids(hidden, lm_head, ids, *, temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
    """Differentiable log-probs at given id sets: ``ids [..., T, J] -> [..., T, J]`` float32.

    For ids with extra axes (e.g. the old policy at each teacher candidate's ids,
    ``[B, C, T, K]`` against student hidden ``[B, T, H]``), move them into J first:
    ``ids.transpose(0, 2, 1, 3).reshape(B, T, C * K)``.
    """
    _, logp, _ = lse_logprobs_entropy(hidden, lm_head, ids, temperature=temperature,
                                      chunk_size=chunk_size, with_entropy=False)
    return logp


def logsumexp(hidden, lm_head, *, temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
    """Differentiable global log-sum-exp of ``hidden @ lm_head / temperature``: ``[..., T]``."""
    lse, _, _ = lse_logprobs_entropy(hidden, lm_head, None, temperature=temperature,
                                     chunk_size=chunk_size, with_entropy=False)
    return lse


def entropy(hidden, lm_head, *, temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
    """Differentiable entropy of ``softmax(hidden @ lm_head / temperature)``: ``[..., T]``."""
    _, _, ent = lse_logprobs_entropy(hidden, lm_head, None, temperature=temperature,
                                     chunk_size=chunk_size, with_entropy=True)
    return ent


def vocab_stats(
    hidden: jax.Array,
    lm_head: jax.Array,
    *,
    ids: jax.Array | None = None,
    top_k: int = 0,
    with_entropy: bool = False,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> VocabStats:
    """One no-grad chunked pass returning every statistic asked for (see :class:`VocabStats`).

    This is what the old-policy pass (``ids`` = sampled tokens ``[..., T, 1]``, ``top_k`` =
    K) and the teacher pass (``ids`` = the student's top-K ids, ``top_k`` = K) need: one LM-head
    matmul per chunk instead of one per statistic. Inputs are wrapped in ``stop_gradient``.
    """
    hidden, lm_head, hc, idc, restore = _chunked_inputs(jax.lax.stop_gradient(jnp.asarray(hidden)),
                                                        jax.lax.stop_gradient(jnp.asarray(lm_head)), ids, chunk_size)
    if not isinstance(top_k, int) or top_k < 0 or top_k > lm_head.shape[-1]:
        raise ValueError(f"top_k must be an int in [0, V={lm_head.shape[-1]}], got {top_k!r}")
    temperature = jnp.asarray(temperature, jnp.float32)
    outs = _forward_scan(hc, lm_head, idc, temperature, with_entropy, top_k)
    lse, logp_ids, ent, top_ids, top_logp = (restore(x) for x in outs)
    return VocabStats(lse, logp_ids, top_ids, top_logp, ent)


def topk_logprobs(hidden, lm_head, k: int, *, temperature=1.0,
                  chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[jax.Array, jax.Array]:
    """No-grad top-k of ``log_softmax(hidden @ lm_head / temperature)``: ``(ids int32, logp)``, each ``[..., T, k]``."""
    if not isinstance(k, int) or k <= 0:
        raise ValueError(f"topk_logprobs needs k >= 1, got {k!r}")
    stats = vocab_stats(hidden, lm_head, top_k=k, temperature=temperature, chunk_size=chunk_size)
    return stats.topk_ids, stats.topk_logprobs


# ---------------------------------------------------------------------------------------------
# Dense (full-logits) variant: the same maths as the chunked kernel above, on logits that
# already exist ([..., V] float32). jax.grad through ``log_softmax`` + ``take_along_axis`` +
# an entropy materialises several [..., V] arrays (the shifted logits, their exp, p * log p,
# a zero array to scatter the gather's cotangent into, the sum of those). This custom VJP
# reads the logits twice forward and once backward and writes one [..., V] array, the
# gradient -- an elementwise function of the logits, so when the caller donates them
# (``jax.jit(..., donate_argnums=...)``) XLA writes it into their buffer and nothing
# [..., V] is allocated at all (a fresh 256 MiB array costs ~65k page faults on CPU, as much
# time as the arithmetic):
#
#   forward   m = max of the logits at ``ids`` (a gather, no pass over V: any m <= max z
#             keeps exp(z - m) from underflowing to an all-zero sum, and the sampled / top-K
#             ids hold the maximum or come close); s = sum exp(z - m) (read z);
#             t = sum exp(z - m) (z - m) (read z, only with the entropy);
#             lse = m + log s, H = log s - t / s. Should a logit exceed m by so much that s
#             overflows (or loses the entropy's precision), the same two reductions are redone
#             from m = max z (one more read), under a lax.cond that otherwise costs nothing.
#   backward  dz = exp(z - lse) (g_lse - sum_j g_j) + scatter(ids, g)
#             [- g_H p (log p + H), p = exp(z - lse), only when the entropy's cotangent is used]
#
# Two separate reductions (each recomputing exp) rather than one over a stored exp(z - m): a
# stored exp is a [..., V] write (and, with donated logits, a second buffer); a variadic reduce
# of both sums measured slower on XLA:CPU than the two passes.
# ---------------------------------------------------------------------------------------------

_F32_MIN = float(jnp.finfo(jnp.float32).min)
# Fast-path bound on s = sum exp(z - m): below it the shift m is within ~28 of max z, so
# H = log s - t / s loses at most ~28 * float32 eps to cancellation; above it, m = max z.
_SUM_LIMIT = float(2.0 ** 40)


def _dense_sums(z: jax.Array, m: jax.Array, with_entropy: bool):
    """``(s, t or None)``: ``sum exp(z - m)`` and ``sum exp(z - m) (z - m)`` over the last axis, reading
    ``z`` once per sum and writing nothing [..., V]."""
    s = jnp.sum(jnp.exp(z - m), axis=-1)
    if not with_entropy:
        return s, None
    # The barrier keeps XLA from sharing exp(z - m) between the two reductions, which would write
    # it out; (z - m) is floored so a -inf logit gives 0 * finite = 0 rather than 0 * -inf.
    m2 = jax.lax.optimization_barrier(m)
    return s, jnp.sum(jnp.exp(z - m2) * jnp.maximum(z - m2, _F32_MIN), axis=-1)


def _dense_stats(z: jax.Array, ids: jax.Array, with_entropy: bool):
    """``(lse, logp_ids, entropy or None)`` of float32 logits ``z [..., V]`` at ``ids [..., J]``."""
    vocab = z.shape[-1]
    at_ids = jnp.take_along_axis(z, jnp.clip(ids, 0, vocab - 1), axis=-1)
    m = jnp.max(at_ids, axis=-1, keepdims=True)
    s, t = _dense_sums(z, m, with_entropy)
    fine = s < _SUM_LIMIT   # False for inf / NaN too
    if with_entropy:
        fine = fine & jnp.isfinite(t)

    def exact(_):
        m_max = jnp.max(z, axis=-1, keepdims=True)
        return (m_max,) + _dense_sums(z, m_max, with_entropy)

    m, s, t = jax.lax.cond(jnp.all(fine), lambda _: (m, s, t), exact, None)
    m = jax.lax.stop_gradient(m)[..., 0]
    log_s = jnp.log(s)
    lse = m + log_s
    ent = log_s - t / s if with_entropy else None
    return lse, at_ids - lse[..., None], ent


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dense_lse_logp_entropy(z, ids, with_entropy: bool, entropy_grad: bool):
    return _dense_stats(z, ids, with_entropy)


def _dense_fwd(z, ids, with_entropy, entropy_grad):
    lse, logp_ids, ent = _dense_stats(z, ids, with_entropy)
    return (lse, logp_ids, ent), (z, ids, lse, ent)


def _dense_bwd(with_entropy, entropy_grad, residuals, cotangents):
    z, ids, lse, ent = residuals
    g_lse, g_ids, g_ent = cotangents
    vocab = z.shape[-1]
    # Every output depends on z through the normaliser: d lse/dz = p, d logp_j/dz = e_j - p.
    logp = z - lse[..., None]
    p = jnp.exp(logp)
    dz = p * (g_lse - jnp.sum(g_ids, axis=-1))[..., None]
    if with_entropy and entropy_grad:
        # dH/dz = -p (log p + H); log p floored so a -inf logit gives 0 * finite = 0, not 0 * -inf.
        dz = dz - (g_ent[..., None] * p) * (jnp.maximum(logp, 0.5 * _F32_MIN) + ent[..., None])
    lead = jnp.indices(ids.shape[:-1], sparse=True)
    index = tuple(i[..., None] for i in lead) + (jnp.clip(ids, 0, vocab - 1),)
    dz = dz.at[index].add(g_ids.astype(dz.dtype))
    return dz.astype(z.dtype), jnp.zeros(ids.shape, jax.dtypes.float0)


_dense_lse_logp_entropy.defvjp(_dense_fwd, _dense_bwd)


def dense_lse_logprobs_entropy(
    logits: jax.Array,
    ids: jax.Array,
    *,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Differentiable ``(logsumexp [...], log_softmax(logits) at ids [..., J], entropy [...])`` from
    full float32 logits ``[..., V]`` (ids clipped into ``[0, V)``); the dense twin of
    :func:`lse_logprobs_entropy`. The only [..., V] array it writes is the gradient (none
    without differentiation), elementwise from the logits: donate them to the jitted caller and
    it is written into their buffer. ``entropy_grad=False`` ignores the entropy's cotangent."""
    logits = jnp.asarray(logits, jnp.float32)
    ids = jnp.asarray(ids, jnp.int32)
    if ids.shape[:-1] != logits.shape[:-1]:
        raise ValueError(f"ids must be [..., J] with [...] = logits.shape[:-1] = {logits.shape[:-1]}, got {ids.shape}")
    return _dense_lse_logp_entropy(logits, ids, with_entropy, entropy_grad)
