"""Chunked KL divergence between two models' next-token distributions over the whole vocabulary.

``kl_divergence(hidden_p, lm_head_p, hidden_q, lm_head_q)`` is, per position,
``sum_v p(v) (log p(v) - log q(v))`` with ``p = softmax(hidden_p @ lm_head_p / temperature)`` and
``q`` likewise: the two models read the same positions (e.g. a served and a candidate policy on the
same tokens, or a hinted teacher and a student aligned on the response). As in ``logprobs.py`` the
positions go through the LM heads ``chunk_size`` at a time (``lax.scan``), so only a
``[rows, chunk, V]`` float32 block of each distribution exists at once. Not differentiable by
design (an evaluation metric: the promotion gate's drift bound and teacher agreement).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from openclaw_jax.ops.logprobs import DEFAULT_CHUNK_SIZE, _chunked_inputs


def kl_divergence(hidden_p: jax.Array, lm_head_p: jax.Array, hidden_q: jax.Array, lm_head_q: jax.Array, *,
                  temperature: float | jax.Array = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
    """KL(p || q) per position, float32 ``[..., T]``, for ``hidden_p``, ``hidden_q`` ``[..., T, H_p|H_q]``."""
    if hidden_p.shape[:-1] != hidden_q.shape[:-1]:
        raise ValueError(f"hidden_p {hidden_p.shape} and hidden_q {hidden_q.shape} must cover the same positions")
    if lm_head_p.shape[1] != lm_head_q.shape[1]:
        raise ValueError(f"the vocabularies differ: lm_head_p {lm_head_p.shape}, lm_head_q {lm_head_q.shape}")
    _, wp, hp, _, restore = _chunked_inputs(jnp.asarray(hidden_p), jnp.asarray(lm_head_p), None, chunk_size)
    _, wq, hq, _, _ = _chunked_inputs(jnp.asarray(hidden_q), jnp.asarray(lm_head_q), None, chunk_size)
    tau = jnp.asarray(temperature, jnp.float32)

    def body(_, xs):
        block_p, block_q = xs
        lp = jax.nn.log_softmax(jnp.dot(block_p, wp, preferred_element_type=jnp.float32) / tau, axis=-1)
        lq = jax.nn.log_softmax(jnp.dot(block_q, wq, preferred_element_type=jnp.float32) / tau, axis=-1)
        return None, jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1)

    _, kl = jax.lax.scan(body, None, (jax.lax.stop_gradient(hp), jax.lax.stop_gradient(hq)))
    return restore(kl)
