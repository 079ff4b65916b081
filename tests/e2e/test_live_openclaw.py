"""Live mode with its promotion gate, through the real OpenClaw: `python -m openclaw_jax.train --config
configs/live_cpu.yaml` on a tiny random model with SmolLM2's tokenizer, OpenClaw connected with the command the run
prints, a person's sessions as `openclaw agent --local` turns, a trained version checked, promoted and served, then
Ctrl-C and the same command again.

Overrides, so that three sessions suffice: ``gate.holdout_every=2`` (one scored turn in two is replayed by the gate)
and ``gate.min_replay=1``; and a rule every candidate passes (``gate.min_score=-1e9``, ``gate.max_kl=1e9``), since
what is under test here is the path through OpenClaw, not the check's verdict: whether one Adam step on one sampled
turn scores above 0 on three others depends on the sampled tokens (the check's verdicts are tested on their own in
`tests/serving/test_gate_*.py`). Everything else is the config's: a step every 4 scored turns, the run's seed 0.

What is determined, and why:

* **which turns are held out**: the seed draws the turns' ids (`samples.holdout.sample_ids`) and the person types one
  message at a time, so the 7 scored turns are held out as H H t H | t H t (asserted from the store): the first
  window of 4 trains on one turn and the gate replays three; the second window is still open at the end;
* **when the gate decides**: after each message the person waits (reading ``GET /v1/status``, as the status page
  shows it) until the reaction is stored and every step it allows is checked, so the check replays exactly the
  held-out turns stored before the step;
* **what the check reads**: every reaction is the same correction with the same hint, so every replayed verdict
  is -1 and the reward part of the score (verdict minus the replay set's mean, times the log-ratio) is exactly 0;
  the score is the teacher part alone.

The tokens themselves are not reproducible (OpenClaw stamps each message with the minute it was sent, and the
answers are sampled from that prompt); the assertions hold for any of them. The test fails if the candidate is not
checked on the three held-out turns and promoted, if a version answers turns before it is served, or if the versions
log, ``GET /v1/status``, the summary and the restarted run disagree on what is served.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers.server_utils import free_port
from openclaw_jax.envs.openclaw_agent import node_bin, openclaw_bin, parse_result
from openclaw_jax.samples import SampleStore
from openclaw_jax.samples.holdout import is_held_out
from openclaw_jax.serving.versions import VersionLog
from tests.serving.test_gate_train import check_decisions
from tests.e2e.test_live import ROOT, LiveRun

pytestmark = pytest.mark.slow

GATE = ("gate.holdout_every=2", "gate.min_replay=1", "gate.min_score=-1e9", "gate.max_kl=1e9")
SAMPLES_PER_STEP = 4   # configs/live_cpu.yaml
CORRECTION = "No, that's wrong. You should answer with just the number."
HINT = "You should answer with just the number."
# a question and the corrections that follow it; each correction scores the answer before it (a session's last
# answer is never scored: no reaction follows it): 3 + 3 + 1 = 7 scored turns
SESSIONS = [("live-1", ["What is 2 + 3?", CORRECTION, CORRECTION, CORRECTION]),
            ("live-2", ["What is 7 + 6?", CORRECTION, CORRECTION, CORRECTION]),
            ("live-3", ["What is 9 + 2?", CORRECTION])]


def openclaw_env(tmp_path) -> dict[str, str]:
    state = tmp_path / "openclaw"
    (state / "home").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
    env.update(OPENCLAW_STATE_DIR=str(state), OPENCLAW_CONFIG_PATH=str(state / "openclaw.json"),
               HOME=str(state / "home"), NO_COLOR="1", PYTHON=sys.executable,
               PATH=f"{node_bin().parent}{os.pathsep}{env['PATH']}")
    return env


def say(env: dict[str, str], session: str, text: str) -> None:
    turn = subprocess.run([str(openclaw_bin()), "agent", "--local", "--session-id", session, "-m", text, "--json",
                           "--timeout", "500"], env=env, capture_output=True, text=True, timeout=600)
    assert turn.returncode == 0, turn.stderr[-3000:]
    assert parse_result(turn.stdout)["meta"].get("stopReason") not in (None, "error"), turn.stdout[-2000:]


def steps_allowed(status: dict) -> int:
    """The trainer's steps the stored turns allow: one per window of `SAMPLES_PER_STEP` stored turns, on those of
    them not held out (a window with none left is skipped), as the status page marks them."""
    held = {t["offset"]: t["held_out"] for t in status["scored_turns"]}
    windows = [range(w, w + SAMPLES_PER_STEP) for w in range(0, status["store"]["samples"] - SAMPLES_PER_STEP + 1,
                                                            SAMPLES_PER_STEP)]
    return sum(not all(held[offset] for offset in window) for window in windows)


def settle(run: LiveRun, scored: int, timeout_s: float = 900) -> dict:
    """Wait until ``scored`` turns are stored and the gate has decided every candidate they allow; the status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = run.status()
        store, trainer = status["store"], status["trainer"]
        steps = steps_allowed(status)
        if store["samples"] == scored and trainer["candidates"] == steps:
            return status
        assert store["samples"] <= scored and trainer["candidates"] <= steps, status
        assert run.proc.poll() is None, f"the live run exited:\n{run.log()[-4000:]}"
        assert time.monotonic() < deadline, (f"not settled in {timeout_s} s ({scored} turns scored, {steps} steps "
                                             f"checked expected): {store}, {trainer}\n{run.log()[-3000:]}")
        time.sleep(1.0)


