"""`trainer.skip_steps_without_signal`: a step whose samples can teach nothing (every advantage 0, no hint
candidate for a distilling loss) leaves the weights and the optimizer state as they were, in the phased and
the fused step; a step with a signal updates exactly as without the setting.

Why the setting exists, checked here too: without it, such a step still applies the KL anchor's gradient,
and Adam scales every update to about the learning rate whatever the gradient's size: a KL gradient
10,000 times smaller still moves the weights a sizeable part of the learning rate (about a fifth as far
here, where Adam's epsilon starts to count)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from openclaw_jax.config import ExperimentConfig
from openclaw_jax.configlib import load_config
from openclaw_jax.losses import LossConfig
from openclaw_jax.samples import SampleSpec
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.advantages import apply_reward_baseline
from openclaw_jax.trainer.batcher import pack
from openclaw_jax.trainer.train_step import step_settings

from tests.trainer.test_fused_step import updated_step
from tests.trainer.test_step_packing import _samples, _spec
from tests.trainer.test_trainer_step import TAU

LR = 1e-3


def _settings(loss: str, skip: bool, kl_coef: float = 0.05) -> S.StepSettings:
    return S.StepSettings(loss=LossConfig(name=loss, kl_coef=kl_coef), temperature=TAU, chunk_size=4,
                          skip_without_signal=skip)


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _step(packed, settings: S.StepSettings, *, fused: bool = False):
    """One step from fresh models with the trainer's AdamW (eps 1e-8, clip at norm 1): (metrics, params
    before, params after, opt state before, opt state after) as lists of arrays."""
    metrics, *trees = updated_step(packed, settings, fused=fused, lr=LR, eps=1e-8)
    return (metrics, *map(_leaves, trees))


def _turns(rewards: list[float], *, hints: bool = False):
    """GRPO turns with these rewards, the advantages centred over the step; `hints`: the samples keep their
    hints and kinds (a hint-only "opd" sample keeps its reward 0)."""
    samples = [dataclasses.replace(s, reward=0.0 if s.kind == "opd" else r) if hints else
               dataclasses.replace(s, reward=r, hints=[], hint_prompt_ids=[], kind="rl")
               for s, r in zip(_samples(np.random.default_rng(3)), rewards)]
    spec = dataclasses.replace(_spec(True), rl_only_teacher="none", kl_coef=0.05)
    packed = pack(samples, spec)
    apply_reward_baseline(packed, "batch_mean")
    return packed


def _mean_move(before, after) -> float:
    return float(np.mean(np.concatenate([np.abs(a - b).ravel() for a, b in zip(after, before)])))


@pytest.mark.parametrize("fused", [False, True])
def test_a_step_without_signal_keeps_the_weights_and_the_optimizer_state(fused):
    packed = _turns([-1.0] * 6)   # every turn corrected: batch_mean leaves no advantage
    assert not packed.has_teacher and not packed.student["advantages"].any()
    metrics, before, after, opt_before, opt_after = _step(packed, _settings("rl", True), fused=fused)
    assert metrics["update_skipped"] == 1.0
    assert metrics["grad_norm"] > 0   # the KL anchor's gradient was there, and not applied
    for a, b in zip(after + opt_after, before + opt_before):
        np.testing.assert_array_equal(a, b)


def test_without_the_setting_adam_makes_a_tiny_kl_gradient_a_full_step():
    packed = _turns([-1.0] * 6)
    moves, norms = [], []
    for kl_coef in (0.05, 5e-6):
        metrics, before, after, _, _ = _step(packed, _settings("rl", False, kl_coef))
        assert "update_skipped" not in metrics
        moves.append(_mean_move(before, after))
        norms.append(metrics["grad_norm"])
    assert norms[1] < norms[0] * 1e-3           # the gradient shrank with the coefficient ...
    assert moves[1] > 0.1 * LR                  # ... the step far less: still a sizeable part of the learning rate
    assert moves[1] / moves[0] > 100 * norms[1] / norms[0]


@pytest.mark.parametrize("fused", [False, True])
def test_a_step_with_signal_updates_as_without_the_setting(fused):
    packed = _turns([-1.0, -1.0, 1.0, -1.0, -1.0, -1.0])   # one satisfied turn: advantages are not all 0
    got, before, after, _, opt_after = _step(packed, _settings("rl", True), fused=fused)
    want, _, want_after, _, want_opt = _step(packed, _settings("rl", False), fused=fused)
    assert got["update_skipped"] == 0.0 and _mean_move(before, after) > 0
    for a, b in zip(after + opt_after, want_after + want_opt):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_hint_candidates_are_a_signal_for_a_distilling_loss_not_for_grpo():
    packed = _turns([-1.0] * 6, hints=True)   # some samples carry hints: the teacher pass runs
    assert packed.has_teacher and not packed.student["advantages"].any()
    metrics, before, after, _, _ = _step(packed, _settings("combine", True))
    assert metrics["update_skipped"] == 0.0 and _mean_move(before, after) > 0
    metrics, before, after, _, _ = _step(packed, _settings("rl", True))
    assert metrics["update_skipped"] == 1.0 and _mean_move(before, after) == 0


def test_the_config_key_reaches_the_step_settings():
    for value, want in (("true", True), ("false", False)):
        cfg = load_config(ExperimentConfig, overrides=[f"trainer.skip_steps_without_signal={value}"])
        assert step_settings(cfg, SampleSpec()).skip_without_signal is want
    assert step_settings(load_config(ExperimentConfig), SampleSpec()).skip_without_signal is False   # the default
