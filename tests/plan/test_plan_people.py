"""`python -m openclaw_jax.plan ... trainer.personalize=per_person`: one person's adapter on the trainer, on disk
and in the serving engine, against counts made apart from the planner: the adapter and optimizer state of a
real LoRA model, the tensor bytes of an adapter file `save_adapter` writes, a real `AdapterBank`'s slot arrays,
the fused decode weights of a real model, and NumPy formulas from config.json (the tiny model's, and
Qwen3-4B's shipped one on 8 simulated devices)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.inference.adapters import AdapterBank
from openclaw_jax.inference.decode_layers import fuse_layers
from openclaw_jax.models.config import LoRAConfig, ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.models.lora import add_lora, lora_state
from openclaw_jax.models.lora_files import ADAPTER_WEIGHTS, save_adapter
from openclaw_jax.models.weights import apply_dtypes
from openclaw_jax.plan.cli import parse_bytes
from openclaw_jax.plan.table import format_table
from openclaw_jax.trainer.state import optimizer

from tests.helpers.xla_flags import env_without_device_count
from tests.plan.test_plan import HF_CONFIG, OVERRIDES, _plan

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("q", "v", "up", "down")
PER_PERSON = ["trainer.personalize=per_person", "model.lora.enabled=true", "model.lora.rank=4",
              f"model.lora.targets=[{','.join(TARGETS)}]"]
SERVING_MEMORY = "3100MiB"   # the tiny engine's 2 GiB KV budget and 1 GiB prefix cache, and room for slots


def _widths(hf: dict) -> dict[str, tuple[int, int]]:
    """Each projection's (in, out) features, from config.json."""
    H, I = hf["hidden_size"], hf["intermediate_size"]
    N, K, D = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    return {"q": (H, N * D), "k": (H, K * D), "v": (H, K * D), "o": (N * D, H), "gate": (H, I), "up": (H, I),
            "down": (I, H)}


def _adapter_params(hf: dict, rank: int, targets) -> int:
    """A LoRA adapter's params: per layer and target, A [in, r] and B [r, out]."""
    widths = _widths(hf)
    return int(np.sum([hf["num_hidden_layers"] * rank * (widths[t][0] + widths[t][1]) for t in targets],
                      dtype=np.int64))


def _kv_bytes_per_token(hf: dict, itemsize: int = 2) -> int:
    return 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * hf["head_dim"] * itemsize


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return json.loads(_plan(tmp_path_factory.mktemp("plan_people"), "--json", "--people", "3", "--serving-memory",
                            SERVING_MEMORY, "--device-memory", "64MiB", overrides=PER_PERSON))


@pytest.fixture(scope="module")
def cfg():
    return load_experiment_config([str(ROOT / "configs/tiny_cpu.yaml")], OVERRIDES + PER_PERSON)


def test_per_person_adapter_and_optimizer_state_equal_a_real_lora_model(report, cfg):
    pp = report["per_person"]
    a = pp["adapter"]
    assert pp["lora"] == {"rank": 4, "alpha": cfg.model.lora.alpha, "targets": list(TARGETS)}
    assert a["params"] == _adapter_params(HF_CONFIG, 4, TARGETS) and a["param_dtype"] == "float32"
    # the adapter and AdamW state a real tiny LoRA model has (float32 master weights)
    base = Decoder(apply_dtypes(ModelConfig.from_hf_dict(HF_CONFIG), "bfloat16", "float32"), rngs=nnx.Rngs(0))
    trainable = lora_state(add_lora(base, cfg.model.lora, rngs=nnx.Rngs(1)))
    assert a["bytes"] == _nbytes(trainable) == 4 * a["params"]
    assert a["optimizer_bytes"] == _nbytes(optimizer(cfg)[0].init(trainable))
    assert 0 <= a["optimizer_bytes"] - 2 * a["bytes"] <= 64   # two moments and a few scalar counts
    # sharded over the 4 devices as the planned mesh places them: at least a quarter of each, at most all
    for whole, shard in ((a["bytes"], a["bytes_per_device"]), (a["optimizer_bytes"], a["optimizer_bytes_per_device"])):
        assert whole / 4 <= shard <= whole
    assert a["device_bytes_per_person"] == a["bytes_per_device"] + a["optimizer_bytes_per_device"]


