"""Mixed precision (float32 master weights, bfloat16 compute) and micro-batched phases.

- A tiny model trained with bf16 compute + f32 master weights at lr 1e-6 moves its master
  weights as the all-float32 run does; a pure-bf16 run does not move them (the update is below
  bfloat16's spacing); the export keeps float32, serving gets bfloat16.
- One step over micro-batches equals one step over the whole batch (every phase, loss,
  metrics and updated params), float32.
"""

from __future__ import annotations

import functools
import json
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.losses import LossConfig
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.parallel.mesh import make_mesh, shard_model
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import pack
from openclaw_jax.trainer.loop import Trainer

from tests.trainer.test_trainer_step import VOCAB, _samples

BASE = ["trainer.samples_per_step=4", "loss.top_k=4", "trainer.chunk_size=8", "gateway.max_candidates=3",
        "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8", "trainer.optimizer.lr=1e-6"]


def _decoder(seed: int, dtype: str, param_dtype: str) -> Decoder:
    cfg = ModelConfig(family="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=False,
                      dtype=dtype, param_dtype=param_dtype)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def _flat(state) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_value(), np.float32) for p, v in nnx.to_flat_state(state)}


def _train(dtype: str, param_dtype: str, steps: int):
    cfg = load_experiment_config([], BASE + [f"model.dtype={dtype}", f"model.param_dtype={param_dtype}"])
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    # placed on the mesh first, as `train.build_trainer` does: unplaced params would compile each phase twice
    # (once for the first step's uncommitted arrays, once for the placed arrays every later step gets)
    student, teacher = (shard_model(_decoder(seed, dtype, param_dtype), mesh) for seed in (0, 1))
    trainer = Trainer(cfg, student, teacher, mesh, samples=cfg.sample_spec())
    before = _flat(trainer.state.trainable)
    packed = pack(_samples(np.random.default_rng(0)), trainer.train_step.spec)
    for _ in range(steps):
        trainer.train_on(packed)
    return trainer, before, _flat(trainer.state.trainable)


@pytest.fixture(scope="module")
def runs():
    steps = 3
    return {name: _train(dt, pdt, steps) for name, dt, pdt in
            [("f32", "float32", "float32"), ("mixed", "bfloat16", "float32"), ("bf16", "bfloat16", "bfloat16")]}


def _deltas(run):
    _, before, after = run
    return np.concatenate([(after[k] - before[k]).ravel() for k in sorted(before)])


def test_mixed_precision_master_weights_move_like_float32(runs):
    ref, mixed, bf16 = (_deltas(runs[k]) for k in ("f32", "mixed", "bf16"))
    ref_norm = np.linalg.norm(ref)
    assert ref_norm > 0
    # The reference moves (almost) every weight by ~steps * lr (Adam's normalised steps).
    assert np.mean(np.abs(ref) > 1e-7) > 0.9
    # bf16 compute changes the gradients slightly; the master weights follow the same path.
    assert np.linalg.norm(mixed - ref) / ref_norm < 0.35
    assert np.mean(np.sign(mixed) == np.sign(ref)) > 0.85
    # Pure bf16: a 1e-6 step on a ~0.02 weight is below bfloat16's spacing; nearly nothing moves.
    assert np.mean(bf16 != 0) < 0.05
    assert np.linalg.norm(bf16 - ref) / ref_norm > 0.9
    trainer = runs["mixed"][0]
    assert {str(x.dtype) for x in jax.tree.leaves(trainer.state.trainable)} == {"float32"}
    assert {str(x.dtype) for x in jax.tree.leaves(trainer.state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)} \
        == {"float32"}
    assert {str(x.dtype) for x in jax.tree.leaves(trainer.state.teacher)} == {"bfloat16"}


