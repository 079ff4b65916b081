"""The trainer as several JAX processes (the multi-node stand-in: CPU processes with gloo
collectives on 127.0.0.1, one shared run_dir), started exactly as a user would:

    JAX_COORDINATOR_ADDRESS=127.0.0.1:P JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=i python -m openclaw_jax.train ...

Both runs train on the same stored samples (a store written before the run; no simulated users),
so a two-process run must reproduce a one-process run's losses, and a two-process run SIGKILLed
and restarted must train every sample window exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from openclaw_jax.samples import Sample, SampleStore
from tests.helpers.tb_events import read_event_tags
from tests.helpers.xla_flags import env_without_device_count

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BATCH = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_samples(store_dir: Path, count: int) -> None:
    """Scored turns in the tiny tokenizer's id range: RL, OPD and OPD+RL, one or two hints."""
    rng = np.random.default_rng(0)

    def ids(n):
        return [int(x) for x in rng.integers(3, 300, n)]

    with SampleStore(store_dir) as store:
        for i in range(count):
            kind = ("rl", "opd", "opd+rl")[i % 3]
            prompt, response = ids(10 + i % 5), ids(6 + i % 4)
            n_hints = 0 if kind == "rl" else 1 + i % 2
            store.append(Sample(
                session_id=f"s{i}", turn_index=0, kind=kind, reward=0.0 if kind == "opd" else (-1.0) ** i,
                prompt_ids=prompt, response_ids=response,
                rollout_logprobs=[float(x) for x in -rng.random(len(response)) - 0.2],
                hints=[f"hint {j} long enough" for j in range(n_hints)],
                hint_prompt_ids=[prompt[:-2] + ids(3 + 2 * j) + prompt[-2:] for j in range(n_hints)],
                weight_version="0", temperature=1.0))


def _command(run_dir: Path, max_steps: int) -> list[str]:
    return [sys.executable, "-m", "openclaw_jax.train", "--config", str(ROOT / "configs/tiny_cpu.yaml"),
            f"run_dir={run_dir}", f"trainer.max_steps={max_steps}", f"trainer.samples_per_step={BATCH}",
            "trainer.checkpoint_every=1", "trainer.max_staleness=1000", "env.enabled=false", "progress=false"]


def _start(run_dir: Path, max_steps: int, processes: int, logs: Path, tag: str) -> list[subprocess.Popen]:
    env = env_without_device_count()
    env["PYTHONUNBUFFERED"] = "1"
    port = _free_port()
    procs = []
    for i in range(processes):
        penv = dict(env)
        if processes > 1:
            penv.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
                        JAX_PROCESS_ID=str(i))
        out = open(logs / f"{tag}-p{i}.log", "w")
        procs.append(subprocess.Popen(_command(run_dir, max_steps), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                      env=penv))
    return procs


def _wait(procs, logs: Path, tag: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    try:
        for i, proc in enumerate(procs):
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
            assert proc.returncode == 0, (f"{tag} process {i} exited {proc.returncode}:\n"
                                          + (logs / f"{tag}-p{i}.log").read_text()[-4000:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def _losses(run_dir: Path) -> dict[int, float]:
    return {step: value.simple_value for step, value in read_event_tags(run_dir / "tb")["loss"]}


def test_two_processes_train_like_one(tmp_path):
    steps = 2
    one, two = tmp_path / "one", tmp_path / "two"
    for run_dir in (one, two):
        _write_samples(run_dir / "samples", steps * BATCH)
    _wait(_start(one, steps, 1, tmp_path, "one"), tmp_path, "one")
    _wait(_start(two, steps, 2, tmp_path, "two"), tmp_path, "two")
    a, b = _losses(one), _losses(two)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-4 * max(1.0, abs(a[step])), (step, a[step], b[step])
    assert len({round(v, 6) for v in a.values()}) == steps, "the steps trained on identical data"
    # checkpoints written collectively hold the same step and offset
    for run_dir in (one, two):
        windows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
        assert [(w["start_offset"], w["end_offset"]) for w in windows] == [(0, BATCH), (BATCH, 2 * BATCH)]
    assert (two / "export" / f"step_{steps}" / "config.json").exists()


def test_two_processes_killed_and_resumed_lose_and_repeat_nothing(tmp_path):
    steps = 5
    run_dir = tmp_path / "run"
    _write_samples(run_dir / "samples", steps * BATCH)
    procs = _start(run_dir, steps, 2, tmp_path, "first")
    try:
        deadline = time.monotonic() + 600
        ckpt = run_dir / "ckpt"
        while not (ckpt.exists() and any(p.name.isdigit() and int(p.name) >= 2 for p in ckpt.iterdir())):
            assert all(p.poll() is None for p in procs), "a process exited before the kill:\n" + \
                (tmp_path / "first-p0.log").read_text()[-3000:] + (tmp_path / "first-p1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no second checkpoint in time"
            time.sleep(0.2)
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    _wait(_start(run_dir, steps, 2, tmp_path, "second"), tmp_path, "second")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] is True and 2 <= summary["start_step"] < steps and summary["end_step"] == steps
    windows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [w["step"] for w in windows] == list(range(1, steps + 1))
    assert [(w["start_offset"], w["end_offset"]) for w in windows] == [(i * BATCH, (i + 1) * BATCH)
                                                                       for i in range(steps)]
