"""Replay a run's training windows through the real trainer, timed, under two batch layouts.

The run's own layout (its `config.yaml`: packing, quantum buckets, shape reuse) against the layout
before sequence packing (one sample per row, power-of-two buckets), on the same stored samples and
windows (`steps.jsonl`), each through its own `Trainer` built from the run's config and base model.
The two trainers alternate step by step, so a load that drifts over the replay hits both alike.
Step times include compilation, as a live run pays it (a new shape compiles on first use).

    python bench/step_replay.py runs/cpu_demo [--steps N] [--json]

Prints, per layout: the total trainer seconds over the replay, the median step, the compiled
shapes, the padding fraction; and after / before ratios. This is the trainer's share of a run's
wall time (the rollouts, evaluations and weight syncs do not depend on the batch layout).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from padding_replay import windows_of  # noqa: E402  (bench/ is not a package)

BEFORE = ("trainer.packing=false", "trainer.bucket_quantum=0", "trainer.shape_reuse_slack=0")


def _trainer(config_path: str, overrides: tuple[str, ...]):
    from openclaw_jax.config import load_run_config
    from openclaw_jax.runs.base_model import build_trainer, load_base_model

    cfg = load_run_config(config_path, list(overrides))   # a run's config.yaml, of any version
    return build_trainer(cfg, load_base_model(cfg))


def replay_timed(run_dir: str, steps: int = 0) -> dict:
    from openclaw_jax.trainer.batcher import SampleBatcher

    config_path = os.path.join(run_dir, "config.yaml")
    layouts = {"before": BEFORE, "after": ()}
    trainers = {name: _trainer(config_path, ov) for name, ov in layouts.items()}
    batchers = {name: SampleBatcher(os.path.join(run_dir, "samples"), t.train_step.spec)
                for name, t in trainers.items()}
    rows: dict[str, list[dict]] = {name: [] for name in layouts}
    try:
        windows = windows_of(run_dir, batchers["after"])
        for step, start, stop in windows[:steps or None]:
            for name in layouts:
                packed = next(iter(batchers[name].batches(start, stop, current_version=step - 1)), None)
                if packed is None:
                    continue
                t0 = time.perf_counter()
                metrics = trainers[name].train_on(packed)
                rows[name].append({"step": step, "seconds": time.perf_counter() - t0,
                                   "padding_fraction": packed.padding_fraction(),
                                   "compiled_shapes": metrics.get("batch/compiled_shapes", float("nan"))})
                logging.getLogger(__name__).info("step %d %s: %.1f s", step, name, rows[name][-1]["seconds"])
    finally:
        for b in batchers.values():
            b.close()
    out = {"run_dir": run_dir, "steps": len(rows["after"])}
    for name, rs in rows.items():
        out[name] = {"total_s": sum(r["seconds"] for r in rs),
                     "median_step_s": statistics.median(r["seconds"] for r in rs) if rs else float("nan"),
                     "compiled_shapes": max((r["compiled_shapes"] for r in rs), default=0),
                     "padding_fraction_mean": statistics.fmean(r["padding_fraction"] for r in rs) if rs else 0.0,
                     "per_step": rs}
    out["total_after_over_before"] = out["after"]["total_s"] / out["before"]["total_s"]
    out["median_after_over_before"] = out["after"]["median_step_s"] / out["before"]["median_step_s"]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a finished run directory (config.yaml, samples/, steps.jsonl)")
    ap.add_argument("--steps", type=int, default=0, help="replay only the first N windows (0: all)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)
    from openclaw_jax.logs import configure_logging

    configure_logging()
    result = replay_timed(args.run_dir, args.steps)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['steps']} training windows of {args.run_dir}, each through both trainers in turn")
    print(f"{'layout':<8} {'trainer s':>10} {'median step s':>14} {'shapes':>7} {'padding':>8}")
    for name in ("before", "after"):
        r = result[name]
        print(f"{name:<8} {r['total_s']:>10.1f} {r['median_step_s']:>14.2f} {r['compiled_shapes']:>7.0f} "
              f"{r['padding_fraction_mean']:>8.3f}")
    print(f"after / before: total {result['total_after_over_before']:.2f}x, "
          f"median step {result['median_after_over_before']:.2f}x")


if __name__ == "__main__":
    main()
