"""Policy-gradient building blocks: PPO clip, low-variance KL, entropy, and aggregation.

Everything here is elementwise or a masked reduction, float32, jittable, and free of any
knowledge of the batch layout beyond "the last axis is tokens" (per-sample helpers) or
"the leading axis is samples".

Aggregation (docs/design.md §6): a per-sample value is the masked token mean
``sum_t m_t x_t / max(sum_t m_t, 1)``; the batch value is the mean of that over the *real*
samples (``sample_mask``), where a real sample whose token mask is all zero still counts.

Metrics are carried MaxText style as :class:`MetricStat` ``(sum, count)`` pairs so that
micro-batches, devices or hosts can be combined by adding sums and counts before dividing
once (:func:`merge_metric_stats`, :func:`finalize_metrics`). Two weightings are used:

* *sample-weighted* (loss terms): ``sum`` = sum over real samples of the per-sample token
  mean, ``count`` = number of real samples;
* *token-weighted* (diagnostics such as clip fractions): ``sum`` = sum over trained tokens
  of real samples, ``count`` = number of those tokens.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import jax
import jax.numpy as jnp

# The docs/design.md §6 metric names, in the order TensorBoard shows them. `grad_norm` and
# `lr` come from the trainer step, not from the loss; `train_rollout_logprob_abs_diff` only
# appears when the batch carries rollout log-probs.
METRIC_NAMES: tuple[str, ...] = (
    "loss",
    "grpo_pg_loss",
    "opd_loss",
    "grpo_pg_clipfrac",
    "opd_pg_clipfrac",
    "ppo_kl",
    "opd_subset_size",
    "sel_overlap_at_k_star",
    "sel_k_star_mean",
    "opd_teacher_student_logp_topk_abs_mean",
    "train_rollout_logprob_abs_diff",
    "entropy_loss",
    "grad_norm",
    "lr",
)
# The subset of METRIC_NAMES that the loss functions themselves produce.
TRAINER_METRIC_NAMES: tuple[str, ...] = ("grad_norm", "lr")
LOSS_METRIC_NAMES: tuple[str, ...] = tuple(n for n in METRIC_NAMES if n not in TRAINER_METRIC_NAMES)


class MetricStat(NamedTuple):
    """A metric as ``(sum, count)``; its value is ``sum / max(count, tiny)`` (0 when empty)."""

    sum: jax.Array
    count: jax.Array


def metric_value(stat: MetricStat) -> jax.Array:
    """``sum / count`` with an empty metric (count 0) reading as 0 instead of NaN."""
    count = jnp.asarray(stat.count, jnp.float32)
    return jnp.where(count > 0, jnp.asarray(stat.sum, jnp.float32) / jnp.maximum(count, 1e-30), 0.0)


def finalize_metrics(stats: Mapping[str, MetricStat]) -> dict[str, jax.Array]:
    """Turn ``{name: MetricStat}`` into ``{name: scalar float32}``."""
    return {name: metric_value(stat) for name, stat in stats.items()}


def merge_metric_stats(a: Mapping[str, MetricStat], b: Mapping[str, MetricStat]) -> dict[str, MetricStat]:
    """Add two stat dicts (e.g. two micro-batches); names present in only one are kept."""
    out = dict(a)
    for name, stat in b.items():
        out[name] = MetricStat(out[name].sum + stat.sum, out[name].count + stat.count) if name in out else stat
    return out


def ppo_clip_loss(
    ppo_kl: jax.Array,
    advantages: jax.Array,
    eps_clip: float,
    eps_clip_high: float,
    kl_clamp: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Elementwise PPO clipped surrogate.

    ``ppo_kl = logp_old - logp_cur`` (the gradient flows through ``logp_cur`` inside it);
    ``rho = exp(-clamp(ppo_kl, +-kl_clamp))`` (no clamp when ``kl_clamp`` is None);
    ``loss = max(-rho * A, -clip(rho, 1 - eps_clip, 1 + eps_clip_high) * A)``.

    Returns ``(loss, clipped)`` where ``clipped`` is 1.0 where the clipped term is strictly
    larger than the unclipped one (the token's gradient is then zero), else 0.0. Outside the
    clamp range the ratio is constant, so the gradient is zero there as well.
    """
    ppo_kl = jnp.asarray(ppo_kl, jnp.float32)
    advantages = jnp.asarray(advantages, jnp.float32)
    if kl_clamp is not None:
        ppo_kl = jnp.clip(ppo_kl, -kl_clamp, kl_clamp)
    ratio = jnp.exp(-ppo_kl)
    unclipped = -ratio * advantages
    clipped = -jnp.clip(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    loss = jnp.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).astype(jnp.float32)


