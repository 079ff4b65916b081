"""The GRPO advantages, all of them here: from a sample, the batch baseline, the off-policy correction.

A conversation turn's advantage is its reward (+1 / -1, docs/design.md §6) on every response token; an
environment sample brings its own per-token advantages (`token_advantages`, group-normalised). The
step finishes them in one order: `sample_advantages` (written by `pack`), `apply_reward_baseline`
(host, before the step), `importance_weighted` (inside the jitted step, where pi_old is known).

`batch_mean` subtracts the mean reward of the step's evaluated conversation turns (the REINFORCE
baseline over the batch). Uncentred, +-1 rewards keep reinforcing whatever the policy samples once most
turns satisfy the user, and push every sampled token down while most fail; centred, a step where every
turn earned the same reward has no GRPO gradient. Only turns that carry a reward (kinds "rl" and
"opd+rl") are centred and form the mean: hint-only turns have no evaluation, and environment samples
come with their own advantages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from openclaw_jax.samples import Sample
from openclaw_jax.trainer.batch import PackedBatch

BASELINES = ("none", "batch_mean")


def sample_advantages(sample: Sample) -> np.ndarray | float:
    """A sample's advantage per response token: its `token_advantages`, else its reward (broadcast)."""
    return float(sample.reward) if sample.token_advantages is None else np.asarray(sample.token_advantages,
                                                                                    np.float32)


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


def importance_weights(old_logprobs: Any, rollout_logprobs: Any, mask: Any, cap: float) -> Any:
    """Truncated importance weights min(pi_old / pi_rollout, cap) per token (1 where masked). Written
    against the arrays' own namespace (jax.numpy inside the jitted step, NumPy on the host), so this
    module, which the NumPy batcher imports, imports no JAX."""
    xp = old_logprobs.__array_namespace__()
    ratio = xp.exp(xp.clip(old_logprobs - rollout_logprobs, -20.0, 20.0))
    return xp.where(mask > 0, xp.minimum(ratio, cap), 1.0)


def importance_weighted(advantages: Any, old_logprobs: Any, rollout_logprobs: Any, mask: Any, cap: float) -> Any:
    """The advantages of stale samples weighted by `importance_weights` (`staleness_mode=importance`)."""
    return advantages * importance_weights(old_logprobs, rollout_logprobs, mask, cap)
