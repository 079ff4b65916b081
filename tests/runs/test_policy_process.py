"""`policy.mode=process`: the policy server as its own process ahead of the run's own in CPU priority.

A real `python -m openclaw_jax.train` run on configs/tiny_cpu.yaml: while it trains, the policy server is
a child process at the priority the run was started with and every thread of the run's own process
(trainer, gateway, judge) is at `policy.trainer_nice`; each step's weights reach the child (its served
version follows the trainer's), and nothing of it is left once the run ends.
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


def _nice(pid: int, tid: int | None = None) -> int:
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of stat: nice


def _thread_nices(pid: int) -> set[int]:
    nices = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            nices.add(_nice(pid, int(tid)))
        except FileNotFoundError:  # a thread that ended while we listed
            pass
    return nices


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
            if kids and _nice(proc.pid) == 15:
                child = kids[0]
                break
            time.sleep(0.2)
        assert child is not None, "no policy server child process (or the run did not lower its priority)"
        assert _thread_nices(proc.pid) == {15}
        assert _nice(child) == base_nice
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


def test_lower_priority_covers_every_thread_and_the_ones_started_later():
    code = """
import os, threading, time
from openclaw_jax.runs.policy_process import lower_priority
stop = threading.Event()
early = [threading.Thread(target=stop.wait) for _ in range(3)]
for t in early: t.start()
n = lower_priority(7)
late = threading.Thread(target=stop.wait); late.start()
tids = os.listdir('/proc/self/task')
nices = {int(open(f'/proc/self/task/{t}/stat').read().rsplit(')', 1)[1].split()[16]) for t in tids}
stop.set()
print(n, len(tids), sorted(nices))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=env_without_device_count())
    assert out.returncode == 0, out.stderr
    lowered, threads, nices = out.stdout.split(maxsplit=2)
    assert int(lowered) == (4 if os.nice(0) < 7 else 0)  # the main thread and the 3 early ones
    assert int(threads) == 5 and nices.strip() == f"[{max(7, os.nice(0))}]"
