"""The hybrid GRPO + top-K OPD loss (docs/design.md §6) and its siblings, dense and chunked.

Two entry points compute the same numbers:

* :func:`hybrid_loss` ``(logits [B,T,V], batch, cfg)`` -- the readable definition, from
  full current logits (already divided by the temperature);
* :func:`chunked_hybrid_loss` ``(hidden [B,T,H], lm_head [H,V], batch, cfg)`` -- the
  production path: logits ``hidden @ lm_head / temperature`` are formed a chunk of
  positions at a time (:mod:`openclaw_jax.ops.logprobs`), so ``[B*T, V]`` float32 never
  exists. ``hidden[b, t]`` must be the state that *predicts* ``response_ids[b, t]``.

Both first build a *gather plan* from the batch alone (hint selection, the OPD id subset),
then ask the vocabulary for the current log-probs at a few ids per position plus the
entropy, and finally combine those with the batch data in :func:`_loss_terms`. Only the
middle step differs between the paths.

What counts where (``m`` = ``response_mask``, real = ``sample_mask``, hint = any
``candidate_mask``):

* every loss term is a per-sample masked token mean ``sum_t m_t x_t / max(sum_t m_t, 1)``
  averaged over real samples (padding samples excluded, real all-masked samples count);
  ``cfg.sample_norm_tokens = N > 0`` replaces the mean by ``sum_t m_t x_t / N``;
* ``loss = w_rl * grpo_pg_loss + w_opd * opd_loss - entropy_coef * entropy_loss
  + kl_coef * kl_loss``; the entropy term only carries a gradient when ``entropy_coef != 0``;
* a sample without a hint candidate has ``opd_loss`` 0 (and still counts);
* ``stop_gradient`` sits on everything except the current log-probs: advantages, the OPD
  weights ``w_v``, diffs ``d_v``, old/teacher/reference/rollout log-probs are data.

Masked positions, padding samples and padding candidates may hold any values (even NaN):
they are replaced by zeros before use.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from openclaw_jax.losses.config import LossConfig
from openclaw_jax.losses.opd import opd_subset, take_candidate, topk_opd_token_loss
from openclaw_jax.losses.policy import (
    MetricStat,
    batch_mean,
    finalize_metrics,
    low_var_kl,
    ppo_clip_loss,
    sample_token_aggregate,
    sample_stat,
    token_stat,
)
from openclaw_jax.losses.registry import get_kind, loss_kind, register_loss
from openclaw_jax.losses.selection import overlap_counts, select_hint
from openclaw_jax.ops.logprobs import (DEFAULT_CHUNK_SIZE, dense_lse_logprobs_entropy, lse_logprobs_entropy,
                                      lse_logprobs_entropy_with_grads, vocab_stats)

@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class HybridBatch:
    """One padded training batch for the loss family (B samples, T response positions).

    Pinned fields (docs/design.md §6):
      response_ids ``[B,T]`` int: the sampled response tokens y_t.
      response_mask ``[B,T]``: 1 where the token is trained.
      old_logprobs ``[B,T]``: ``l_old(y_t)`` from the old-policy pass.
      advantages ``[B,T]``: the GRPO advantage (the turn's reward broadcast over tokens).
      student_topk_ids / student_topk_logprobs ``[B,T,K]``: S^q_t and ``l_old`` there.
      teacher_topk_ids / teacher_topk_logprobs ``[B,C,T,K]``: each candidate's own top-K.
      teacher_logprobs_at_student_ids ``[B,C,T,K]``: candidate c's log-probs at S^q_t.
      old_logprobs_at_teacher_ids ``[B,C,T,K]``: ``l_old`` at candidate c's top-K ids.
      candidate_mask ``[B,C]``: 1 for real hint candidates (sorted shortest-first).
      sample_mask ``[B]``: 1 for real samples, 0 for batch padding.
    Optional fields (None = absent):
      segment_ids ``[B,T]`` int in ``[0, T]``: per-segment ``sequence_optimal`` selection.
      rollout_logprobs ``[B,T]``: the serving engine's log-probs (metric
        ``train_rollout_logprob_abs_diff``).
      ref_logprobs ``[B,T]``: reference-policy log-probs of y_t (the low-variance KL term).
      teacher_logprobs_at_tokens ``[B,C,T]``: candidate c's log-prob of y_t (``token_combine``).
    """

    response_ids: jax.Array
    response_mask: jax.Array
    old_logprobs: jax.Array
    advantages: jax.Array
    student_topk_ids: jax.Array
    student_topk_logprobs: jax.Array
    teacher_topk_ids: jax.Array
    teacher_topk_logprobs: jax.Array
    teacher_logprobs_at_student_ids: jax.Array
    old_logprobs_at_teacher_ids: jax.Array
    candidate_mask: jax.Array
    sample_mask: jax.Array
    segment_ids: jax.Array | None = None
    rollout_logprobs: jax.Array | None = None
    ref_logprobs: jax.Array | None = None
    teacher_logprobs_at_tokens: jax.Array | None = None

    def replace(self, **changes: Any) -> "HybridBatch":
        return dataclasses.replace(self, **changes)

    def dims(self) -> tuple[int, int, int, int]:
        """Validate every field's shape and return ``(B, T, K, C)``."""
        if jnp.ndim(self.response_ids) != 2:
            raise ValueError(f"HybridBatch.response_ids must be [B,T], got shape {jnp.shape(self.response_ids)}")
        b, t = jnp.shape(self.response_ids)
        if jnp.ndim(self.student_topk_ids) != 3:
            raise ValueError(f"HybridBatch.student_topk_ids must be [B,T,K], got shape {jnp.shape(self.student_topk_ids)}")
        k = jnp.shape(self.student_topk_ids)[-1]
        c = jnp.shape(self.candidate_mask)[-1] if jnp.ndim(self.candidate_mask) == 2 else None
        if c is None:
            raise ValueError(f"HybridBatch.candidate_mask must be [B,C], got shape {jnp.shape(self.candidate_mask)}")
        expected = {
            "response_mask": (b, t),
            "old_logprobs": (b, t),
            "advantages": (b, t),
            "student_topk_ids": (b, t, k),
            "student_topk_logprobs": (b, t, k),
            "teacher_topk_ids": (b, c, t, None),
            "teacher_topk_logprobs": (b, c, t, None),
            "teacher_logprobs_at_student_ids": (b, c, t, k),
            "old_logprobs_at_teacher_ids": (b, c, t, None),
            "candidate_mask": (b, c),
            "sample_mask": (b,),
            "segment_ids": (b, t),
            "rollout_logprobs": (b, t),
            "ref_logprobs": (b, t),
            "teacher_logprobs_at_tokens": (b, c, t),
        }
        teacher_k = jnp.shape(self.teacher_topk_ids)[-1] if jnp.ndim(self.teacher_topk_ids) == 4 else None
        for name, shape in expected.items():
            value = getattr(self, name)
            if value is None:
                continue
            shape = tuple(teacher_k if s is None else s for s in shape)
            if tuple(jnp.shape(value)) != shape:
                raise ValueError(
                    f"HybridBatch.{name} has shape {tuple(jnp.shape(value))}, expected {shape} "
                    f"(B={b}, T={t}, K={k}, C={c}, teacher K={teacher_k})"
                )
        return b, t, k, c


