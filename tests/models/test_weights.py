"""HF safetensors checkpoints: round trips, sharded files, transformers interop, clear errors."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
import transformers
from flax import nnx

from openclaw_jax.models import weights
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.models.weights import (CheckpointError, load_hf_checkpoint, model_from_state_dict,
                                         save_hf_checkpoint, state_dict_from_model)
from tests.helpers.hf_models import hf_logits, make_hf_model

CFG = ModelConfig(family="qwen3", vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, qk_norm=True, rope_theta=1e6)


def _flat(model):
    return {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))}


def _random_model(cfg, seed=0):
    model = Decoder(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    nnx.update(model, nnx.from_flat_state([
        (p, v.replace(jnp.asarray(rng.normal(size=v.get_value().shape).astype(np.float32)).astype(v.get_value().dtype)))
        for p, v in nnx.to_flat_state(nnx.state(model))]))
    return model


def _assert_bit_equal(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        x, y = np.asarray(fa[name]), np.asarray(fb[name])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), name


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_save_load_round_trip_is_bit_exact(tmp_path, param_dtype):
    cfg = CFG.replace(param_dtype=param_dtype, dtype=param_dtype)
    model = _random_model(cfg)
    out = save_hf_checkpoint(model, cfg, tmp_path / "ckpt")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    loaded, loaded_cfg = load_hf_checkpoint(out, dtype=param_dtype)
    assert loaded_cfg == cfg.replace(max_position_embeddings=loaded_cfg.max_position_embeddings)
    _assert_bit_equal(model, loaded)
    # an independent reader (the safetensors library) sees the HF names, layout and dtype
    ours = state_dict_from_model(model)
    theirs = safetensors.torch.load_file(str(out / "model.safetensors"))
    assert theirs.keys() == ours.keys()
    for name, tensor in theirs.items():
        expected = ours[name]
        assert tuple(tensor.shape) == expected.shape, name
        if param_dtype == "bfloat16":
            assert tensor.dtype == torch.bfloat16
            assert tensor.view(torch.int16).numpy().tobytes() == expected.view(np.int16).tobytes(), name
        else:
            assert tensor.numpy().tobytes() == expected.tobytes(), name
    assert ours["model.layers.1.self_attn.q_proj.weight"].shape == (4 * 16, 32)  # HF [out, in]
    assert ours["model.layers.0.self_attn.k_norm.weight"].shape == (16,)


def test_sharded_checkpoint_round_trip(tmp_path):
    model = _random_model(CFG, seed=1)
    out = save_hf_checkpoint(model, CFG, tmp_path / "sharded", max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and not (out / "model.safetensors").exists()
    assert files == sorted(p.name for p in out.glob("model-*.safetensors"))
    assert all(f.endswith(f"-of-{len(files):05d}.safetensors") for f in files)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in state_dict_from_model(model).values())
    for f in files:  # every shard is a valid safetensors file within the size bound (or one big tensor)
        tensors = safetensors.numpy.load_file(str(out / f))
        assert sum(t.nbytes for t in tensors.values()) <= 20_000 or len(tensors) == 1
    loaded, _ = load_hf_checkpoint(out)
    _assert_bit_equal(model, loaded)


def test_loads_transformers_sharded_checkpoint(tmp_path):
    hf, cfg = make_hf_model("qwen2", tie=False, num_heads=4, num_kv_heads=2, hidden=32, vocab=128)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) >= 2
    model, loaded_cfg = load_hf_checkpoint(tmp_path / "hf")
    assert loaded_cfg.attention_bias and loaded_cfg.family == "qwen2"
    ids = np.random.default_rng(0).integers(0, 128, (2, 9)).astype(np.int32)
    assert np.abs(np.asarray(model(jnp.asarray(ids))) - hf_logits(hf, ids)).max() <= 1e-4


@pytest.mark.parametrize("family,tie", [("llama", True), ("qwen3", False)])
def test_transformers_loads_what_we_save(tmp_path, family, tie):
    hf, cfg = make_hf_model(family, tie=tie, num_heads=4, num_kv_heads=1, head_dim=8, vocab=128)
    hf.save_pretrained(tmp_path / "orig")
    model, cfg = load_hf_checkpoint(tmp_path / "orig")
    save_hf_checkpoint(model, cfg, tmp_path / "ours")
    if tie:
        assert "lm_head.weight" not in safetensors.numpy.load_file(str(tmp_path / "ours" / "model.safetensors"))
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert type(again) is type(hf)
    for (name, a), (_, b) in zip(sorted(hf.state_dict().items()), sorted(again.state_dict().items())):
        assert torch.equal(a, b), name
    ids = np.random.default_rng(1).integers(0, 128, (2, 7)).astype(np.int32)
    np.testing.assert_array_equal(hf_logits(again, ids), hf_logits(hf, ids))


def test_save_into_existing_dir_keeps_other_files_and_drops_stale_weights(tmp_path):
    out = tmp_path / "ckpt"
    save_hf_checkpoint(_random_model(CFG, seed=2), CFG, out, max_shard_bytes=20_000)
    (out / "tokenizer.json").write_text("{}")
    model = _random_model(CFG, seed=3)
    save_hf_checkpoint(model, CFG, out)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json"]
    _assert_bit_equal(model, load_hf_checkpoint(out)[0])


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []
    real = weights.write_safetensors

    def failing(path, tensors, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real(path, tensors, metadata)

    monkeypatch.setattr(weights, "write_safetensors", failing)
    with pytest.raises(OSError, match="disk full"):
        save_hf_checkpoint(_random_model(CFG), CFG, tmp_path / "ckpt", max_shard_bytes=20_000)
    assert list(tmp_path.iterdir()) == []


# --- errors name the file and the tensor --------------------------------------------------------


@pytest.fixture()
def saved(tmp_path):
    out = save_hf_checkpoint(_random_model(CFG), CFG, tmp_path / "ckpt")
    return out


def test_truncated_file_names_file_and_tensor(saved):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(saved)
    message = str(err.value)
    assert str(path) in message and "truncated" in message
    last = max(json.loads(data[8:8 + int.from_bytes(data[:8], "little")]).items(),
               key=lambda kv: kv[1]["data_offsets"][1] if kv[0] != "__metadata__" else -1)[0]
    assert repr(last) in message


def test_corrupt_header_names_file(saved):
    path = saved / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"\xff" * 12
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt safetensors header") as err:
        load_hf_checkpoint(saved)
    assert str(path) in str(err.value)


def test_missing_weights_file(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_hf_checkpoint(saved)


def test_index_pointing_to_missing_shard(tmp_path):
    out = save_hf_checkpoint(_random_model(CFG), CFG, tmp_path / "ckpt", max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    victim_file = sorted(set(index["weight_map"].values()))[1]
    victim_tensor = sorted(n for n, f in index["weight_map"].items() if f == victim_file)[0]
    (out / victim_file).unlink()
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(out)
    assert victim_file in str(err.value) and repr(victim_tensor) in str(err.value)
    # a tensor dropped from the index is reported against the index file
    (out / victim_file).write_bytes(b"")
    del index["weight_map"][victim_tensor]
    for name in [n for n, f in index["weight_map"].items() if f == victim_file]:
        del index["weight_map"][name]
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(out)
    assert str(out / "model.safetensors.index.json") in str(err.value) and repr(victim_tensor) in str(err.value)


def test_missing_tensor_names_it(saved):
    tensors = safetensors.numpy.load_file(str(saved / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    safetensors.numpy.save_file(tensors, str(saved / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(saved)
    assert "'model.layers.1.mlp.up_proj.weight' is missing" in str(err.value)
    assert str(saved / "model.safetensors") in str(err.value)


def test_shape_mismatch_names_file_and_tensor(saved):
    config = json.loads((saved / "config.json").read_text())
    config["intermediate_size"] = 48
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_hf_checkpoint(saved)
    message = str(err.value)
    assert str(saved / "model.safetensors") in message
    assert "'model.layers.0.mlp.gate_proj.weight' has shape [64, 32]" in message and "[48, 32]" in message


def test_state_dict_errors():
    sd = state_dict_from_model(_random_model(CFG))
    sd["model.norm.weight"] = np.ones(31, np.float32)
    with pytest.raises(CheckpointError, match=r"state dict: tensor 'model.norm.weight' has shape \[31\]"):
        model_from_state_dict(CFG, sd)
    sd.pop("model.norm.weight")
    sd["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    with pytest.raises(CheckpointError, match="missing"):
        model_from_state_dict(CFG, sd)
