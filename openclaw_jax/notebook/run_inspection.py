"""Helpers for looking at a finished (or running) run directory from notebooks and scripts.

A run directory (see `openclaw_jax.train`) holds `config.yaml`, `base_model/`, `samples/`,
`ckpt/`, `tb/`, `export/step_N/`, `eval.jsonl`, `steps.jsonl` and `summary.json`. This module
finds one (`run_dir_from_env`), creates a tiny one when there is none (`ensure_run`, the
`configs/tiny_cpu.yaml` loop in a subprocess), and reads its pieces back.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from openclaw_jax.config import load_run_config
from openclaw_jax.samples import SampleStore

log = logging.getLogger(__name__)

RUN_DIR_ENV = "OPENCLAW_RUN_DIR"
TINY_CONFIG = "tiny_cpu.yaml"


def repo_root() -> Path:
    """The source checkout this package runs from (it holds `configs/`)."""
    return Path(__file__).resolve().parents[2]


def config_path(name: str = TINY_CONFIG) -> Path:
    path = repo_root() / "configs" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"config {str(path)!r} not found; run from a source checkout of openclaw_jax (the configs/ folder "
            "is not part of an installed wheel) or pass a run directory that already exists")
    return path


def default_run_dir() -> Path:
    return repo_root() / "runs" / "notebook_tiny"


def run_dir_from_env(default: str | os.PathLike | None = None) -> Path:
    """`$OPENCLAW_RUN_DIR`, else `default`, else `<repo>/runs/notebook_tiny`."""
    value = os.environ.get(RUN_DIR_ENV) or default or default_run_dir()
    return Path(value).expanduser().resolve()


def is_complete_run(run_dir: str | os.PathLike) -> bool:
    """True once the train entry point has finished (it writes `summary.json` last)."""
    return (Path(run_dir) / "summary.json").is_file()


def ensure_run(run_dir: str | os.PathLike, *, steps: int = 2, overrides: Sequence[str] = (),
               timeout_s: float = 1200.0) -> Path:
    """Return `run_dir`; if it holds no run yet (no `config.yaml`), first run the tiny CPU loop into it.

    A directory that already has a `config.yaml` is used as it is, finished or still running
    (nothing is ever started into an existing run). Otherwise `python -m openclaw_jax.train
    --config configs/tiny_cpu.yaml trainer.max_steps=<steps>` runs in a subprocess (about two
    minutes on two cores; its log goes to `<run_dir>/train.log`), with the gateway on an
    ephemeral port so it cannot clash with anything already listening.
    """
    run_dir = Path(run_dir).expanduser().resolve()
    if (run_dir / "config.yaml").is_file():
        if not is_complete_run(run_dir):
            log.warning("%s has no summary.json: the run is still going or stopped early; showing what is there",
                        run_dir)
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", str(config_path()), f"run_dir={run_dir}",
           f"trainer.max_steps={steps}", "progress=false", "gateway.port=0", *overrides]
    log.info("creating a tiny run in %s: %s", run_dir, " ".join(cmd))
    t0 = time.monotonic()
    with open(run_dir / "train.log", "ab") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=repo_root())
    if proc.returncode != 0 or not is_complete_run(run_dir):
        tail = (run_dir / "train.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the tiny run in {run_dir} failed (exit code {proc.returncode}); delete the directory "
                           f"before trying again. End of {run_dir / 'train.log'}:\n{tail}")
    log.info("tiny run finished in %.0f s", time.monotonic() - t0)
    return run_dir


def load_config(run_dir: str | os.PathLike):
    """The resolved `ExperimentConfig` the run was started with (with `run_dir` set to `run_dir`)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} not found; is {str(run_dir)!r} a run directory?")
    # run_dir is re-pointed at where the run is now, so a moved or copied run still finds its files;
    # a run written before the config's keys moved reads in today's keys (`upgrade_run_config`)
    return load_run_config(path, [f"run_dir={Path(run_dir).resolve()}"])


def load_samples(run_dir: str | os.PathLike, start: int = 0, stop: int | None = None) -> list:
    """Samples `[start, stop)` of the run's store (read-only; safe while the run writes)."""
    store = SampleStore(Path(run_dir) / "samples", readonly=True)
    try:
        count = None if stop is None else max(stop - start, 0)
        return store.read(start, count)
    finally:
        store.close()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Records of a JSON-lines file (missing file -> []; a torn last line is ignored)."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: unparsable line skipped: %.80s", path, line)
    return records


def step_window(run_dir: str | os.PathLike, step: int) -> tuple[int, int]:
    """Store offsets `[start, end)` of the samples trained at `step` (the TensorBoard step, >= 1).

    From `steps.jsonl` when the run wrote it (its first record for a step is the trained
    window; later ones with the same number are windows dropped before the next step).
    Otherwise assumes nothing was dropped: `[(step-1)*B, step*B)` with B the rollout batch size.
    """
    if step < 1:
        raise ValueError(f"step={step}: trained steps start at 1")
    for record in read_jsonl(Path(run_dir) / "steps.jsonl"):
        if int(record.get("step", -1)) == step:
            return int(record["start_offset"]), int(record["end_offset"])
    batch = load_config(run_dir).trainer.samples_per_step
    return (step - 1) * batch, step * batch


def latest_export(run_dir: str | os.PathLike) -> Path | None:
    """The newest `export/step_N` directory (HF safetensors + tokenizer), or None."""
    exports = [p for p in (Path(run_dir) / "export").glob("step_*") if (p / "config.json").is_file()]
    if not exports:
        return None
    return max(exports, key=lambda p: int(p.name.split("_")[-1]))


def case_counts(samples: Sequence) -> dict[str, Counter]:
    """`{kind: Counter(reward -> count)}` over `samples` (kinds opd+rl, opd, rl)."""
    out: dict[str, Counter] = {}
    for s in samples:
        out.setdefault(s.kind, Counter())[float(s.reward)] += 1
    return out


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], max_cell: int = 120) -> str:
    """A Markdown table (cells shortened to `max_cell` characters, pipes and newlines escaped)."""
    def cell(value: object) -> str:
        text = str(value).replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= max_cell else text[:max_cell - 1] + "…"

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
