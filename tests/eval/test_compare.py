"""`python -m openclaw_jax.eval.compare`: the per-run commands, and the table/plot from finished runs.

The runs are written by hand (eval.jsonl + summary.json, as `python -m openclaw_jax.train` writes
them), so every number in the table has a hand-computed expected value; a finished run is reused,
not retrained.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from openclaw_jax.eval import compare as C

# method -> seed -> [(step, preference, accuracy)]
RUNS = {
    "combine": {0: [(0, 0.25, 0.5), (2, 1.0, 0.75)], 1: [(0, 0.5, 0.5), (2, 0.5, 0.25)]},
    "rl": {0: [(0, 0.25, 0.5), (2, 0.25, 0.5)], 1: [(0, 0.5, 0.5), (2, 0.75, None)]},
}


def _write_runs(out):
    for method, by_seed in RUNS.items():
        for seed, records in by_seed.items():
            run = C.run_dir_for(out, method, seed)
            run.mkdir(parents=True)
            lines = [json.dumps({"step": s, "preference_score": p, "accuracy": a, "time_s": 1.0}) for s, p, a in records]
            (run / "eval.jsonl").write_text("\n".join(lines) + "\n")
            (run / "summary.json").write_text(json.dumps({"interrupted": False, "preference": [{}]}))


def test_dry_run_same_budget_per_method_and_seed(capsys, tmp_path):
    assert C.main(["--config", "configs/cpu_demo.yaml", "--methods", "combine,rl", "--seeds", "2", "--out",
                   str(tmp_path), "--dry-run", "trainer.max_steps=4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    for line, (seed, method) in zip(lines, [(0, "combine"), (0, "rl"), (1, "combine"), (1, "rl")]):
        assert f"seed={seed} env.seed={seed} loss.name={method}" in line
        assert line.endswith("trainer.max_steps=4") and f"run_dir={tmp_path}/{method}/seed{seed}" in line


def test_concurrent_runs_bind_their_own_gateway_ports(capsys, tmp_path):
    argv = ["--config", "configs/cpu_demo.yaml", "--methods", "combine,rl", "--seeds", "1", "--out", str(tmp_path),
            "--dry-run"]
    assert C.main([*argv, "--jobs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.endswith("gateway.port=0") for line in lines)
    assert C.main([*argv, "--jobs", "2", "gateway.port=9123"]) == 0  # the user's own port choice stays
    assert all(line.endswith("gateway.port=9123") for line in capsys.readouterr().out.splitlines())
    assert C.main(argv) == 0  # one at a time: the config's port
    assert not any("gateway.port" in line for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("argv", [["--methods", "combine,bogus"], ["--seeds", "0"], ["loss.name=rl"],
                                  ["--jobs", "0"]])
def test_bad_arguments_exit_2(argv, tmp_path):
    assert C.main(["--config", "configs/cpu_demo.yaml", "--out", str(tmp_path), *argv]) == 2


def test_table_and_plot_from_finished_runs(tmp_path):
    _write_runs(tmp_path)
    assert C.main(["--config", "configs/cpu_demo.yaml", "--methods", "combine,rl", "--seeds", "2",
                   "--out", str(tmp_path)]) == 0
    with open(tmp_path / "comparison.csv") as f:
        rows = {(r["method"], int(r["step"])): r for r in csv.DictReader(f)}
    combine2 = rows[("combine", 2)]
    assert float(combine2["preference_score_mean"]) == pytest.approx(0.75)
    assert float(combine2["preference_score_std"]) == pytest.approx(0.25)  # population std of {1.0, 0.5}
    assert float(combine2["accuracy_mean"]) == pytest.approx(0.5)
    assert (float(combine2["accuracy_min"]), float(combine2["accuracy_max"])) == (0.25, 0.75)
    rl2 = rows[("rl", 2)]
    assert float(rl2["preference_score_mean"]) == pytest.approx(0.5)
    assert float(rl2["accuracy_mean"]) == pytest.approx(0.5) and float(rl2["accuracy_std"]) == 0.0  # None left out
    summary = json.loads((tmp_path / "comparison.json").read_text())
    final = {f["method"]: f for f in summary["final"]}
    assert final["combine"]["final_preference"] == pytest.approx(0.75)
    assert final["combine"]["best_preference"] == pytest.approx(0.75)  # best per seed: 1.0 and 0.5
    assert final["combine"]["drop_from_best"] == pytest.approx(0.0)
    assert final["rl"]["base_preference"] == pytest.approx(0.375)
    assert final["rl"]["final_accuracy"] == pytest.approx(0.5)
    md = (tmp_path / "comparison.md").read_text()
    assert "| combine | 2 | 0.375 | 0.750 | 0.750 | 0.000 | 0.500 | 0.500 |" in md
    assert "| rl | 2 | 2 | 0.500 ± 0.250 | 0.500 ± 0.000 |" in md
    assert (tmp_path / "comparison.png").stat().st_size > 1000


def test_aggregate_leaves_nan_out_and_keeps_methods_apart():
    runs = {"opd": {0: [{"step": 0, "preference_score": 0.5, "accuracy": None}]}}
    [row] = C.aggregate(runs)
    assert row["preference_score_mean"] == 0.5 and math.isnan(row["accuracy_mean"])


@pytest.mark.parametrize("method,w_rl,w_opd", [("combine", 1.0, 0.5), ("rl", 1.0, 0.0), ("opd", 0.0, 0.5)])
def test_each_method_runs_the_demo_config_as_that_loss(method, w_rl, w_opd, tmp_path):
    """cpu_demo weights the combined loss (loss.w_opd 0.5): `rl` / `opd` reset the weight they fix
    rather than being refused for a conflicting one."""
    from openclaw_jax.config import load_experiment_config

    cmd = C.train_command(["configs/cpu_demo.yaml"], method, 0, tmp_path)
    overrides = cmd[cmd.index("configs/cpu_demo.yaml") + 1:]
    cfg = load_experiment_config(["configs/cpu_demo.yaml"], overrides)
    assert (cfg.loss.name, cfg.loss.w_rl, cfg.loss.w_opd) == (method, w_rl, w_opd)