class GatherPlan(NamedTuple):
    """Everything the loss needs from the batch before touching the vocabulary.

    ids ``[B,T,J]``: where the current log-probs are needed; column 0 is the sampled token, the
      other columns are the kind's (the OPD subset for ``hybrid``, the teacher's top-K at k* for
      ``tail_kl``). trained ``[B,T]``: trained token of a real sample. active ``[B,T]``: trained
      and the sample has a hint candidate. sample_mask ``[B]``, kstar / overlap_at_kstar ``[B,T]``.
      extra: what the kind's ``gather`` kept for its ``terms`` (e.g. the OPD subset).
    """

    ids: jax.Array
    trained: jax.Array
    active: jax.Array
    sample_mask: jax.Array
    kstar: jax.Array
    overlap_at_kstar: jax.Array
    extra: Any


def masked(x: jax.Array | None, mask: jax.Array, dtype=jnp.float32) -> jax.Array | None:
    """``x`` where ``mask``, else 0 (masked slots may hold anything, even NaN), in ``dtype``."""
    return None if x is None else jnp.where(mask, jnp.asarray(x), 0).astype(dtype)


class LossKind:
    """One loss of the family: which ids it needs and how it turns current log-probs into terms.

    Subclass it in a file of its own and decorate it with ``@loss_kind("name")`` (``registry``);
    the shared parts (hint selection, entropy / KL / diagnostics, the batch mean) stay here.
    """

    name: str = ""
    # True when the loss is a sum over positions of terms that each depend on that position's
    # current log-probs / entropy only (data-weighted: masks, token counts, advantages). The
    # chunked path then forms the gradient in its forward scan (see `_fused_chunked_loss`); a
    # kind that couples positions through the current policy (e.g. a sequence-level ratio) must
    # leave it False.
    per_position: bool = False

    def gather(self, batch: HybridBatch, cfg: LossConfig, *, tokens: jax.Array, kstar: jax.Array,
               active: jax.Array) -> tuple[jax.Array, Any]:
        """``(ids [B,T,J], extra)``: column 0 of ids must be ``tokens``; ``extra`` goes to ``terms``."""
        raise NotImplementedError

    def terms(self, cur_logprobs: jax.Array, batch: HybridBatch, cfg: LossConfig, plan: GatherPlan, *,
              old: jax.Array, rewards: jax.Array, raw_kl: jax.Array,
              stats: dict[str, MetricStat]) -> jax.Array:
        """The per-sample policy terms ``[B]`` (adds its metrics to ``stats``)."""
        raise NotImplementedError

    def dense_with_stats(self, logits, batch: HybridBatch, cfg: LossConfig, *, sample_count=None,
                         with_k_star: bool = False):
        return dense_loss_with_stats(logits, batch, cfg, kind=self.name, sample_count=sample_count,
                                     with_k_star=with_k_star)

    def chunked_with_stats(self, hidden, lm_head, batch: HybridBatch, cfg: LossConfig, *, temperature=1.0,
                           chunk_size: int = DEFAULT_CHUNK_SIZE, sample_count=None, with_k_star: bool = False):
        return chunked_loss_with_stats(hidden, lm_head, batch, cfg, kind=self.name, temperature=temperature,
                                       chunk_size=chunk_size, sample_count=sample_count, with_k_star=with_k_star)


