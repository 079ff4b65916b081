"""Pure, jittable sampling and log-prob functions with per-row parameters.

Every function takes a batch of float32 logits `[B, V]` and per-row arrays `[B]`, so one
compiled step serves rows with different temperatures, top-p, top-k, min-p and seeds.

Conventions (docs/design.md §8, as SGLang):
  * temperature 0 means greedy: the token is argmax(logits), and its reported log-probs
    are log_softmax(logits) (temperature 1), exactly what SGLang does for greedy rows;
  * reported log-probs are log_softmax(logits / T) over the *full* vocabulary, before any
    top-p/top-k/min-p truncation;
  * truncation follows SGLang's reference sampler: sort by probability, drop tokens whose
    preceding cumulative probability exceeds top_p, drop ranks >= top_k, then drop tokens
    below min_p * (largest kept probability); the top token is always kept.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_GREEDY_EPS = 1e-6


def effective_temperature(temperature: jax.Array) -> jax.Array:
    """Per-row temperature used for log-probs and scaling: greedy rows (T ~ 0) use 1."""
    return jnp.where(temperature < _GREEDY_EPS, 1.0, temperature).astype(jnp.float32)


def scaled_log_probs(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """log_softmax(logits / T) over the last axis, in float32. logits `[B, ..., V]`, temperature `[B]`."""
    t = effective_temperature(temperature).reshape((-1,) + (1,) * (logits.ndim - 1))
    return jax.nn.log_softmax(logits.astype(jnp.float32) / t, axis=-1)


def _sample_sorted(keys, log_probs, top_p, top_k, min_p):
    """Top-p / top-k / min-p truncation on the sorted distribution, then a categorical draw."""
    V = log_probs.shape[-1]
    order = jnp.argsort(-log_probs, axis=-1)  # stable: ties keep the lower token id first
    sorted_lp = jnp.take_along_axis(log_probs, order, axis=-1)
    sorted_p = jnp.exp(sorted_lp)
    preceding = jnp.cumsum(sorted_p, axis=-1) - sorted_p
    rank = jnp.arange(V, dtype=jnp.int32)[None, :]
    k = jnp.where(top_k > 0, top_k, V)[:, None]
    keep = (preceding <= top_p[:, None]) & (rank < k)
    keep = keep & (sorted_p >= sorted_p[:, :1] * min_p[:, None])
    keep = keep.at[:, 0].set(True)
    masked = jnp.where(keep, sorted_lp, -jnp.inf)
    choice = jax.vmap(jax.random.categorical)(keys, masked)
    return jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0]


def _sample_unsorted(keys, log_probs, min_p):
    """Plain categorical draw with an optional min-p filter (no sort needed)."""
    max_lp = jnp.max(log_probs, axis=-1, keepdims=True)
    # p >= min_p * p_max  <=>  lp >= log(min_p) + lp_max  (min_p = 0 keeps everything)
    threshold = jnp.where(min_p[:, None] > 0, jnp.log(jnp.maximum(min_p[:, None], 1e-38)) + max_lp, -jnp.inf)
    masked = jnp.where(log_probs >= threshold, log_probs, -jnp.inf)
    return jax.vmap(jax.random.categorical)(keys, masked)


def sample_tokens(logits: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array,
                  min_p: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sample one token per row.

    logits `[B, V]` float32; temperature/top_p/min_p `[B]` float32; top_k `[B]` int32 (<= 0: off);
    keys `[B, 2]` uint32 raw PRNG keys (one per row and step).
    Returns (token ids `[B]` int32, log_softmax(logits / T) `[B, V]`).
    """
    log_probs = scaled_log_probs(logits, temperature)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    is_greedy = temperature < _GREEDY_EPS
    needs_sort = jnp.any(((top_p < 1.0) | (top_k > 0)) & ~is_greedy)
    # Only the work the batch needs runs: no random draws for an all-greedy batch, no vocabulary
    # sort unless some sampled row truncates with top-p/top-k.
    branch = jnp.where(jnp.all(is_greedy), 0, jnp.where(needs_sort, 2, 1))
    sampled = jax.lax.switch(branch, [
        lambda: greedy,
        lambda: _sample_unsorted(keys, log_probs, min_p).astype(jnp.int32),
        lambda: _sample_sorted(keys, log_probs, top_p, top_k, min_p).astype(jnp.int32),
    ])
    tokens = jnp.where(is_greedy, greedy, sampled).astype(jnp.int32)
    return tokens, log_probs


def gather_logprobs(log_probs: jax.Array, ids: jax.Array) -> jax.Array:
    """log_probs `[..., V]` at ids `[..., K]` -> `[..., K]`."""
    return jnp.take_along_axis(log_probs, ids.astype(jnp.int32), axis=-1)


def top_logprobs(log_probs: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """The n best (log-prob, id) per row, best first; n is static."""
    values, ids = jax.lax.top_k(log_probs, n)
    return values, ids.astype(jnp.int32)


def step_keys(base_keys: jax.Array, steps: jax.Array) -> jax.Array:
    """Per-row key for generation step `steps[b]`: fold_in(base_keys[b], steps[b])."""
    return jax.vmap(jax.random.fold_in)(base_keys, steps.astype(jnp.uint32))
