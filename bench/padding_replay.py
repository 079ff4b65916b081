"""Replay a run's stored samples through the batcher, offline: padding fraction and step shapes.

Reads `<run_dir>/samples` with the run's `config.yaml` (or `--config`, plus dotted `--set`
overrides), forms the windows the trainer trained on (`steps.jsonl`; without one, consecutive
`samples_per_step` windows) and packs each as the trainer does (drops included, at the weight
version the trainer had at that step). No model runs: this measures the batch layout only.

    python bench/padding_replay.py runs/cpu_demo [--config configs/cpu_demo.yaml]
                                   [--set trainer.bucket_quantum=128 ...] [--json]

Reports per step the padding fraction (padded / total token slots of the student and teacher
inputs; a step without teacher candidates runs no teacher pass and has no teacher slots), the
student / teacher shapes, and the mean and max padding, the distinct compiled step shapes and the
bound the config states (`ShapeLadder.bound`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics


def windows_of(run_dir: str, batcher) -> list[tuple[int, int, int]]:
    """(step, start, stop) of each window the run trained on (`steps.jsonl`; without one, consecutive
    `batch_size` windows), as far as the store holds samples."""
    available = batcher.tail.refresh()
    steps_file = os.path.join(run_dir, "steps.jsonl")
    if os.path.exists(steps_file):
        with open(steps_file) as f:
            windows = [(r["step"], r["start_offset"], r["end_offset"]) for r in map(json.loads, f) if r]
    else:
        b = batcher.spec.samples_per_step
        windows = [(i // b + 1, i, i + b) for i in range(0, available - b + 1, b)]
    return [w for w in windows if w[2] <= available]


def replay(run_dir: str, config: str | None = None, overrides: tuple[str, ...] = ()) -> dict:
    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.trainer.batcher import SampleBatcher, shape_ladder
    from openclaw_jax.trainer.train_step import batch_spec

    cfg = load_experiment_config([config or os.path.join(run_dir, "config.yaml")], list(overrides))
    spec = batch_spec(cfg, cfg.sample_spec())
    batcher = SampleBatcher(os.path.join(run_dir, "samples"), spec)
    try:
        rows, keys = [], set()
        for step, start, stop in windows_of(run_dir, batcher):
            packed = next(iter(batcher.batches(start, stop, current_version=step - 1)), None)
            if packed is None:
                continue
            student, teacher = packed.phase_keys()
            keys.update(k for k in (student, teacher) if k is not None)
            rows.append({"step": step, "padding_fraction": packed.padding_fraction(),
                         "student_padding_fraction": packed.padding_fraction("student"),
                         "teacher_padding_fraction": packed.padding_fraction("teacher"),
                         "student_shape": list(student[1]), "teacher_shape": list(teacher[1]) if teacher else None,
                         "response_len": student[2], "real_tokens": packed.real_tokens})
    finally:
        batcher.close()
    fractions = [r["padding_fraction"] for r in rows]
    ladder = shape_ladder(spec)
    return {"steps": rows, "padding_fraction_mean": statistics.fmean(fractions) if fractions else 0.0,
            "padding_fraction_max": max(fractions, default=0.0), "distinct_shapes": len(keys),
            "shape_bound": ladder.bound, "student_shape_bound": ladder.student_shapes,
            "teacher_shape_bound": ladder.teacher_shapes}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run directory with samples/ (and config.yaml, steps.jsonl)")
    ap.add_argument("--config", default=None, help="config YAML to batch with (default: <run_dir>/config.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="dotted config override, e.g. trainer.bucket_quantum=128 (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    out = replay(args.run_dir, args.config, tuple(args.overrides))
    if args.json:
        print(json.dumps(out))
        return
    for r in out["steps"]:
        print(f"step {r['step']:3d}  padding {r['padding_fraction']:.3f}  student {r['student_shape']}  "
              f"teacher {r['teacher_shape']}  T {r['response_len']}")
    print(f"padding fraction: mean {out['padding_fraction_mean']:.3f}, max {out['padding_fraction_max']:.3f} "
          f"over {len(out['steps'])} steps; distinct step shapes {out['distinct_shapes']} "
          f"(bound {out['shape_bound']}: student {out['student_shape_bound']}, teacher {out['teacher_shape_bound']})")


if __name__ == "__main__":
    main()