def grpo_sample_loss(raw_kl: jax.Array, rewards: jax.Array, cfg: LossConfig, plan: GatherPlan,
                     stats: dict[str, MetricStat]) -> jax.Array:
    """Per-sample GRPO (PPO-clip on the sampled token) ``[B]``; records its loss and clip fraction."""
    pg, clipped = ppo_clip_loss(raw_kl, rewards, cfg.eps_clip, cfg.eps_clip_high, cfg.kl_clamp)
    grpo_sample = sample_token_aggregate(pg, plan.trained, cfg.sample_norm_tokens)
    stats["grpo_pg_loss"] = sample_stat(grpo_sample, plan.sample_mask)
    stats["grpo_pg_clipfrac"] = token_stat(clipped, plan.trained)
    return grpo_sample


def grpo_plus_distill(grpo_sample: jax.Array, opd_token: jax.Array, cfg: LossConfig, plan: GatherPlan,
                      stats: dict[str, MetricStat]) -> jax.Array:
    """``w_rl * GRPO + w_opd * mean_t(distillation token loss)`` per sample; records ``opd_loss``."""
    opd_sample = sample_token_aggregate(opd_token, plan.trained, cfg.sample_norm_tokens)
    stats["opd_loss"] = sample_stat(opd_sample, plan.sample_mask)
    return cfg.w_rl * grpo_sample + cfg.w_opd * opd_sample


