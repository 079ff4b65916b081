"""`python -m openclaw_jax.eval.agentic_table`: the per-condition commands, and the table from run directories.

* The commands: each condition's overrides, checked on the config they load to (base: no warm-up and
  no step, whatever the user's `trainer.max_steps`; rl: no PRM; rl_prm: PRM), and the bad arguments.
* The table from hand-written runs (eval.jsonl + summary.json as `python -m openclaw_jax.train` writes
  them; a resumed run's duplicate step, an unfinished run, a missing environment), every number
  derived by hand below.
* A real table (slow): the `base` and `rl` runs of seed 0 trained for real on the `easy` environment
  with the tiny random model (base evaluates it untouched; rl warms it up until it answers, then one
  GRPO step), next to hand-written runs of the other cells, which are reused, not retrained; the
  table's means combine both. (A real run per condition and seed takes ~95 s on 2 cores with a cold
  compile cache; these two take ~65 s.) Then the `rl` run's warm-up cache is copied for an rl_prm run.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from openclaw_jax.config import load_experiment_config
from openclaw_jax.eval import agentic_table as T

ROOT = Path(__file__).resolve().parents[2]
TERMINAL, SWE, TINY = "configs/terminal_cpu.yaml", "configs/swe_cpu.yaml", "configs/tiny_cpu.yaml"


def _write_run(out: Path, config: str, condition: str, seed: int, evals, *, wall=None, resumed=False,
               finished=True, duplicate=None) -> Path:
    """A run directory as the trainer leaves it: eval.jsonl (one line per evaluation; `duplicate`: an
    earlier record of a step, as a resumed run appends) and, when finished, summary.json."""
    run = T.run_dir_for(out, config, condition, seed)
    run.mkdir(parents=True)
    lines = [] if duplicate is None else [duplicate]
    for step, value, *family in evals:
        lines.append({"step": step, "heldout_success": value, "n": 20, "per_family": family[0] if family else {},
                      "eval_s": 5.0, "time_s": 100.0 * (step + 1)})
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if finished:
        (run / "summary.json").write_text(json.dumps({"resumed": resumed, "interrupted": False, "wall_time_s": wall,
                                                      "heldout": lines[-1:], "end_step": evals[-1][0]}))
    return run


# ----------------------------------------------------------------------------- commands


@pytest.mark.parametrize("condition, max_steps, warmup, prm", [("base", 0, 0, False), ("rl", 5, 6, False),
                                                                ("rl_prm", 5, 6, True)])
def test_each_condition_loads_to_its_config(tmp_path, condition, max_steps, warmup, prm):
    run_dir = T.run_dir_for(tmp_path, TERMINAL, condition, 3)
    assert run_dir == tmp_path / "terminal_cpu" / condition / "seed3"
    cmd = T.train_command(TERMINAL, condition, 3, run_dir, ["trainer.max_steps=5"])
    assert cmd[1:5] == ["-m", "openclaw_jax.train", "--config", TERMINAL]
    # rl and rl_prm say which they are; base trains nothing, so PRM is the config's (off)
    expected = set() if condition == "base" else {f"agentic.prm={str(prm).lower()}"}
    assert {"agentic.prm=true", "agentic.prm=false"} & set(cmd) == expected
    cfg = load_experiment_config([str(ROOT / TERMINAL)], cmd[5:])
    assert (cfg.trainer.max_steps, cfg.agentic.warmup_steps, cfg.agentic.prm) == (max_steps, warmup, prm)
    assert (cfg.seed, cfg.agentic.seed, cfg.run_dir) == (3, 3, str(run_dir))
    assert (cfg.trainer.checkpoint_every, cfg.trainer.keep_checkpoints, cfg.progress) == (0, 1, False)


def test_dry_run_lists_every_run_seed_major_with_overrides_after_the_options(capsys, tmp_path):
    assert T.main(["--configs", TERMINAL, SWE, "--seeds", "0", "1", "trainer.max_steps=4", "--out", str(tmp_path),
                   "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = [(s, c, cond) for s in (0, 1) for c in ("terminal_cpu", "swe_cpu") for cond in T.CONDITIONS]
    assert len(lines) == 12
    for line, (seed, name, cond) in zip(lines, expected):
        assert f"run_dir={tmp_path}/{name}/{cond}/seed{seed} seed={seed} agentic.seed={seed}" in line
        assert "trainer.max_steps=4" in line
    assert T.main(["--configs", TERMINAL, "--out", str(tmp_path), "--dry-run", "--jobs", "2",
                   "--conditions", "rl"]) == 0
    assert capsys.readouterr().out.strip().endswith("policy.port=0 agentic.prm=false")


@pytest.mark.parametrize("argv, message", [
    (["--conditions", "base,bogus"], "unknown ['bogus']"),
    (["agentic.prm=true"], "'agentic.prm=true' is set per run"),
    (["--jobs", "0"], "--jobs 0 must be >= 1"),
    (["--seeds", "1", "1"], "a seed is repeated"),
    (["--configs", "configs/cpu_demo.yaml"], "is not an agentic config"),
    (["--configs", "configs/nope.yaml"], "configs/nope.yaml is not a file"),
    (["--configs", TERMINAL, "elsewhere/terminal_cpu.yaml"], "share a file name"),
    (["trainer.bogus=1"], "unknown config key trainer.bogus"),
])
def test_bad_arguments_exit_2_naming_the_value(argv, message, tmp_path, capsys):
    base = [] if "--configs" in argv else ["--configs", TERMINAL]
    assert T.main([*base, "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "agentic_table.md").exists()


# ----------------------------------------------------------------------------- the table from hand-written runs


def _hand_written(out: Path) -> None:
    _write_run(out, TERMINAL, "base", 0, [(0, 0.0)], wall=60.0)
    _write_run(out, TERMINAL, "base", 1, [(0, 0.1)], wall=80.0)
    # seed 0 was resumed: its step 3 appears twice, the later record (0.6) counts
    _write_run(out, TERMINAL, "rl", 0, [(0, 0.45), (3, 0.6), (6, 0.3, {"count": 0.25, "max": 0.5})], wall=1000.0,
               resumed=True, duplicate={"step": 3, "heldout_success": 0.1, "n": 20})
    _write_run(out, TERMINAL, "rl", 1, [(0, 0.35), (3, 0.35), (6, 0.5, {"count": 0.75, "max": 0.25})], wall=1200.0)
    _write_run(out, TERMINAL, "rl_prm", 0, [(0, 0.45), (3, 0.7), (6, 0.7)], wall=1300.0)
    # seed 1 stopped after step 3 (no summary.json): its wall time is its last evaluation's time_s (400 s)
    _write_run(out, TERMINAL, "rl_prm", 1, [(0, 0.30), (3, 0.2)], finished=False)


def test_collect_only_table_from_hand_written_runs(tmp_path, capsys):
    _hand_written(tmp_path)
    assert T.main(["--configs", TERMINAL, SWE, "--seeds", "0", "1", "--out", str(tmp_path), "--collect-only"]) == 0
    data = json.loads((tmp_path / "agentic_table.json").read_text())
    terminal, swe = data["rows"]
    c = terminal["cells"]
    assert c["base"]["mean"] == pytest.approx(0.05)                              # (0.0 + 0.1) / 2
    assert c["warmup"]["mean"] == pytest.approx(0.40)                            # rl step 0: (0.45 + 0.35) / 2
    assert c["rl_final"]["mean"] == pytest.approx(0.40)                          # (0.3 + 0.5) / 2
    assert c["rl_best"]["mean"] == pytest.approx(0.55)                           # (0.6 @3 + 0.5 @6) / 2
    assert [c["rl_best"]["per_seed"][s]["step"] for s in ("0", "1")] == [3, 6]
    assert c["rl_prm_final"]["mean"] == pytest.approx(0.45)                      # (0.7 @6 + 0.2 @3) / 2
    assert c["rl_prm_best"]["mean"] == pytest.approx(0.50)                       # (0.7 @3, the earlier tie + 0.3 @0) / 2
    assert [c["rl_prm_best"]["per_seed"][s]["step"] for s in ("0", "1")] == [3, 0]
    assert c["rl_final"]["per_family"] == pytest.approx({"count": 0.5, "max": 0.375})
    wall = terminal["wall_time_s"]
    assert [wall[k]["mean"] for k in T.CONDITIONS] == pytest.approx([70.0, 1100.0, 850.0])   # rl_prm: (1300 + 400) / 2
    assert terminal["warmup_disagree"] == {"1": {"rl": 0.35, "rl_prm": 0.30}}
    assert swe["cells"]["base"]["mean"] is None and swe["n_heldout"] is None

    md = (tmp_path / "agentic_table.md").read_text()
    assert capsys.readouterr().out == md
    assert ("| terminal, 20 held-out tasks (`configs/terminal_cpu.yaml`) | 0.050 [0.000, 0.100] | 0.400 [0.450, 0.350] "
            "| 0.400 [0.300 @6, 0.500 @6] | 0.550 [0.600 @3, 0.500 @6] | 0.450 [0.700 @6, 0.200 @3] "
            "| 0.500 [0.700 @3, 0.300 @0] | base 1 min 10 s, RL 18 min 20 s, RL+PRM 14 min 10 s |") in md
    assert "| swe (`configs/swe_cpu.yaml`) | n/a [—, —] |" in md
    assert f"`{tmp_path}/terminal_cpu/rl_prm/seed1` has not finished (last evaluation at step 3)" in md
    assert f"`{tmp_path}/terminal_cpu/rl/seed0` was resumed" in md
    assert "terminal_cpu seed 1: step 0 of rl (0.350) and rl_prm (0.300) differ" in md
    assert f"no evaluation in `{tmp_path}/swe_cpu/base/seed0` (no such run)" in md
    assert "seed0: not started by this command (no command.txt)\n" in md and "the rl_prm run's step 0" not in md


def test_without_rl_the_warm_up_column_reads_rl_prm(tmp_path, capsys):
    _hand_written(tmp_path)
    assert T.main(["--configs", TERMINAL, "--seeds", "0", "1", "--out", str(tmp_path), "--collect-only",
                   "--conditions", "rl_prm"]) == 0
    row = json.loads((tmp_path / "agentic_table.json").read_text())["rows"][0]
    assert row["warmup_from"] == "rl_prm" and row["cells"]["warmup"]["mean"] == pytest.approx(0.375)  # (0.45 + 0.30) / 2
    header = capsys.readouterr().out.splitlines()[2]
    assert header == ("| environment | after warm-up (step 0) | RL + PRM: final | RL + PRM: best | "
                      "wall time per run |")
    assert "terminal_cpu: after warm-up is the rl_prm run's step 0 (no rl run)" in (tmp_path / "agentic_table.md").read_text()


def test_unfinished_run_restarts_clean_unless_it_has_a_checkpoint(tmp_path):
    killed = _write_run(tmp_path, TERMINAL, "rl", 0, [(0, 0.5)], finished=False)
    (killed / "samples").mkdir()
    (killed / "warmup").mkdir()
    (killed / "warmup" / "config.json").write_text("{}")
    T.prepare_run_dir(killed, "rl", None)
    assert sorted(p.name for p in killed.iterdir()) == ["warmup"]       # the warm-up cache is kept
    interrupted = _write_run(tmp_path, TERMINAL, "rl", 1, [(0, 0.5)], finished=False)
    (interrupted / "ckpt" / "3").mkdir(parents=True)
    T.prepare_run_dir(interrupted, "rl", None)
    assert (interrupted / "eval.jsonl").is_file() and (interrupted / "ckpt" / "3").is_dir()   # resumes


def test_rl_prm_waits_for_its_rl_run_with_several_jobs(tmp_path, monkeypatch):
    spans, lock = {}, threading.Lock()

    def fake_run(config, condition, seed, out, overrides, **kw):
        t0 = time.monotonic()
        time.sleep(0.3 if condition == "rl" else 0.05)
        _write_run(out, config, condition, seed, [(0, 0.5)], wall=1.0)
        with lock:
            spans[(condition, seed)] = (t0, time.monotonic())

    monkeypatch.setattr(T, "run_one", fake_run)
    assert T.main(["--configs", TERMINAL, "--seeds", "0", "1", "--out", str(tmp_path), "--jobs", "3"]) == 0
    assert len(spans) == 6
    for seed in (0, 1):
        assert spans[("rl_prm", seed)][0] >= spans[("rl", seed)][1]
    spans.clear()
    assert T.main(["--configs", TERMINAL, "--seeds", "0", "1", "--out", str(tmp_path)]) == 0
    assert spans == {}   # every run finished: reused


# ----------------------------------------------------------------------------- a real table


TINY_EASY = ["agentic.enabled=true", "agentic.env=easy", "env.enabled=false", "loss.name=rl",
             "trainer.rl_only_teacher=none", "trainer.samples_per_step=4", "agentic.group_size=2",
             "agentic.max_turns=1", "agentic.max_new_tokens=4", "agentic.heldout_tasks=4", "agentic.all_equal=zero",
             "agentic.backlog=4", "trainer.max_steps=1", "agentic.warmup_steps=10", "agentic.warmup_lr=3e-2",
             "agentic.warmup_examples=4", "agentic.warmup_batch_size=2"]


@pytest.mark.slow
def test_real_base_and_rl_runs_in_the_table(tmp_path):
    out = tmp_path / "table"
    # hand-written: seed 1 of base and rl, both seeds of rl_prm (finished, so reused)
    _write_run(out, TINY, "base", 1, [(0, 0.25)], wall=10.0)
    _write_run(out, TINY, "rl", 1, [(0, 0.5), (1, 0.75)], wall=30.0)
    _write_run(out, TINY, "rl_prm", 0, [(0, 1.0), (1, 0.5)], wall=40.0)
    _write_run(out, TINY, "rl_prm", 1, [(0, 0.5), (1, 1.0)], wall=50.0)
    t0 = time.monotonic()
    assert T.main(["--configs", str(ROOT / TINY), "--seeds", "0", "1", "--out", str(out), *TINY_EASY]) == 0
    elapsed = time.monotonic() - t0

    base_dir, rl_dir = T.run_dir_for(out, TINY, "base", 0), T.run_dir_for(out, TINY, "rl", 0)
    base = [json.loads(x) for x in (base_dir / "eval.jsonl").read_text().splitlines()]
    rl = [json.loads(x) for x in (rl_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in base] == [0] and [r["step"] for r in rl] == [0, 1]
    # base skipped the warm-up and trained nothing; rl's warm-up taught the reply the easy tasks want
    assert not (base_dir / "warmup").exists() and json.loads((base_dir / "summary.json").read_text())["end_step"] == 0
    assert base[0]["heldout_success"] < rl[0]["heldout_success"]
    assert (rl_dir / "warmup" / "config.json").is_file()
    for d in (base_dir, rl_dir):   # one checkpoint, then pruned; the log and the command stay
        assert not (d / "ckpt").exists() and not (d / "export").exists() and (d / "train.log").stat().st_size > 0
    assert "agentic.prm=false" in (rl_dir / "command.txt").read_text()

    row = json.loads((out / "agentic_table.json").read_text())["rows"][0]
    b0, w0, f0 = base[0]["heldout_success"], rl[0]["heldout_success"], rl[-1]["heldout_success"]
    best0 = max(rl, key=lambda r: (r["heldout_success"], -r["step"]))
    c = row["cells"]
    assert row["env"] == "easy" and row["n_heldout"] == 4
    assert c["base"]["mean"] == pytest.approx((b0 + 0.25) / 2)
    assert c["warmup"]["mean"] == pytest.approx((w0 + 0.5) / 2)
    assert c["rl_final"]["mean"] == pytest.approx((f0 + 0.75) / 2)
    assert c["rl_best"]["mean"] == pytest.approx((best0["heldout_success"] + 0.75) / 2)
    assert c["rl_best"]["per_seed"]["0"]["step"] == best0["step"]
    assert (c["rl_prm_final"]["mean"], c["rl_prm_best"]["mean"]) == (0.75, 1.0)   # (0.5 + 1.0) / 2, (1.0 @0 + 1.0 @1) / 2
    assert [c["rl_prm_best"]["per_seed"][s]["step"] for s in ("0", "1")] == [0, 1]
    wall = json.loads((base_dir / "summary.json").read_text())["wall_time_s"]
    assert row["wall_time_s"]["base"]["mean"] == pytest.approx((wall + 10.0) / 2)
    md = (out / "agentic_table.md").read_text()
    assert f"| {(b0 + 0.25) / 2:.3f} [{b0:.3f}, 0.250] | {(w0 + 0.5) / 2:.3f} [{w0:.3f}, 0.500] |" in md
    assert (base_dir / "command.txt").read_text().strip() in md and "agentic.warmup_steps=0 trainer.max_steps=0" in md
    print(f"two real tiny runs and the table: {elapsed:.0f} s")

    # an rl_prm run of seed 0 would start from a copy of the rl run's warm-up
    prm_dir = tmp_path / "prm"
    done = T.prepare_run_dir(prm_dir, "rl_prm", rl_dir)
    assert done and done[0].startswith("cp -r ")
    files = sorted(p.relative_to(rl_dir / "warmup") for p in (rl_dir / "warmup").rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(prm_dir / "warmup") for p in (prm_dir / "warmup").rglob("*")
                                     if p.is_file())
    assert all((rl_dir / "warmup" / f).read_bytes() == (prm_dir / "warmup" / f).read_bytes() for f in files)
