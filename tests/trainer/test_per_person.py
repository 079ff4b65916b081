"""`trainer.personalize=per_person`: each person's LoRA adapter trains on their own samples alone.

On a tiny random model with LoRA and samples of two or three people: a person's step leaves every other
person's adapter and optimizer state, the frozen base and the teacher bit-identical; it equals the shared
mode's LoRA step on that person's samples alone (an independent route: the shared trainer, one batch); a
run stopped and resumed from its checkpoint ends with the adapters of a run never stopped; the exported
adapter directory (PEFT's layout) gives, in NumPy float64, the merged model's HF weights.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from openclaw_jax.config import load_experiment_config
from openclaw_jax.configlib import ConfigError
from openclaw_jax.models.lora import LoRAConfig, add_lora
from openclaw_jax.models.lora_files import ADAPTER_CONFIG, ADAPTER_EXTRA, ADAPTER_WEIGHTS, load_adapter
from openclaw_jax.models.weights import state_dict_from_model
from openclaw_jax.parallel.mesh import make_mesh
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batcher import pack
from openclaw_jax.trainer.checkpoint import Checkpointer
from openclaw_jax.trainer.loop import Trainer
from openclaw_jax.trainer.people import PerPersonTrainer, group_by_person

from tests.trainer.test_trainer_step import _model, _samples

LORA = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"]
OVERRIDES = ["trainer.samples_per_step=4", "loss.top_k=4", "trainer.chunk_size=4", "gateway.temperature=0.7",
             "gateway.max_candidates=3", "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8",
             "trainer.optimizer.lr=1e-2", "loss.kl_coef=0.1", *LORA]


def _values(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.array(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _assert_equal(got, want, what: str) -> None:
    got, want = _values(got), _values(want)
    assert got.keys() == want.keys(), what
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{what} {key}")


def _people(person: str, seed: int, n: int = 2):
    return [dataclasses.replace(s, person=person, session_id=f"{person}-{s.session_id}")
            for s in _samples(np.random.default_rng(seed))[:n]]


ALICE, BOB, CAROL = _people("alice", 10), _people("bob@home", 11), _people("carol", 12)


def _trainer(mode: str = "per_person"):
    cfg = load_experiment_config([], OVERRIDES + [f"trainer.personalize={mode}"])
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    student = add_lora(_model(0), LoRAConfig(rank=4, alpha=8.0), rngs=nnx.Rngs(2))
    cls = PerPersonTrainer if mode == "per_person" else Trainer
    return cls(cfg, student, _model(1), mesh, samples=cfg.sample_spec())


def _train(trainer, samples):
    return trainer.train_on(pack(samples, trainer.train_step.spec))


def test_per_person_needs_lora_and_says_so():
    with pytest.raises(ConfigError, match="model.lora.enabled=true"):
        load_experiment_config([], ["trainer.personalize=per_person"])
    with pytest.raises(ConfigError, match="personalize"):
        load_experiment_config([], ["trainer.personalize=everyone"])
    assert load_experiment_config([], []).trainer.personalize == "shared"   # the default


def test_per_person_serving_is_configured_and_checked():
    """Each person's adapter is served by the JAX engine or by SGLang workers, and the adapter slots are
    validated."""
    per_person = ["trainer.personalize=per_person", "model.lora.enabled=true", "gate.enabled=false"]
    cfg = load_experiment_config([], per_person)
    assert cfg.policy.lora_slots == 4 and cfg.policy.mode == "embedded"
    external = load_experiment_config([], per_person + ["policy.mode=external", "policy.urls=[http://127.0.0.1:1]"])
    assert external.trainer.personalize == "per_person" and external.policy.mode == "external"
    with pytest.raises(ConfigError, match="policy.lora_slots=0 must be >= 1"):
        load_experiment_config([], per_person + ["policy.lora_slots=0"])
    with pytest.raises(ConfigError, match="gate.enabled=false"):
        load_experiment_config([], per_person[:2] + ["gate.enabled=true"])


def test_the_window_is_grouped_by_person_in_order():
    window = [ALICE[0], BOB[0], ALICE[1], CAROL[0]]
    assert group_by_person(window) == {"alice": [ALICE[0], ALICE[1]], "bob@home": [BOB[0]], "carol": [CAROL[0]]}


def test_one_persons_steps_leave_the_others_bit_identical():
    trainer = _trainer()
    initial, frozen, teacher = jax.tree.map(np.array, (trainer.state.trainable, trainer.state.frozen,
                                                       trainer.state.teacher))
    metrics = _train(trainer, [ALICE[0], BOB[0], ALICE[1], BOB[1]])
    assert metrics["people/stepped"] == 2 and trainer.step == 1
    assert {"people/alice/loss", "people/bob_40home/loss", "people/bob_40home/adapter_steps"} <= metrics.keys()
    bob = jax.tree.map(np.array, (trainer.adapters["bob@home"].trainable, trainer.adapters["bob@home"].opt_state))
    alice_before = _values(trainer.adapters["alice"].trainable)

    for _ in range(2):   # two more steps of alice's alone
        _train(trainer, ALICE)
    assert (trainer.adapters["alice"].steps, trainer.adapters["bob@home"].steps, trainer.step) == (3, 1, 3)
    _assert_equal(trainer.adapters["bob@home"].trainable, bob[0], "bob's adapter")
    _assert_equal(trainer.adapters["bob@home"].opt_state, bob[1], "bob's optimizer state")
    _assert_equal(trainer.state.frozen, frozen, "the frozen base")
    _assert_equal(trainer.state.teacher, teacher, "the teacher")
    _assert_equal(trainer.state.trainable, initial, "the initial adapter")
    moved = [k for k, v in _values(trainer.adapters["alice"].trainable).items() if not np.array_equal(v, alice_before[k])]
    assert moved   # alice's did train
    # the initial adapter is the base model exactly (B = 0): what a per-person run serves
    assert all(not v.any() for k, v in _values(initial).items() if "lora_b" in k)


def test_a_persons_step_is_the_shared_lora_step_on_their_samples_alone():
    per_person = _trainer()
    metrics = _train(per_person, [ALICE[0], BOB[0], ALICE[1], BOB[1]])
    for person, tag, own in (("alice", "alice", ALICE), ("bob@home", "bob_40home", BOB)):
        shared = _trainer("shared")
        initial = _values(shared.state.trainable)
        want = _train(shared, own)   # the shared mode's step, from the same initial adapter, on their samples only
        assert metrics[f"people/{tag}/loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6)
        assert metrics[f"people/{tag}/grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4) and want["grad_norm"] > 0
        got, expected = _values(per_person.adapters[person].trainable), _values(shared.state.trainable)
        assert got.keys() == expected.keys()
        assert any(not np.array_equal(expected[k], initial[k]) for k in expected)
        for key in expected:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-7, err_msg=f"{person} {key}")
    n = {"alice": 2, "bob@home": 2}
    assert metrics["samples/per_step"] == sum(n.values())


def test_resume_from_a_checkpoint_continues_as_if_never_stopped(tmp_path):
    windows = [[ALICE[0], BOB[0], ALICE[1], BOB[1]], ALICE, [BOB[0], CAROL[0], CAROL[1], BOB[1]]]
    straight = _trainer()
    for window in windows:
        _train(straight, window)

    stopped = _trainer()
    for window in windows[:2]:
        _train(stopped, window)
    stopped.state = stopped.state.replace(sample_offset=6)
    ckpt = Checkpointer(tmp_path / "ckpt")
    stopped.save_checkpoint(ckpt)
    meta = ckpt.metadata()
    assert meta["people"] == ["alice", "bob@home"] and meta["adapter_steps"] == {"alice": 2, "bob@home": 1}

    resumed = _trainer()
    assert resumed.restore(ckpt)
    assert (resumed.step, resumed.sample_offset) == (2, 6)
    with pytest.raises(ValueError, match="trainer.personalize=per_person"):   # nor as one shared model
        _trainer("shared").restore(ckpt)
    _train(resumed, windows[2])   # carol's first adapter after the resume
    assert resumed.adapters.keys() == straight.adapters.keys() == {"alice", "bob@home", "carol"}
    for person, own in straight.adapters.items():
        assert resumed.adapters[person].steps == own.steps
        _assert_equal(resumed.adapters[person].trainable, own.trainable, f"{person}'s adapter")
        _assert_equal(resumed.adapters[person].opt_state, own.opt_state, f"{person}'s optimizer state")
    ckpt.close()

    shared = _trainer("shared")   # a shared run's checkpoint does not resume as per-person
    _train(shared, ALICE)
    other = Checkpointer(tmp_path / "shared")
    shared.save_checkpoint(other)
    with pytest.raises(ValueError, match="trainer.personalize=shared"):
        _trainer().restore(other)
    other.close()


def test_the_exported_adapter_is_the_merged_models_delta(tmp_path):
    trainer = _trainer()
    _train(trainer, [ALICE[0], BOB[0], ALICE[1], BOB[1]])
    out = trainer.export_adapters(tmp_path / "adapters", base_model="base-dir")
    assert sorted(p.name for p in out.iterdir()) == ["alice", "bob@home"]

    state = trainer.state
    base = state_dict_from_model(S.serving_model(state.graphdef, state.trainable, state.frozen, merge_lora=True,
                                                 dtype=None))
    for person in ("alice", "bob@home"):
        directory = out / person
        config = json.loads((directory / ADAPTER_CONFIG).read_text())
        assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
        assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj"]
        assert config["base_model_name_or_path"] == "base-dir" and "openclaw" not in config   # PEFT's keys only
        ours = json.loads((directory / ADAPTER_EXTRA).read_text())
        assert (ours["person"], ours["adapter_steps"], ours["trainer_step"]) == (person, 1, 1)
        tensors = load_file(directory / ADAPTER_WEIGHTS)   # the safetensors package's own reader
        own = trainer.adapters[person].trainable
        merged = state_dict_from_model(S.serving_model(state.graphdef, own, state.frozen, merge_lora=True, dtype=None))
        scale = config["lora_alpha"] / config["r"]
        checked = 0
        for name, weight in merged.items():   # HF weight = base + (alpha / r) * lora_B @ lora_A, in float64
            stem = "base_model.model." + name.removesuffix(".weight")
            a, b = tensors.get(stem + ".lora_A.weight"), tensors.get(stem + ".lora_B.weight")
            if a is None:
                np.testing.assert_array_equal(weight, base[name], err_msg=name)
                continue
            assert a.shape[0] == b.shape[1] == 4
            want = base[name].astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))
            np.testing.assert_allclose(weight, want, rtol=1e-5, atol=1e-6, err_msg=name)
            checked += 1
        assert checked == 2 * 7   # two layers, seven targets
        read, loaded = load_adapter(directory, own)   # and back into our layout, exactly
        assert read["openclaw"] == ours
        _assert_equal(loaded, own, f"{person}'s adapter read back")