@loss_kind("hybrid")
class HybridKind(LossKind):
    """GRPO on the sampled token + top-K OPD on the subset S_t (docs/design.md §6)."""

    per_position = True

    def gather(self, batch, cfg, *, tokens, kstar, active):
        subset = opd_subset(
            student_topk_ids=batch.student_topk_ids,
            student_topk_logprobs=batch.student_topk_logprobs,
            teacher_topk_ids=batch.teacher_topk_ids,
            teacher_topk_logprobs=batch.teacher_topk_logprobs,
            teacher_logprobs_at_student_ids=batch.teacher_logprobs_at_student_ids,
            old_logprobs_at_teacher_ids=batch.old_logprobs_at_teacher_ids,
            kstar=kstar,
            active=active,
            mode=cfg.subset_mode,
        )
        return jnp.concatenate([tokens, subset.ids], axis=-1), subset

    def terms(self, cur_logprobs, batch, cfg, plan, *, old, rewards, raw_kl, stats):
        grpo_sample = grpo_sample_loss(raw_kl, rewards, cfg, plan, stats)
        subset = plan.extra
        terms = topk_opd_token_loss(
            cur_logprobs[..., 1:], subset, adv_diff_clip=cfg.adv_diff_clip, eps_clip=cfg.eps_clip,
            eps_clip_high=cfg.eps_clip_high, kl_clamp=cfg.kl_clamp,
        )
        member = subset.member
        stats["opd_pg_clipfrac"] = token_stat(terms.clipped, member)
        stats["opd_subset_size"] = token_stat(jnp.sum(member, axis=-1), plan.active)
        stats["opd_teacher_student_logp_topk_abs_mean"] = token_stat(terms.abs_diff, member)
        return grpo_plus_distill(grpo_sample, terms.loss, cfg, plan, stats)


register_loss("combine", "hybrid", None, "hybrid GRPO + top-K OPD (w_rl, w_opd from the config)")
register_loss("rl", "hybrid", {"w_opd": 0.0}, "GRPO only", uses_hints=False)
register_loss("opd", "hybrid", {"w_rl": 0.0}, "top-K OPD only")


def make_gather_plan(batch: HybridBatch, cfg: LossConfig, kind: str = "hybrid") -> GatherPlan:
    """Hint selection and the id sets to gather, from the batch alone (no logits needed)."""
    impl = get_kind(kind)
    batch.dims()
    sample_mask = jnp.asarray(batch.sample_mask) > 0
    trained = (jnp.asarray(batch.response_mask) > 0) & sample_mask[:, None]
    has_hint = jnp.any(jnp.asarray(batch.candidate_mask) > 0, axis=1)
    active = trained & has_hint[:, None]

    overlap = overlap_counts(batch.student_topk_ids, batch.teacher_topk_ids)
    kstar = select_hint(overlap, batch.candidate_mask, batch.response_mask, cfg.hint_selection, batch.segment_ids)
    overlap_at_kstar = take_candidate(overlap, kstar)
    tokens = masked(batch.response_ids, trained, jnp.int32)[..., None]
    ids, extra = impl.gather(batch, cfg, tokens=tokens, kstar=kstar, active=active)
    return GatherPlan(ids, trained, active, sample_mask, kstar, overlap_at_kstar, extra)


