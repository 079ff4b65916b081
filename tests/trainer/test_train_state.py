"""The train state is one pytree and a step is a function of it (`state, metrics = train_step(state, batch)`);
a checkpoint in the layout stored on disk restores into it. The step's numbers are checked against
independent references elsewhere (test_step_reference, test_trainer_step, test_fused_step)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from openclaw_jax.config import load_experiment_config
from openclaw_jax.parallel.mesh import make_mesh
from openclaw_jax.trainer.batcher import pack
from openclaw_jax.trainer.checkpoint import Checkpointer
from openclaw_jax.trainer.loop import Trainer
from openclaw_jax.trainer.state import TrainState, init_state, optimizer
from openclaw_jax.trainer.train_step import make_train_step

from tests.trainer.test_trainer_step import _model, _samples

OVERRIDES = ["trainer.samples_per_step=4", "loss.top_k=4", "trainer.chunk_size=4", "gateway.temperature=0.7",
             "gateway.max_candidates=3", "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8",
             "trainer.optimizer.lr=1e-2", "loss.kl_coef=0.1", "trainer.freeze=[norm]"]   # norm: a frozen part


def _values(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.array(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def cfg():
    return load_experiment_config([], OVERRIDES)


def test_the_step_maps_one_state_pytree_to_the_next(cfg):
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    opt = optimizer(cfg)
    state = init_state(cfg, _model(0), _model(1), mesh, opt[0])
    parts = {"trainable": state.trainable, "frozen": state.frozen, "teacher": state.teacher,
             "opt_state": state.opt_state, "rng": state.rng}
    assert all(jax.tree.leaves(part) for part in parts.values())   # every part is in the state
    assert len(jax.tree.leaves(state)) == 2 + sum(len(jax.tree.leaves(p)) for p in parts.values())   # + step, offset
    assert {str(x.dtype) for x in jax.tree.leaves(state.teacher)} == {"float32"}   # model.dtype here
    structure = jax.tree.structure(state)
    before = {name: _values(part) for name, part in parts.items()}

    train_step = make_train_step(cfg, cfg.sample_spec(), state, mesh, opt)
    packed = pack(_samples(np.random.default_rng(0)), train_step.spec)
    new, metrics = train_step(state, packed)   # the trained params and optimizer state are donated

    assert isinstance(new, TrainState) and jax.tree.structure(new) == structure
    assert (new.step, new.sample_offset, new.weight_version) == (1, 0, "1")
    assert np.isfinite(metrics["loss"]) and metrics["kl_loss"] > 0   # the reference came from the state's teacher
    assert metrics["sel_k_star"].shape == packed.student["response_ids"].shape
    assert metrics["time/step"] >= metrics["time/old_pass"] > 0
    for name in ("frozen", "teacher"):   # held, not changed
        for key, value in _values(getattr(new, name)).items():
            np.testing.assert_array_equal(value, before[name][key], err_msg=f"{name} {key}")
    moved = [k for k, v in _values(new.trainable).items() if not np.array_equal(v, before["trainable"][k])]
    assert moved and _values(new.opt_state).keys() == before["opt_state"].keys()

    again, _ = train_step(new, packed)   # the returned state is the next step's input as it is
    assert again.step == 2


def test_a_checkpoint_in_the_stored_layout_restores_the_state(cfg, tmp_path):
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    trained = Trainer(cfg, _model(0), _model(1), mesh, samples=cfg.sample_spec())
    trained.train_on(pack(_samples(np.random.default_rng(0)), trained.train_step.spec))
    ckpt = Checkpointer(tmp_path / "ckpt")
    # the layout every checkpoint on disk has: these arrays, and the step and offset as JSON
    ckpt.save(1, {"trainable": trained.state.trainable, "opt_state": trained.state.opt_state,
                  "rng": trained.state.rng}, {"step": 1, "sample_offset": 7, "weight_version": "1"})
    assert trained.state.checkpoint_items()[0].keys() == {"trainable", "opt_state", "rng"}

    fresh = Trainer(cfg, _model(0), _model(1), mesh, samples=cfg.sample_spec())
    assert fresh.restore(ckpt)
    assert (fresh.step, fresh.sample_offset, fresh.weight_version) == (1, 7, "1")
    for name in ("trainable", "opt_state", "rng"):
        want, got = _values(getattr(trained.state, name)), _values(getattr(fresh.state, name))
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name} {key}")
    ckpt.close()


def test_the_fused_step_is_the_same_function_of_the_state(cfg):
    """`trainer.fused_old_pass` changes how the step runs (one program), not what it computes: from the
    same state and batch, the same metrics, trained params and serving weights."""
    import dataclasses

    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    results = {}
    for fused in (False, True):
        run_cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, fused_old_pass=fused))
        opt = optimizer(run_cfg)
        state = init_state(run_cfg, _model(0), _model(1), mesh, opt[0])
        train_step = make_train_step(run_cfg, run_cfg.sample_spec(), state, mesh, opt)
        packed = pack(_samples(np.random.default_rng(3)), train_step.spec)
        new, metrics, serving = train_step.with_serving_weights(state, packed)
        results[fused] = (metrics, _values(new.trainable), _values(serving))
    (m0, p0, s0), (m1, p1, s1) = results[False], results[True]
    assert m0["grad_norm"] > 1e-6 and ("time/old_pass" in m0) and ("time/old_pass" not in m1)   # one program
    for name in ("loss", "grpo_pg_loss", "opd_loss", "kl_loss", "grad_norm", "lr"):
        assert m1[name] == pytest.approx(m0[name], rel=1e-4, abs=1e-6), name
    np.testing.assert_array_equal(m1["sel_k_star"], m0["sel_k_star"])
    for got, want in ((p1, p0), (s1, s0)):
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
