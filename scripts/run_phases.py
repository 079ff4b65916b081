"""Where a finished run's wall time went: start-up, held-out evaluations, the trainer's phases, the rest.

    python scripts/run_phases.py runs/cpu_demo [runs/other ...] [--json]

Read from what every run writes: `summary.json` (wall time), `eval.jsonl` (each evaluation's end and,
since it records them, its seconds) and TensorBoard (`time/old_pass`, `time/teacher_pass`,
`time/reference_pass`, `time/train_step`, `time/step` per step). Evaluations hold the serving side; the
trainer's steps run beside the simulated users' rollouts, so "rollouts only" is the wall time in which
neither an evaluation nor a step ran: start-up excluded, the time the trainer waited for samples.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from openclaw_jax.notebook.run_inspection import read_jsonl  # noqa: E402
from openclaw_jax.notebook.tb_reader import read_scalars  # noqa: E402

PHASES = ("old_pass", "teacher_pass", "reference_pass", "train_step")


def phases(run_dir: Path) -> dict[str, float]:
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = read_jsonl(run_dir / "eval.jsonl")
    scalars = read_scalars(run_dir / "tb")
    out: dict[str, float] = {"wall_s": float(summary["wall_time_s"])}
    first = evals[0] if evals else None
    # the first evaluation starts when serving is up: everything before it is start-up
    if first is not None and "eval_s" in first:
        out["startup_s"] = first["time_s"] - first["eval_s"]
    out["evaluations"] = float(len(evals))
    out["evaluation_s"] = float(sum(e.get("eval_s", 0.0) for e in evals))
    for name in PHASES:
        out[f"trainer_{name}_s"] = float(sum(v for _, v in scalars.get(f"time/{name}", [])))
    out["trainer_steps"] = float(len(scalars.get("time/step", [])))
    out["trainer_s"] = float(sum(v for _, v in scalars.get("time/step", [])))
    out["rollouts_only_s"] = out["wall_s"] - out.get("startup_s", 0.0) - out["evaluation_s"] - out["trainer_s"]
    return {k: round(v, 1) for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (run_dir of a finished run)")
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    args = parser.parse_args()
    rows = {str(r): phases(r) for r in args.runs}
    if args.json:
        for name, row in rows.items():
            print(json.dumps({"run": name, **row}))
        return 0
    keys = list(next(iter(rows.values())))
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  " + "  ".join(f"{Path(n).name:>14}" for n in rows))
    for key in keys:
        print(f"{key:{width}}  " + "  ".join(f"{row.get(key, float('nan')):>14}" for row in rows.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