def _loss_terms(
    kind: str,
    cur_logprobs: jax.Array,
    entropy: jax.Array,
    batch: HybridBatch,
    cfg: LossConfig,
    plan: GatherPlan,
    sample_count: jax.Array | float | None,
) -> tuple[jax.Array, dict[str, MetricStat]]:
    """Combine current log-probs at ``plan.ids`` (``[B,T,J]``) and entropy ``[B,T]`` into the loss."""
    trained, active, smask = plan.trained, plan.active, plan.sample_mask
    old = masked(batch.old_logprobs, trained)
    rewards = masked(batch.advantages, trained)
    cur_token = cur_logprobs[..., 0]
    raw_kl = old - cur_token

    stats: dict[str, MetricStat] = {}
    per_sample_total = jnp.zeros(smask.shape, jnp.float32)
    per_sample_total = per_sample_total + get_kind(kind).terms(cur_logprobs, batch, cfg, plan, old=old,
                                                               rewards=rewards, raw_kl=raw_kl, stats=stats)

    entropy_sample = sample_token_aggregate(entropy, trained, cfg.sample_norm_tokens)
    stats["entropy_loss"] = sample_stat(entropy_sample, smask)
    if cfg.entropy_coef != 0:
        per_sample_total = per_sample_total - cfg.entropy_coef * entropy_sample
    if cfg.kl_coef != 0 and batch.ref_logprobs is None:
        raise ValueError(
            f"loss.kl_coef={cfg.kl_coef} needs HybridBatch.ref_logprobs [B,T] (reference log-probs of the "
            "sampled tokens); pass them or set kl_coef to 0"
        )
    if batch.ref_logprobs is not None:
        kl_sample = sample_token_aggregate(low_var_kl(cur_token, masked(batch.ref_logprobs, trained)), trained,
                                           cfg.sample_norm_tokens)
        stats["kl_loss"] = sample_stat(kl_sample, smask)
        if cfg.kl_coef != 0:
            per_sample_total = per_sample_total + cfg.kl_coef * kl_sample

    stats["ppo_kl"] = token_stat(raw_kl, trained)
    if batch.rollout_logprobs is not None:
        stats["train_rollout_logprob_abs_diff"] = token_stat(
            jnp.abs(old - masked(batch.rollout_logprobs, trained)), trained
        )
    stats["sel_overlap_at_k_star"] = token_stat(plan.overlap_at_kstar, active)
    stats["sel_k_star_mean"] = token_stat(plan.kstar, active)
    stats["loss"] = sample_stat(per_sample_total, smask)
    loss = batch_mean(per_sample_total, smask, sample_count)
    return loss, stats


def dense_current_logprobs(logits: jax.Array, ids: jax.Array, *, entropy_grad: bool = True
                           ) -> tuple[jax.Array, jax.Array]:
    """Global log-softmax of ``logits [B,T,V]`` at ``ids [B,T,J]``, and the full entropy ``[B,T]``.

    One custom-VJP kernel (:func:`openclaw_jax.ops.logprobs.dense_lse_logprobs_entropy`): the same
    values as ``take_along_axis(log_softmax(logits), ids)`` and ``policy.entropy_from_logits``, without
    materialising the log-softmax (forward) or its one-hot/scatter temporaries (backward).
    ``entropy_grad=False``: the entropy is a metric (its cotangent is ignored)."""
    _, cur, entropy = dense_lse_logprobs_entropy(logits, ids, with_entropy=True, entropy_grad=entropy_grad)
    return cur, entropy


def _check_logits(logits: jax.Array, batch: HybridBatch) -> None:
    b, t, _, _ = batch.dims()
    if jnp.ndim(logits) != 3 or tuple(jnp.shape(logits)[:2]) != (b, t):
        raise ValueError(f"logits must be [B,T,V] = [{b},{t},V] to match the batch, got shape {jnp.shape(logits)}")


def _with_k_star(out: tuple[jax.Array, dict[str, MetricStat]], plan: GatherPlan, with_k_star: bool):
    """``(loss, stats)``, or ``(loss, (stats, k*))`` with the hint chosen per token ``[B,T]``."""
    loss, stats = out
    return (loss, (stats, plan.kstar)) if with_k_star else (loss, stats)


def dense_loss_with_stats(logits, batch: HybridBatch, cfg: LossConfig, *, kind: str = "hybrid",
                          sample_count=None, with_k_star: bool = False):
    """Any loss kind from full logits; metrics as ``(sum, count)`` :class:`MetricStat` (with
    ``with_k_star``: ``(loss, (stats, k* [B,T]))``)."""
    _check_logits(logits, batch)
    plan = make_gather_plan(batch, cfg, kind)
    cur, entropy = dense_current_logprobs(logits, plan.ids, entropy_grad=cfg.entropy_coef != 0)
    if cfg.entropy_coef == 0:
        entropy = jax.lax.stop_gradient(entropy)
    return _with_k_star(_loss_terms(kind, cur, entropy, batch, cfg, plan, sample_count), plan, with_k_star)


