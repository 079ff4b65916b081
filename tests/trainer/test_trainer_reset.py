"""Restarting training from the served weights (the gate's reset after refusals in a row).

After `reset_to_serving(trainer, served)` the trainer's serving model is the served model exactly
(full fine-tuning: the params; LoRA: the merged served weights become the base, the adapters start
as at init), the optimizer state is fresh, the served arrays the caller keeps are not donated by the
next step, and training goes on from there.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.models.lora import LoRAConfig, add_lora
from openclaw_jax.parallel.mesh import make_mesh, shard_model
from openclaw_jax.trainer.batcher import BatchSpec, pack
from openclaw_jax.trainer.loop import Trainer
from openclaw_jax.trainer.reset import reset_to_serving

from tests.trainer.test_trainer_step import _samples
from tests.trainer.test_weight_sync_handoff import BASE, _decoder, _flat


@pytest.mark.parametrize("lora", [False, True])
def test_reset_serves_the_served_weights_and_trains_on(lora):
    overrides = BASE + ["model.dtype=float32", "model.param_dtype=float32"]
    student = _decoder(0, "float32")
    if lora:
        overrides += ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"]
        student = add_lora(student, LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(2))
    cfg = load_experiment_config([], overrides)
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    trainer = Trainer(cfg, shard_model(student, mesh), shard_model(_decoder(1, "float32"), mesh), mesh,
                      samples=cfg.sample_spec())
    packed = pack(_samples(np.random.default_rng(0))[:4], BatchSpec(samples_per_step=4, max_candidates=3,
                                                                     min_seq_bucket=16, min_response_bucket=8))
    trainer.train_on(packed, serve=True)
    _, served = trainer.take_serving_weights()          # version 1: what the gate serves
    served_values = _flat(served)
    for _ in range(2):                                  # the trainer moves on (refused candidates)
        trainer.train_on(packed)
    assert any(not np.array_equal(v, served_values[k]) for k, v in _flat(nnx.split(trainer.serving_model())[1]).items())

    reset_to_serving(trainer, served)
    now = _flat(nnx.split(trainer.serving_model())[1])
    assert now.keys() == served_values.keys()
    for name, value in served_values.items():
        np.testing.assert_array_equal(now[name], value, err_msg=name)   # exactly the served model
    counts = [np.asarray(x) for x in jax.tree.leaves(trainer.state.opt_state) if np.asarray(x).dtype == np.int32]
    assert counts and all(int(c) == 0 for c in counts)                  # a fresh optimizer state
    if lora:
        b = [v for p, v in _flat(trainer.state.trainable).items() if p.endswith("lora_b")]
        assert b and all(not x.any() for x in b)

    trainer.train_on(packed)                            # training goes on, and donates only its own arrays
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(served))
    kept = _flat(served)
    assert all(np.array_equal(kept[k], v) for k, v in served_values.items())
    moved = _flat(nnx.split(trainer.serving_model())[1])
    assert any(not np.array_equal(moved[k], v) for k, v in served_values.items())