def low_var_kl(cur_logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """k3 estimator of KL(cur || ref) on sampled tokens: ``exp(ref - cur) - (ref - cur) - 1``.

    Non-negative; the gradient flows through ``cur_logprobs`` (``ref_logprobs`` is data).
    """
    log_ratio = jnp.asarray(ref_logprobs, jnp.float32) - jnp.asarray(cur_logprobs, jnp.float32)
    return jnp.exp(log_ratio) - log_ratio - 1.0


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Entropy of ``softmax(logits)`` over the last axis, in float32 (``logits`` already / tau)."""
    logits = jnp.asarray(logits, jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    # p log p -> 0 where p = 0 (e.g. -inf logits of masked vocabulary entries).
    return -jnp.sum(jnp.where(logp > -jnp.inf, jnp.exp(logp) * logp, 0.0), axis=-1)


def masked_token_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-sample ``sum_t m_t x_t`` over the last axis."""
    mask = jnp.asarray(mask, jnp.float32)
    # `where`, not a product: a masked-out position may hold inf/NaN garbage.
    values = jnp.where(mask > 0, jnp.asarray(values, jnp.float32), 0.0)
    return jnp.sum(values * mask, axis=-1)


def masked_token_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-sample ``sum_t m_t x_t / max(sum_t m_t, 1)`` over the last axis."""
    count = jnp.sum(jnp.asarray(mask, jnp.float32), axis=-1)
    return masked_token_sum(values, mask) / jnp.maximum(count, 1.0)


def sample_token_aggregate(values: jax.Array, mask: jax.Array, norm_tokens: int = 0) -> jax.Array:
    """Per-sample aggregate of token values over the last axis: the masked token mean when
    ``norm_tokens`` is 0, else ``sum_t m_t x_t / norm_tokens`` (a constant, the same for every sample)."""
    if norm_tokens <= 0:
        return masked_token_mean(values, mask)
    return masked_token_sum(values, mask) / float(norm_tokens)


def sample_stat(per_sample: jax.Array, sample_mask: jax.Array) -> MetricStat:
    """Sample-weighted stat: sum over real samples of ``per_sample``, count = real samples."""
    sample_mask = jnp.asarray(sample_mask, jnp.float32)
    per_sample = jnp.where(sample_mask > 0, jnp.asarray(per_sample, jnp.float32), 0.0)
    return MetricStat(jnp.sum(per_sample * sample_mask), jnp.sum(sample_mask))


def token_stat(values: jax.Array, weights: jax.Array) -> MetricStat:
    """Token-weighted stat: ``(sum w * x, sum w)`` over every axis (weights are 0/1 masks)."""
    weights = jnp.asarray(weights, jnp.float32)
    values = jnp.broadcast_to(jnp.asarray(values, jnp.float32), weights.shape)
    values = jnp.where(weights > 0, values, 0.0)
    return MetricStat(jnp.sum(values * weights), jnp.sum(weights))


def batch_mean(per_sample: jax.Array, sample_mask: jax.Array, sample_count: jax.Array | float | None = None) -> jax.Array:
    """Mean of per-sample values over real samples.

    ``sample_count`` overrides the denominator (e.g. the number of real samples over all
    micro-batches of one optimizer step, so that summed micro-batch gradients equal the
    full-batch gradient); by default it is ``max(sum(sample_mask), 1)``.
    """
    sample_mask = jnp.asarray(sample_mask, jnp.float32)
    per_sample = jnp.where(sample_mask > 0, jnp.asarray(per_sample, jnp.float32), 0.0)
    total = jnp.sum(per_sample * sample_mask)
    if sample_count is None:
        denominator = jnp.maximum(jnp.sum(sample_mask), 1.0)
    else:
        denominator = jnp.maximum(jnp.asarray(sample_count, jnp.float32), 1.0)
    return total / denominator
