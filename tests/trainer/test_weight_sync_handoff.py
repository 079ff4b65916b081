"""The weight-sync hand-off: the jitted step writes the serving weights itself.

`Trainer.train_on(packed, serve=True)` returns, as an extra output of the same program, the model
that `serving_model()` builds outside jit (LoRA merged, compute dtype). The trainer hands those
arrays to the background sync without copying them; the following steps donate the trainable
state, and the handed-over arrays must stay valid and unchanged.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.models.lora import LoRAConfig, add_lora
from openclaw_jax.parallel.mesh import make_mesh, shard_model
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import pack
from openclaw_jax.trainer.loop import Trainer

from tests.trainer.test_trainer_step import VOCAB, _samples

BASE = ["trainer.samples_per_step=4", "loss.top_k=4", "trainer.chunk_size=8", "gateway.max_candidates=3",
        "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8", "trainer.optimizer.lr=1e-2"]


def _decoder(seed: int, dtype: str) -> Decoder:
    cfg = ModelConfig(family="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=False,
                      dtype=dtype, param_dtype="float32")
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def _flat(state) -> dict[str, np.ndarray]:
    # copies: a NumPy view of a CPU array is an outside reference, and JAX does not donate such a buffer
    return {".".join(map(str, p)): np.array(v.get_value(), copy=True) for p, v in nnx.to_flat_state(state)}


# float32 compute: the serving copy is the updated trainable value itself, the case a donated buffer
# could alias; bfloat16 + LoRA: the cast and the merge (slow: a second set of compiles)
@pytest.mark.parametrize("dtype,lora", [("float32", False), pytest.param("bfloat16", True, marks=pytest.mark.slow)])
def test_step_emits_the_serving_weights_and_later_steps_leave_them_alone(dtype, lora):
    overrides = BASE + [f"model.dtype={dtype}", "model.param_dtype=float32"]
    student = _decoder(0, dtype)
    if lora:
        overrides += ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"]
        student = add_lora(student, LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(2))
    cfg = load_experiment_config([], overrides)
    # placed on the mesh first, as `train.build_trainer` does (unplaced params compile the step twice)
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    trainer = Trainer(cfg, shard_model(student, mesh), shard_model(_decoder(1, dtype), mesh), mesh,
                      samples=cfg.sample_spec())
    spec = BatchSpec(samples_per_step=4, max_candidates=3, min_seq_bucket=16, min_response_bucket=8)
    packed = pack(_samples(np.random.default_rng(0))[:4], spec)

    trainer.train_on(packed, serve=True)
    graphdef, state = trainer.take_serving_weights()
    ref_graphdef, ref_state = nnx.split(trainer.serving_model())  # built outside jit, as before
    assert graphdef == ref_graphdef
    got, want = _flat(state), _flat(ref_state)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32),
                                   rtol=0, atol=1e-6, err_msg=name)
    kept = got
    del ref_state, want

    # two more steps donate the trainable state (and change it): the handed-over arrays stay intact
    trainer.train_on(packed, serve=True)
    trainer.train_on(packed, serve=True)
    leaves = jax.tree.leaves(state)
    assert not any(leaf.is_deleted() for leaf in leaves)
    after = _flat(state)
    assert all(np.array_equal(after[k], kept[k]) for k in kept)
    changed = _flat(nnx.split(trainer.serving_model())[1])
    assert any(not np.array_equal(changed[k], kept[k]) for k in kept)  # the model did move on
    with pytest.raises(RuntimeError, match="no serving weights"):
        trainer.take_serving_weights(), trainer.take_serving_weights()
