"""The batch types, a leaf the batcher, the step and the loop all read (NumPy only, nothing of ours
but the `Sample` type): how samples become a batch (`BatchSpec`), one packed batch (`PackedBatch`:
the host arrays of `step.StudentInputs` / `step.TeacherInputs` and its samples), and the two rules
both sides of the host/device line share: length buckets (`bucket_length`) and how rows split into
micro-batches (`num_micro_batches`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from openclaw_jax.samples import Sample


def bucket_length(n: int, minimum: int, maximum: int | None = None, quantum: int = 0) -> int:
    """The bucket of a length n: the smallest power of two >= max(n, minimum) while that is <= `quantum`,
    else n rounded up to a multiple of `quantum` (quantum 0: powers of two only); error if it exceeds
    `maximum` (a bucket past `maximum` is clipped to it)."""
    size = max(int(minimum), 1)
    while size < n:
        size *= 2
    if quantum > 0 and size > quantum:
        size = max(-(-max(int(n), int(minimum)) // quantum) * quantum, 1)
    if maximum is not None and size > maximum:
        if n > maximum:
            raise ValueError(f"length {n} exceeds the largest bucket {maximum}")
        size = maximum
    return size


def num_micro_batches(rows: int, micro_batch_size: int) -> int:
    """How many micro-batches `rows` rows split into (1 when micro-batching is off or too big)."""
    if micro_batch_size <= 0 or micro_batch_size >= rows:
        return 1
    if rows % micro_batch_size:
        raise ValueError(f"micro_batch_size={micro_batch_size} must divide the {rows} rows of the batch")
    return rows // micro_batch_size


@dataclass(frozen=True)
class BatchSpec:
    """How samples become a batch. Each field is the config key of the same name: `trainer.<field>`,
    except `max_candidates` and `temperature` (the samples' source: `SampleSpec`, from the gateway),
    `uses_hints` and `kl_coef` (`loss.<field>`), `holdout_every` (`gate.holdout_every`, 0 with the gate off)
    and the ones the trainer sets itself (`pad_id`,
    `row_multiple`, the images); `train_step.batch_spec(cfg, ...)` fills them in. What the layouts
    derive from them is computed once, here, when the spec is made: `shares_prefix` and `reference`."""

    samples_per_step: int = 4
    max_candidates: int = 3
    min_seq_bucket: int = 32
    max_seq_len: int = 2048
    min_response_bucket: int = 16
    rl_only_teacher: Literal["unhinted", "none"] = "unhinted"
    # False (the `rl` method): no teacher candidates at all, and hint-only samples (kind "opd",
    # reward 0) are dropped so they do not dilute the GRPO mean with zero-loss rows
    uses_hints: bool = True
    max_staleness: int = 2
    staleness_mode: Literal["drop", "importance"] = "drop"
    # the trainer's tau: a sample sampled at another temperature is refused (None: accept any)
    temperature: float | None = None
    pad_id: int = 0
    packing: bool = False           # several sequences per row (segment ids, per-segment positions)
    bucket_quantum: int = 0         # lengths past this are multiples of it (0: powers of two)
    micro_batch_size: int = 0       # packing keeps each micro-batch's sequences in its own rows
    row_multiple: int = 1           # packed row counts are multiples of this (the batch shards)
    shared_prefix_teacher: bool = False   # the prompt prefix common to a sample's candidates runs once
    kl_coef: float = 0.0            # the loss's KL anchor to the frozen initial model (`reference`)
    # packing: a prompt prefix common to every sequence of a batch (OpenClaw's system prompt) at least
    # this long runs once per packed row, not once per sequence (0: never; `batch_prefix`)
    batch_prefix_min: int = 0
    # packing: a shape used before (compiled) is taken over a new one that saves fewer than this
    # fraction of its token slots (0: always the fewest slots)
    shape_reuse_slack: float = 0.1
    # a vision-language student (QwenVL): its `ImageProcessorConfig` and image token id; the input
    # pipeline reads each batch's images from the store and attaches their patches (trainer/vision_batch.py)
    image_processor: Any = None
    image_token_id: int | None = None
    # samples held out of training for the promotion gate's replay set (samples/holdout.py: 1 in N; 0: none)
    holdout_every: int = 0
    # derived (not arguments): the teacher layout is the shared-prefix one when it is asked for and a
    # sample can have two or more candidates (one candidate shares nothing; the packed layout pads less)
    shares_prefix: bool = field(init=False)
    # the batch carries the KL anchor's reference (`kl_coef` nonzero): with the shared prefix, the teacher
    # row also holds the un-hinted prompt's rest, so the teacher pass gives the reference log-probs and
    # no separate reference pass runs (RL-only samples: their candidate)
    reference: bool = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "shares_prefix",
                           self.shared_prefix_teacher and self.uses_hints and self.max_candidates >= 2)
        object.__setattr__(self, "reference", self.kl_coef != 0)
        if self.bucket_quantum < 0:
            raise ValueError(f"bucket_quantum={self.bucket_quantum} must be >= 0 (0: power-of-two buckets)")
        if self.row_multiple < 1:
            raise ValueError(f"row_multiple={self.row_multiple} must be >= 1")
        if not 0 <= self.shape_reuse_slack < 1:
            raise ValueError(f"shape_reuse_slack={self.shape_reuse_slack} must be in [0, 1)")
        if self.image_processor is not None and (self.packing or self.shares_prefix):
            raise ValueError("a vision-language student trains on unpacked batches: set trainer.packing=false and "
                             "trainer.shared_prefix_teacher=false")


@dataclass
class PackedBatch:
    """One step's batch on the host: `student` and `teacher` hold the NumPy arrays of `step.StudentInputs`
    and `step.TeacherInputs` by field name (per sample `[B, ...]` / `[B, C, ...]`, rows packed where the
    layout packs them, `pixel_values` with images); `samples` are the real rows' samples in row order
    (padding rows follow them)."""

    student: dict[str, np.ndarray]
    teacher: dict[str, np.ndarray]
    samples: list[Sample]
    staleness: np.ndarray                 # [n_real] versions behind the trainer
    kinds: dict[str, int] = field(default_factory=dict)
    real_tokens: dict[str, int] = field(default_factory=dict)   # "student" / "teacher": unpadded tokens
    # the images' grid of every row, when the batch has `pixel_values` (trainer/vision_batch.py)
    image_grid: tuple[tuple[int, int, int], ...] = ()

    @property
    def has_teacher(self) -> bool:
        """Whether the step runs a teacher pass: a sample has a teacher candidate, or the pass gives the
        reference log-probs (`BatchSpec.reference`)."""
        return bool(np.any(self.teacher["candidate_mask"] > 0)) or "reference_offset" in self.teacher

    def slots(self, part: str) -> int:
        """Token slots (real + padding) of the `part` ("student" / "teacher") model inputs (the teacher's:
        0 when no teacher pass runs)."""
        if part == "teacher" and not self.has_teacher:
            return 0
        return int(getattr(self, part)["input_ids"].size)

    def padding_fraction(self, part: str | None = None) -> float:
        """Padded / total token slots of the student and teacher inputs (or of one `part`)."""
        parts = ("student", "teacher") if part is None else (part,)
        total = sum(self.slots(p) for p in parts)
        real = sum(self.real_tokens.get(p, 0) for p in parts)
        return (total - real) / total if total else 0.0

    def phase_keys(self) -> tuple[tuple, tuple | None]:
        """(student key, teacher key): the student phases (old pass, train step) compile once per
        student key, the teacher pass once per teacher key (None: no teacher pass runs)."""
        t = self.student["response_ids"].shape[1]
        student = ("student", self.student["input_ids"].shape, t)
        if not self.has_teacher:
            return student, None
        layout = "teacher_shared" if "prefix_len" in self.teacher else "teacher"   # another program
        return student, (layout, self.teacher["input_ids"].shape, t)