def chunked_loss_with_stats(hidden, lm_head, batch: HybridBatch, cfg: LossConfig, *, kind: str = "hybrid",
                            temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE, sample_count=None,
                            with_k_star: bool = False):
    """Any loss kind from ``hidden [B,T,H]`` and ``lm_head [H,V]``; metrics as :class:`MetricStat`
    (with ``with_k_star``: ``(loss, (stats, k* [B,T]))``, the hint the loss chose per token)."""
    b, t, _, _ = batch.dims()
    if jnp.ndim(hidden) != 3 or tuple(jnp.shape(hidden)[:2]) != (b, t):
        raise ValueError(f"hidden must be [B,T,H] = [{b},{t},H] to match the batch, got shape {jnp.shape(hidden)}")
    plan = make_gather_plan(batch, cfg, kind)
    if get_kind(kind).per_position:
        loss, cur, entropy = _fused_chunked_loss(kind, hidden, lm_head, jnp.asarray(temperature, jnp.float32),
                                                 (batch, plan, sample_count), cfg, chunk_size)
        _, stats = _loss_terms(kind, cur, entropy, batch, cfg, plan, sample_count)
        return _with_k_star((loss, stats), plan, with_k_star)
    _, cur, entropy = lse_logprobs_entropy(
        hidden, lm_head, plan.ids, temperature=temperature, chunk_size=chunk_size,
        with_entropy=True, entropy_grad=cfg.entropy_coef != 0,
    )
    if cfg.entropy_coef == 0:
        entropy = jax.lax.stop_gradient(entropy)
    return _with_k_star(_loss_terms(kind, cur, entropy, batch, cfg, plan, sample_count), plan, with_k_star)


def _zero_cotangent(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 5, 6))
def _fused_chunked_loss(kind, hidden, lm_head, temperature, data, cfg, chunk_size):
    """``(loss, current log-probs at plan.ids [B,T,J], entropy [B,T])`` for a ``per_position`` kind,
    ``data = (batch, plan, sample_count)``. Only ``loss`` carries a gradient (to ``hidden`` and
    ``lm_head``); the log-probs and entropy come back for the metrics.

    Why a custom VJP around the whole loss: the loss is a data-weighted sum of per-position terms,
    so its derivative w.r.t. one chunk's log-probs needs only that chunk's log-probs, and the
    forward scan can form the logits gradient of each chunk while it is in cache
    (:func:`openclaw_jax.ops.logprobs.lse_logprobs_entropy_with_grads`) instead of a backward scan
    recomputing every logits block; the backward just scales the stored gradients."""
    batch, plan, sample_count = data
    stats = vocab_stats(hidden, lm_head, ids=plan.ids, with_entropy=True, temperature=temperature,
                        chunk_size=chunk_size)
    cur, entropy = stats.logprobs_at_ids, stats.entropy
    return _loss_terms(kind, cur, entropy, batch, cfg, plan, sample_count)[0], cur, entropy


