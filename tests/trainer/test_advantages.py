"""`trainer.reward_baseline`: the GRPO advantage of conversation turns, centred over the step."""

from __future__ import annotations

import numpy as np
import pytest

from openclaw_jax.samples import Sample
from openclaw_jax.trainer.advantages import apply_reward_baseline
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import pack


def _turn(kind: str, reward: float, n: int, *, token_advantages=None) -> Sample:
    hints = ["be brief"] if kind in ("opd", "opd+rl") else []
    return Sample(session_id="s", turn_index=0, kind=kind, reward=reward, prompt_ids=[1, 2, 3],
                  response_ids=list(range(5, 5 + n)), rollout_logprobs=[-0.5] * n, hints=hints,
                  hint_prompt_ids=[[1, 2, 3, 9]] * len(hints), token_advantages=token_advantages)


@pytest.mark.parametrize("packing", [False, True])
def test_batch_mean_centres_evaluated_turns_only(packing):
    samples = [_turn("rl", 1, 3), _turn("opd+rl", -1, 5), _turn("rl", 1, 2), _turn("opd", 0, 4),
               _turn("rl", -1, 2, token_advantages=[0.3, -0.7])]   # an environment sample: its own advantages
    spec = BatchSpec(samples_per_step=6, max_candidates=1, min_seq_bucket=16, min_response_bucket=8, packing=packing)
    packed = pack(samples, spec)
    baseline = apply_reward_baseline(packed, "batch_mean")
    assert baseline == pytest.approx((1 - 1 + 1) / 3)   # the three +-1 conversation turns
    adv = packed.student["advantages"]
    expected = np.zeros_like(adv)
    for i, (value, n) in enumerate([(1 - 1 / 3, 3), (-1 - 1 / 3, 5), (1 - 1 / 3, 2), (0.0, 4)]):
        expected[i, :n] = value
    expected[4, :2] = [0.3, -0.7]
    np.testing.assert_allclose(adv, expected, rtol=0, atol=1e-6)


def test_none_keeps_the_reward_and_equal_rewards_give_no_advantage():
    spec = BatchSpec(samples_per_step=2, max_candidates=1, min_seq_bucket=16, min_response_bucket=8)
    packed = pack([_turn("rl", 1, 3), _turn("rl", 1, 2)], spec)
    assert apply_reward_baseline(packed, "none") is None
    assert packed.student["advantages"][0, :3].tolist() == [1.0, 1.0, 1.0]
    assert apply_reward_baseline(packed, "batch_mean") == 1.0
    assert not packed.student["advantages"].any()   # every turn satisfied: nothing to push up or down
    with pytest.raises(ValueError, match="batch_median"):
        apply_reward_baseline(packed, "batch_median")
