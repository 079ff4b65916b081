"""`python -m openclaw_jax.eval.agentic_table`: the agentic results table in one command.

For each config (a row: one environment) and seed it trains three conditions, each one
`python -m openclaw_jax.train --config C run_dir=<out>/<config name>/<condition>/seed<S> seed=S
agentic.seed=S ...` subprocess (its output in `train.log`, its command in `command.txt`, both in the
run directory):

* `base`: `agentic.warmup_steps=0 trainer.max_steps=0`, the untouched model's held-out evaluation;
* `rl`: the config as it is, outcome reward only (`agentic.prm=false`);
* `rl_prm`: `agentic.prm=true`, plus the judge's PRM vote on each tool-calling step.

The "after warm-up" column is the step-0 evaluation of the `rl` run (the `rl_prm` run's step 0 must
agree, its warm-up being seeded the same; a note says where it does not). To save the warm-up's time
the `rl_prm` run starts from a copy of the `rl` run's cached warm-up (`<rl run>/warmup`, which
`runs/agentic.py` loads when its `config.json` exists), copied before it starts; so within a seed
`rl` runs before `rl_prm`. Every run checkpoints once, at its end (`trainer.checkpoint_every=0`), and
once finished its `ckpt/` and `export/` (and the `rl_prm` copy of the warm-up) are deleted unless
`--keep-weights`: the table needs only `eval.jsonl` and `summary.json`. A run whose `summary.json`
says it finished is reused, so rerunning the command resumes the table; an interrupted run resumes
from its checkpoint; one that died without a checkpoint starts again (its warm-up cache kept).
`--collect-only` builds the table from run directories already there (made by hand, or still going),
starting nothing.

Cells are held-out success (greedy, tasks never trained on) as the mean over seeds with each seed's
value; "final" is a run's last evaluation, "best" its best one (earliest on ties, step 0 included),
each with its step. Writes `<out>/agentic_table.md` (the table, notes, and the exact commands run)
and `<out>/agentic_table.json` (the same, plus per-family means and every run's evaluations), and
prints the markdown.

Example:
  python -m openclaw_jax.eval.agentic_table --configs configs/terminal_cpu.yaml configs/swe_cpu.yaml \\
      configs/toolcall_hard_cpu.yaml --seeds 0 1 --out runs/agentic_table
  # twice the RL steps (every run), two runs at once
  python -m openclaw_jax.eval.agentic_table --configs configs/terminal_cpu.yaml --seeds 0 1 \\
      --out runs/agentic_table_12 --jobs 2 trainer.max_steps=12
  # the table of the runs already there, starting nothing
  python -m openclaw_jax.eval.agentic_table --configs configs/terminal_cpu.yaml --seeds 0 1 \\
      --out runs/agentic_table_12 --collect-only
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from openclaw_jax.config import load_experiment_config
from openclaw_jax.configlib import ConfigError, dump_yaml
from openclaw_jax.logs import configure_logging
from openclaw_jax.notebook.run_inspection import markdown_table, read_jsonl

log = logging.getLogger("openclaw_jax.eval.agentic_table")

CONDITIONS = ("base", "rl", "rl_prm")
CONDITION_OVERRIDES = {"base": ["agentic.warmup_steps=0", "trainer.max_steps=0"],
                       "rl": ["agentic.prm=false"],
                       "rl_prm": ["agentic.prm=true"]}
# set per run by this command; an override of them would make the runs disagree with their directories
RESERVED = ("run_dir", "seed", "agentic.seed", "agentic.prm")
# one checkpoint per run, at its end (and on Ctrl-C); the user's overrides come after and may change it
RUN_SETTINGS = ["progress=false", "trainer.checkpoint_every=0", "trainer.keep_checkpoints=1"]
PRUNED = ("ckpt", "export")   # deleted from a finished run unless --keep-weights
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")
COLUMNS = [("base", "base"), ("warmup", "after warm-up (step 0)"), ("rl_final", "RL outcome-only: final"),
           ("rl_best", "RL outcome-only: best"), ("rl_prm_final", "RL + PRM: final"), ("rl_prm_best", "RL + PRM: best")]
NEEDS = {"base": {"base"}, "warmup": {"rl", "rl_prm"}, "rl_final": {"rl"}, "rl_best": {"rl"},
         "rl_prm_final": {"rl_prm"}, "rl_prm_best": {"rl_prm"}}   # the conditions a column is read from


# ----------------------------------------------------------------------------- runs


def run_dir_for(out: Path, config: str, condition: str, seed: int) -> Path:
    """`<out>/<config file name without .yaml>/<condition>/seed<S>`."""
    return Path(out) / Path(config).stem / condition / f"seed{seed}"


def run_overrides(condition: str, seed: int, run_dir: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The overrides of one run: the user's after this command's settings, the condition's last (a `base`
    run evaluates the untouched model whatever `trainer.max_steps` the user gave)."""
    return [f"run_dir={run_dir}", f"seed={seed}", f"agentic.seed={seed}", *RUN_SETTINGS, *overrides,
            *CONDITION_OVERRIDES[condition]]