def test_per_person_trainer_holds_every_persons_state(report):
    """The step compiled as a person's (no weight sync), with the 3 people's states resident beside it."""
    pp, t = report["per_person"], report["per_person"]["trainer"]
    person = pp["adapter"]["device_bytes_per_person"]
    assert report["serving_bytes"] == 0 and set(report["phases"]) == {"old_pass", "teacher_pass", "old_logprobs_at",
                                                                       "train_step"}
    assert report["resident_bytes"]["people"] == 3 * person
    first = next(iter(report["phases"].values()))
    assert first["live_before_bytes"] == sum(report["resident_bytes"].values())
    # the update's outputs: its person's new adapter and optimizer state and the metrics, no serving copy
    train = report["phases"]["train_step"]
    assert 0 <= train["output_bytes"] - report["param_bytes"] - report["optimizer_bytes"] <= 4096
    assert t["peak_bytes"] == report["peak_bytes"] and t["peak_bytes_without_people"] == report["peak_bytes"] - 3 * person
    memory = parse_bytes("64MiB")
    for most, room in ((t["max_people"], memory), (t["max_people_beside_engine"], memory - pp["serving"]["total"])):
        assert t["peak_bytes_without_people"] + most * person <= room or most == 0
        assert t["peak_bytes_without_people"] + (most + 1) * person > room
    assert t["max_people"] > 3 and t["max_people_beside_engine"] == 0   # 64 MiB holds no 3 GiB engine


def test_per_person_disk_equals_a_written_adapter_file(report, cfg, tmp_path):
    d, a = report["per_person"]["disk"], report["per_person"]["adapter"]
    assert d["checkpoint_bytes_per_person"] == a["bytes"] + a["optimizer_bytes"]
    base = Decoder(ModelConfig.from_hf_dict(HF_CONFIG), rngs=nnx.Rngs(0))
    path = save_adapter(tmp_path / "alice", lora_state(add_lora(base, cfg.model.lora, rngs=nnx.Rngs(1))),
                        cfg.model.lora, base_model="tiny") / ADAPTER_WEIGHTS
    with open(path, "rb") as f:
        header = struct.unpack("<Q", f.read(8))[0]
    assert d["adapter_file_bytes"] == path.stat().st_size - 8 - header   # the file's tensor bytes
    assert d["checkpoints_kept"] == cfg.trainer.keep_checkpoints and d["served_versions"] == 2
    assert d["bytes_per_person"] == (d["checkpoints_kept"] * d["checkpoint_bytes_per_person"]
                                     + 2 * d["adapter_file_bytes"])


def test_per_person_serving_equals_a_real_engines_arrays(report, cfg):
    s = report["per_person"]["serving"]
    served = apply_dtypes(ModelConfig.from_hf_dict(HF_CONFIG), "bfloat16", "bfloat16")
    assert s["param_dtype"] == "bfloat16" and s["slots"] == cfg.policy.lora_slots == 4 and s["max_rank"] == 4
    bank = AdapterBank(served, slots=4, max_rank=4, targets=TARGETS)
    assert s["slot_bytes"] == bank.slot_bytes == 2 * _adapter_params(HF_CONFIG, 4, TARGETS)
    assert s["adapter_slots"] == _nbytes(bank._bank)   # the slot buffers, slot 0 included
    graphdef, state = nnx.split(Decoder(served, rngs=nnx.Rngs(0)))
    fused = fuse_layers(graphdef, state)
    assert s["weights"] == _nbytes(state)
    assert s["decode_weights"] == _nbytes(fused["layers"]) + _nbytes(fused["head"])   # an untied head: a copy
    per_token = _kv_bytes_per_token(HF_CONFIG)
    assert s["kv_bytes_per_token"] == per_token
    # sequences up to the model's 1024 positions (less than the gateway's prompt + max_tokens limits): one
    # alone takes 1024 x 384 B, less than the engine's 2 GiB batch budget
    assert s["context_length"] == s["longest_sequence"] == 1024 and s["kv_cache"] == 2 << 30
    block = 64 * per_token
    assert s["prefix_cache"] == (cfg.policy.prefix_cache_mb << 20) // block * block
    assert s["row_adapters"] == 2 * 8 * s["slot_bytes"]   # a decode and a prefill call of max_batch_size 8 rows
    parts = ("weights", "decode_weights", "kv_cache", "prefix_cache", "row_adapters", "adapter_slots")
    assert s["total"] == sum(s[k] for k in parts)
    for most, room in ((s["max_slots"], parse_bytes(SERVING_MEMORY)),
                       (s["beside_trainer"]["max_slots"], parse_bytes("64MiB") - report["peak_bytes"])):
        fixed = s["total"] - s["adapter_slots"] + s["slot_bytes"]
        assert fixed + most * s["slot_bytes"] <= room or most == 0
        assert fixed + (most + 1) * s["slot_bytes"] > room
    assert s["fits"] is True and s["max_slots"] > s["slots"]
    # the trainer's 64 MiB device holds no 3 GiB engine beside it
    assert s["beside_trainer"]["fits"] is False and s["beside_trainer"]["max_slots"] == 0


