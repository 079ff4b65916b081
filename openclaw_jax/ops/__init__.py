"""Chunked vocabulary kernels over the LM head (never [tokens x vocab] float32 at once).

A leaf under `losses/`: the chunked hybrid loss built on these kernels is `openclaw_jax.losses.chunked_hybrid_loss`.
"""

from openclaw_jax.ops.divergence import kl_divergence
from openclaw_jax.ops.logprobs import (
    DEFAULT_CHUNK_SIZE,
    VocabStats,
    dense_lse_logprobs_entropy,
    entropy,
    logprobs_at_ids,
    logsumexp,
    lse_logprobs_entropy,
    lse_logprobs_entropy_with_grads,
    token_logprobs,
    topk_logprobs,
    vocab_stats,
)


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "VocabStats",
    "dense_lse_logprobs_entropy",
    "entropy",
    "kl_divergence",
    "logprobs_at_ids",
    "logsumexp",
    "lse_logprobs_entropy",
    "lse_logprobs_entropy_with_grads",
    "token_logprobs",
    "topk_logprobs",
    "vocab_stats",
]
