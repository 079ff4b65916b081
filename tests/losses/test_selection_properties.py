"""Property tests (hypothesis) for overlap counting and hint selection.

Shapes are fixed per test so each jitted mode compiles once; hypothesis draws the values.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from openclaw_jax.losses import overlap_counts, select_hint

B, C, T, K = 3, 4, 7, 3
MODES = ("shortest", "token_optimal", "sequence_optimal")
SETTINGS = settings(max_examples=40, deadline=None)


@functools.lru_cache(maxsize=None)
def _select(mode: str, with_segments: bool):
    if with_segments:
        return jax.jit(lambda o, c, m, s: select_hint(o, c, m, mode, s))
    return jax.jit(lambda o, c, m: select_hint(o, c, m, mode))


def kstar(overlap, cand, mask, mode, segments=None):
    if segments is None:
        return np.asarray(_select(mode, False)(overlap, cand, mask))
    return np.asarray(_select(mode, True)(overlap, cand, mask, segments))


overlaps = arrays(np.int32, (B, C, T), elements=st.integers(0, K))
cand_masks = arrays(np.int32, (B, C), elements=st.integers(0, 1))
token_masks = arrays(np.int32, (B, T), elements=st.integers(0, 1))
segment_arrays = arrays(np.int32, (B, T), elements=st.integers(0, 3))
modes = st.sampled_from(MODES)


def _scores(overlap, cand, mask, mode, segments):
    """Per-token score of every candidate under ``mode`` (what k* maximises)."""
    if mode == "token_optimal":
        return overlap.astype(np.int64)
    weighted = overlap * (mask > 0)[:, None, :]
    if segments is None:
        return np.broadcast_to(weighted.sum(-1, keepdims=True), overlap.shape)
    out = np.zeros(overlap.shape, np.int64)
    for b in range(B):
        for t in range(T):
            same = segments[b] == segments[b, t]
            out[b, :, t] = weighted[b][:, same].sum(-1)
    return out


@SETTINGS
@given(overlaps, cand_masks, token_masks, modes, st.booleans(), segment_arrays)
def test_padding_never_wins_and_ties_pick_lowest(overlap, cand, mask, mode, use_segments, segments):
    segments = segments if use_segments else None
    got = kstar(overlap, cand, mask, mode, segments)
    assert got.shape == (B, T) and got.dtype == np.int32
    if mode == "shortest":
        assert not got.any()
        return
    scores = _scores(overlap, cand, mask, mode, segments)
    for b in range(B):
        real = np.flatnonzero(cand[b])
        for t in range(T):
            k = got[b, t]
            if real.size == 0 or (segments is not None and mode == "sequence_optimal" and segments[b, t] == 0):
                assert k == 0
                continue
            assert cand[b, k] == 1, "a padding candidate won"
            best = scores[b, real, t].max()
            assert scores[b, k, t] == best
            assert k == real[scores[b, real, t] == best].min(), "tie not broken to the lowest index"


@SETTINGS
@given(overlaps, cand_masks, token_masks, st.booleans(), segment_arrays)
def test_shortest_is_always_zero(overlap, cand, mask, use_segments, segments):
    got = kstar(overlap, cand, mask, "shortest", segments if use_segments else None)
    assert not got.any()


@SETTINGS
@given(overlaps, cand_masks, token_masks, modes, st.permutations(list(range(C))), st.booleans(), segment_arrays)
def test_permuting_candidates_permutes_kstar(overlap, cand, mask, mode, perm, use_segments, segments):
    """New slot j holds old candidate perm[j]; the winner must be the same candidate
    whenever it is unique (ties may legitimately resolve to another equally good one)."""
    segments = segments if use_segments else None
    perm = np.asarray(perm)
    before = kstar(overlap, cand, mask, mode, segments)
    after = kstar(overlap[:, perm], cand[:, perm], mask, mode, segments)
    if mode == "shortest":
        assert not after.any()
        return
    scores = _scores(overlap, cand, mask, mode, segments)
    for b in range(B):
        real = np.flatnonzero(cand[b])
        if real.size == 0:
            continue
        for t in range(T):
            if segments is not None and mode == "sequence_optimal" and segments[b, t] == 0:
                continue
            best = scores[b, real, t].max()
            assert scores[b, perm[after[b, t]], t] == best
            if np.sum(scores[b, real, t] == best) == 1:
                assert perm[after[b, t]] == before[b, t]


@SETTINGS
@given(st.integers(0, 2**31 - 1))
def test_overlap_counts_is_set_intersection(seed):
    rng = np.random.default_rng(seed)
    # top-K ids are distinct within a row: draw distinct ids per row
    student = np.stack([[rng.permutation(10)[:K] for _ in range(5)] for _ in range(2)]).astype(np.int32)
    teacher = np.stack([[[rng.permutation(10)[:K] for _ in range(5)] for _ in range(C)] for _ in range(2)])
    teacher = teacher.astype(np.int32)
    got = np.asarray(jax.jit(overlap_counts)(student, teacher))
    for b in range(2):
        for c in range(C):
            for t in range(5):
                assert got[b, c, t] == len(set(student[b, t]) & set(teacher[b, c, t]))


def test_select_hint_rejects_unknown_mode():
    import pytest

    with pytest.raises(ValueError, match="longest"):
        select_hint(jnp.zeros((B, C, T), jnp.int32), jnp.ones((B, C)), jnp.ones((B, T)), "longest")
