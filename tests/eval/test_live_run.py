"""The measured live run (`python -m openclaw_jax.eval.live_run`): a person who knows only OpenClaw's endpoint,
the real OpenClaw daemon, and the live config, here on a tiny random model with SmolLM2's tokenizer.

What is checked against sources the report does not compute: the live run's own sample store (every scored
turn is one of the person's answers that drew a reaction, from the person's conversations and none from the
held-out ones), its versions log, and the person's per-answer records."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter

import pytest

from openclaw_jax.envs.personas import persona_from_spec
from openclaw_jax.eval.live_run import report_markdown, served_at
from openclaw_jax.eval.person import PersonConfig
from openclaw_jax.samples import SampleStore
from openclaw_jax.serving.versions import VersionLog
from tests.e2e.test_live import ROOT


def test_eval_points_are_before_every_n_sessions_and_after():
    cfg = PersonConfig(agent_url="http://127.0.0.1:1/v1", out=ROOT, sessions=30, eval_every=12)
    assert cfg.eval_points() == [0, 12, 24, 30]
    assert PersonConfig(agent_url="http://127.0.0.1:1/v1", out=ROOT, sessions=24, eval_every=12).eval_points() == \
        [0, 12, 24]
    assert PersonConfig(agent_url="http://127.0.0.1:1/v1", out=ROOT, sessions=5, eval_every=0).eval_points() == [0, 5]
    with pytest.raises(ValueError, match="--sessions=0"):
        PersonConfig(agent_url="http://127.0.0.1:1/v1", out=ROOT, sessions=0)
    with pytest.raises(ValueError, match="OpenClaw's endpoint"):
        PersonConfig(agent_url="127.0.0.1:1", out=ROOT)


def test_served_at_follows_the_versions_log():
    events = [{"time": 10.0, "event": "start", "served_version": "0"},
              {"time": 20.0, "event": "refused", "served_version": "0"},
              {"time": 30.0, "event": "promoted", "served_version": "2"},
              {"time": 40.0, "event": "rollback", "served_version": "0"}]
    assert [served_at(events, t) for t in (5, 10, 25, 30, 35, 45)] == [None, "0", "0", "2", "2", "0"]


@pytest.mark.slow
def test_a_person_through_openclaw_only_is_measured_against_the_live_run(tiny_smollm2_dir, tmp_path):
    from tests.integrations.test_openclaw_real import require_openclaw
    require_openclaw()
    out = tmp_path / "measure"
    persona = "concise:max_chars=60,correct=true"
    cmd = [sys.executable, "-m", "openclaw_jax.eval.live_run", "--out", str(out), "--max-tokens", "8",
           "--persona", persona, "--sessions", "2", "--eval-every", "0", "--heldout", "2", "--concurrency", "1",
           "--", f"model.path={tiny_smollm2_dir}", "trainer.samples_per_step=2", "gate.holdout_every=2",
           "gate.min_replay=1"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:] + (out / "train.log").read_text()[-3000:]
    report = json.loads((out / "report.json").read_text())
    sessions = [json.loads(line) for line in (out / "person" / "sessions.jsonl").read_text().splitlines()]
    assert [s["session"] for s in sessions] == [1, 2] and not any(s["error"] for s in sessions)

    # every answer the person reacted to is a scored turn of the live run, from the person's conversations only
    with SampleStore(out / "run" / "samples", readonly=True) as store:
        samples = store.read(0)
    assert len(samples) == sum(s["answers"] for s in sessions) == report["store"]["samples"]
    # OpenClaw's own session table: the person's conversation (the request's `user`) -> OpenClaw's session id
    db = out / "openclaw" / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        table = dict(conn.execute("select session_key, current_session_id from session_nodes"))
    person = {name: [sid for key, sid in table.items() if key.endswith(name)] for name in (s["name"] for s in sessions)}
    assert all(len(ids) == 1 for ids in person.values()), table
    heldout = {sid for key, sid in table.items() if "heldout-" in key}
    assert len(heldout) == 2 * 2, table   # two evaluations of two questions, each its own conversation
    per_session = Counter(s.session_id for s in samples)
    assert per_session == {person[s["name"]][0]: s["answers"] for s in sessions}
    assert not heldout & set(per_session)
    assert sum(s.reward == -1 for s in samples) == sum(s["corrections"] for s in sessions)

    # the held-out answers, graded again by the person's rule, give the report's numbers
    rule = persona_from_spec(persona)
    for evaluation, name in ((report["before"], "after_0_sessions"), (report["after"], "after_2_sessions")):
        answers = [json.loads(line) for line in (out / "person" / "heldout" / f"{name}.jsonl").read_text().splitlines()]
        assert len(answers) == 2
        verdicts = [rule.check(a["answer"], a["question"], finish_reason=a["finish_reason"],
                               reference=a["reference"]).satisfied for a in answers]
        assert evaluation["preference"] == sum(verdicts) / 2

    # the versions the status page reported are the versions log's; the served one at each evaluation too
    events = VersionLog(out / "run" / "versions").events()
    decided = [e for e in events if e["event"] in ("promoted", "refused") and e["time"] <= report["status_time"]]
    assert [(v["event"], v["version"]) for v in report["versions"]] == [(e["event"], e["version"]) for e in decided]
    assert report["trainer"]["promoted"] == sum(e["event"] == "promoted" for e in decided)
    assert report["before"]["served_version"] == "0"
    assert report_markdown(report) in done.stdout
