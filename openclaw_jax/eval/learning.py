"""`python -m openclaw_jax.eval.learning`: training against memory, through the person's own agent.

For each persona config, method and seed, one `python -m openclaw_jax.train` run (one after the other),
then one table: **sessions to a stable effect** (the 1-based number of the first of three satisfied
sessions in a row, in the order the person had them; `envs/sessions.py`) beside the held-out preference
and accuracy at the first and last evaluation.

Methods: `memory` (nothing trains: the person's corrections are kept as notes in OpenClaw's USER.md,
`trainer.enabled=false env.memory=user_md`) and every registered loss (`combine`, `rl`, `opd`, ...: that
loss, with the weights it fixes). A method may carry overrides of its own after `@`, e.g.
`rl@trainer.reward_baseline=none` (GRPO with the reward as its advantage) beside plain `rl`. Every run of
a table has the same config, seeds and sample budget (`trainer.max_steps` x `trainer.samples_per_step`):
`seed=S env.seed=S` (model sampling, trainer RNG, question order, held-out questions).

Runs land in `<out>/<persona>/<method>/seed<S>/`; a finished one is reused (re-running the command
resumes the table). Writes `<out>/learning.md` and `<out>/learning.json`.

A household config (`env.people`) gives a row per person (`<label>: <person>`), each person's own sessions
and held-out numbers; methods such as `combine@trainer.personalize=per_person` beside `combine` compare one
shared model against an adapter per person (docs/results/household.md).

Example (the OpenClaw table of docs/results/openclaw_learning.md):
  python -m openclaw_jax.eval.learning --persona arithmetic=configs/openclaw_cpu.yaml \\
      --persona student=configs/openclaw_student_cpu.yaml --methods memory,combine,rl,opd --seeds 2
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from openclaw_jax.envs.grading import right_by_restatement
from openclaw_jax.envs.sessions import STABLE_RUN, describe_stable, sessions_to_stable
from openclaw_jax.eval.compare import finished, method_overrides, read_evals, run_training
from openclaw_jax.logs import configure_logging
from openclaw_jax.losses import available_losses
from openclaw_jax.notebook.run_inspection import load_samples, read_jsonl
from openclaw_jax.notebook.tb_reader import read_scalars

log = logging.getLogger("openclaw_jax.eval.learning")

MEMORY = "memory"
MEMORY_OVERRIDES = ("trainer.enabled=false", "env.memory=user_md")
PER_RUN_KEYS = ("seed", "env.seed", "run_dir", "loss.name")


# ----------------------------------------------------------------------------- methods and runs


@dataclass(frozen=True)
class Method:
    """A method spec `NAME[@key=value...]`: a registered loss or `memory`, with its own overrides."""

    spec: str
    name: str
    overrides: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str) -> "Method":
        name, *extra = spec.strip().split("@")
        known = (MEMORY, *available_losses())
        if name not in known:
            raise ValueError(f"method {spec!r}: {name!r} is not one of {', '.join(known)}")
        for o in extra:
            if "=" not in o or o.split("=", 1)[0] in PER_RUN_KEYS:
                raise ValueError(f"method {spec!r}: {o!r} must be key=value and not one of {', '.join(PER_RUN_KEYS)}")
        return cls(spec.strip(), name, tuple(extra))

    def train_overrides(self) -> list[str]:
        base = list(MEMORY_OVERRIDES) if self.name == MEMORY else method_overrides(self.name)
        return base + list(self.overrides)


def parse_persona(spec: str) -> tuple[str, list[str]]:
    """`LABEL=CONFIG[,CONFIG...]` -> (label, configs): the label names the table row and the run folder."""
    label, eq, configs = spec.partition("=")
    files = [c for c in configs.split(",") if c]
    if not eq or not label.strip() or "/" in label or not files:
        raise ValueError(f"--persona {spec!r}: expected LABEL=CONFIG[,CONFIG...], e.g. arithmetic=configs/openclaw_cpu.yaml")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise ValueError(f"--persona {spec!r}: no such config file {missing}")
    return label.strip(), files


def run_dir_for(out: Path, persona: str, method: Method, seed: int) -> Path:
    return out / persona / method.spec / f"seed{seed}"


def train_command(configs: Sequence[str], method: Method, seed: int, run_dir: Path,
                  overrides: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "openclaw_jax.train"]
    for c in configs:
        cmd += ["--config", str(c)]
    return cmd + [f"run_dir={run_dir}", f"seed={seed}", f"env.seed={seed}", *method.train_overrides(),
                  "progress=false", *overrides]


# ----------------------------------------------------------------------------- one run's numbers (pure)


def people_of(run_dir: Path) -> list[str]:
    """The people of a household run (`env.people`: each has `people/<person>/`), or [] for one person."""
    people = run_dir / "people"
    return sorted(p.name for p in people.iterdir() if p.is_dir()) if people.is_dir() else []


def read_sessions(run_dir: Path, person: str | None = None) -> list[bool]:
    """The person's sessions in order (`sessions.jsonl`; a household's `people/<person>/sessions.jsonl`),
    satisfied or not."""
    path = (run_dir / "people" / person if person else run_dir) / "sessions.jsonl"
    if not path.is_file():
        return []
    return [bool(json.loads(line)["satisfied"]) for line in path.read_text().splitlines() if line.strip()]


def step_seconds_per_sample(run_dir: Path) -> float | None:
    """The trainer's step time per sample (TensorBoard `time/step` / `samples/per_step`), the median over
    the steps after the first (which compiles); None for a run that did not train."""
    if not (run_dir / "tb").is_dir():
        return None
    scalars = read_scalars(run_dir / "tb")
    per_step = dict(scalars.get("samples/per_step", []))
    ratios = sorted(t / per_step[s] for s, t in scalars.get("time/step", []) if s > 1 and per_step.get(s))
    return ratios[len(ratios) // 2] if ratios else None


def step_rewards(run_dir: Path) -> list[str]:
    """Each trained step's samples by their reward, in the order the trainer read them: "+" satisfied, "-"
    corrected, "0" neither (`steps.jsonl`'s first window per step, the samples in `samples/`). With
    `trainer.reward_baseline: batch_mean` a step whose samples are all "-" gives GRPO no advantage."""
    windows: dict[int, tuple[int, int]] = {}
    for record in read_jsonl(run_dir / "steps.jsonl"):
        windows.setdefault(int(record["step"]), (int(record["start_offset"]), int(record["end_offset"])))
    if not windows or not (run_dir / "samples").is_dir():
        return []
    return ["".join("+" if s.reward > 0 else "-" if s.reward < 0 else "0" for s in load_samples(run_dir, *windows[step]))
            for step in sorted(windows)]


def gain_standard_error(first: Path, last: Path) -> float | None:
    """The standard error of the held-out preference gain between two evaluations of the same questions
    (`heldout/step_<N>.jsonl`), paired by question: each question's change d in {-1, 0, +1} (satisfied at the
    last evaluation, not the first: +1), s.e. = sqrt(sample variance of d / n). None without both files,
    with other questions, or with fewer than 2."""
    a, b = read_jsonl(first), read_jsonl(last)
    if len(a) < 2 or [r["question"] for r in a] != [r["question"] for r in b]:
        return None
    d = [int(bool(y["satisfied"])) - int(bool(x["satisfied"])) for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))


def preference_without_restatements(heldout: Path) -> float | None:
    """One evaluation's held-out preference (`heldout/step_<N>.jsonl`: the fraction of answers that satisfied
    the person) not counting the satisfied answers graded right only because they restate the question
    ("The answer is 2 - 1." for "What is 2 - 1?": `envs/grading.py`); None when the file is missing."""
    rows = read_jsonl(heldout)
    if not rows:
        return None
    kept = [r["satisfied"] and not right_by_restatement(r["answer"], r["question"], r["reference"]) for r in rows]
    return sum(kept) / len(rows)


def run_result(run_dir: Path, person: str | None = None) -> dict[str, Any]:
    """Sessions to a stable effect and the held-out numbers of one finished run (of `person`, in a household)."""
    satisfied = read_sessions(run_dir, person)
    evals = read_evals(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    first, last = (evals[0], evals[-1]) if evals else ({}, {})
    if person:   # the household's records hold each person's numbers under `people`
        first, last = first.get("people", {}).get(person, {}), last.get("people", {}).get(person, {})
        last = {**last, "step": evals[-1]["step"]} if evals else last
    heldout = (run_dir / "people" / person if person else run_dir) / "heldout"
    first_step, last_step = (evals[0]["step"], evals[-1]["step"]) if evals else (None, None)
    return {
        "sessions": len(satisfied),
        "sessions_satisfied": sum(satisfied),
        "sessions_to_stable": sessions_to_stable(satisfied, STABLE_RUN),
        "base_preference": first.get("preference_score"), "final_preference": last.get("preference_score"),
        "base_accuracy": first.get("accuracy"), "final_accuracy": last.get("accuracy"),
        "base_preference_unrestated": preference_without_restatements(heldout / f"step_{first_step}.jsonl"),
        "final_preference_unrestated": preference_without_restatements(heldout / f"step_{last_step}.jsonl"),
        "preference_gain_se": gain_standard_error(heldout / f"step_{first_step}.jsonl",
                                                  heldout / f"step_{last_step}.jsonl"),
        "final_step": last.get("step"), "wall_time_s": summary.get("wall_time_s"),
        "step_s_per_sample": step_seconds_per_sample(run_dir),
        "step_rewards": step_rewards(run_dir),
    }


def _mean(xs: Sequence[float | None]) -> float:
    vals = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    return sum(vals) / len(vals) if vals else float("nan")


def _changes(results: Sequence[dict[str, Any]], name: str) -> list[float | None]:
    """Per run, `final_<name>` - `base_<name>` (None where either is missing)."""
    return [None if r[f"final_{name}"] is None or r[f"base_{name}"] is None else r[f"final_{name}"] - r[f"base_{name}"]
            for r in results]


def aggregate(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over the seeds of one (persona, method): mean held-out numbers and their change, whether every seed
    ended above its base, and sessions to a stable effect (a mean only when every seed reached it)."""
    stable = [r["sessions_to_stable"] for r in results]
    gain = _changes(results, "preference")
    acc_change = _changes(results, "accuracy")
    return {
        "seeds": len(results),
        "sessions": [r["sessions"] for r in results],
        "sessions_to_stable": stable,
        "sessions_to_stable_mean": _mean(stable) if stable and all(s is not None for s in stable) else None,
        "reached": sum(s is not None for s in stable),
        "base_preference": _mean([r["base_preference"] for r in results]),
        "final_preference": _mean([r["final_preference"] for r in results]),
        "preference_gain": _mean(gain),
        # of the mean over seeds (independent runs): sqrt(sum of s.e.^2) / seeds, when every run has one
        "preference_gain_se": (math.sqrt(sum(r["preference_gain_se"] ** 2 for r in results)) / len(results)
                               if results and all(r["preference_gain_se"] is not None for r in results) else None),
        "every_seed_above_base": all(g is not None and g > 0 for g in gain),
        "preference_gain_unrestated": _mean(_changes(results, "preference_unrestated")),
        "base_accuracy": _mean([r["base_accuracy"] for r in results]),
        "final_accuracy": _mean([r["final_accuracy"] for r in results]),
        "accuracy_change": _mean(acc_change),
        "wall_time_s": [r["wall_time_s"] for r in results],
        "step_s_per_sample": _mean([r["step_s_per_sample"] for r in results]),
    }


