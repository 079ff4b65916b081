"""The versions directory: the event log (append-only, durable, torn lines skipped, safe between
processes), the kept weights (complete or absent, pruned but never the served one), version names,
and the hold-out rule the trainer, the gate and the status page share."""

from __future__ import annotations

import json
import multiprocessing
import os
import uuid

import numpy as np
import pytest

from openclaw_jax.samples import Sample, SampleStore
from openclaw_jax.samples.holdout import is_held_out, sample_ids
from openclaw_jax.serving.versions import (VersionError, VersionLog, VersionStore, check_version, refusals_in_a_row,
                                           versions_dir_for)


def test_log_appends_and_reads_back(tmp_path):
    log = VersionLog(tmp_path)
    assert log.events() == [] and log.served_version() is None
    log.append("start", "0", "0", reason="first")
    log.append("refused", "1", "0", step=1, rule="min_score", reason="worse")
    log.append("promoted", "2", "2", step=2, check={"score": 0.1})
    events = log.events()
    assert [e["event"] for e in events] == ["start", "refused", "promoted"]
    assert events[1]["step"] == 1 and events[2]["check"] == {"score": 0.1}
    assert log.served_version() == "2"
    with pytest.raises(ValueError, match="not one of"):
        log.append("served", "3", "3")


def test_torn_line_is_skipped_and_closed_off(tmp_path):
    log = VersionLog(tmp_path)
    log.append("start", "0", "0")
    with open(log.path, "ab") as f:                       # a crash mid-write: half a line, no newline
        f.write(b'{"time": 1, "event": "promo')
    assert [e["event"] for e in log.events()] == ["start"]
    log.append("rollback", "0", "0", from_version="0")    # the next append starts on a line of its own
    assert [e["event"] for e in log.events()] == ["start", "rollback"]
    assert log.path.read_bytes().count(b"\n") == 3


def _append_many(directory: str, worker: int, n: int) -> None:
    log = VersionLog(directory)
    for i in range(n):
        log.append("refused", str(worker * 1000 + i), "0", reason="x" * 300)


def test_appends_from_several_processes_never_interleave(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, 50)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = (tmp_path / "events.jsonl").read_bytes().split(b"\n")[:-1]
    assert len(lines) == 150 and all(json.loads(line)["event"] == "refused" for line in lines)
    assert sorted(int(json.loads(line)["version"]) for line in lines) == sorted(
        w * 1000 + i for w in range(3) for i in range(50))


def test_refusals_in_a_row_counts_evidence_since_the_last_change():
    ev = lambda kind, rule=None: {"event": kind, "rule": rule}   # noqa: E731
    assert refusals_in_a_row([ev("start"), ev("refused", "min_score"), ev("refused", "max_kl")]) == 2
    assert refusals_in_a_row([ev("refused", "min_score"), ev("promoted"), ev("refused", "min_score")]) == 1
    assert refusals_in_a_row([ev("refused", "min_score"), ev("reset"), ev("refused", "max_kl")]) == 1
    assert refusals_in_a_row([ev("refused", "min_score"), ev("rollback")]) == 0
    # too few held-out turns is no evidence against the training
    assert refusals_in_a_row([ev("refused", "min_replay"), ev("refused", "min_replay")]) == 0


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", ".hidden", "x" * 65, None, True, 1.5, "v 1"])
def test_version_names_are_plain(bad):
    with pytest.raises(VersionError):
        check_version(bad)
    assert check_version(3) == "3" and check_version("step-12") == "step-12"


def test_kept_weights_are_complete_and_pruned(tmp_path, tiny_qwen3_dir):
    from flax import nnx

    from openclaw_jax.models.weights import load_hf_checkpoint

    model, cfg = load_hf_checkpoint(tiny_qwen3_dir, dtype="float32", param_dtype="float32")
    store = VersionStore(tmp_path)
    for v in ("0", "1", "2", "3"):
        store.write(v, model, cfg, tokenizer_files_from=tiny_qwen3_dir)
    assert store.kept() == ["0", "1", "2", "3"]
    assert (store.path("2") / "tokenizer.json").is_file()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]   # no temporary directory left
    state = store.load_state("1", "float32")
    for (_, a), (_, b) in zip(nnx.to_flat_state(nnx.split(model)[1]), nnx.to_flat_state(state)):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))   # exact round trip
    assert store.prune(2, protect={"0"}) == ["1"]
    assert store.kept() == ["0", "2", "3"]
    with pytest.raises(VersionError, match=r"kept versions: \['0', '2', '3'\]"):
        store.require("1")


def test_versions_dir_is_the_store_sibling(tmp_path):
    assert versions_dir_for(tmp_path / "run" / "samples") == tmp_path / "run" / "versions"
    assert versions_dir_for(str(tmp_path / "run" / "samples") + "/") == tmp_path / "run" / "versions"


def _sample(i: int) -> Sample:
    return Sample(session_id="s", turn_index=i, kind="rl", reward=1, prompt_ids=[1, 2], response_ids=[3],
                  rollout_logprobs=[-0.5], sample_id=uuid.UUID(int=i * 7919 + 1).hex)


def test_holdout_rule_is_one_in_n_and_the_batcher_skips_it(tmp_path):
    ids = [uuid.UUID(int=i * 104729 + 17).hex for i in range(4000)]
    frac = np.mean([is_held_out(s, 4) for s in ids])
    assert abs(frac - 0.25) < 0.03
    assert not any(is_held_out(s, 0) for s in ids)
    assert [is_held_out(s, 4) for s in ids[:50]] == [is_held_out(s, 4) for s in ids[:50]]   # a function of the id

    from openclaw_jax.trainer.batcher import BatchSpec, SampleBatcher

    samples = [_sample(i) for i in range(24)]
    with SampleStore(tmp_path / "samples") as store:
        for s in samples:
            store.append(s)
    held = sum(is_held_out(s.sample_id, 3) for s in samples)
    assert 0 < held < len(samples)
    batcher = SampleBatcher(tmp_path / "samples", BatchSpec(samples_per_step=64, holdout_every=3, min_seq_bucket=8,
                                                            min_response_bucket=1))
    packed = list(batcher.batches(0, len(samples)))
    trained = {s.sample_id for p in packed for s in p.samples}
    assert batcher.dropped["held_out"] == held
    assert trained == {s.sample_id for s in samples if not is_held_out(s.sample_id, 3)}
    batcher.close()


def draw(seed: int | None, start: int, n: int) -> list[str]:
    ids = sample_ids(seed, start)
    return [ids() for _ in range(n)]


def test_seeded_sample_ids_repeat_a_run_and_never_collide_with_its_earlier_turns():
    first = draw(0, 0, 200)
    assert first == draw(0, 0, 200)                                # the same seed holds out the same turns
    assert len(set(first)) == 200 and all(len(i) == 32 and int(i, 16) >= 0 for i in first)
    resumed = draw(0, 200, 200)                                    # a restarted gateway, 200 samples stored
    assert not set(first) & set(resumed) and not set(first) & set(draw(1, 0, 200))
    assert abs(np.mean([is_held_out(i, 2) for i in first + resumed]) - 0.5) < 0.08
    unseeded = draw(None, 0, 50)
    assert len(set(unseeded + draw(None, 0, 50))) == 100          # random without a seed
