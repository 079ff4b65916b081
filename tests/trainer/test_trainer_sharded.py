"""The trainer step on 8 fake CPU devices (2x2x2 and 1x2x4 meshes) equals the 1-device step;
LoRA training touches only the adapters and serves the merged model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from tests.helpers.xla_flags import env_without_device_count

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(r'''
    import os, json, sys
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    import jax, numpy as np
    from flax import nnx
    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.parallel.mesh import make_mesh, shard_model
    from openclaw_jax.trainer.batcher import pack
    from openclaw_jax.trainer.loop import Trainer
    from tests.trainer.test_trainer_step import _model, _samples

    assert len(jax.devices()) == 8
    cfg = load_experiment_config([], ["trainer.samples_per_step=8", "loss.top_k=4", "trainer.chunk_size=4",
                                      "gateway.temperature=0.7", "trainer.optimizer.lr=1e-3",
                                      "trainer.optimizer.eps=1e-3", "gateway.max_candidates=3",
                                      "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8"])
    rng = np.random.default_rng(0)
    samples = _samples(rng) + _samples(rng)
    results = {}
    for name, shape, devices in [("one", (1, 1, 1), jax.devices()[:1]), ("2x2x2", (2, 2, 2), None),
                                 ("1x2x4", (1, 2, 4), None)]:
        mesh = make_mesh(shape, devices=devices)
        trainer = Trainer(cfg, shard_model(_model(0), mesh), shard_model(_model(1), mesh), mesh,
                          samples=cfg.sample_spec())
        packed = pack(samples, trainer.train_step.spec)
        metrics = trainer.train_on(packed)
        metrics2 = trainer.train_on(packed)   # a second step exercises the optimizer state
        leaves = jax.tree.leaves(trainer.state.trainable)
        shardings = {str(l.sharding.spec) for l in leaves}
        results[name] = {"metrics": metrics, "metrics2": metrics2,
                         "params": [np.asarray(l).tolist() for l in leaves], "shardings": sorted(shardings)}
    json.dump(results, open(sys.argv[1], "w"))
''')


def test_train_step_sharded_equals_one_device(tmp_path):
    out = tmp_path / "results.json"
    env = env_without_device_count()
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    one = results["one"]
    for name in ("2x2x2", "1x2x4"):
        other = results[name]
        assert len(other["shardings"]) > 1, f"{name}: params are not sharded: {other['shardings']}"
        for key in ("metrics", "metrics2"):
            for metric, value in one[key].items():
                if metric.startswith(("time/", "batch/")) or metric == "tokens_per_s":  # batch/: the packed layout depends on the mesh
                    continue
                assert abs(other[key][metric] - value) <= 1e-5 * max(1.0, abs(value)), (name, key, metric)
        for a, b in zip(one["params"], other["params"]):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6)


def test_lora_trains_only_adapters_and_serves_merged(tmp_path):
    import jax
    from flax import nnx

    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.models.lora import LoRAConfig, LoRAParam, add_lora
    from openclaw_jax.parallel.mesh import make_mesh, shard_model
    from openclaw_jax.trainer.batcher import pack
    from openclaw_jax.trainer.loop import Trainer
    from tests.trainer.test_trainer_step import _model, _samples

    cfg = load_experiment_config([], ["model.lora.enabled=true", "model.lora.rank=4", "trainer.samples_per_step=4",
                                      "trainer.chunk_size=4", "trainer.optimizer.lr=1e-2",
                                      "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8"])
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    base = _model(0)
    base_state = jax.tree.map(np.asarray, nnx.state(base, nnx.Param))
    student = add_lora(base, LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(3))
    trainer = Trainer(cfg, shard_model(student, mesh), shard_model(_model(1), mesh), mesh, samples=cfg.sample_spec())
    assert all(isinstance(v, LoRAParam) for v in jax.tree.leaves(
        trainer.state.trainable, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    metrics = trainer.train_on(pack(_samples(np.random.default_rng(0)), trainer.train_step.spec))
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    # the base weights did not move; the served model is the merged one and differs from the base
    model = nnx.merge(trainer.state.graphdef, trainer.state.trainable, trainer.state.frozen)
    frozen_now = nnx.state(model, nnx.Not(LoRAParam))
    for a, b in zip(jax.tree.leaves(base_state), jax.tree.leaves(frozen_now)):
        np.testing.assert_array_equal(np.asarray(b), a)
    served = trainer.serving_model()
    ids = np.array([[1, 5, 7, 9, 11]], np.int32)
    np.testing.assert_allclose(np.asarray(served(ids)), np.asarray(model(ids)), atol=1e-4)
    assert not np.allclose(np.asarray(served(ids)), np.asarray(_model(0)(ids)), atol=1e-6)
