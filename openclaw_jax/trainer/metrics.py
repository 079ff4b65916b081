"""Token-weighted metrics, per-person sample metrics and the TensorBoard writer.

Metrics are carried as (sum, count) pairs so that means are exact across micro-batches,
devices and hosts (MaxText style): combine by adding sums and counts, divide once at the end.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from openclaw_jax.samples import Sample
from openclaw_jax.samples.person import person_tag

log = logging.getLogger(__name__)


class MetricAccumulator:
    """Adds (sum, count) pairs per metric name; `means()` divides once."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, float] = defaultdict(float)

    def add(self, name: str, total: float, count: float = 1.0) -> None:
        self._sums[name] += float(total)
        self._counts[name] += float(count)

    def merge(self, other: "MetricAccumulator") -> None:
        for name in other._sums:
            self.add(name, other._sums[name], other._counts[name])

    def means(self) -> dict[str, float]:
        return {k: self._sums[k] / self._counts[k] for k in self._sums if self._counts[k] > 0}

    def reset(self) -> None:
        self._sums.clear()
        self._counts.clear()


def person_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """A step's samples per person (samples/person.py): ``people/<person>/samples``, ``/reward`` (their
    mean reward), ``/satisfied`` and ``/corrected`` (turns the judge scored +1 and -1)."""
    by_person: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_person[sample.person].append(sample)
    out: dict[str, float] = {}
    for person, own in by_person.items():
        tag = f"people/{person_tag(person)}"
        out[f"{tag}/samples"] = float(len(own))
        out[f"{tag}/reward"] = float(np.mean([s.reward for s in own]))
        out[f"{tag}/satisfied"] = float(sum(s.eval_score > 0 for s in own))
        out[f"{tag}/corrected"] = float(sum(s.eval_score < 0 for s in own))
    return out


class MetricsWriter:
    """TensorBoard (tensorboardX) writer; only the first JAX process writes."""

    def __init__(self, logdir: str | Path, *, enabled: bool = True):
        self.logdir = Path(logdir)
        self._writer = None
        if enabled:
            from tensorboardX import SummaryWriter

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(str(self.logdir), flush_secs=5)

    def scalars(self, step: int, values: Mapping[str, float], prefix: str = "") -> None:
        if self._writer is None:
            return
        for name, value in values.items():
            value = float(value)
            if np.isfinite(value):
                self._writer.add_scalar(f"{prefix}{name}", value, step)

    def histogram(self, step: int, name: str, values: Iterable[float]) -> None:
        if self._writer is None:
            return
        arr = np.asarray(list(values), dtype=np.float64)
        if arr.size:
            self._writer.add_histogram(name, arr, step)

    def text(self, step: int, name: str, text: str) -> None:
        if self._writer is not None and text:
            self._writer.add_text(name, text, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
