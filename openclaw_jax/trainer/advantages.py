"""Baselines for the GRPO advantage of conversation turns (host-side, on a packed batch).

A conversation turn has no group of rollouts to compare with: its advantage is its reward (+1 / -1,
docs/design.md §6). Uncentred, that keeps reinforcing whatever the policy samples once most turns
satisfy the user (every sampled answer is pushed up, so the policy sharpens onto one answer form,
right or wrong), and while most turns fail it pushes every sampled token down, the good ones too.
`batch_mean` subtracts the mean reward of the step's evaluated turns (the REINFORCE baseline over
the batch): a step where every turn earned the same reward then has no GRPO gradient, and the
better-than-usual turns are the ones pushed up.

Only conversation turns that carry a reward (kinds "rl" and "opd+rl") are centred, and only they
form the mean: hint-only turns (reward 0) have no evaluation, and environment samples
(`token_advantages` set) come with their own group-normalised advantages.
"""

from __future__ import annotations

import numpy as np

from openclaw_jax.trainer.batcher import PackedBatch

BASELINES = ("none", "batch_mean")


def evaluated_turns(packed: PackedBatch) -> list[int]:
    """Rows of `packed` (sample order) that are conversation turns with a +-1 reward."""
    return [i for i, s in enumerate(packed.samples)
            if s.token_advantages is None and s.kind in ("rl", "opd+rl")]


def apply_reward_baseline(packed: PackedBatch, baseline: str) -> float | None:
    """Centre the advantages of the evaluated conversation turns in place; returns the baseline
    subtracted (None when nothing was centred)."""
    if baseline not in BASELINES:
        raise ValueError(f"reward baseline {baseline!r} is not one of {BASELINES}")
    rows = evaluated_turns(packed)
    if baseline == "none" or not rows:
        return None
    mean = float(np.mean([packed.samples[i].reward for i in rows]))
    for i in rows:  # advantages keep the [B, T] sample layout when packed (trainer/batcher.py)
        packed.student["advantages"][i, :len(packed.samples[i].response_ids)] = packed.samples[i].reward - mean
    return mean
