"""From stored samples to padded, bucketed training batches (host side, NumPy).

`SampleBatcher.batches(start, stop)` reads the samples in `[start, stop)` through the run's one
`SampleTail` (an incremental reader: it reads only those records, never rescans the store), drops
those that cannot train (too stale, too long, another temperature), and packs `batch_size` of
them per batch. `pack` turns a list of samples into the padded arrays of
`StudentInputs` / `TeacherInputs`, with every length rounded up to a bucket so each shape
compiles once.

Buckets: powers of two up to `bucket_quantum`, then multiples of it (quantum 0: powers of two
throughout), so a length costs at most one quantum of padding and the number of shapes stays
bounded (log2(quantum) + max_seq_len / quantum per dimension).

Packing (`BatchSpec.packing`): the sequences (the student's prompt+response per sample, the
teacher's hint prompt+response per candidate) are laid first-fit-decreasing into rows, several
per row. Each gets a segment id (1, 2, ... within its row; padding slots are segment 0) and
positions restarting at 0, so attention never crosses a segment and RoPE sees each sequence as if
it were alone; `row` / `offset` say where each sequence starts. Rows are the bucketed length of
the longest sequence, or up to 4 times it (multiples of that length or of the quantum, at most
`max_seq_len`) when that packs into fewer slots. The per-sample arrays (response ids, masks,
advantages, ...) keep their `[B, T]` layout, so the loss and its metrics are those of the
unpacked batch. With micro-batches the sequences of micro-batch g (samples g, g + n, ...) go into
rows g, g + n, ... only, and `row` is the index among that micro-batch's rows.

Shared prefix (`BatchSpec.shared_prefix`, teacher only, not packed): the prompt tokens common to
all candidates of a sample (everything before the hint) become `prefix_ids`, run once per sample;
each candidate keeps only the rest of its prompt and the response (step.py).

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
from openclaw_jax.trainer.step import num_micro_batches  # the phases split rows the same way

log = logging.getLogger(__name__)


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
    packing: bool = False           # several sequences per row (segment ids, per-segment positions)
    bucket_quantum: int = 0         # lengths past this are multiples of it (0: powers of two)
    micro_batch_size: int = 0       # packing keeps each micro-batch's sequences in its own rows
    row_multiple: int = 1           # packed row counts are multiples of this (the batch shards)
    shared_prefix: bool = False     # teacher: the prompt prefix common to a sample's candidates runs once

    def __post_init__(self):
        if self.bucket_quantum < 0:
            raise ValueError(f"bucket_quantum={self.bucket_quantum} must be >= 0 (0: power-of-two buckets)")
        if self.row_multiple < 1:
            raise ValueError(f"row_multiple={self.row_multiple} must be >= 1")


@dataclass
class PackedBatch:
    """NumPy arrays for one step plus host-side bookkeeping."""

    student: dict[str, np.ndarray]
    teacher: dict[str, np.ndarray]
    samples: list[Sample]
    staleness: np.ndarray                 # [n_real] versions behind the trainer
    kinds: dict[str, int] = field(default_factory=dict)
    real_tokens: dict[str, int] = field(default_factory=dict)   # "student" / "teacher": unpadded tokens

    @property
    def num_tokens(self) -> int:
        return int(self.student["response_mask"].sum())

    def slots(self, part: str) -> int:
        """Token slots (real + padding) of the `part` ("student" / "teacher") model inputs."""
        arrays = getattr(self, part)
        return int(arrays["input_ids"].size + (arrays["prefix_ids"].size if "prefix_ids" in arrays else 0))

    def padding_fraction(self, part: str | None = None) -> float:
        """Padded / total token slots of the student and teacher inputs (or of one `part`)."""
        parts = ("student", "teacher") if part is None else (part,)
        total = sum(self.slots(p) for p in parts)
        real = sum(self.real_tokens.get(p, 0) for p in parts)
        return (total - real) / total if total else 0.0

    def shape_key(self) -> tuple:
        """The shapes that decide which compiled phases this batch runs."""
        return (self.student["input_ids"].shape, self.student["response_ids"].shape,
                self.teacher["input_ids"].shape, self.teacher["candidate_mask"].shape)


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


def pack_rows(lengths: Sequence[int], groups: Sequence[int], n_groups: int, capacity: int,
              row_multiple: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    """First-fit-decreasing placement of sequences of `lengths` into rows of `capacity` tokens.

    Sequence i goes into a row of its group `groups[i]` (group g owns rows g, g + n_groups, ...).
    Returns (local row within its group, offset within the row) per sequence and the row count
    (the same for every group, a multiple of `n_groups` and of `row_multiple`). Zero-length
    sequences (padding) take no slot: row 0, offset 0.
    """
    row = np.zeros(len(lengths), np.int32)
    offset = np.zeros(len(lengths), np.int32)
    per_group = 1
    for g in range(n_groups):
        members = [i for i in range(len(lengths)) if groups[i] == g and lengths[i] > 0]
        free: list[int] = []                        # remaining capacity of each row of group g
        for i in sorted(members, key=lambda i: -lengths[i]):
            if lengths[i] > capacity:
                raise ValueError(f"a sequence of {lengths[i]} tokens does not fit rows of {capacity}")
            j = next((j for j, f in enumerate(free) if f >= lengths[i]), len(free))
            if j == len(free):
                free.append(capacity)
            row[i], offset[i] = j, capacity - free[j]
            free[j] -= lengths[i]
        per_group = max(per_group, len(free))
    rows = per_group * n_groups
    while rows % row_multiple:
        rows += n_groups
    return row, offset, rows


def _fill_packed(seqs: Sequence[Sequence[int] | None], groups: Sequence[int], n_groups: int, length: int,
                 max_length: int, row_multiple: int, pad_id: int, quantum: int = 0) -> dict[str, np.ndarray]:
    """Packed rows of the sequences (None: padding): input_ids, positions, segment_ids, row, offset."""
    lengths = [0 if q is None else len(q) for q in seqs]
    # Rows of the bucketed length, or up to 4 times it (multiples of it or of the quantum, at most
    # `max_length`) when that leaves fewer padded slots, e.g. two 272- and two 288-token
    # candidates: one row of 1152, not four of 384.
    best = None
    capacities = {length * k for k in range(1, 5)}
    if quantum > 0:
        capacities |= set(range(-(-length // quantum) * quantum, 4 * length + 1, quantum))
    for capacity in sorted(x for x in capacities if x == length or x <= max_length):
        layout = pack_rows(lengths, groups, n_groups, capacity, row_multiple)
        if best is None or layout[2] * capacity < best[0][2] * best[1]:
            best = (layout, capacity)
    (row, offset, rows), length = best
    ids = np.full((rows, length), pad_id, np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    segments = np.zeros((rows, length), np.int32)
    count = np.zeros(rows, np.int32)
    for i, q in enumerate(seqs):
        if not lengths[i]:
            continue
        r, o, n = int(row[i]) * n_groups + groups[i], int(offset[i]), lengths[i]
        count[r] += 1
        ids[r, o:o + n] = q
        positions[r, o:o + n] = np.arange(n)
        segments[r, o:o + n] = count[r]
    for r in range(rows):  # the padding tail of a row: positions from 0, segment 0
        used = int(np.count_nonzero(segments[r]))
        positions[r, used:] = np.arange(length - used)
    return {"input_ids": ids, "positions": positions, "segment_ids": segments, "row": row, "offset": offset}


def pack(samples: Sequence[Sample], spec: BatchSpec, *, current_version: int | None = None) -> PackedBatch:
    """Pad `samples` (<= batch_size) into bucketed arrays; missing rows are padding (sample_mask 0).

    With `spec.packing` the student and teacher sequences are packed several per row (module doc).
    """
    if not samples:
        raise ValueError("pack needs at least one sample")
    if len(samples) > spec.batch_size:
        raise ValueError(f"{len(samples)} samples do not fit batch_size={spec.batch_size}")
    b, c, q = spec.batch_size, spec.max_candidates, spec.bucket_quantum
    t = bucket_length(max(len(s.response_ids) for s in samples), spec.min_response_bucket, spec.max_seq_len, q)
    ls = bucket_length(max(len(s.prompt_ids) + len(s.response_ids) for s in samples), spec.min_seq_bucket,
                       spec.max_seq_len, q)
    lt = bucket_length(max(sample_length(s, spec) for s in samples), spec.min_seq_bucket, spec.max_seq_len, q)

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
    student_seqs: list[list[int] | None] = [None] * b
    teacher_seqs: list[list[int] | None] = [None] * (b * c)
    kinds: dict[str, int] = {}
    staleness = []
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p < 1:
            raise ValueError(f"sample {s.sample_id} has an empty prompt")
        student_seqs[i] = list(s.prompt_ids) + list(s.response_ids)
        student["input_ids"][i, :p + r] = student_seqs[i]
        student["response_start"][i] = p
        student["response_ids"][i, :r] = s.response_ids
        student["response_mask"][i, :r] = 1.0 if s.loss_mask is None else np.asarray(s.loss_mask, np.float32)
        student["advantages"][i, :r] = (float(s.reward) if s.token_advantages is None
                                        else np.asarray(s.token_advantages, np.float32))
        student["rollout_logprobs"][i, :r] = np.maximum(np.asarray(s.rollout_logprobs, np.float32), -1e4)
        student["sample_mask"][i] = 1.0
        for j, prompt in enumerate(teacher_prompts(s, spec)):
            teacher_seqs[i * c + j] = prompt + list(s.response_ids)
            teacher["input_ids"][i, j, :len(teacher_seqs[i * c + j])] = teacher_seqs[i * c + j]
            teacher["response_start"][i, j] = len(prompt)
            teacher["candidate_mask"][i, j] = 1.0
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
        v = parse_version(s.weight_version)
        staleness.append(0 if current_version is None or v is None else max(current_version - v, 0))
    real = {"student": sum(len(x) for x in student_seqs if x is not None),
            "teacher": sum(len(x) for x in teacher_seqs if x is not None)}
    if spec.packing:
        n = num_micro_batches(b, spec.micro_batch_size)
        packed = _fill_packed(student_seqs, [i % n for i in range(b)], n, ls, spec.max_seq_len, spec.row_multiple,
                              spec.pad_id, spec.bucket_quantum)
        student.update(packed)
    if spec.packing and not spec.shared_prefix:
        nt = num_micro_batches(b * c, spec.micro_batch_size)
        packed = _fill_packed(teacher_seqs, [f % nt for f in range(b * c)], nt, lt, spec.max_seq_len, spec.row_multiple,
                              spec.pad_id, spec.bucket_quantum)
        packed["row"] = packed["row"].reshape(b, c)
        packed["offset"] = packed["offset"].reshape(b, c)
        teacher.update(packed)
    if spec.shared_prefix:
        teacher, real["teacher"] = _shared_prefix_teacher(samples, spec)
    return PackedBatch(student, teacher, list(samples), np.asarray(staleness, np.int64), kinds, real)


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(q) for q in seqs)
    for i in range(n):
        if any(q[i] != seqs[0][i] for q in seqs[1:]):
            return i
    return n


def _shared_prefix_teacher(samples: Sequence[Sample], spec: BatchSpec) -> tuple[dict[str, np.ndarray], int]:
    """Teacher arrays with each sample's common candidate-prompt prefix split off (`TeacherInputs`):
    prefix_ids [B, P], prefix_len [B], and per candidate the rest of its prompt + the response. The
    prefix stops one token short of the shortest prompt, so every suffix holds the position that
    predicts the first response token. Returns (arrays, real teacher tokens)."""
    b, c, q = spec.batch_size, spec.max_candidates, spec.bucket_quantum
    prompts = [teacher_prompts(s, spec) for s in samples]
    plen = [min(_common_prefix(ps), min(len(p) for p in ps) - 1) if ps else 0 for ps in prompts]
    suffix = max([len(p) - n + len(s.response_ids) for s, ps, n in zip(samples, prompts, plen) for p in ps] + [1])
    lp = bucket_length(max(plen + [1]), spec.min_response_bucket, spec.max_seq_len, q)
    ls = bucket_length(suffix, spec.min_response_bucket, spec.max_seq_len, q)
    teacher = {"input_ids": np.full((b, c, ls), spec.pad_id, np.int32), "response_start": np.ones((b, c), np.int32),
               "candidate_mask": np.zeros((b, c), np.float32), "prefix_ids": np.full((b, lp), spec.pad_id, np.int32),
               "prefix_len": np.zeros((b,), np.int32)}
    real = 0
    for i, (s, ps, n) in enumerate(zip(samples, prompts, plen)):
        if not ps:
            continue
        teacher["prefix_ids"][i, :n] = ps[0][:n]
        teacher["prefix_len"][i] = n
        real += n
        for j, p in enumerate(ps):
            rest = p[n:] + list(s.response_ids)
            teacher["input_ids"][i, j, :len(rest)] = rest
            teacher["response_start"][i, j] = len(p) - n
            teacher["candidate_mask"][i, j] = 1.0
            real += len(rest)
    return teacher, real


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