def _fmt(x: Any, sign: str = "", digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:{sign}.{digits}f}"


def _stable_cell(agg: dict[str, Any]) -> str:
    per_seed = ", ".join(describe_stable(s, n) for s, n in zip(agg["sessions_to_stable"], agg["sessions"]))
    mean = agg["sessions_to_stable_mean"]
    return f"{mean:.1f} ({per_seed})" if mean is not None else per_seed


def markdown_table(rows: Sequence[dict[str, Any]], seeds: Sequence[int]) -> str:
    lines = [f"Sessions to a stable effect (first of {STABLE_RUN} satisfied sessions in a row; per seed, mean when "
             f"every seed reached it) and held-out preference / accuracy (first -> last evaluation, mean over seeds "
             f"{', '.join(map(str, seeds))}). \"s.e.\": the gain's standard error, paired by held-out question. "
             "\"Restatements not counted\": the gain without the satisfied held-out answers graded right only "
             "because they restate the question (envs/grading.py).", "",
             "| persona | method | sessions to stable | sessions | held-out preference | gain | s.e. | every seed up | "
             "gain, restatements not counted | accuracy | step s/sample | run min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        a = r["aggregate"]
        lines.append(
            f"| {r['persona']} | {r['method']} | {_stable_cell(a)} | {', '.join(map(str, a['sessions']))} | "
            f"{_fmt(a['base_preference'])} -> {_fmt(a['final_preference'])} | "
            f"{_fmt(a['preference_gain'], '+')} | {_fmt(a['preference_gain_se'])} | "
            f"{'yes' if a['every_seed_above_base'] else 'no'} | "
            f"{_fmt(a['preference_gain_unrestated'], '+')} | "
            f"{_fmt(a['base_accuracy'])} -> {_fmt(a['final_accuracy'])} | "
            f"{_fmt(a['step_s_per_sample'], digits=1)} | "
            f"{', '.join(_fmt(None if w is None else w / 60, digits=0) for w in a['wall_time_s'])} |")
    return "\n".join(lines) + "\n"


def table(out: Path, personas: Sequence[str], methods: Sequence[Method], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """One row per (persona, method) over the finished runs below `out` (missing runs left out)."""
    rows = []
    for persona in personas:
        for m in methods:
            dirs = [run_dir_for(out, persona, m, s) for s in seeds]
            done = [d for d in dirs if finished(d)]
            if not done:
                continue
            seeds_done = [int(d.name[4:]) for d in done]
            for person in people_of(done[0]) or [None]:   # a household: a row per person
                results = [run_result(d, person) for d in done]
                rows.append({"persona": f"{persona}: {person}" if person else persona, "method": m.spec,
                             "seeds": seeds_done, "runs": results, "aggregate": aggregate(results)})
    return rows


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openclaw_jax.eval.learning",
        description="Train (or remember) with each method, persona and seed on the same budget; one table of "
                    "sessions to a stable effect beside held-out preference and accuracy.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("Example", 1)[1])
    p.add_argument("--persona", action="append", required=True, metavar="LABEL=CONFIG[,CONFIG]",
                   help="a persona's training config(s), layered in order (repeatable)")
    p.add_argument("--methods", default="memory,combine,rl,opd",
                   help="comma-separated: memory, a loss name, or NAME@key=value[@key=value] (default "
                        "memory,combine,rl,opd)")
    p.add_argument("--seeds", type=int, default=2, help="number of seeds: first .. first+N-1 (default 2)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--out", default="runs/learning", help="output directory (default runs/learning)")
    p.add_argument("--rerun", action="store_true", help="train again where a finished run exists")
    p.add_argument("--dry-run", action="store_true", help="print the run commands and exit")
    p.add_argument("--table-only", action="store_true", help="write the table from the finished runs; run nothing")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds one run may take (default 7200)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides for every run (the same budget)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(logging.INFO)
    try:
        personas = [parse_persona(s) for s in args.persona]
        methods = [Method.parse(m) for m in args.methods.split(",") if m.strip()]
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    bad = [o for o in args.overrides if "=" not in o or o.split("=", 1)[0] in PER_RUN_KEYS]
    if not methods or args.seeds < 1 or bad or len({p for p, _ in personas}) != len(personas):
        print(f"need at least one method, --seeds >= 1, distinct persona labels, and key=value overrides other than "
              f"{', '.join(PER_RUN_KEYS)} (got {bad or args.overrides})", file=sys.stderr)
        return 2
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    out = Path(args.out)
    # seed-major, then persona: a partial table covers every method of the first seed first
    plan = [(label, files, m, s) for s in seeds for label, files in personas for m in methods]
    if args.dry_run:
        for label, files, m, s in plan:
            print(" ".join(train_command(files, m, s, run_dir_for(out, label, m, s), args.overrides)))
        return 0
    errors = []
    for label, files, m, s in ([] if args.table_only else plan):
        run_dir = run_dir_for(out, label, m, s)
        if finished(run_dir) and not args.rerun:
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)   # an unfinished or rerun run starts afresh
        error = run_training(train_command(files, m, s, run_dir, args.overrides), run_dir, args.timeout)
        if error:
            errors.append(error)
            log.error("%s", error)
    rows = table(out, [label for label, _ in personas], methods, seeds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning.md").write_text(markdown_table(rows, seeds))
    invocation = {"personas": dict(personas), "methods": [m.spec for m in methods], "seeds": seeds,
                  "overrides": list(args.overrides)}
    (out / "learning.json").write_text(json.dumps({"invocation": invocation, "rows": rows}, indent=2, default=str)
                                       .replace("NaN", "null") + "\n")
    sys.stdout.write((out / "learning.md").read_text())
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
