"""Run-directory helpers used by the notebooks (`openclaw_jax.notebook.run_inspection`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from openclaw_jax.samples import Sample, SampleStore
from openclaw_jax.notebook import run_inspection as ri

REPO = Path(__file__).resolve().parents[2]


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(REPO / "configs" / "tiny_cpu.yaml", run / "config.yaml")   # samples_per_step 4
    return run


def _sample(kind: str, reward: float, hints=()) -> Sample:
    return Sample(session_id="s", turn_index=0, kind=kind, reward=reward, prompt_ids=[1, 2], response_ids=[3],
                  rollout_logprobs=[-0.5], hints=list(hints), hint_prompt_ids=[[1, 2, 9]] * len(hints))


def test_run_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv(ri.RUN_DIR_ENV, str(tmp_path / "a"))
    assert ri.run_dir_from_env(tmp_path / "b") == (tmp_path / "a").resolve()
    monkeypatch.delenv(ri.RUN_DIR_ENV)
    assert ri.run_dir_from_env(tmp_path / "b") == (tmp_path / "b").resolve()
    assert ri.run_dir_from_env() == REPO / "runs" / "notebook_tiny"


def test_ensure_run_never_starts_a_run_into_an_existing_one(tmp_path):
    run = _run_dir(tmp_path)
    assert ri.ensure_run(run) == run.resolve()
    assert not (run / "train.log").exists()   # nothing was launched
    assert not ri.is_complete_run(run)


def test_load_config_points_at_the_run_where_it_is_now(tmp_path):
    run = _run_dir(tmp_path)
    cfg = ri.load_config(run)
    assert cfg.run_dir == str(run.resolve())
    assert cfg.trainer.samples_per_step == 4
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        ri.load_config(tmp_path)


def test_step_window_from_steps_jsonl(tmp_path):
    run = _run_dir(tmp_path)
    # Step 1 trained [0, 4); the next window [4, 8) was dropped (logged with the same step); step 2 trained [8, 12).
    lines = [{"step": 1, "start_offset": 0, "end_offset": 4}, {"step": 1, "start_offset": 4, "end_offset": 8},
             {"step": 2, "start_offset": 8, "end_offset": 12}]
    (run / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3, "sta')
    assert ri.step_window(run, 1) == (0, 4)
    assert ri.step_window(run, 2) == (8, 12)
    assert ri.step_window(run, 3) == (8, 12)   # torn line ignored; falls back to (3-1)*4
    with pytest.raises(ValueError, match="start at 1"):
        ri.step_window(run, 0)


def test_step_window_without_steps_jsonl_assumes_full_batches(tmp_path):
    run = _run_dir(tmp_path)
    assert ri.step_window(run, 1) == (0, 4)
    assert ri.step_window(run, 5) == (16, 20)


def test_load_samples_and_case_counts(tmp_path):
    run = _run_dir(tmp_path)
    samples = [_sample("opd+rl", -1, ["Begin with Sure."]), _sample("rl", 1), _sample("opd", 0, ["Be brief!!"]),
               _sample("rl", 1), _sample("opd+rl", 1, ["Use metric units."])]
    with SampleStore(run / "samples") as store:
        for s in samples:
            store.append(s)
    loaded = ri.load_samples(run)
    assert [s.sample_id for s in loaded] == [s.sample_id for s in samples]
    assert [s.sample_id for s in ri.load_samples(run, 1, 3)] == [samples[1].sample_id, samples[2].sample_id]
    counts = ri.case_counts(loaded)
    assert {k: dict(v) for k, v in counts.items()} == {"opd+rl": {-1.0: 1, 1.0: 1}, "rl": {1.0: 2}, "opd": {0.0: 1}}


def test_latest_export_is_the_highest_step(tmp_path):
    run = _run_dir(tmp_path)
    assert ri.latest_export(run) is None
    for step in (2, 10, 9):
        (run / "export" / f"step_{step}").mkdir(parents=True)
        (run / "export" / f"step_{step}" / "config.json").write_text("{}")
    (run / "export" / "step_11").mkdir()   # unfinished: no config.json yet
    assert ri.latest_export(run).name == "step_10"


def test_markdown_table_escapes_and_shortens():
    table = ri.markdown_table(["a", "b"], [["x|y", "line1\nline2"], ["z" * 10, 3]], max_cell=5)
    assert table.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | line… |", "| zzzz… | 3 |"]


def test_read_jsonl_missing_file(tmp_path):
    assert ri.read_jsonl(tmp_path / "nope.jsonl") == []
