"""Checkpointer round trip and resume metadata; (sum, count) metric accumulation; TB events."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest

from openclaw_jax.trainer.checkpoint import Checkpointer
from openclaw_jax.trainer.metrics import MetricAccumulator, MetricsWriter
from tests.helpers.tb_events import read_event_tags


def _state(seed: int):
    key = jax.random.key(seed)
    return {
        "params": {"w": jax.random.normal(key, (4, 3)), "b": jnp.arange(3, dtype=jnp.float32) * seed},
        "opt": (jnp.zeros((4, 3)) + seed, {"count": jnp.int32(seed)}),
        "rng": jax.random.key_data(key),
    }


def test_checkpoint_round_trip_and_latest(tmp_path):
    ckpt = Checkpointer(tmp_path / "ckpt", max_to_keep=2)
    assert ckpt.latest_step() is None
    assert ckpt.restore(_state(0)) is None
    for step in (1, 2, 3):
        ckpt.save(step, _state(step), {"sample_offset": 10 * step, "weight_version": f"v{step}"})
    assert ckpt.latest_step() == 3
    restored, meta = ckpt.restore(_state(0))
    assert meta == {"sample_offset": 30, "weight_version": "v3"}
    chex.assert_trees_all_equal(restored, _state(3))  # same tree structure and values
    # max_to_keep=2 leaves steps 2 and 3; a fresh manager on the same directory sees them
    again = Checkpointer(tmp_path / "ckpt")
    assert again.latest_step() == 3
    _, meta2 = again.restore(_state(0), step=2)
    assert meta2["sample_offset"] == 20
    with pytest.raises(Exception):
        again.restore(_state(0), step=1)


def test_accumulator_weights_by_count():
    acc = MetricAccumulator()
    acc.add("loss", total=6.0, count=3)  # mean 2 over 3 tokens
    acc.add("loss", total=1.0, count=1)  # mean 1 over 1 token
    other = MetricAccumulator()
    other.add("loss", total=3.0, count=4)
    acc.merge(other)
    assert acc.means()["loss"] == pytest.approx((6 + 1 + 3) / (3 + 1 + 4))
    acc.add("empty", 0.0, 0)
    assert "empty" not in acc.means()


def test_writer_scalars_histogram_text(tmp_path):
    writer = MetricsWriter(tmp_path / "tb")
    writer.scalars(1, {"loss": 0.5, "nan_metric": float("nan")})
    writer.scalars(2, {"loss": 0.25}, prefix="train/")
    writer.histogram(2, "sel_k_star", [0, 1, 1, 2])
    writer.text(2, "hints", "use plain prose")
    writer.close()
    tags = read_event_tags(tmp_path / "tb")
    assert [s for s, _ in tags["loss"]] == [1]
    assert tags["loss"][0][1].simple_value == pytest.approx(0.5)
    assert tags["train/loss"][0][1].simple_value == pytest.approx(0.25)
    assert "nan_metric" not in tags
    assert "sel_k_star" in tags
    assert any(t.startswith("hints") for t in tags)


def test_step_log_is_reconciled_with_the_restored_step(tmp_path):
    """Windows logged for steps past the restored checkpoint (a crash before the save finished) are dropped."""
    import json
    from types import SimpleNamespace

    from openclaw_jax.trainer.loop import Trainer

    ckpt = Checkpointer(tmp_path / "ckpt")
    log_path = tmp_path / "steps.jsonl"
    lines = [{"step": 1, "start_offset": 0, "end_offset": 4}, {"step": 2, "start_offset": 4, "end_offset": 8},
             {"step": 3, "start_offset": 8, "end_offset": 12}]
    log_path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 4, "sta')  # torn last line
    fake = SimpleNamespace(step=2, _step_log=Trainer._step_log)
    Trainer._reconcile_step_log(fake, ckpt)
    assert [json.loads(x)["step"] for x in log_path.read_text().splitlines()] == [1, 2]
    # after a retrained step 3 is appended and the log is reconciled at step 3, the new entry stands
    with open(log_path, "a") as f:
        f.write(json.dumps({"step": 3, "start_offset": 8, "end_offset": 12}) + "\n")
    Trainer._reconcile_step_log(SimpleNamespace(step=3, _step_log=Trainer._step_log), ckpt)
    assert [json.loads(x)["step"] for x in log_path.read_text().splitlines()] == [1, 2, 3]
