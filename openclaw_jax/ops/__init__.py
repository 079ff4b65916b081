"""Chunked vocabulary kernels over the LM head (never [tokens x vocab] float32 at once)."""

from openclaw_jax.ops.logprobs import (
    DEFAULT_CHUNK_SIZE,
    VocabStats,
    entropy,
    logprobs_at_ids,
    logsumexp,
    lse_logprobs_entropy,
    token_logprobs,
    topk_logprobs,
    vocab_stats,
)


def __getattr__(name):
    # The chunked hybrid loss lives with the losses (which import these kernels); resolve it
    # lazily so importing either package first works.
    if name == "chunked_hybrid_loss":
        from openclaw_jax.losses.hybrid import chunked_hybrid_loss

        return chunked_hybrid_loss
    raise AttributeError(f"module 'openclaw_jax.ops' has no attribute {name!r}")


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "VocabStats",
    "entropy",
    "logprobs_at_ids",
    "logsumexp",
    "lse_logprobs_entropy",
    "token_logprobs",
    "topk_logprobs",
    "vocab_stats",
    "chunked_hybrid_loss",
]
