"""The learning table through the real OpenClaw (npm `openclaw@2026.9.6`, our plugin on): one command,
`python -m openclaw_jax.eval.learning`, runs the memory baseline and a training method on the same seed
and budget, each a real `python -m openclaw_jax.train` run of `configs/openclaw_cpu.yaml` (a tiny random
model with SmolLM2's tokenizer stands in for SmolLM2), and writes the table.

Checked against what the run's own gateway stored: each recorded session's verdict (the person's rule)
agrees with the judge's rewards for those sessions, the measure is in the run's records and TensorBoard,
and with memory the person's corrections reach OpenClaw's USER.md and, from there, the prompts OpenClaw
sends in later sessions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_jax.envs.memory import NOTES_FILE, NOTES_HEADER, hint_sentences
from openclaw_jax.envs.sessions import METRIC_SESSION_SATISFIED, sessions_to_stable
from openclaw_jax.models.tokenizer import smollm2_tokenizer
from openclaw_jax.samples import SampleStore
from tests.helpers.tb_events import read_event_tags
from tests.integrations.test_openclaw_real import require_openclaw

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table(tiny_smollm2_dir, tmp_path_factory):
    require_openclaw()
    out = tmp_path_factory.mktemp("learning")
    cmd = [sys.executable, "-m", "openclaw_jax.eval.learning", "--persona", "arith=configs/openclaw_cpu.yaml",
           "--methods", "memory,combine", "--seeds", "1", "--out", str(out),
           f"model.path={tiny_smollm2_dir}", "model.remat=false", "gateway.port=0",
           # 3 samples a step, 2 steps: at least two rounds of 2 sessions (a round gives at most 4 samples), so
           # the second round starts after the first one's corrections were written down
           "trainer.samples_per_step=3", "trainer.max_steps=2", "env.concurrency=2", "env.max_tokens=8",
           "env.heldout_questions=2", "env.eval_concurrency=2", "env.eval_every=0", "trainer.checkpoint_every=0"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:] + "".join(
        p.read_text()[-3000:] for p in out.glob("arith/*/seed0.log"))
    return out


def _samples(run: Path):
    with SampleStore(run / "samples", readonly=True) as store:
        return store.read(0)


@pytest.mark.parametrize("method", ["memory", "combine"])
def test_every_run_records_the_persons_sessions_and_the_measure(table, method):
    run = table / "arith" / method / "seed0"
    records = [json.loads(line) for line in (run / "sessions.jsonl").read_text().splitlines()]
    assert [r["session"] for r in records] == list(range(1, len(records) + 1)) and len(records) >= 2
    for r in records:
        assert r["error"] is None and r["answers"] >= 1
        assert r["satisfied"] == (r["corrections"] == 0)
    satisfied = [r["satisfied"] for r in records]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sessions"] == len(records) and summary["sessions_to_stable"] == sessions_to_stable(satisfied)
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 2
    assert evals[-1]["sessions"] <= len(records) and "sessions_to_stable" in evals[-1]
    tb = read_event_tags(run / "tb")
    assert [step for step, _ in tb[METRIC_SESSION_SATISFIED]] == list(range(1, len(records) + 1))
    assert [v.simple_value for _, v in tb[METRIC_SESSION_SATISFIED]] == [float(s) for s in satisfied]
    # The person's verdicts and the judge's rewards read the same reactions: every correction the sessions
    # recorded is a -1 sample of the store, every satisfied answer a +1 (sessions cut off at the end of the
    # run may add samples of their own).
    rewards = [s.reward for s in _samples(run)]
    assert sum(r["corrections"] for r in records) <= rewards.count(-1.0)
    assert sum(r["answers"] - r["corrections"] for r in records) <= rewards.count(1.0)
    assert (run / "heldout" / "step_0.jsonl").is_file()


def test_memory_keeps_the_corrections_in_openclaws_user_md_and_openclaw_shows_them(table):
    run = table / "arith" / "memory" / "seed0"
    samples = _samples(run)
    notes = (run / "openclaw" / "workspace" / NOTES_FILE).read_text().splitlines()
    assert notes[0] == NOTES_HEADER and len(notes) >= 2
    given = {s for sample in samples for h in sample.hints for s in hint_sentences(h)}
    assert set(notes[1:]) <= given   # every note is a sentence of a hint the judge accepted
    assert not (run / "export").exists()   # nothing trained, nothing exported
    # OpenClaw put the notes into the system prompt of the sessions that started after they were written
    tok = smollm2_tokenizer()
    with_notes = [s for s in samples if NOTES_HEADER in tok.decode(s.prompt_ids)]
    assert with_notes and len(with_notes) < len(samples)   # the first round had no notes yet


def test_the_table_has_both_methods_on_the_same_seed(table):
    rows = {r["method"]: r for r in json.loads((table / "learning.json").read_text())["rows"]}
    assert set(rows) == {"memory", "combine"}
    for row in rows.values():
        assert row["seeds"] == [0] and len(row["runs"]) == 1
    md = (table / "learning.md").read_text()
    assert "| arith | memory |" in md and "| arith | combine |" in md
