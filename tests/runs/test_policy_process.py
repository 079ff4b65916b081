"""`policy.mode=process`: the policy server as its own process ahead of the run's own in CPU priority.

A real `python -m openclaw_jax.train` run on configs/tiny_cpu.yaml: while it trains, the policy server is
a child process at the priority the run was started with, the run's event loop (the gateway) keeps that
priority too, and the trainer's threads are at `policy.trainer_nice`, XLA's in SCHED_IDLE; each step's weights reach the child (its served version follows the trainer's), and
nothing of it is left once the run ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.helpers.xla_flags import env_without_device_count

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _priority(pid: int, tid: int | None = None) -> tuple[str, int]:
    """("idle" or "normal", nice) of a thread, read from /proc (fields 41 and 19 of stat)."""
    fields = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text().rsplit(")", 1)[1].split()
    return ("idle" if int(fields[38]) == os.SCHED_IDLE else "normal"), int(fields[16])


def _thread_priorities(pid: int) -> dict[int, tuple[str, int]]:
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(tid)] = _priority(pid, int(tid))
        except FileNotFoundError:  # a thread that ended while we listed
            pass
    return found


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended while we listed
            pass
    return found


def _cmdline(pid: int) -> str:
    """The process's command line, or "" for one that has already ended (the run starts short-lived
    helpers too, which can end between listing and reading)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def test_trainer_steps_back_and_weights_reach_the_policy_process(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", str(ROOT / "configs/tiny_cpu.yaml"),
           "policy.mode=process", "policy.trainer_nice=15", "trainer.max_steps=2", f"run_dir={run_dir}",
           "progress=false", "compile_cache_dir="]
    base_nice = os.nice(0)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env_without_device_count())
    try:
        deadline = time.monotonic() + 600
        child = None
        while time.monotonic() < deadline and proc.poll() is None:
            kids = [k for k in _children(proc.pid) if "openclaw_jax.inference" in _cmdline(k)]
            if kids and ("idle", 15) in _thread_priorities(proc.pid).values():
                child = kids[0]
                break
            time.sleep(0.2)
        assert child is not None, "no policy server child process (or the run did not lower its trainer)"
        threads = _thread_priorities(proc.pid)
        assert threads.pop(proc.pid) == ("normal", base_nice)     # the event loop: the gateway answers on it
        # XLA's threads idle, the trainer's Python threads at the nice value alone, the loop's new threads normal
        assert ("idle", 15) in threads.values() and ("normal", 15) in threads.values()
        assert set(threads.values()) <= {("idle", 15), ("normal", 15), ("normal", base_nice)}
        assert _priority(child) == ("normal", base_nice)
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["end_step"] == 2
    assert "weights pushed to 1 worker(s): weight_version=2" in err
    assert not Path(f"/proc/{child}").exists()  # stopped with the run
    # what the last push had the server load: step 2's weights, written as an HF directory
    assert (run_dir / "weights" / "step_2" / "config.json").exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(summary["gateway_url"] + "/healthz", timeout=5)
