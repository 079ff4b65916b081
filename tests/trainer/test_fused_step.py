"""`trainer.fused_old_pass`: the whole step as one program (trainer/fused_step.py) must train exactly as the
phased step does (old pass, teacher pass, l_old at the teacher's ids, reference pass, train step, each its
own program: the route test_step_reference checks against NumPy float64): same loss, metrics and updated
params, with and without a KL anchor, with the reference folded into a shared-prefix teacher pass, and for
a batch without hint candidates (no teacher pass)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

from openclaw_jax.losses import LossConfig
from openclaw_jax.trainer import fused_step as F
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batcher import pack

from tests.trainer.test_step_packing import _inputs, _models, _samples, _spec
from tests.trainer.test_trainer_step import TAU


SETTINGS = S.StepSettings(loss=LossConfig(kl_coef=0.05), temperature=TAU, chunk_size=4)


@functools.lru_cache(maxsize=None)
def _jitted(settings: S.StepSettings, lr: float = 1e-2, eps: float = 1e-3):
    """Each phase jitted once per module (a shape compiles once), with AdamW at `lr`, `eps`."""
    tx, schedule = S.make_optimizer(lr, eps=eps)
    fused = functools.partial(F.fused_train_step, settings=settings, optimizer=tx, lr_schedule=schedule)
    return tx, dict(old=jax.jit(functools.partial(S.old_pass, settings=settings)),
                    teacher=jax.jit(functools.partial(S.teacher_pass, settings=settings)),
                    old_at=jax.jit(functools.partial(S.old_logprobs_at, settings=settings)),
                    ref=jax.jit(functools.partial(S.reference_pass, settings=settings)),
                    train=jax.jit(functools.partial(S.update_step, settings=settings, optimizer=tx,
                                                    lr_schedule=schedule)),
                    fused=jax.jit(fused, static_argnums=(8, 9)))


def _params(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def updated_step(packed, settings: S.StepSettings, *, fused: bool, lr: float = 1e-2, eps: float = 1e-3):
    """One step from fresh models and optimizer state, fused (one program) or phased (each phase its own
    jitted program, as the runner runs it without fusion): (host metrics, params before, params after,
    optimizer state before, after)."""
    tx, fn = _jitted(settings, lr, eps)
    inputs, tinputs = _inputs(packed)
    (gd, trainable, frozen), (tgd, tstate) = _models()
    opt_state = tx.init(trainable)
    if fused:
        new, new_opt, metrics, _ = fn["fused"](gd, trainable, frozen, opt_state, inputs, tgd, tstate, tinputs,
                                               packed.has_teacher, "reference_offset" in packed.teacher)
        return {k: float(v) for k, v in metrics.items()}, trainable, new, opt_state, new_opt
    old = fn["old"](gd, (trainable, frozen), inputs)
    b, c = packed.teacher["candidate_mask"].shape
    t, k = old.topk_ids.shape[1:]
    if packed.has_teacher:
        teach = fn["teacher"](tgd, tstate, tinputs, inputs.response_ids, old.topk_ids)
        old_at = fn["old_at"](gd, (trainable, frozen), old.hidden, teach.topk_ids)
    else:
        teach = S.no_teacher_outputs(b, c, t, k)
        old_at = teach.logprobs_at_student_ids
    ref = None
    if settings.loss.kl_coef:
        ref = teach.reference_logprobs if "reference_offset" in packed.teacher else fn["ref"](tgd, tstate, inputs)
    batch = S.assemble_batch(inputs, tinputs, old, teach, old_at, None, ref)
    new, new_opt, metrics, _ = fn["train"](gd, trainable, frozen, opt_state, inputs, batch)
    return {k: float(v) for k, v in metrics.items()}, trainable, new, opt_state, new_opt


def _phased(packed, settings: S.StepSettings):
    metrics, _, new, _, _ = updated_step(packed, settings, fused=False)
    return metrics, _params(new)


def _fused(packed, settings: S.StepSettings):
    metrics, before, new, _, _ = updated_step(packed, settings, fused=True)
    return metrics, _params(new), _params(before)


def _check_same(packed, settings: S.StepSettings):
    want_metrics, want_params = _phased(packed, settings)
    got_metrics, got_params, before = _fused(packed, settings)
    assert want_metrics["grad_norm"] > 1e-6
    assert set(got_metrics) == set(want_metrics)
    for name, value in want_metrics.items():
        assert got_metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    moved = 0
    for name, want in want_params.items():
        np.testing.assert_allclose(got_params[name], want, rtol=1e-4, atol=1e-6, err_msg=name)
        moved += not np.allclose(want, before[name])
    assert moved > 0   # the update did something both routes agree on


def test_fused_step_equals_the_phased_step_on_packed_rows():
    packed = pack(_samples(np.random.default_rng(0)), _spec(True))
    assert packed.has_teacher and "reference_offset" not in packed.teacher
    _check_same(packed, SETTINGS)


def test_fused_step_with_the_reference_folded_into_a_shared_prefix_teacher_pass():
    spec = dataclasses.replace(_spec(True), shared_prefix_teacher=True, kl_coef=0.05)
    packed = pack(_samples(np.random.default_rng(1)), spec)
    assert "reference_offset" in packed.teacher and "prefix_len" in packed.teacher
    _check_same(packed, SETTINGS)


def test_fused_step_without_hint_candidates_runs_no_teacher_pass():
    samples = [dataclasses.replace(s, hints=[], hint_prompt_ids=[], kind="rl", reward=1.0 - 2 * (i % 3 == 0))
               for i, s in enumerate(_samples(np.random.default_rng(2)))]
    packed = pack(samples, dataclasses.replace(_spec(True), rl_only_teacher="none"))
    assert not packed.has_teacher
    _check_same(packed, SETTINGS)


def test_fused_step_refuses_micro_batches():
    settings = dataclasses.replace(SETTINGS, micro_batch_size=4)
    packed = pack(_samples(np.random.default_rng(0)), _spec(True, 4))
    with pytest.raises(ValueError, match="micro_batch_size"):
        _fused(packed, settings)
