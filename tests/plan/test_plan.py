"""`python -m openclaw_jax.plan` on a tiny config.json: the JSON report's schema, `fits` against
the device memory, and its param/optimizer bytes against a count written out from config.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from openclaw_jax.plan.cli import parse_bytes
from openclaw_jax.plan.hlo import hlo_matmul_flops
from tests.helpers.xla_flags import env_without_device_count

ROOT = Path(__file__).resolve().parents[2]

HF_CONFIG = {"model_type": "qwen3", "vocab_size": 384, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
             "max_position_embeddings": 1024, "torch_dtype": "bfloat16"}
OVERRIDES = ["model.dtype=bfloat16", "model.param_dtype=float32", "model.remat=true", "trainer.max_seq_len=64",
             "trainer.min_seq_bucket=64", "trainer.samples_per_step=4", "trainer.micro_batch_size=2",
             "gateway.max_candidates=2", "trainer.chunk_size=16"]
# the tests below that count packed rows by hand plan the packed (unshared) teacher layout
PACKED_TEACHER = ["trainer.shared_prefix_teacher=false"]


def _plan(tmp_path, *extra, overrides=()):
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    env = env_without_device_count()
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "openclaw_jax.plan", "--config", "configs/tiny_cpu.yaml",
                           "--devices", "4", "--model-config", str(tmp_path), *extra, *OVERRIDES, *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def _hand_count(hf: dict, fsdp: int) -> tuple[int, int]:
    """(trainable params, float32 bytes per device) from config.json: FSDP splits the model dim
    ("embed") of every matrix over `fsdp`; norm weights are replicated."""
    V, H, I = hf["vocab_size"], hf["hidden_size"], hf["intermediate_size"]
    N, K, D, L = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"], hf["num_hidden_layers"]
    matrices = np.array([V * H, H * V] + [H * N * D, H * K * D, H * K * D, N * D * H, H * I, H * I, I * H] * L,
                        np.int64)
    norms = np.array([H] + [H, H, D, D] * L, np.int64)
    params = int(matrices.sum() + norms.sum())
    per_device = int((matrices // fsdp).sum() + norms.sum()) * 4
    return params, per_device


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return json.loads(_plan(tmp_path_factory.mktemp("plan"), "--json", "--device-memory", "64MiB", *PACKED_TEACHER))


def test_plan_json_schema_and_counts(report):
    for key, kind in [("peak_bytes", int), ("param_bytes", int), ("optimizer_bytes", int),
                      ("flops_per_step", float), ("fits", bool), ("phases", dict)]:
        assert isinstance(report[key], kind), key
    assert set(report["phases"]) == {"old_pass", "teacher_pass", "old_logprobs_at", "train_step"}
    for phase in report["phases"].values():
        for key in ("argument_bytes", "output_bytes", "temp_bytes", "peak_bytes", "flops"):
            assert phase[key] >= 0
        assert phase["peak_bytes"] >= phase["output_bytes"] + phase["temp_bytes"] - phase["alias_bytes"]
        assert phase["flops"] > 0
    assert report["peak_bytes"] == max(p["peak_bytes"] for p in report["phases"].values())
    params, per_device = _hand_count(HF_CONFIG, fsdp=4)
    assert report["trainable_params"] == params
    assert report["param_bytes"] == per_device
    # AdamW: two float32 moments sharded like the params, plus a few scalar counts.
    assert 0 <= report["optimizer_bytes"] - 2 * per_device <= 64
    # the teacher is held in bfloat16
    assert report["resident_bytes"]["teacher_params"] == per_device // 2
    assert report["fits"] is (report["peak_bytes"] <= parse_bytes("64MiB"))
    # the train step's matmuls: at least forward + backward over every trained token (6N per token)
    assert report["train_flops_per_token_over_6n"] > 1.0


def test_plan_does_not_fit_a_tiny_device_and_prints_a_table(tmp_path, report):
    small = report["peak_bytes"] - 1
    table = _plan(tmp_path, "--device-memory", str(small))
    assert "DOES NOT FIT" in table
    for phase in report["phases"]:
        assert phase in table
    assert f"peak {report['peak_bytes'] / 1024 ** 3:.2f} GiB/device" in table
    assert report["fits"] is True  # 64 MiB holds this tiny step


def test_hlo_flops_count_loops_by_trip_count():
    import jax
    import jax.numpy as jnp

    def f(w, x):
        def body(h, w1):
            return jnp.tanh(h @ w1), None
        return jax.lax.scan(body, x, w)[0].sum()

    x = jax.ShapeDtypeStruct((8, 32), jnp.float32)
    w = jax.ShapeDtypeStruct((5, 32, 32), jnp.float32)
    text = jax.jit(jax.grad(f)).lower(w, x).compile().as_text()
    # forward x@w, backward dx and dw: 3 matmuls of 2*8*32*32 per layer, 5 layers
    assert hlo_matmul_flops(text) == 3 * 5 * 2 * 8 * 32 * 32


def test_parse_bytes():
    assert parse_bytes("80GiB") == 80 * 1024 ** 3
    assert parse_bytes("141GB") == 141 * 10 ** 9
    assert parse_bytes("1e9") == 10 ** 9


def test_plan_counts_packed_rows_and_the_serving_copy(report):
    b = report["batch"]
    # 4 samples in micro-batches of 2 over 4 batch shards: the largest packed batch holds one
    # max_seq_len sequence per row, 2 rows per micro-batch -> [4, 64]; the 8 teacher candidates in 4
    # micro-batches of 2 -> [8, 64]
    assert b["packing"] is True and b["student_shape"] == [4, 64] and b["teacher_shape"] == [8, 64]
    # resident batch, per device (rows and samples split 4 ways), int32/float32: student ids, positions,
    # segment ids [4, 64]; response ids, mask, advantages, rollout log-probs [4, 64]; response_start,
    # sample_mask, row, offset [4]; teacher ids, positions, segment ids [8, 64]; response_start,
    # candidate_mask, row, offset [4, 2]
    elements = 3 * 4 * 64 + 4 * 4 * 64 + 4 * 4 + 3 * 8 * 64 + 4 * 8
    assert report["resident_bytes"]["batch"] == elements * 4 // 4
    # a sync step's train step also writes the serving weights: every param once more in the compute
    # dtype (bfloat16), sharded over the 4 devices at least as finely as the params
    params, per_device = _hand_count(HF_CONFIG, fsdp=4)
    assert params * 2 // 4 <= report["serving_bytes"] <= per_device // 2
    # XLA's own output size of the compiled step: new params + optimizer state + serving copy + metrics
    train = report["phases"]["train_step"]
    extra = train["output_bytes"] - report["param_bytes"] - report["optimizer_bytes"] - report["serving_bytes"]
    assert 0 <= extra <= 4096
    assert train["peak_bytes"] >= train["live_before_bytes"] + report["serving_bytes"]


def test_plan_includes_the_reference_pass_with_a_kl_anchor(tmp_path):
    report = json.loads(_plan(tmp_path, "--json", "loss.kl_coef=0.05", *PACKED_TEACHER))
    ref = report["phases"]["reference_pass"]
    # the frozen model over the student's rows: a forward, no gradient (far fewer FLOPs than the step)
    assert 0 < ref["flops"] < report["phases"]["train_step"]["flops"] / 2
    assert report["peak_bytes"] >= ref["peak_bytes"]


def test_plan_of_openclaw_lengths_with_the_shared_prefix_teacher(tmp_path):
    """`--prompt-len` plans the batch `pack` makes from samples of those lengths: 4 samples of a
    300-token prompt (250 common to all) + 40 response tokens, 2 hints of 32 tokens each inserted
    before the prompt's last 3; the teacher runs each sample's 297 shared tokens once."""
    report = json.loads(_plan(tmp_path, "--json", "--prompt-len", "300", "--shared-len", "250",
                              "--response-len", "40", "--hint-len", "32", overrides=["trainer.max_seq_len=512"]))
    b = report["batch"]
    assert b["shared_prefix"] is True and b["lengths"] == {"prompt": 300, "response": 40, "hint": 32, "shared": 250}
    # buckets (min 32/64/128, powers of two to the 128 quantum, multiples of it past): student 340 -> 384,
    # one per row (4 rows: the 4 batch shards); T 40 -> 64; teacher rows: the 297-token prefix, then
    # 2 x (32 + 3 + 40) -> 447 -> 512 (unshared: 2 rows of 372 -> 384 each per sample)
    assert b["student_shape"] == [4, 384] and b["response_len"] == 64 and b["teacher_shape"] == [4, 512]
    # int32/float32 elements, split over the 4 devices: student ids, positions, segments [4, 384]; 4 [4, 64]
    # response arrays; 4 [4] vectors; teacher ids, positions, segments [4, 512], prefix_len [4],
    # response_start, candidate_mask, row, offset [4, 2]
    elements = 3 * 4 * 384 + 4 * 4 * 64 + 4 * 4 + 3 * 4 * 512 + 4 + 4 * 8
    assert report["resident_bytes"]["batch"] == elements * 4 // 4
    assert set(report["phases"]) >= {"old_pass", "teacher_pass", "old_logprobs_at", "train_step"}
    assert all(p["flops"] > 0 for p in report["phases"].values())