def _safetensors_dtypes(path) -> set[str]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_export_keeps_master_dtype_and_serving_gets_compute_dtype(runs, tmp_path):
    from openclaw_jax.models.hub import load_pretrained
    from openclaw_jax.models.weights import save_hf_checkpoint

    trainer = runs["mixed"][0]
    served = trainer.serving_model()
    assert {str(x.dtype) for x in jax.tree.leaves(nnx.state(served))} == {"bfloat16"}
    out = save_hf_checkpoint(trainer.serving_model(trainer.cfg.trainer.export_dtype), None, tmp_path / "export")
    assert _safetensors_dtypes(out / "model.safetensors") == {"F32"}
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    # the export holds the master weights exactly
    exported = load_pretrained(out, tokenizer=False).model
    np.testing.assert_array_equal(np.asarray(exported.embed_tokens[...]),
                                  np.asarray(trainer.state.trainable["embed_tokens"].get_value()))
    bf16_out = save_hf_checkpoint(trainer.serving_model("bfloat16"), None, tmp_path / "export_bf16")
    assert _safetensors_dtypes(bf16_out / "model.safetensors") == {"BF16"}


@pytest.fixture(scope="module")
def batch():
    spec = BatchSpec(samples_per_step=4, max_candidates=3, min_seq_bucket=16, min_response_bucket=8)
    packed = pack(_samples(np.random.default_rng(1)) + _samples(np.random.default_rng(2))[:1], spec)
    inputs = S.StudentInputs(**{k: jnp.asarray(v) for k, v in packed.student.items()})
    tinputs = S.TeacherInputs(**{k: jnp.asarray(v) for k, v in packed.teacher.items()})
    return inputs, tinputs


def _one_step(micro: int, inputs, tinputs):
    settings = S.StepSettings(loss=LossConfig(), temperature=0.7, chunk_size=4,
                              micro_batch_size=micro)
    gd, trainable, frozen = nnx.split(_decoder(0, "float32", "float32"), nnx.Param, ...)
    tgd, tstate = nnx.split(_decoder(1, "float32", "float32"))
    old = jax.jit(functools.partial(S.old_pass, settings=settings))(gd, (trainable, frozen), inputs)
    teach = jax.jit(functools.partial(S.teacher_pass, settings=settings))(tgd, tstate, tinputs, inputs.response_ids,
                                                                           old.topk_ids)
    old_at = jax.jit(functools.partial(S.old_logprobs_at, settings=settings))(gd, (trainable, frozen), old.hidden,
                                                                             teach.topk_ids)
    batch = S.assemble_batch(inputs, tinputs, old, teach, old_at)
    tx, schedule = S.make_optimizer(1e-2, eps=1e-3)
    opt_state = tx.init(trainable)
    new, _, metrics, k_star = jax.jit(functools.partial(S.update_step, settings=settings, optimizer=tx,
                                                lr_schedule=schedule))(gd, trainable, frozen, opt_state, inputs, batch)
    return old, teach, metrics, _flat(new), _flat(trainable), k_star


def test_micro_batches_equal_the_whole_batch(batch):
    inputs, tinputs = batch
    assert float(inputs.sample_mask.sum()) == 4  # 4 real samples with different lengths and hint counts
    whole = _one_step(0, inputs, tinputs)
    micro = _one_step(2, inputs, tinputs)       # 2 micro-batches of 2 rows; the teacher: 6 of 2 rows
    for a, b in zip(jax.tree.leaves(whole[:2]), jax.tree.leaves(micro[:2])):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-5, atol=1e-5)
    assert set(whole[2]) == set(micro[2])
    for name in whole[2]:
        np.testing.assert_allclose(float(micro[2][name]), float(whole[2][name]), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    assert float(whole[2]["loss"]) != 0.0
    moved = 0
    for k in whole[3]:
        np.testing.assert_allclose(micro[3][k], whole[3][k], rtol=1e-5, atol=1e-6, err_msg=k)
        moved += int(np.any(whole[3][k] != whole[4][k]))
    assert moved > 0
    # k* from the micro-batched loss, joined back to the batch's row order, is the whole batch's
    np.testing.assert_array_equal(np.asarray(micro[5]), np.asarray(whole[5]))


def test_split_and_join_micro_batches_interleave_rows():
    x = jnp.arange(12).reshape(6, 2)
    parts = S.split_micro(x, 3)
    assert parts.shape == (3, 2, 2)
    np.testing.assert_array_equal(np.asarray(parts[1]), np.asarray(x)[[1, 4]])
    np.testing.assert_array_equal(np.asarray(S.join_micro(parts)), np.asarray(x))
    assert S.num_micro_batches(16, 0) == 1 and S.num_micro_batches(16, 4) == 4
    with pytest.raises(ValueError, match="must divide"):
        S.num_micro_batches(6, 4)