def _fused_fwd(kind, hidden, lm_head, temperature, data, cfg, chunk_size):
    batch, plan, sample_count = data
    b, t, j = plan.ids.shape

    def loss_of(cur, entropy):
        return _loss_terms(kind, cur, entropy, batch, cfg, plan, sample_count)[0]

    def cotangents(index, cur_chunk, ent_chunk):
        # The loss's gradient at this chunk's positions, from the full loss evaluated with this chunk's
        # values in place and zeros elsewhere: exact because each position's term depends on its own
        # values only (`per_position`). O(B T J) per chunk, small next to the chunk's [rows, V] work.
        c = cur_chunk.shape[1]
        padded = -(-t // c) * c
        start = index * c
        cur = jax.lax.dynamic_update_slice(jnp.zeros((b, padded, j), jnp.float32), cur_chunk, (0, start, 0))[:, :t]
        ent = jax.lax.dynamic_update_slice(jnp.zeros((b, padded), jnp.float32), ent_chunk, (0, start))[:, :t]
        g_cur, g_ent = jax.grad(loss_of, argnums=(0, 1))(cur, ent)
        g_cur = jnp.pad(g_cur, ((0, 0), (0, padded - t), (0, 0)))
        g_ent = jnp.pad(g_ent, ((0, 0), (0, padded - t)))
        return (jax.lax.dynamic_slice(g_cur, (0, start, 0), (b, c, j)),
                jax.lax.dynamic_slice(g_ent, (0, start), (b, c)))

    _, cur, entropy, d_hidden, d_lm_head = lse_logprobs_entropy_with_grads(
        hidden, lm_head, plan.ids, cotangents, temperature=temperature, chunk_size=chunk_size,
        entropy_grad=cfg.entropy_coef != 0)
    return (loss_of(cur, entropy), cur, entropy), (d_hidden, d_lm_head, temperature, data)


def _fused_bwd(kind, cfg, chunk_size, residuals, cotangents):
    d_hidden, d_lm_head, temperature, data = residuals
    g_loss = cotangents[0]   # the log-probs / entropy outputs are metrics: their cotangents are ignored
    return ((g_loss * d_hidden).astype(d_hidden.dtype), (g_loss * d_lm_head).astype(d_lm_head.dtype),
            jax.tree.map(_zero_cotangent, temperature), jax.tree.map(_zero_cotangent, data))


_fused_chunked_loss.defvjp(_fused_fwd, _fused_bwd)


def hybrid_loss_with_stats(logits, batch: HybridBatch, cfg: LossConfig = LossConfig(), *,
                           sample_count=None) -> tuple[jax.Array, dict[str, MetricStat]]:
    """:func:`hybrid_loss` with metrics as ``(sum, count)`` pairs for cross-batch averaging."""
    return dense_loss_with_stats(logits, batch, cfg, kind="hybrid", sample_count=sample_count)


def hybrid_loss(logits, batch: HybridBatch, cfg: LossConfig = LossConfig(), *,
                sample_count=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The hybrid GRPO + top-K OPD loss from current logits ``[B,T,V]`` (already / tau).

    Returns ``(loss, metrics)``; metrics are float32 scalars named as in
    :data:`openclaw_jax.losses.METRIC_NAMES` (plus ``kl_loss`` when ``ref_logprobs`` is
    given; ``train_rollout_logprob_abs_diff`` only when ``rollout_logprobs`` is given).
    Loss terms are sample-weighted (mean over real samples of per-sample token means); the
    diagnostics are token-weighted: ``grpo_pg_clipfrac``, ``ppo_kl`` (raw ``l_old - l_cur``)
    and ``train_rollout_logprob_abs_diff`` over trained tokens of real samples;
    ``opd_pg_clipfrac`` and ``opd_teacher_student_logp_topk_abs_mean`` over the (token, id)
    pairs of S_t; ``opd_subset_size``, ``sel_overlap_at_k_star`` and ``sel_k_star_mean`` over
    trained tokens of real samples that have a hint candidate.

    ``sample_count`` replaces the number of real samples in the denominator (use the total
    over all micro-batches of a step when accumulating gradients).
    """
    loss, stats = hybrid_loss_with_stats(logits, batch, cfg, sample_count=sample_count)
    return loss, finalize_metrics(stats)


def chunked_hybrid_loss(hidden, lm_head, batch: HybridBatch, cfg: LossConfig = LossConfig(), *,
                        temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE,
                        sample_count=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """:func:`hybrid_loss` on logits ``hidden @ lm_head / temperature``, never materialising them.

    Differentiable w.r.t. ``hidden [B,T,H]`` and ``lm_head [H,V]``; ``chunk_size`` positions
    of every sample go through the vocabulary at once (peak ~ ``B * chunk_size * V`` floats).
    """
    loss, stats = chunked_loss_with_stats(hidden, lm_head, batch, cfg, kind="hybrid", temperature=temperature,
                                          chunk_size=chunk_size, sample_count=sample_count)
    return loss, finalize_metrics(stats)