def train_command(config: str, condition: str, seed: int, run_dir: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The `python -m openclaw_jax.train` command of one (config, condition, seed) run."""
    return [sys.executable, "-m", "openclaw_jax.train", "--config", str(config),
            *run_overrides(condition, seed, run_dir, overrides)]


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "summary.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError:
        log.warning("%s: not valid JSON; the run counts as unfinished", path)
        return None


def finished(run_dir: Path) -> bool:
    """Done when `summary.json` exists, says the run was not interrupted and holds its held-out evaluations."""
    summary = read_summary(run_dir)
    return bool(summary) and not summary.get("interrupted", False) and bool(summary.get("heldout"))


def read_evals(run_dir: Path) -> list[dict[str, Any]]:
    """The held-out evaluations of a run (`eval.jsonl`; the last record per step, a resumed run having
    appended to it), with the fields the table uses."""
    keep = ("step", "heldout_success", "n", "per_family", "eval_s", "time_s")
    by_step = {int(r["step"]): {k: r.get(k) for k in keep} for r in read_jsonl(Path(run_dir) / "eval.jsonl")
               if "step" in r and r.get("heldout_success") is not None}
    return [by_step[s] for s in sorted(by_step)]


def read_run(run_dir: Path) -> dict[str, Any]:
    """What the table needs of one run directory (it may be missing, unfinished or made by hand)."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir) or {}
    evals = read_evals(run_dir)
    wall = summary.get("wall_time_s")
    if wall is None and evals and evals[-1].get("time_s") is not None:
        wall = evals[-1]["time_s"]   # unfinished: the time to its last evaluation
    command = run_dir / "command.txt"
    return {"run_dir": str(run_dir), "exists": run_dir.is_dir(), "finished": finished(run_dir), "evals": evals,
            "wall_time_s": wall, "resumed": bool(summary.get("resumed", False)),
            "command": command.read_text().strip() if command.is_file() else None}


def _has_checkpoint(run_dir: Path) -> bool:
    ckpt = run_dir / "ckpt"
    return ckpt.is_dir() and any(p.is_dir() and p.name.isdigit() for p in ckpt.iterdir())


def prepare_run_dir(run_dir: Path, condition: str, rl_dir: Path | None, *, rerun: bool = False) -> list[str]:
    """Make `run_dir` ready to (re)start; returns the shell equivalents of what it did (for `command.txt`).

    `rerun`: delete the directory. An unfinished run without a checkpoint (killed before its end) loses
    everything but its warm-up cache (its samples and evaluations would mix with the new attempt's); one
    with a checkpoint (interrupted) is left to resume. `rl_prm`: copy the `rl` run's warm-up cache in."""
    done: list[str] = []
    if rerun and run_dir.exists():
        shutil.rmtree(run_dir)
    if run_dir.exists() and not _has_checkpoint(run_dir):
        stale = [p for p in run_dir.iterdir() if p.name not in ("warmup", "train.log", "command.txt")]
        for p in stale:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if stale:
            log.info("%s: unfinished and without a checkpoint; starting it again (warm-up cache kept)", run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / "warmup"
    if condition == "rl_prm" and rl_dir is not None and (rl_dir / "warmup" / "config.json").is_file() \
            and not (target / "config.json").is_file():
        shutil.rmtree(target, ignore_errors=True)
        partial = run_dir / "warmup.copying"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(rl_dir / "warmup", partial)
        partial.rename(target)   # complete or absent: runs/agentic.py loads it when config.json exists
        done.append(shlex.join(["cp", "-r", str(rl_dir / "warmup"), str(target)]))
        log.info("%s: warm-up copied from %s", run_dir, rl_dir / "warmup")
    return done


def prune(run_dir: Path, condition: str) -> None:
    """A finished run without its weights: checkpoint, export and (rl_prm) the copy of the rl warm-up."""
    for name in PRUNED + (("warmup",) if condition == "rl_prm" else ()):
        shutil.rmtree(run_dir / name, ignore_errors=True)


def run_one(config: str, condition: str, seed: int, out: Path, overrides: Sequence[str], *, rerun: bool = False,
            keep_weights: bool = False, timeout: float | None = None) -> str | None:
    """Train one run (output appended to `<run_dir>/train.log`); an error message if it failed."""
    run_dir = run_dir_for(out, config, condition, seed)
    rl_dir = run_dir_for(out, config, "rl", seed)
    cmd = train_command(config, condition, seed, run_dir, overrides)
    prep = prepare_run_dir(run_dir, condition, rl_dir, rerun=rerun)
    (run_dir / "command.txt").write_text("\n".join([*prep, shlex.join(cmd)]) + "\n")
    log.info("training %s %s seed %d: %s", Path(config).stem, condition, seed, shlex.join(cmd))
    t0 = time.monotonic()
    log_path = run_dir / "train.log"
    with open(log_path, "a") as logf:
        try:
            proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except subprocess.TimeoutExpired:
            return (f"{Path(config).stem} {condition} seed {seed} ran past --timeout {timeout:g} s and was stopped; "
                    f"see {log_path}; rerun with a larger --timeout (it resumes)")
    if proc.returncode != 0 or not finished(run_dir):
        return f"{Path(config).stem} {condition} seed {seed} failed (exit {proc.returncode}); see {log_path}"
    if not keep_weights:
        prune(run_dir, condition)
    log.info("%s %s seed %d done in %.0f s", Path(config).stem, condition, seed, time.monotonic() - t0)
    return None


# ----------------------------------------------------------------------------- the table (pure)


def _pick(evals: list[dict[str, Any]], which: str) -> dict[str, Any] | None:
    """The step-0 (`start`), last (`final`) or best (`best`, earliest on ties) evaluation of a run."""
    if not evals:
        return None
    if which == "start":
        return evals[0] if evals[0]["step"] == 0 else None
    if which == "final":
        return evals[-1]
    return max(evals, key=lambda r: (r["heldout_success"], -r["step"]))


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def cell(runs_by_seed: dict[int, dict[str, Any]], which: str) -> dict[str, Any]:
    """`{mean, per_seed: {seed: {value, step, per_family} | None}, per_family: {family: mean}}` of one column."""
    per_seed: dict[int, dict[str, Any] | None] = {}
    for seed, run in runs_by_seed.items():
        r = _pick(run["evals"], which) if run else None
        per_seed[seed] = None if r is None else {"value": r["heldout_success"], "step": r["step"],
                                                 "per_family": r.get("per_family") or {}}
    present = [p for p in per_seed.values() if p is not None]
    families = sorted({f for p in present for f in p["per_family"]})
    return {"mean": _mean([p["value"] for p in present]), "per_seed": per_seed,
            "per_family": {f: _mean([p["per_family"].get(f) for p in present]) for f in families}}


def table_row(config: str, runs: dict[str, dict[int, dict[str, Any]]], env: str) -> dict[str, Any]:
    """One environment's row from `{condition: {seed: read_run(...)}}` (absent conditions: empty dicts)."""
    seeds = sorted({s for by_seed in runs.values() for s in by_seed})
    empty = {s: None for s in seeds}
    rl, rl_prm = runs.get("rl") or empty, runs.get("rl_prm") or empty
    # after the warm-up: the rl run's step 0, else (rl not run) the rl_prm run's
    has_evals = {c: any(r and r["evals"] for r in by_seed.values()) for c, by_seed in (("rl", rl), ("rl_prm", rl_prm))}
    warm_source = "rl_prm" if has_evals["rl_prm"] and not has_evals["rl"] else "rl"
    cells = {"base": cell(runs.get("base") or empty, "start"),
             "warmup": cell(rl if warm_source == "rl" else rl_prm, "start"),
             "rl_final": cell(rl, "final"), "rl_best": cell(rl, "best"),
             "rl_prm_final": cell(rl_prm, "final"), "rl_prm_best": cell(rl_prm, "best")}
    disagree = {}
    for s in seeds:
        a, b = _pick((rl.get(s) or {}).get("evals", []), "start"), _pick((rl_prm.get(s) or {}).get("evals", []), "start")
        if a and b and a["heldout_success"] != b["heldout_success"]:
            disagree[s] = {"rl": a["heldout_success"], "rl_prm": b["heldout_success"]}
    wall = {c: {"mean": _mean([(r or {}).get("wall_time_s") for r in by_seed.values()]),
                "per_seed": {s: (r or {}).get("wall_time_s") for s, r in by_seed.items()}}
            for c, by_seed in runs.items()}
    n = next((e["n"] for by_seed in runs.values() for r in by_seed.values() if r for e in r["evals"]
              if e.get("n") is not None), None)
    return {"config": config, "name": Path(config).stem, "env": env, "n_heldout": n, "seeds": seeds, "cells": cells,
            "warmup_from": warm_source, "warmup_disagree": disagree, "wall_time_s": wall}


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    m, s = divmod(int(round(seconds)), 60)
    return f"{s} s" if not m else f"{m} min {s} s" if m < 60 else f"{m // 60} h {m % 60} min"


def format_cell(c: dict[str, Any], with_step: bool) -> str:
    """`mean [seed values in seed order]`, `@N` the step of each value; one seed: `value @N`."""
    def one(p: dict[str, Any] | None) -> str:
        return "—" if p is None else f"{p['value']:.3f}" + (f" @{p['step']}" if with_step else "")

    per_seed = list(c["per_seed"].values())
    if len(per_seed) == 1:
        return one(per_seed[0])
    return ("n/a" if c["mean"] is None else f"{c['mean']:.3f}") + " [" + ", ".join(one(p) for p in per_seed) + "]"


def markdown(rows: list[dict[str, Any]], conditions: Sequence[str], seeds: Sequence[int], notes: list[str],
             commands: list[str], invocation: str) -> str:
    names = {"base": "base", "rl": "RL", "rl_prm": "RL+PRM"}
    shown = [(k, h) for k, h in COLUMNS if NEEDS[k] & set(conditions)]
    body = []
    for row in rows:
        label = f"{row['env']}" + (f", {row['n_heldout']} held-out tasks" if row["n_heldout"] else "") + \
                f" (`{row['config']}`)"
        wall = ", ".join(f"{names[c]} {_fmt_s(row['wall_time_s'][c]['mean'])}" for c in conditions)
        body.append([label, *(format_cell(row["cells"][k], with_step=k not in ("base", "warmup")) for k, _ in shown),
                     wall])
    seed_text = "seed " + str(seeds[0]) if len(seeds) == 1 else "seeds " + ", ".join(map(str, seeds))
    lines = [f"Held-out success (greedy, tasks never trained on), {seed_text}" +
             ("" if len(seeds) == 1 else ": the mean over seeds, then [each seed's value in seed order]") +
             "; `@N`: the step of that evaluation. After warm-up: the step-0 evaluation of the RL run. Final: a "
             "run's last evaluation; best: its best (earliest on ties, step 0 included). Wall time: one run, "
             "mean over seeds.", "",
             markdown_table(["environment", *(h for _, h in shown), "wall time per run"], body, max_cell=400), ""]
    if notes:
        lines += ["Notes:", "", *(f"- {n}" for n in notes), ""]
    lines += [f"Made by `{invocation}`. Runs, in order (each run directory's `command.txt`):", "", "```",
              *commands, "```"]
    return "\n".join(lines) + "\n"


def collect(configs: Sequence[str], envs: dict[str, str], conditions: Sequence[str], seeds: Sequence[int],
            out: Path) -> tuple[list[dict[str, Any]], dict[str, Any], list[str], list[str]]:
    """(rows, runs, notes, commands) from the run directories under `out`."""
    rows, all_runs, notes, commands = [], {}, [], []
    for config in configs:
        runs = {c: {s: read_run(run_dir_for(out, config, c, s)) for s in seeds} for c in conditions}
        all_runs[Path(config).stem] = runs
        row = table_row(config, runs, envs[config])
        rows.append(row)
        for c in conditions:
            for s, r in runs[c].items():
                if not r["evals"]:
                    notes.append(f"no evaluation in `{r['run_dir']}`" + ("" if r["exists"] else " (no such run)"))
                elif not r["finished"]:
                    notes.append(f"`{r['run_dir']}` has not finished (last evaluation at step {r['evals'][-1]['step']})")
                elif r["resumed"]:
                    notes.append(f"`{r['run_dir']}` was resumed: its wall time is that of the last part")
        for s, d in row["warmup_disagree"].items():
            notes.append(f"{row['name']} seed {s}: step 0 of rl ({d['rl']:.3f}) and rl_prm ({d['rl_prm']:.3f}) "
                         "differ; the table shows rl's")
        if row["warmup_from"] == "rl_prm":
            notes.append(f"{row['name']}: after warm-up is the rl_prm run's step 0 (no rl run)")
    for s in seeds:
        for config in configs:
            for c in conditions:
                r = all_runs[Path(config).stem][c][s]
                if r["command"]:
                    commands.append(r["command"])
                elif r["exists"]:
                    resolved = Path(r["run_dir"]) / "config.yaml"
                    commands.append(f"# {r['run_dir']}: not started by this command (no command.txt)"
                                    + (f"; its resolved config: {resolved}" if resolved.is_file() else ""))
    return rows, all_runs, notes, commands


# ----------------------------------------------------------------------------- CLI


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`key=value` words anywhere in argv (they may follow `--seeds 0 1`) apart from the options."""
    overrides = [a for a in argv if _OVERRIDE.match(a)]
    return [a for a in argv if not _OVERRIDE.match(a)], overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openclaw_jax.eval.agentic_table",
        description="Train base / RL outcome-only / RL + PRM on each agentic config and seed, and tabulate "
                    "held-out success (base, after the warm-up, after RL: final and best) with wall times.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog="Example:" + __doc__.split("Example:", 1)[1])
    p.add_argument("--configs", nargs="+", required=True, metavar="YAML",
                   help="agentic training configs, one table row each (their file names must differ)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], metavar="S", help="seeds (default: 0)")
    p.add_argument("--out", default="runs/agentic_table", help="output directory (default runs/agentic_table)")
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"comma-separated subset of {', '.join(CONDITIONS)} (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1); rl_prm waits for its rl run")
    p.add_argument("--collect-only", action="store_true",
                   help="build the table from the run directories under --out; start nothing")
    p.add_argument("--rerun", action="store_true", help="delete and train again even finished runs")
    p.add_argument("--keep-weights", action="store_true",
                   help="keep a finished run's ckpt/ and export/ (and rl_prm's warm-up copy); default: deleted")
    p.add_argument("--dry-run", action="store_true", help="print the training commands and exit")
    p.add_argument("--timeout", type=float, default=None, help="seconds one run may take (default: no limit)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="config overrides for every run, e.g. trainer.max_steps=12 (anywhere on the line)")
    return p


def _check_configs(configs: Sequence[str], conditions: Sequence[str], overrides: Sequence[str],
                   out: Path, seeds: Sequence[int]) -> tuple[dict[str, str], dict[tuple, str]]:
    """Each config loads with every condition's overrides and is agentic; returns ({config: env name},
    {(config, condition, seed): resolved config YAML}). Raises ValueError with what to change."""
    envs, resolved = {}, {}
    for config in configs:
        if not Path(config).is_file():
            raise ValueError(f"--configs: {config} is not a file; give paths of agentic configs such as "
                             "configs/terminal_cpu.yaml")
        for c in conditions:
            for s in seeds:
                args = run_overrides(c, s, run_dir_for(out, config, c, s), overrides)
                try:
                    cfg = load_experiment_config([config], args)
                except ConfigError as err:
                    raise ValueError(f"{config} with the {c} run's overrides: {err}") from None
                if not cfg.agentic.enabled:
                    raise ValueError(f"{config} is not an agentic config (agentic.enabled is false); give a config "
                                     "such as configs/terminal_cpu.yaml or add agentic.enabled=true")
                envs[config] = cfg.agentic.env
                resolved[(config, c, s)] = dump_yaml(cfg)
    return envs, resolved


def main(argv: Sequence[str] | None = None) -> int:
    words, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(words)
    configure_logging(logging.INFO)
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    bad = [c for c in conditions if c not in CONDITIONS]
    problems = []
    if not conditions or bad:
        problems.append(f"--conditions {args.conditions!r}: unknown {bad}; use a comma-separated subset of "
                        f"{','.join(CONDITIONS)}")
    if args.jobs < 1:
        problems.append(f"--jobs {args.jobs} must be >= 1")
    if args.timeout is not None and args.timeout <= 0:
        problems.append(f"--timeout {args.timeout:g} must be > 0 seconds (leave it out for no limit)")
    if len(set(args.seeds)) != len(args.seeds):
        problems.append(f"--seeds {' '.join(map(str, args.seeds))}: a seed is repeated; give each once")
    stems = [Path(c).stem for c in args.configs]
    if len(set(stems)) != len(stems):
        problems.append(f"--configs {' '.join(args.configs)}: two configs share a file name (their runs would "
                        "share <out>/<name>); copy one under another name")
    problems += [f"override {o!r} is set per run by this command; leave it out" for o in overrides
                 if o.split("=", 1)[0] in RESERVED]
    if problems:
        for problem in problems:
            log.error("%s", problem)
        return 2
    conditions = [c for c in CONDITIONS if c in conditions]   # rl before rl_prm (the warm-up copy)
    out = Path(args.out)
    if args.jobs > 1 and not any(o.startswith("policy.port=") for o in overrides):
        overrides.append("policy.port=0")   # concurrent runs cannot share a fixed port
    try:
        envs, resolved = _check_configs(args.configs, conditions, overrides, out, args.seeds)
    except ValueError as err:
        log.error("%s", err)
        return 2
    plan = [(cfg, c, s) for s in args.seeds for cfg in args.configs for c in conditions]   # seed-major
    if args.dry_run:
        for cfg, c, s in plan:
            print(shlex.join(train_command(cfg, c, s, run_dir_for(out, cfg, c, s), overrides)))
        return 0
    errors: list[str] = []
    if not args.collect_only:
        try:
            errors = _train_all(args, plan, out, overrides, resolved)
        except KeyboardInterrupt:
            log.error("interrupted; the same command resumes (finished runs are reused, interrupted ones resume)")
            return 130
    out.mkdir(parents=True, exist_ok=True)
    rows, runs, notes, commands = collect(args.configs, envs, conditions, args.seeds, out)
    given = list(sys.argv[1:] if argv is None else argv)
    invocation = shlex.join(["python", "-m", "openclaw_jax.eval.agentic_table", *given])
    text = markdown(rows, conditions, args.seeds, notes + errors, commands, invocation)
    (out / "agentic_table.md").write_text(text)
    data = {"invocation": invocation, "configs": args.configs, "seeds": args.seeds, "conditions": conditions,
            "overrides": overrides, "collect_only": args.collect_only, "rows": rows, "notes": notes,
            "errors": errors, "commands": commands, "runs": runs}
    (out / "agentic_table.json").write_text(json.dumps(data, indent=2) + "\n")
    sys.stdout.write(text)
    log.info("wrote %s and %s", out / "agentic_table.md", out / "agentic_table.json")
    for e in errors:
        log.error("%s", e)
    return 1 if errors else 0


def _train_all(args: argparse.Namespace, plan: list[tuple[str, str, int]], out: Path, overrides: list[str],
               resolved: dict[tuple, str]) -> list[str]:
    """Run what is not finished yet (`--jobs` at once; an rl_prm run waits for its rl run); error messages."""
    todo = []
    for cfg, c, s in plan:
        run_dir = run_dir_for(out, cfg, c, s)
        if args.rerun or not finished(run_dir):
            todo.append((cfg, c, s))
            continue
        log.info("reusing finished run %s", run_dir)
        written = run_dir / "config.yaml"
        if written.is_file() and written.read_text() != resolved[(cfg, c, s)]:
            log.warning("%s was made with another config than this command's (other overrides?); "
                        "--rerun trains it again", run_dir)
    futures: dict[tuple[str, str, int], concurrent.futures.Future] = {}

    def job(cfg: str, c: str, s: int) -> str | None:
        if c == "rl_prm" and (cfg, "rl", s) in futures:
            concurrent.futures.wait([futures[(cfg, "rl", s)]])   # its warm-up is copied from the rl run's
        return run_one(cfg, c, s, out, overrides, rerun=args.rerun, keep_weights=args.keep_weights,
                       timeout=args.timeout)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for key in todo:   # submitted in plan order: an rl run starts before its rl_prm run
            futures[key] = pool.submit(job, *key)
        results = []
        for key, f in futures.items():
            try:
                results.append(f.result())
            except Exception as err:   # noqa: BLE001  (a failed copy or a full disk: name the run)
                results.append(f"{Path(key[0]).stem} {key[1]} seed {key[2]}: {type(err).__name__}: {err}")
    return [r for r in results if r]


if __name__ == "__main__":
    sys.exit(main())