def test_live_run_through_real_openclaw_promotes_a_trained_version_and_keeps_it_across_a_restart(
        tiny_smollm2_dir, tmp_path):
    from tests.integrations.test_openclaw_real import require_openclaw
    require_openclaw()
    env = openclaw_env(tmp_path)
    run_dir, port = tmp_path / "run", free_port()
    run = LiveRun(tiny_smollm2_dir, run_dir, port, tmp_path / "live.log", *GATE).start()
    served_while_answered = {}   # (session, turn index) -> the versions served before and after the answer was made
    try:
        log = run.log()
        assert "promotion gate on" in log and "serving weight version 0, trained on samples [0, 0)" in log
        command = re.search(r"INFO openclaw_jax\.train: (bash scripts/openclaw\.sh connect .*)$", log,
                            re.MULTILINE).group(1)
        connected = subprocess.run(command + " --max-tokens 8", shell=True, env=env, cwd=ROOT, capture_output=True,
                                   text=True, timeout=600)
        assert connected.returncode == 0, connected.stderr

        scored, served = 0, run.status()["served_version"]
        assert served == "0"
        for session, messages in SESSIONS:
            for index, text in enumerate(messages):
                say(env, session, text)
                scored += index > 0
                now = settle(run, scored)["served_version"]
                served_while_answered[(session, index)] = {served, now}
                served = now
        status = run.status()
        before = run.probe_at(served)
    finally:
        rc = run.stop()
    assert rc == 0, run.log()[-4000:]

    with SampleStore(run_dir / "samples", readonly=True) as store:
        samples = store.read(0)
    assert len(samples) == scored == 7
    assert "".join("H" if is_held_out(s.sample_id, 2) else "t" for s in samples) == "HHtHtHt"   # the seed's
    # OpenClaw's wrapper stripped: the judge read the person's words, and took the hint from them
    assert all(s.next_state["content"] == CORRECTION and s.reward == -1 and s.hints == [HINT] for s in samples)
    assert all(len(s.prompt_ids) > 1500 for s in samples)   # OpenClaw's own system prompt came with every turn

    # one candidate, checked on the three held-out turns before it, promoted with the numbers its rule read
    events = VersionLog(run_dir / "versions").events()
    assert [(e["event"], e["version"], e["served_version"]) for e in events] == [
        ("start", "0", "0"), ("promoted", "1", "1")], events
    check_decisions(events, min_score=-1e9, max_kl=1e9)
    check = events[1]["check"]
    assert check["replayed"] == check["with_signal"] == 3 and check["reward_term"] == 0
    assert check["score"] == check["teacher_term"] and np.isfinite(check["score"]) and 0 <= check["drift"] < 1e9
    assert served == "1"

    # OpenClaw's turns met the promoted version, and no version answered before it was served
    for s in samples:
        assert s.weight_version in served_while_answered[(s.session_id, s.turn_index)], (s.session_id, s.turn_index)
    assert [s.weight_version for s in samples[:4]] == ["0"] * 4 and [s.weight_version for s in samples[5:]] == ["1"] * 2

    # the status page's JSON shows the promotion and what is served; so does the summary
    assert status["served_version"] == "1" and status["kept_versions"] == ["0", "1"]
    assert status["trainer"] == {"last_step": 1, "candidates": 1, "promoted": 1, "refused": 0, "rollbacks": 0,
                                 "resets": 0, "gate": True}
    assert [(e["event"], e["version"], e.get("check")) for e in status["versions"]] == [
        ("promoted", "1", check), ("start", "0", None)]
    assert status["store"]["samples"] == 7 and status["store"]["held_out"] == 4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["served_version"] == "1"
    assert summary["versions"]["promoted"] == 1 and summary["end_step"] == 1

    # Ctrl-C and the same command: version 1 serves again, from its kept weights, with the same log-probs
    again = LiveRun(tiny_smollm2_dir, run_dir, port, tmp_path / "again.log", *GATE).start()
    try:
        assert "serving weight version 1, trained on samples [0, 4)" in again.log()
        assert again.status()["served_version"] == "1"
        after = again.probe()
    finally:
        assert again.stop() == 0, again.log()[-4000:]
    restarted = VersionLog(run_dir / "versions").events()[len(events):]
    assert [(e["event"], e["version"]) for e in restarted] == [("start", "1")]
    assert restarted[0]["reason"] == "the version served before the restart (kept weights)"
    assert json.loads((run_dir / "summary.json").read_text())["served_version"] == "1"
    assert after[0] == "1" and after[1] == before[1], (before, after)
    np.testing.assert_allclose(after[2], before[2], rtol=0, atol=1e-6)
