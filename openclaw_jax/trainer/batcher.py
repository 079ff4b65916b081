"""From stored samples to padded, bucketed training batches (host side, NumPy).

`SampleBatcher.batches(start, stop)` reads the samples in `[start, stop)` through the run's one
`SampleTail` (an incremental reader: it reads only those records, never rescans the store), drops
those that cannot train (too stale, too long, another temperature), and packs `batch_size` of
them per batch. `pack` turns a list of samples into the padded arrays of
`StudentInputs` / `TeacherInputs`, with every length rounded up to a bucket so each shape
compiles once.

Staleness: a sample generated with weight version v is `current - v` versions old. With
`staleness_mode="drop"` samples older than `max_staleness` are dropped; with `"importance"`
they are kept and the trainer weights their GRPO advantages by the truncated importance
ratio min(pi_old / pi_rollout, cap).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Iterator, Literal, Sequence

import numpy as np

from openclaw_jax.samples import Sample, SampleTail

log = logging.getLogger(__name__)


def bucket_length(n: int, minimum: int, maximum: int | None = None) -> int:
    """Smallest power of two >= max(n, minimum); error if it exceeds `maximum`."""
    size = max(int(minimum), 1)
    while size < n:
        size *= 2
    if maximum is not None and size > maximum:
        if n > maximum:
            raise ValueError(f"length {n} exceeds the largest bucket {maximum}")
        size = maximum
    return size


def parse_version(version: str | int | None) -> int | None:
    """Weight versions are step numbers written as strings; anything else has no age."""
    if version is None:
        return None
    try:
        return int(str(version).split("-")[-1])
    except ValueError:
        return None


@dataclass(frozen=True)
class BatchSpec:
    batch_size: int = 4
    max_candidates: int = 3
    min_seq_bucket: int = 32
    max_seq_len: int = 2048
    min_response_bucket: int = 16
    rl_only_teacher: Literal["unhinted", "none"] = "unhinted"
    # False (the `rl` method): no teacher candidates at all, and hint-only samples (kind "opd",
    # reward 0) are dropped so they do not dilute the GRPO mean with zero-loss rows
    use_hints: bool = True
    max_staleness: int = 2
    staleness_mode: Literal["drop", "importance"] = "drop"
    # the trainer's tau: a sample sampled at another temperature is refused (None: accept any)
    temperature: float | None = None
    pad_id: int = 0


@dataclass
class PackedBatch:
    """NumPy arrays for one step plus host-side bookkeeping."""

    student: dict[str, np.ndarray]
    teacher: dict[str, np.ndarray]
    samples: list[Sample]
    staleness: np.ndarray                 # [n_real] versions behind the trainer
    kinds: dict[str, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.student["response_mask"].sum())


def teacher_prompts(sample: Sample, spec: BatchSpec) -> list[list[int]]:
    """The teacher candidates of a sample: its hint prompts, or the un-hinted prompt for RL-only samples."""
    if not spec.use_hints:
        return []
    if sample.hint_prompt_ids:
        return [list(p) for p in sample.hint_prompt_ids[: spec.max_candidates]]
    if spec.rl_only_teacher == "unhinted":
        return [list(sample.prompt_ids)]
    return []


def sample_length(sample: Sample, spec: BatchSpec) -> int:
    """Longest sequence (student or any teacher candidate) this sample needs."""
    response = len(sample.response_ids)
    longest_prompt = max([len(sample.prompt_ids)] + [len(p) for p in teacher_prompts(sample, spec)])
    return longest_prompt + response


def pack(samples: Sequence[Sample], spec: BatchSpec, *, current_version: int | None = None) -> PackedBatch:
    """Pad `samples` (<= batch_size) into bucketed arrays; missing rows are padding (sample_mask 0)."""
    if not samples:
        raise ValueError("pack needs at least one sample")
    if len(samples) > spec.batch_size:
        raise ValueError(f"{len(samples)} samples do not fit batch_size={spec.batch_size}")
    b, c = spec.batch_size, spec.max_candidates
    t = bucket_length(max(len(s.response_ids) for s in samples), spec.min_response_bucket, spec.max_seq_len)
    ls = bucket_length(max(len(s.prompt_ids) + len(s.response_ids) for s in samples), spec.min_seq_bucket,
                       spec.max_seq_len)
    lt = bucket_length(max(sample_length(s, spec) for s in samples), spec.min_seq_bucket, spec.max_seq_len)

    student = {
        "input_ids": np.full((b, ls), spec.pad_id, np.int32),
        "response_start": np.ones((b,), np.int32),
        "response_ids": np.full((b, t), spec.pad_id, np.int32),
        "response_mask": np.zeros((b, t), np.float32),
        "advantages": np.zeros((b, t), np.float32),
        "rollout_logprobs": np.zeros((b, t), np.float32),
        "sample_mask": np.zeros((b,), np.float32),
    }
    teacher = {
        "input_ids": np.full((b, c, lt), spec.pad_id, np.int32),
        "response_start": np.ones((b, c), np.int32),
        "candidate_mask": np.zeros((b, c), np.float32),
    }
    kinds: dict[str, int] = {}
    staleness = []
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p < 1:
            raise ValueError(f"sample {s.sample_id} has an empty prompt")
        student["input_ids"][i, :p] = s.prompt_ids
        student["input_ids"][i, p:p + r] = s.response_ids
        student["response_start"][i] = p
        student["response_ids"][i, :r] = s.response_ids
        student["response_mask"][i, :r] = 1.0 if s.loss_mask is None else np.asarray(s.loss_mask, np.float32)
        student["advantages"][i, :r] = (float(s.reward) if s.token_advantages is None
                                        else np.asarray(s.token_advantages, np.float32))
        student["rollout_logprobs"][i, :r] = np.maximum(np.asarray(s.rollout_logprobs, np.float32), -1e4)
        student["sample_mask"][i] = 1.0
        for j, prompt in enumerate(teacher_prompts(s, spec)):
            q = len(prompt)
            teacher["input_ids"][i, j, :q] = prompt
            teacher["input_ids"][i, j, q:q + r] = s.response_ids
            teacher["response_start"][i, j] = q
            teacher["candidate_mask"][i, j] = 1.0
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
        v = parse_version(s.weight_version)
        staleness.append(0 if current_version is None or v is None else max(current_version - v, 0))
    return PackedBatch(student, teacher, list(samples), np.asarray(staleness, np.int64), kinds)


class SampleBatcher:
    """Windows of the store, read through one `SampleTail` for the run: filter samples that cannot
    train, batch the rest. `store` is the tail (the caller owns it) or a store directory (a tail is
    opened on first use; `close` closes it)."""

    def __init__(self, store: str | os.PathLike | SampleTail, spec: BatchSpec):
        self._tail = store if isinstance(store, SampleTail) else None
        self._owns_tail = self._tail is None
        self.store_dir = self._tail.directory if self._tail is not None else os.fspath(store)
        self.spec = spec
        self.dropped: dict[str, int] = {"stale": 0, "too_long": 0, "temperature": 0, "hint_only": 0}
        self._warned_temperature = False

    def _keep(self, sample: Sample, current_version: int | None) -> bool:
        if not self.spec.use_hints and sample.kind == "opd":  # no reward: nothing for GRPO to learn
            self.dropped["hint_only"] += 1
            return False
        if sample_length(sample, self.spec) > self.spec.max_seq_len:
            self.dropped["too_long"] += 1
            log.warning("dropping sample %s: %d tokens exceed max_seq_len=%d", sample.sample_id,
                        sample_length(sample, self.spec), self.spec.max_seq_len)
            return False
        tau = self.spec.temperature
        if tau is not None and abs(float(sample.temperature) - tau) > 1e-6:
            # log-probs at another temperature are another distribution: PPO ratios and the OPD
            # targets would be wrong for this sample (DESIGN section 6)
            self.dropped["temperature"] += 1
            if not self._warned_temperature:
                self._warned_temperature = True
                log.warning("refusing sample %s: sampled at temperature %g but trainer.temperature=%g (the rollout "
                            "log-probs and tau must match; make gateway.temperature equal trainer.temperature and "
                            "leave gateway.honor_client_sampling off); counted in samples/dropped_temperature, "
                            "logged once", sample.sample_id, sample.temperature, tau)
            return False
        v = parse_version(sample.weight_version)
        if (self.spec.staleness_mode == "drop" and current_version is not None and v is not None
                and current_version - v > self.spec.max_staleness):
            self.dropped["stale"] += 1
            return False
        return True

    def batches(self, start: int, stop: int, *, current_version: int | None = None) -> Iterator[PackedBatch]:
        """Batches from store offsets `[start, stop)` (which must exist); the last one may be partial
        (padded rows). Windows are read forward: offsets before `start` are released."""
        kept = [s for s in self.tail.read(start, stop) if self._keep(s, current_version)]
        for i in range(0, len(kept), self.spec.batch_size):
            yield pack(kept[i:i + self.spec.batch_size], self.spec, current_version=current_version)

    @property
    def tail(self) -> SampleTail:
        if self._tail is None:
            self._tail = SampleTail(self.store_dir)
        return self._tail

    def close(self) -> None:
        if self._owns_tail and self._tail is not None:
            self._tail.close()
            self._tail = None