def test_per_person_table(report):
    text = format_table(report)
    pp = report["per_person"]
    assert "no weight sync" in text and f"at most {pp['trainer']['max_people']} people fit" in text
    assert f"at most {pp['serving']['max_slots']} adapter slots" in text and "DOES NOT FIT" in text


def test_people_need_per_person(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    proc = subprocess.run([sys.executable, "-m", "openclaw_jax.plan", "--config", "configs/tiny_cpu.yaml", "--devices",
                           "1", "--model-config", str(tmp_path), "--people", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**env_without_device_count(), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "trainer.personalize=per_person" in proc.stderr


def test_per_person_plan_of_qwen3_4b_on_8_devices(tmp_path):
    """The shipped Qwen3-4B config.json, rank-16 adapters on all seven projections, 8 simulated devices: the
    numbers against NumPy formulas (FSDP splits every matrix's model dim, "embed", 8 ways)."""
    hf = json.loads((ROOT / "configs/models/qwen3-4b/config.json").read_text())
    env = env_without_device_count()
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_jax.plan", "--config", "configs/qwen3_4b_gpu.yaml", "--devices", "8",
         "--people", "2", "--json", "trainer.personalize=per_person", "model.lora.enabled=true",
         "model.lora.rank=16", "policy.mode=embedded", "trainer.max_seq_len=1024", "trainer.min_seq_bucket=1024",
         "trainer.samples_per_step=8", "trainer.micro_batch_size=8"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plan = json.loads(proc.stdout)
    pp = plan["per_person"]
    a, s = pp["adapter"], pp["serving"]
    targets = ("q", "k", "v", "o", "gate", "up", "down")
    assert a["params"] == _adapter_params(hf, 16, targets) == 33_030_144
    # per device: A [in, r] of q, k, v, gate, up and B [r, out] of o, down have the model dim (split 8 ways)
    H, L, r = hf["hidden_size"], hf["num_hidden_layers"], 16
    w = _widths(hf)
    whole = sum(w[t][1] for t in ("q", "k", "v", "gate", "up")) + sum(w[t][0] for t in ("o", "down"))
    assert a["bytes_per_device"] == L * r * (7 * H // 8 + whole) * 4
    assert 0 <= a["optimizer_bytes_per_device"] - 2 * a["bytes_per_device"] <= 64
    # the engine: the whole model in bfloat16 (tied embedding), the decode's copy of every layer, K/V in bfloat16
    N, K, D, I, V = (hf[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                                      "vocab_size"))
    layer = H * N * D + 2 * H * K * D + N * D * H + 3 * H * I + 2 * H + 2 * D
    assert s["weights"] == 2 * (V * H + L * layer + H) and s["decode_weights"] == 2 * L * layer
    assert s["slot_bytes"] == 2 * a["params"] and s["kv_bytes_per_token"] == _kv_bytes_per_token(hf)
    # one sequence of 40960 tokens (the model's context = the gateway's 32768 + 8192) in a 40960-token cache: past
    # 4096 the running cache grows in quarter octaves, and 40960 = 32768 x 1.25 is one of them
    assert s["longest_sequence"] == 40960 and s["kv_cache"] == 40960 * _kv_bytes_per_token(hf)
    assert plan["fits"] and s["fits"] and pp["trainer"]["max_people"] > 100 and s["max_slots"] > 500
