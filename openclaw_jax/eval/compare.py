"""`python -m openclaw_jax.eval.compare`: train with several methods on the same seeds and budget,
then tabulate and plot held-out preference and accuracy against the step.

Each (method, seed) is one `python -m openclaw_jax.train` run, one after the other (the runs share
the machine; `--jobs N` runs N at once, each with its own ephemeral gateway port), with the same config, the same `trainer.max_steps` x `trainer.samples_per_step`
samples, and `seed=S env.seed=S` (model sampling, trainer RNG, question order and held-out
questions). Only `loss.name` differs (with the weights that loss fixes). Runs land in `<out>/<method>/seed<S>/`; a run whose
`summary.json` already shows it finished is reused (re-running the command resumes a comparison).

Writes `<out>/comparison.md` (markdown table), `comparison.csv` (one row per method and step),
`comparison.json` and `comparison.png` (preference and accuracy vs step, mean over seeds with a
min-max band).

Example:
  python -m openclaw_jax.eval.compare --config configs/cpu_demo.yaml --methods combine,rl,opd --seeds 3
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import logging
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from openclaw_jax.logs import configure_logging
from openclaw_jax.losses import available_losses, get_loss

log = logging.getLogger("openclaw_jax.eval.compare")

METHODS = available_losses()   # a method is a registered loss (loss.name)
METRICS = ("preference_score", "accuracy")


# ----------------------------------------------------------------------------- runs


def run_dir_for(out: Path, method: str, seed: int) -> Path:
    return out / method / f"seed{seed}"


def train_command(configs: Sequence[str], method: str, seed: int, run_dir: Path,
                  overrides: Sequence[str] = ()) -> list[str]:
    """The `python -m openclaw_jax.train` command of one (method, seed) run."""
    cmd = [sys.executable, "-m", "openclaw_jax.train"]
    for c in configs:
        cmd += ["--config", str(c)]
    return cmd + [f"run_dir={run_dir}", f"seed={seed}", f"env.seed={seed}", *method_overrides(method),
                  "progress=false", *overrides]


def method_overrides(method: str) -> list[str]:
    """`loss.name=<method>`, and each loss weight that loss fixes reset to null (its default), so a
    config that weights the combined loss (cpu_demo's `loss.w_opd: 0.5`) runs `rl` / `opd` as they are
    defined rather than being refused for a conflicting weight."""
    return [f"loss.name={method}"] + [f"loss.{w}=null" for w in get_loss(method).fixed_weights]


def finished(run_dir: Path) -> bool:
    """A run counts as done when its summary says it reached its last step and was not interrupted."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return False
    summary = json.loads(path.read_text())
    return not summary.get("interrupted", False) and bool(summary.get("preference"))


def read_evals(run_dir: Path) -> list[dict[str, Any]]:
    """The held-out evaluations of a run (`eval.jsonl`), the last record per step."""
    path = run_dir / "eval.jsonl"
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_step[int(record["step"])] = record
    return [by_step[s] for s in sorted(by_step)]


# ----------------------------------------------------------------------------- aggregation (pure)


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def aggregate(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Rows `{method, step, n, <metric>_mean, <metric>_std, <metric>_min, <metric>_max}` from
    `{method: {seed: eval records}}`, over the seeds that evaluated at that step (population std;
    NaN values, e.g. accuracy without numeric answers, left out)."""
    rows = []
    for method, by_seed in runs.items():
        steps = sorted({int(r["step"]) for records in by_seed.values() for r in records})
        for step in steps:
            at = [r for records in by_seed.values() for r in records if int(r["step"]) == step]
            row: dict[str, Any] = {"method": method, "step": step, "n": len(at)}
            for metric in METRICS:
                values = [v for v in (_num(r.get(metric)) for r in at) if not math.isnan(v)]
                if values:
                    mean = sum(values) / len(values)
                    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
                    row.update({f"{metric}_mean": mean, f"{metric}_std": std, f"{metric}_min": min(values),
                                f"{metric}_max": max(values)})
                else:
                    row.update({f"{metric}_{k}": float("nan") for k in ("mean", "std", "min", "max")})
            rows.append(row)
    return rows


def final_rows(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per method: base (step 0), final and best preference/accuracy, mean over seeds, and the mean
    per-seed drop from the best preference to the final one."""
    out = []
    for method, by_seed in runs.items():
        per_seed = [records for records in by_seed.values() if records]
        if not per_seed:
            continue

        def mean(xs):
            xs = [x for x in xs if not math.isnan(x)]
            return sum(xs) / len(xs) if xs else float("nan")

        out.append({
            "method": method,
            "seeds": len(per_seed),
            "final_step": mean([float(r[-1]["step"]) for r in per_seed]),
            "base_preference": mean([_num(r[0].get("preference_score")) for r in per_seed]),
            "final_preference": mean([_num(r[-1].get("preference_score")) for r in per_seed]),
            "best_preference": mean([max(_num(x.get("preference_score")) for x in r) for r in per_seed]),
            "drop_from_best": mean([max(_num(x.get("preference_score")) for x in r) - _num(r[-1].get("preference_score"))
                                    for r in per_seed]),
            "base_accuracy": mean([_num(r[0].get("accuracy")) for r in per_seed]),
            "final_accuracy": mean([_num(r[-1].get("accuracy")) for r in per_seed]),
        })
    return out


def _fmt(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def markdown_table(rows: list[dict[str, Any]], finals: list[dict[str, Any]], seeds: Sequence[int]) -> str:
    lines = [f"Held-out preference and accuracy, mean ± std over seeds {', '.join(map(str, seeds))}.", "",
             "| method | seeds | base pref | final pref | best pref | drop from best | base acc | final acc |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in finals:
        lines.append(f"| {f['method']} | {f['seeds']} | {_fmt(f['base_preference'])} | {_fmt(f['final_preference'])} | "
                     f"{_fmt(f['best_preference'])} | {_fmt(f['drop_from_best'])} | {_fmt(f['base_accuracy'])} | "
                     f"{_fmt(f['final_accuracy'])} |")
    lines += ["", "| method | step | n | preference | accuracy |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['step']} | {r['n']} | "
                     f"{_fmt(r['preference_score_mean'])} ± {_fmt(r['preference_score_std'])} | "
                     f"{_fmt(r['accuracy_mean'])} ± {_fmt(r['accuracy_std'])} |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    fields = ["method", "step", "n"] + [f"{m}_{k}" for m in METRICS for k in ("mean", "std", "min", "max")]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r[k] for k in fields})


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Preference (left) and accuracy (right) vs step: mean line, min-max band, one colour per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    try:
        methods = list(dict.fromkeys(r["method"] for r in rows))
        for ax, metric, title in zip(axes, METRICS, ("held-out preference", "held-out accuracy")):
            for k, method in enumerate(methods):
                pts = [r for r in rows if r["method"] == method]
                steps = [r["step"] for r in pts]
                ax.plot(steps, [r[f"{metric}_mean"] for r in pts], "o-", color=f"C{k}", label=method)
                ax.fill_between(steps, [r[f"{metric}_min"] for r in pts], [r[f"{metric}_max"] for r in pts],
                                color=f"C{k}", alpha=0.15)
            ax.set_title(title)
            ax.set_xlabel("training step")
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
        axes[0].legend(loc="best", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def write_outputs(runs: dict[str, dict[int, list[dict[str, Any]]]], out: Path, seeds: Sequence[int],
                  invocation: dict[str, Any]) -> dict[str, Path]:
    rows = aggregate(runs)
    finals = final_rows(runs)
    paths = {"markdown": out / "comparison.md", "csv": out / "comparison.csv", "json": out / "comparison.json",
             "plot": out / "comparison.png"}
    paths["markdown"].write_text(markdown_table(rows, finals, seeds))
    write_csv(rows, paths["csv"])
    nan_free = json.loads(json.dumps({"invocation": invocation, "final": finals, "per_step": rows, "runs": runs},
                                     default=str).replace("NaN", "null"))
    paths["json"].write_text(json.dumps(nan_free, indent=2) + "\n")
    plot(rows, paths["plot"])
    return paths


# ----------------------------------------------------------------------------- CLI


def _train(args: argparse.Namespace, out: Path, method: str, seed: int, overrides: Sequence[str]) -> str | None:
    """One training run (its output in `<out>/<method>/seed<S>.log`); an error message if it failed."""
    run_dir = run_dir_for(out, method, seed)
    if run_dir.exists() and args.rerun:
        shutil.rmtree(run_dir)
    return run_training(train_command(args.config, method, seed, run_dir, overrides), run_dir, args.timeout)


def run_training(cmd: Sequence[str], run_dir: Path, timeout: float) -> str | None:
    """Run one `python -m openclaw_jax.train` command, its output in `<run_dir>.log` beside the run
    (`<method>/seed<S>.log`); an error message if it failed or did not finish."""
    log.info("training: %s", " ".join(cmd))
    t0 = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.parent / f"{run_dir.name}.log"
    with open(log_path, "w") as logf:
        proc = subprocess.run(list(cmd), stdout=logf, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0 or not finished(run_dir):
        return f"training into {run_dir} failed (exit {proc.returncode}); see {log_path}"
    log.info("%s done in %.0f s", run_dir, time.monotonic() - t0)
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openclaw_jax.eval.compare",
        description="Train with each method on the same seeds and sample budget; table and plot of held-out "
                    "preference and accuracy vs step (mean and spread over seeds).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python -m openclaw_jax.eval.compare --config configs/cpu_demo.yaml "
               "--methods combine,rl,opd --seeds 3")
    p.add_argument("--config", action="append", required=True, metavar="YAML", help="training config (repeatable)")
    p.add_argument("--methods", default="combine,rl,opd", help="comma-separated loss names (loss.name)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds: 0 .. N-1 (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--out", default=None, help="output directory (default runs/compare_<config name>)")
    p.add_argument("--rerun", action="store_true", help="train again even where a finished run exists")
    p.add_argument("--dry-run", action="store_true", help="print the training commands and exit")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one training run may take")
    p.add_argument("--jobs", type=int, default=1,
                   help="training runs at once (default 1); each then binds an ephemeral gateway port "
                        "(gateway.port=0). Two CPU demo runs take about 17 GB of memory together")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="overrides for every run, e.g. trainer.max_steps=10 (same budget for all methods)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(logging.INFO)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if not methods or bad:
        print(f"--methods {args.methods!r}: unknown {bad}; use a comma-separated list of {', '.join(METHODS)}",
              file=sys.stderr)
        return 2
    if args.seeds < 1:
        print(f"--seeds {args.seeds} must be >= 1", file=sys.stderr)
        return 2
    for o in args.overrides:
        if o.split("=", 1)[0] in ("loss.name", "seed", "env.seed", "run_dir"):
            print(f"override {o!r} is set per run by the comparison; leave it out", file=sys.stderr)
            return 2
    if args.jobs < 1:
        print(f"--jobs {args.jobs} must be >= 1", file=sys.stderr)
        return 2
    overrides = list(args.overrides)
    if args.jobs > 1 and not any(o.startswith("gateway.port=") for o in overrides):
        overrides.append("gateway.port=0")  # concurrent runs cannot share the config's fixed port
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    out = Path(args.out or f"runs/compare_{Path(args.config[-1]).stem}")
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {m: {} for m in methods}
    plan = [(m, s) for s in seeds for m in methods]  # seed-major: a partial comparison covers every method
    if args.dry_run:
        for m, s in plan:
            print(" ".join(train_command(args.config, m, s, run_dir_for(out, m, s), overrides)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    todo = [(m, s) for m, s in plan if args.rerun or not finished(run_dir_for(out, m, s))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        errors = [e for e in pool.map(lambda ms: _train(args, out, *ms, overrides), todo) if e]
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        return 1
    for m, s in plan:
        runs[m][s] = read_evals(run_dir_for(out, m, s))
    invocation = {"config": args.config, "methods": methods, "seeds": seeds, "overrides": overrides}
    paths = write_outputs(runs, out, seeds, invocation)
    sys.stdout.write(paths["markdown"].read_text())
    for name, path in paths.items():
        log.info("%s: %s", name, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
