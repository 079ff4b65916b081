"""A household run: `env.people` simulates two people at once through the gateway (docs/household.md).

A real `python -m openclaw_jax.train` on configs/tiny_cpu.yaml with two people who want opposite things
(alice: answers that begin with "Sure"; bob: answers that begin with "No") and per-person adapters. Each
person's requests name them, so every stored sample belongs to one of them and carries only that person's
corrections; each person's held-out answers are graded by their own rule (checked here against the answer
texts, not the code's verdicts), and the run's records, summary and TensorBoard break the numbers down by
person.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_jax.configlib import ConfigError
from openclaw_jax.envs.config import EnvConfig
from openclaw_jax.samples import SampleStore
from tests.helpers.tb_events import read_event_tags

ROOT = Path(__file__).resolve().parents[2]
PREFIX = {"alice": "Sure", "bob": "No"}


def test_people_entries_are_checked():
    with pytest.raises(ConfigError, match="person_id=persona spec"):
        EnvConfig(people=("alice",))
    with pytest.raises(ConfigError, match="names a person twice"):
        EnvConfig(people=("alice=concise", "alice=keyword"))
    with pytest.raises(ConfigError, match="is not a person id"):
        EnvConfig(people=("al ice=concise",))
    with pytest.raises(ConfigError, match="env.client=openai"):
        EnvConfig(people=("alice=concise",), client="openclaw")


def _own_fraction(path: Path, prefix: str) -> float:
    answers = [json.loads(line) for line in path.read_text().splitlines()]
    assert answers and all(a["satisfied"] == a["answer"].lstrip().startswith(prefix) for a in answers), answers
    return sum(a["answer"].lstrip().startswith(prefix) for a in answers) / len(answers)


@pytest.mark.slow
def test_two_people_train_their_own_adapters_and_are_measured_apart(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", str(ROOT / "configs/tiny_cpu.yaml"),
           f"run_dir={run_dir}", "progress=false", "trainer.max_steps=2", "trainer.checkpoint_every=0",
           "trainer.personalize=per_person", "model.lora.enabled=true", "model.lora.rank=4", "gate.enabled=false",
           "env.eval_every=1", "env.heldout_questions=4",
           f"env.people=[alice=starts_with:prefix={PREFIX['alice']}, bob=starts_with:prefix={PREFIX['bob']}]"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]

    with SampleStore(run_dir / "samples", readonly=True) as store:
        samples = list(store.read(0, store.refresh()))
    assert {s.person for s in samples} == {"alice", "bob"}
    for s in samples:   # a person's corrections ask for their own prefix only
        other = PREFIX["bob" if s.person == "alice" else "alice"]
        assert all(f'"{other}"' not in h for h in s.hints), (s.person, s.hints)
    hinted = {s.person for s in samples if any(f'"{PREFIX[s.person]}"' in h for h in s.hints)}
    assert hinted, "no sample carries its person's correction"

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["end_step"] == 2 and set(summary["people"]) == {"alice", "bob"}
    evals = summary["preference"]
    assert [e["step"] for e in evals] == [0, 1, 2]
    for e in evals:
        own = {p: _own_fraction(run_dir / "people" / p / "heldout" / f"step_{e['step']}.jsonl", PREFIX[p])
               for p in PREFIX}
        assert {p: e["people"][p]["preference_score"] for p in PREFIX} == pytest.approx(own)
        assert e["preference_score"] == pytest.approx(sum(own.values()) / 2)
    for p in PREFIX:
        sessions = [json.loads(line) for line in (run_dir / "people" / p / "sessions.jsonl").read_text().splitlines()]
        assert [r["session"] for r in sessions] == list(range(1, len(sessions) + 1))
        assert summary["people"][p]["sessions"] == len(sessions) == evals[-1]["people"][p]["sessions"]
    assert summary["sessions"] == sum(summary["people"][p]["sessions"] for p in PREFIX)

    tags = set(read_event_tags(run_dir / "tb"))
    for p in PREFIX:
        assert {f"people/{p}/eval/preference_score", f"people/{p}/sessions/satisfied", f"people/{p}/samples"} <= tags
    assert "eval/preference_score" in tags
