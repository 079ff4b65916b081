"""On-policy distillation terms: top-K OPD, top-K tail KL, token-level combine advantages.

All functions take already-gathered log-probs (``[B, T, K]`` current student log-probs at
the subset ids, etc.), so the same code serves the dense path (gathered from full logits)
and the chunked path (gathered inside the vocab scan). The current log-probs are always the
*global* ``log_softmax`` over the whole vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from openclaw_jax.losses.policy import ppo_clip_loss

SUBSET_MODES: tuple[str, ...] = ("student", "teacher", "overlap")
# Tail-bin mass is 1 - min(sum of top-K probs, 1 - TAIL_EPS), so its log stays finite.
TAIL_EPS = 1e-7


class OpdSubset(NamedTuple):
    """The per-token id set S_t of the top-K OPD loss, laid out as K slots.

    ids: ``[B, T, K]`` int32 vocab ids whose current log-probs the loss needs (0 in unused slots).
    old_logprobs: ``[B, T, K]`` ``l_old`` at those ids (0 in unused slots).
    teacher_logprobs: ``[B, T, K]`` ``l_{T,k*}`` at those ids (0 in unused slots).
    member: ``[B, T, K]`` float32, 1 where the slot belongs to S_t *and* counts (trained token of
      a real sample that has a hint candidate), else 0.
    """

    ids: jax.Array
    old_logprobs: jax.Array
    teacher_logprobs: jax.Array
    member: jax.Array


def take_candidate(x: jax.Array, kstar: jax.Array) -> jax.Array:
    """Pick candidate ``k*[b, t]`` from ``x [B, C, T, ...]`` -> ``[B, T, ...]``."""
    index = kstar.astype(jnp.int32)[:, None, :]
    index = index.reshape(index.shape + (1,) * (x.ndim - 3))
    return jnp.take_along_axis(x, index, axis=1, mode="clip")[:, 0]


def opd_subset(
    *,
    student_topk_ids: jax.Array,
    student_topk_logprobs: jax.Array,
    teacher_topk_ids: jax.Array,
    teacher_topk_logprobs: jax.Array,
    teacher_logprobs_at_student_ids: jax.Array,
    old_logprobs_at_teacher_ids: jax.Array,
    kstar: jax.Array,
    active: jax.Array,
    mode: str,
) -> OpdSubset:
    """Build S_t for ``subset_mode``.

    ``student``: S^q_t, with the teacher (candidate k*) log-probs at those ids;
    ``teacher``: S^p_{t,k*}, with the old log-probs at those ids;
    ``overlap``: S^q_t ∩ S^p_{t,k*}, laid out in the student's slots (an empty
    intersection leaves every slot unused: the token contributes 0 but still counts).

    ``active [B, T]`` (1 = trained token of a real sample with a hint) gates every slot, and
    unused slots are zeroed so padding garbage (even NaN/inf) cannot leak into values or
    gradients.
    """
    active = active > 0
    if mode in ("student", "overlap"):
        ids = student_topk_ids
        old = student_topk_logprobs
        teacher = take_candidate(teacher_logprobs_at_student_ids, kstar)
        member = jnp.broadcast_to(active[..., None], ids.shape)
        if mode == "overlap":
            teacher_ids = take_candidate(teacher_topk_ids, kstar)  # [B,T,K']
            in_teacher = jnp.any(ids[..., :, None] == teacher_ids[..., None, :], axis=-1)
            member = member & in_teacher
    elif mode == "teacher":
        ids = take_candidate(teacher_topk_ids, kstar)
        teacher = take_candidate(teacher_topk_logprobs, kstar)
        old = take_candidate(old_logprobs_at_teacher_ids, kstar)
        member = jnp.broadcast_to(active[..., None], ids.shape)
    else:
        raise ValueError(f"subset_mode={mode!r} is not a subset mode; use one of {SUBSET_MODES}")
    return OpdSubset(
        ids=jnp.where(member, ids, 0).astype(jnp.int32),
        old_logprobs=jnp.where(member, old, 0.0).astype(jnp.float32),
        teacher_logprobs=jnp.where(member, teacher, 0.0).astype(jnp.float32),
        member=member.astype(jnp.float32),
    )


class OpdTerms(NamedTuple):
    loss: jax.Array  # [B, T]: sum over S_t of the PPO-clipped per-id loss
    clipped: jax.Array  # [B, T, K]: 1 where the clipped term won (within S_t)
    weights: jax.Array  # [B, T, K]: w_v = softmax over S_t of l_old (0 outside S_t)
    advantages: jax.Array  # [B, T, K]: A_v = d_v * w_v (detached)
    abs_diff: jax.Array  # [B, T, K]: |l_T - l_old| before clipping (0 outside S_t)


def subset_softmax(logits: jax.Array, member: jax.Array) -> jax.Array:
    """Softmax over the slots with ``member > 0`` (last axis); all-zero where none are members."""
    member = member > 0
    masked = jnp.where(member, logits, -jnp.inf)
    top = jnp.max(masked, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.exp(jnp.where(member, logits - top, -jnp.inf))
    return e / jnp.maximum(jnp.sum(e, axis=-1, keepdims=True), 1e-30)


def topk_opd_token_loss(
    cur_logprobs: jax.Array,
    subset: OpdSubset,
    *,
    adv_diff_clip: float,
    eps_clip: float,
    eps_clip_high: float,
    kl_clamp: float | None,
) -> OpdTerms:
    """Per-token top-K OPD loss (docs/design.md §6).

    Over v in S_t: ``w_v = softmax_{S_t}(l_old)``, ``d_v = clip(l_T(v) - l_old(v), +-adv_diff_clip)``
    (no clip when ``adv_diff_clip <= 0``), ``A_v = d_v * w_v`` -- all three under
    ``stop_gradient`` -- and ``L_t = sum_v PPOclip(clamp(l_old(v) - l_cur(v), +-kl_clamp), A_v)``.
    The only gradient path is ``cur_logprobs`` (global log-softmax of the current logits at
    ``subset.ids``).
    """
    member = subset.member
    old = subset.old_logprobs
    weights = jax.lax.stop_gradient(subset_softmax(old, member))
    raw_diff = subset.teacher_logprobs - old
    diff = jnp.clip(raw_diff, -adv_diff_clip, adv_diff_clip) if adv_diff_clip > 0 else raw_diff
    advantages = jax.lax.stop_gradient(diff * weights)
    per_id, clipped = ppo_clip_loss(old - cur_logprobs, advantages, eps_clip, eps_clip_high, kl_clamp)
    return OpdTerms(
        loss=jnp.sum(jnp.where(member > 0, per_id, 0.0), axis=-1),
        clipped=clipped * member,
        weights=weights,
        advantages=advantages,
        abs_diff=jnp.abs(raw_diff) * member,
    )


def tail_bin_logprob(logprobs: jax.Array) -> jax.Array:
    """``log(1 - min(sum_k exp(logprobs_k), 1 - TAIL_EPS))`` over the last axis."""
    mass = jnp.minimum(jnp.sum(jnp.exp(logprobs), axis=-1), 1.0 - TAIL_EPS)
    return jnp.log1p(-mass)


def topk_tail_kl(student_logprobs: jax.Array, teacher_logprobs: jax.Array) -> jax.Array:
    """Reverse KL over the teacher's top-K ids plus one tail bin (SDFT/SDPO style).

    Both inputs ``[..., K]`` are global log-probs at the teacher's top-K ids. The K+1 bins
    are the K ids and the rest of the vocabulary, whose log-mass is
    :func:`tail_bin_logprob`. Returns ``sum_s p_s (log p_s - log p_T)`` over the bins,
    ``[...]``; the gradient flows through ``student_logprobs`` only.
    """
    student_logprobs = jnp.asarray(student_logprobs, jnp.float32)
    teacher_logprobs = jax.lax.stop_gradient(jnp.asarray(teacher_logprobs, jnp.float32))
    student_tail = tail_bin_logprob(student_logprobs)
    teacher_tail = tail_bin_logprob(teacher_logprobs)
    head = jnp.sum(jnp.exp(student_logprobs) * (student_logprobs - teacher_logprobs), axis=-1)
    return head + jnp.exp(student_tail) * (student_tail - teacher_tail)


def token_combine_advantages(
    teacher_token_logprobs: jax.Array,
    old_token_logprobs: jax.Array,
    rewards: jax.Array,
    has_teacher: jax.Array,
    *,
    w_opd: float,
    w_rl: float,
) -> jax.Array:
    """Legacy token-level combine advantage ``w_OPD (l_T(y_t) - l_old(y_t)) + w_RL r_t`` (detached).

    ``has_teacher [B, T]`` zeroes the teacher term where there is no hint candidate.
    """
    teacher_term = jnp.where(has_teacher > 0, teacher_token_logprobs - old_token_logprobs, 0.0)
    return jax.lax.stop_gradient(w_opd * teacher_term + w_rl * rewards)
