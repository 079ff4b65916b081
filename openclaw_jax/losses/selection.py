"""Overlap-guided hint selection (docs/design.md §6).

``O[c, t] = |S^q_t ∩ S^p_{t,c}|`` counts how many of the old policy's top-K ids at token t
are also in hint candidate c's teacher top-K; ``select_hint`` turns it into one candidate
index ``k*`` per token. Pure integer arithmetic, so results are exact and device-independent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

HINT_SELECTION_MODES: tuple[str, ...] = ("shortest", "token_optimal", "sequence_optimal")


def overlap_counts(student_ids: jax.Array, teacher_ids: jax.Array) -> jax.Array:
    """Top-K overlap ``O[b, c, t]`` between the student's and each candidate teacher's ids.

    Args:
      student_ids: ``[B, T, K]`` int, the old policy's top-K ids ``S^q_t``.
      teacher_ids: ``[B, C, T, K']`` int, candidate c's own teacher top-K ids ``S^p_{t,c}``.

    Returns:
      ``[B, C, T]`` int32: the number of student ids present among the teacher ids. Top-K
      ids are distinct within a row, so this is the size of the set intersection.
    """
    student_ids = jnp.asarray(student_ids)
    teacher_ids = jnp.asarray(teacher_ids)
    if student_ids.ndim != 3 or teacher_ids.ndim != 4:
        raise ValueError(
            f"overlap_counts expects student_ids [B,T,K] and teacher_ids [B,C,T,K], got shapes "
            f"{student_ids.shape} and {teacher_ids.shape}"
        )
    b, t, _ = student_ids.shape
    if teacher_ids.shape[0] != b or teacher_ids.shape[2] != t:
        raise ValueError(
            f"overlap_counts: teacher_ids {teacher_ids.shape} does not match student_ids {student_ids.shape} "
            "in the batch (axis 0) or token (axis 2) dimension"
        )
    # [B,1,T,K,1] == [B,C,T,1,K'] -> [B,C,T,K,K']; K is small (top-K), so this stays cheap.
    matches = student_ids[:, None, :, :, None] == teacher_ids[:, :, :, None, :]
    return jnp.sum(jnp.any(matches, axis=-1), axis=-1, dtype=jnp.int32)


def select_hint(
    overlap: jax.Array,
    candidate_mask: jax.Array,
    token_mask: jax.Array,
    mode: str,
    segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Choose the hint candidate ``k*`` for every token.

    Args:
      overlap: ``[B, C, T]`` int, from :func:`overlap_counts`.
      candidate_mask: ``[B, C]``, nonzero for real candidates (sorted shortest-first),
        zero for padding.
      token_mask: ``[B, T]``, nonzero for trained tokens (only used by ``sequence_optimal``).
      mode: ``"shortest"`` -> 0 everywhere; ``"token_optimal"`` -> per token
        ``argmax_c O[c, t]``; ``"sequence_optimal"`` -> ``argmax_c sum_t m_t O[c, t]``, one
        ``k*`` per sample, or per segment when ``segment_ids`` is given.
      segment_ids: optional ``[B, T]`` int in ``[0, T]`` (larger ids are treated as T);
        only ``sequence_optimal`` uses it. Tokens sharing a positive id form one segment and
        get one ``k*`` chosen from that segment's masked overlap; id 0 (outside any step)
        gets ``k* = 0``.

    Padding candidates never win (their score is -1 against real scores >= 0); ties go to
    the lowest index; a sample with no real candidate gets ``k* = 0`` (its OPD term is zero
    anyway).

    Returns:
      ``[B, T]`` int32.
    """
    overlap = jnp.asarray(overlap, jnp.int32)
    if overlap.ndim != 3:
        raise ValueError(f"select_hint expects overlap [B,C,T], got shape {overlap.shape}")
    b, c, t = overlap.shape
    candidate_mask = jnp.asarray(candidate_mask)
    token_mask = jnp.asarray(token_mask)
    if candidate_mask.shape != (b, c):
        raise ValueError(f"select_hint: candidate_mask has shape {candidate_mask.shape}, expected {(b, c)}")
    if token_mask.shape != (b, t):
        raise ValueError(f"select_hint: token_mask has shape {token_mask.shape}, expected {(b, t)}")
    real = candidate_mask > 0

    if mode == "shortest":
        return jnp.zeros((b, t), jnp.int32)
    if mode == "token_optimal":
        scores = jnp.where(real[:, :, None], overlap, -1)  # [B,C,T]
        return jnp.argmax(scores, axis=1).astype(jnp.int32)
    if mode != "sequence_optimal":
        raise ValueError(f"hint_selection={mode!r} is not a selection mode; use one of {HINT_SELECTION_MODES}")

    weighted = overlap * (token_mask > 0).astype(jnp.int32)[:, None, :]  # [B,C,T]
    if segment_ids is None:
        scores = jnp.where(real, jnp.sum(weighted, axis=-1), -1)  # [B,C]
        kstar = jnp.argmax(scores, axis=1).astype(jnp.int32)
        return jnp.broadcast_to(kstar[:, None], (b, t))

    segment_ids = jnp.asarray(segment_ids, jnp.int32)
    if segment_ids.shape != (b, t):
        raise ValueError(f"select_hint: segment_ids has shape {segment_ids.shape}, expected {(b, t)}")
    segment_ids = jnp.clip(segment_ids, 0, t)
    # Per-sample, per-segment overlap sums; at most T non-empty segments, so T + 1 slots
    # (slot 0 = outside any step) cover every valid labelling with static shapes.
    per_segment = jax.vmap(lambda data, seg: jax.ops.segment_sum(data, seg, num_segments=t + 1))(
        jnp.swapaxes(weighted, 1, 2), segment_ids
    )  # [B, T+1, C]
    token_scores = jnp.take_along_axis(per_segment, segment_ids[:, :, None], axis=1)  # [B,T,C]
    token_scores = jnp.where(real[:, None, :], token_scores, -1)
    kstar = jnp.argmax(token_scores, axis=-1).astype(jnp.int32)
    return jnp.where(segment_ids > 0, kstar, 0)
