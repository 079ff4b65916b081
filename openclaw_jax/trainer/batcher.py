"""From stored samples to padded, bucketed training batches (host side, NumPy).

`SampleBatcher.batches(start, stop)` reads store offsets `[start, stop)` through the run's one
`SampleTail`, drops samples that cannot train (too stale, too long, drawn at another temperature,
hint-only under `rl`) and `pack`s them into the arrays of `StudentInputs` / `TeacherInputs`.

Why the layouts look as they do:
- Lengths are bucketed (powers of two up to `bucket_quantum`, then multiples of it; the response
  length T a power of two), and packed batches take `rows x length` from a ladder known from the
  spec alone (`shape_ladder`, logged at start), so a run compiles a bounded set of step shapes.
- Packing (`BatchSpec.packing`) lays sequences first-fit-decreasing into rows, each with its own
  segment id and positions from 0, so attention never crosses a sequence; the per-sample `[B, T]`
  arrays keep their layout, so the loss is that of the unpacked batch. Micro-batch g's sequences
  stay in its own rows.
- A prompt prefix run once: the candidates' common prefix per sample (`shared_prefix_teacher`, when a
  sample can have 2+ candidates) or the batch's common prefix per packed row (`batch_prefix_min`,
  OpenClaw's system prompt), as a segment every sequence of the row sees (`prefix_rows.py`); the
  layout with fewer token slots is taken.
- Staleness: `drop` refuses samples more than `max_staleness` versions old; `importance` keeps them
  and the step weights their advantages (`advantages.py`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from openclaw_jax.models.segments import SHARED_SEGMENT  # keys every segment of a row sees
from openclaw_jax.samples import Sample, SampleTail
from openclaw_jax.samples.holdout import is_held_out
from openclaw_jax.trainer.advantages import sample_advantages
from openclaw_jax.trainer.batch import BatchSpec, PackedBatch, bucket_length, num_micro_batches
from openclaw_jax.trainer.prefix_rows import batch_prefix, rows_held, shared_prefix_teacher

log = logging.getLogger(__name__)


def parse_version(version: str | int | None) -> int | None:
    """Weight versions are step numbers written as strings; anything else has no age."""
    if version is None:
        return None
    try:
        return int(str(version).split("-")[-1])
    except ValueError:
        return None


def teacher_prompts(sample: Sample, spec: BatchSpec) -> list[list[int]]:
    """The teacher candidates of a sample: its hint prompts, or the un-hinted prompt for RL-only samples."""
    if not spec.uses_hints:
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


def length_ladder(minimum: int, maximum: int, quantum: int = 0) -> tuple[int, ...]:
    """Every length `bucket_length(n, minimum, maximum, quantum)` can return for 1 <= n <= maximum."""
    rungs, n = [], 1
    while n <= maximum:
        rungs.append(bucket_length(n, minimum, maximum, quantum))
        n = rungs[-1] + 1
    return tuple(rungs)


def row_ladder(sequences: int, n_groups: int, row_multiple: int = 1) -> tuple[int, ...]:
    """The packed row counts for `sequences` sequences split over `n_groups` micro-batch groups: k rows
    per group, k = k0 times 1, 2, 3, 4, 6, 8, 12, ... (each at most 1.5 times the one before) up to the
    first that holds one sequence per row (k0: the least that makes k * n_groups a multiple of
    `row_multiple`)."""
    per_group = -(-sequences // n_groups)
    k0 = row_multiple // math.gcd(row_multiple, n_groups)
    steps, p = [1], 1
    while k0 * steps[-1] < per_group:
        steps += [3 * p // 2, 2 * p] if p >= 2 else [2 * p]
        p *= 2
    rows = [k0 * k for k in steps]
    first_full = next(r for r in rows if r >= per_group)
    return tuple(n_groups * r for r in rows if r <= first_full)


@dataclass(frozen=True)
class ShapeLadder:
    """The finite set of shapes a `BatchSpec` can produce (each a compiled program of the step).

    student: (rows, length) of the student's `input_ids` (unpacked: rows = batch_size);
    teacher: (rows, length) of the teacher's packed `input_ids` (unpacked: rows = batch_size * C;
    shared prefix: rows = batch_size, one per sample, up to C * max_seq_len long);
    response: T of the per-sample `[B, T]` arrays. The student phases (old pass, train step) compile
    once per (student shape, T), the teacher pass once per (teacher shape, T); a batch without any
    teacher candidate runs no teacher pass."""

    student_rows: tuple[int, ...]
    student_lengths: tuple[int, ...]
    teacher_rows: tuple[int, ...]
    teacher_lengths: tuple[int, ...]
    response: tuple[int, ...]
    shared_prefix: bool
    use_teacher: bool
    shared_lengths: tuple[int, ...] = ()   # shared prefix: lengths of the B per-sample rows
    packed_teacher: bool = True           # the packed (or unpacked) teacher layout can occur

    @property
    def student_shapes(self) -> int:
        return len(self.student_rows) * len(self.student_lengths) * len(self.response)

    @property
    def teacher_shapes(self) -> int:
        if not self.use_teacher:
            return 0
        packed = len(self.teacher_rows) * len(self.teacher_lengths) if self.packed_teacher else 0
        return (packed + len(self.shared_lengths)) * len(self.response)

    @property
    def bound(self) -> int:
        """The most distinct compiled step shapes (student + teacher) a run can see."""
        return self.student_shapes + self.teacher_shapes


def shape_ladder(spec: BatchSpec) -> ShapeLadder:
    """The shapes `pack(..., spec)` can produce (module doc), stated before any batch is seen."""
    b, c, q, top = spec.samples_per_step, spec.max_candidates, spec.bucket_quantum, spec.max_seq_len
    lengths = length_ladder(spec.min_seq_bucket, top, q)
    if spec.packing:
        student_rows = row_ladder(b, num_micro_batches(b, spec.micro_batch_size), spec.row_multiple)
        teacher_rows = row_ladder(b * c, num_micro_batches(b * c, spec.micro_batch_size), spec.row_multiple)
    else:
        student_rows, teacher_rows = (b,), (b * c,)
    shared: tuple[int, ...] = ()
    if spec.shares_prefix:   # B rows: each sample's prefix, then its candidates' (and reference's) rests
        shared = length_ladder(spec.min_seq_bucket, (c + spec.reference) * top, q)
    packed_too = not spec.shares_prefix or (spec.packing and spec.batch_prefix_min > 0)
    return ShapeLadder(student_rows, lengths, teacher_rows, lengths, length_ladder(spec.min_response_bucket, top),
                       spec.shares_prefix, spec.uses_hints and c > 0, shared, packed_too)


def pack_rows(lengths: Sequence[int], groups: Sequence[int], n_groups: int, capacity: int,
              row_multiple: int = 1, max_rows: int | None = None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """First-fit-decreasing placement of sequences of `lengths` into rows of `capacity` tokens.

    Sequence i goes into a row of its group `groups[i]` (group g owns rows g, g + n_groups, ...).
    Returns (local row within its group, offset within the row) per sequence and the row count
    (the same for every group, a multiple of `n_groups` and of `row_multiple`), or None when a
    group needs more than `max_rows // n_groups` rows. Zero-length sequences (padding) take no
    slot: row 0, offset 0.
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
                if max_rows is not None and len(free) >= max_rows // n_groups:
                    return None
                free.append(capacity)
            row[i], offset[i] = j, capacity - free[j]
            free[j] -= lengths[i]
        per_group = max(per_group, len(free))
    rows = per_group * n_groups
    while rows % row_multiple:
        rows += n_groups
    return row, offset, rows


def _fill_packed(seqs: Sequence[Sequence[int] | None], groups: Sequence[int], n_groups: int,
                 rows_ladder: Sequence[int], lengths_ladder: Sequence[int], pad_id: int,
                 seen: set[tuple[int, int]] | None = None, slack: float = 0.0,
                 prefix: Sequence[int] = ()) -> dict[str, np.ndarray]:
    """Packed rows of the sequences (None: padding): input_ids, positions, segment_ids, row, offset.

    The (rows, length) pair comes from the ladders: the fewest token slots rows * length into which
    first-fit-decreasing packs every sequence (ties: the shorter rows, cheaper attention), among row
    lengths from the longest sequence's bucket up to 4 times it (longer rows add attention cost).
    A pair in `seen` (compiled already) with at most 1 / (1 - slack) times those slots that also
    fits is taken instead (the fewest slots among them); the pair used is added to `seen`.

    `prefix` (the tokens every sequence starts with: `batch_prefix`): each row starts with it once,
    as segment `SHARED_SEGMENT` that every sequence of the row sees, and holds only the sequences'
    rests after it, at positions continuing from it; `offset` is where a sequence's rest starts."""
    p0 = len(prefix)
    lengths = [0 if q is None else len(q) - p0 for q in seqs]
    longest = next(x for x in lengths_ladder if x >= p0 + max(lengths + [1]))
    best = None
    for length in (x for x in lengths_ladder if longest <= x <= 4 * longest):
        for rows in rows_ladder:
            if best is not None and rows * length >= best[0] * best[1]:
                break
            layout = pack_rows(lengths, groups, n_groups, length - p0, max_rows=rows)
            if layout is not None:
                best = (rows, length, layout)
                break
    if seen and (best[0], best[1]) not in seen:
        budget = best[0] * best[1] / (1 - slack)
        for rows, length in sorted(seen, key=lambda x: (x[0] * x[1], x[1])):
            if rows * length > budget:
                break
            layout = pack_rows(lengths, groups, n_groups, length - p0, max_rows=rows) if length >= longest else None
            if layout is not None:
                best = (rows, length, layout)
                break
    rows, length, (row, offset, _) = best
    if seen is not None:
        seen.add((rows, length))
    ids = np.full((rows, length), pad_id, np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    segments = np.zeros((rows, length), np.int32)
    count = np.zeros(rows, np.int32)
    used = np.zeros(rows, np.int32)
    offset = offset + p0 * (np.asarray(lengths) > 0)
    for i, q in enumerate(seqs):
        if not lengths[i]:
            continue
        r, o, n = int(row[i]) * n_groups + groups[i], int(offset[i]), lengths[i]
        count[r] += 1
        ids[r, o:o + n] = q[p0:]
        positions[r, o:o + n] = p0 + np.arange(n)
        segments[r, o:o + n] = count[r]
        used[r] = max(used[r], o + n)
    held = count > 0   # the prefix once in each row that holds a sequence (empty rows stay padding)
    ids[held, :p0] = prefix
    segments[held, :p0] = SHARED_SEGMENT
    for r in range(rows):  # the padding tail of a row: positions from 0, segment 0
        positions[r, used[r]:] = np.arange(length - used[r])
    return {"input_ids": ids, "positions": positions, "segment_ids": segments, "row": row,
            "offset": offset.astype(np.int32)}


def pack(samples: Sequence[Sample], spec: BatchSpec, *, current_version: int | None = None,
         seen: dict[str, set[tuple[int, int]]] | None = None) -> PackedBatch:
    """Pad `samples` (<= batch_size) into bucketed arrays; missing rows are padding (sample_mask 0).

    With `spec.packing` the student and teacher sequences are packed several per row (module doc).
    """
    if not samples:
        raise ValueError("pack needs at least one sample")
    if len(samples) > spec.samples_per_step:
        raise ValueError(f"{len(samples)} samples do not fit samples_per_step={spec.samples_per_step}")
    b, c, q = spec.samples_per_step, spec.max_candidates, spec.bucket_quantum
    # T (the per-sample response arrays): powers of two, so it adds few shapes (`shape_ladder`)
    t = bucket_length(max(len(s.response_ids) for s in samples), spec.min_response_bucket, spec.max_seq_len)
    ls = bucket_length(max(len(s.prompt_ids) + len(s.response_ids) for s in samples), spec.min_seq_bucket,
                       spec.max_seq_len, q)

    student = {
        "input_ids": np.full((b, ls), spec.pad_id, np.int32),
        "response_start": np.ones((b,), np.int32),
        "response_ids": np.full((b, t), spec.pad_id, np.int32),
        "response_mask": np.zeros((b, t), np.float32),
        "advantages": np.zeros((b, t), np.float32),
        "rollout_logprobs": np.zeros((b, t), np.float32),
        "sample_mask": np.zeros((b,), np.float32),
    }
    # with a shared prefix the teacher's layout is built from the samples at the end; with a batch prefix
    # too, the packed layout is built as well and the one with fewer token slots is taken
    packed_too = not spec.shares_prefix or (spec.packing and spec.batch_prefix_min > 0)
    lt = bucket_length(max(sample_length(s, spec) for s in samples), spec.min_seq_bucket, spec.max_seq_len,
                       q) if packed_too else 0
    teacher = {
        "input_ids": np.full((b, c, lt), spec.pad_id, np.int32),
        "response_start": np.ones((b, c), np.int32),
        "candidate_mask": np.zeros((b, c), np.float32),
    }
    student_seqs, teacher_seqs = _write_samples(samples, spec, student, teacher, packed_too)
    kinds: dict[str, int] = {}
    for s in samples:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    versions = [parse_version(s.weight_version) for s in samples]
    staleness = [0 if current_version is None or v is None else max(current_version - v, 0) for v in versions]
    real = {"student": sum(len(x) for x in student_seqs if x is not None),
            "teacher": sum(len(x) for x in teacher_seqs if x is not None)}
    ladder = shape_ladder(spec)
    if spec.packing:
        n = num_micro_batches(b, spec.micro_batch_size)
        prefix = batch_prefix(student_seqs, [len(s.prompt_ids) for s in samples], spec.batch_prefix_min)
        packed = _fill_packed(student_seqs, [i % n for i in range(b)], n, ladder.student_rows,
                              ladder.student_lengths, spec.pad_id, None if seen is None else seen["student"],
                              spec.shape_reuse_slack, prefix)
        student.update(packed)
        student["response_start"][:len(samples)] -= len(prefix)   # counted from each rest's start
        real["student"] += (rows_held(packed) - len(samples)) * len(prefix)   # once per row, not per sample
    if spec.packing and packed_too and (not spec.shares_prefix or any(teacher_seqs)):
        # (shared prefix: a trial on a copy of the seen shapes, merged back only if this layout is taken)
        trial = None if seen is None or not any(teacher_seqs) else (
            seen["teacher"] if not spec.shares_prefix else set(seen["teacher"]))
        real["teacher"] += _pack_teacher(teacher, teacher_seqs, spec, ladder, trial)
    if spec.shares_prefix:
        shared, shared_real = shared_prefix_teacher(samples, spec, [teacher_prompts(s, spec) for s in samples])
        # per-sample rows (each sample's prefix once) or packed rows (the batch's prefix once per row, each
        # candidate's own context repeated): the fewer token slots (short contexts after a long common
        # system prompt, OpenClaw's first turns: packed)
        if not (spec.packing and packed_too and any(teacher_seqs)) or shared["input_ids"].size <= teacher[
                "input_ids"].size:
            teacher, real["teacher"] = shared, shared_real
        elif seen is not None:
            seen["teacher"].update(trial)
    return PackedBatch(student, teacher, list(samples), np.asarray(staleness, np.int64), kinds, real)


def _write_samples(samples: Sequence[Sample], spec: BatchSpec, student: dict[str, np.ndarray],
                   teacher: dict[str, np.ndarray], with_teacher: bool) -> tuple[list, list]:
    """Each sample's rows of the padded `[B, ...]` student arrays (and, `with_teacher`, of the `[B, C, ...]`
    teacher arrays); returns the student sequences (one per row) and the teacher's (B * C, None: padding)."""
    b, c = spec.samples_per_step, spec.max_candidates
    student_seqs: list[list[int] | None] = [None] * b
    teacher_seqs: list[list[int] | None] = [None] * (b * c)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p < 1:
            raise ValueError(f"sample {s.sample_id} has an empty prompt")
        student_seqs[i] = list(s.prompt_ids) + list(s.response_ids)
        student["input_ids"][i, :p + r] = student_seqs[i]
        student["response_start"][i] = p
        student["response_ids"][i, :r] = s.response_ids
        student["response_mask"][i, :r] = 1.0 if s.response_mask is None else np.asarray(s.response_mask, np.float32)
        student["advantages"][i, :r] = sample_advantages(s)
        student["rollout_logprobs"][i, :r] = np.maximum(np.asarray(s.rollout_logprobs, np.float32), -1e4)
        student["sample_mask"][i] = 1.0
        for j, prompt in enumerate(teacher_prompts(s, spec) if with_teacher else []):
            teacher_seqs[i * c + j] = prompt + list(s.response_ids)
            teacher["input_ids"][i, j, :len(teacher_seqs[i * c + j])] = teacher_seqs[i * c + j]
            teacher["response_start"][i, j] = len(prompt)
            teacher["candidate_mask"][i, j] = 1.0
    return student_seqs, teacher_seqs


def _pack_teacher(teacher: dict[str, np.ndarray], teacher_seqs: list[list[int] | None], spec: BatchSpec,
                  ladder: ShapeLadder, seen: set[tuple[int, int]] | None) -> int:
    """Pack the teacher sequences (candidate f = b * C + c in micro-batch f mod n) into `teacher`, the
    batch's common prefix once per row; returns the change in real teacher tokens (the prefix is no
    longer repeated per sequence)."""
    b, c = spec.samples_per_step, spec.max_candidates
    nt = num_micro_batches(b * c, spec.micro_batch_size)
    starts = teacher["response_start"].reshape(b * c)
    prefix = batch_prefix(teacher_seqs, [int(starts[f]) for f, q in enumerate(teacher_seqs) if q is not None],
                          spec.batch_prefix_min)
    packed = _fill_packed(teacher_seqs, [f % nt for f in range(b * c)], nt, ladder.teacher_rows,
                          ladder.teacher_lengths, spec.pad_id, seen, spec.shape_reuse_slack, prefix)
    teacher["response_start"] -= (teacher["candidate_mask"] > 0).astype(np.int32) * len(prefix)
    packed["row"] = packed["row"].reshape(b, c)
    packed["offset"] = packed["offset"].reshape(b, c)
    teacher.update(packed)
    return (rows_held(packed) - sum(q is not None for q in teacher_seqs)) * len(prefix)


class SampleBatcher:
    """Windows of the store, read through one `SampleTail` for the run: filter samples that cannot
    train, batch the rest. `store` is the tail (the caller owns it) or a store directory (a tail is
    opened on first use; `close` closes it)."""

    def __init__(self, store: str | os.PathLike | SampleTail, spec: BatchSpec):
        self._tail = store if isinstance(store, SampleTail) else None
        self._owns_tail = self._tail is None
        self.store_dir = self._tail.directory if self._tail is not None else os.fspath(store)
        self.spec = spec
        self.dropped: dict[str, int] = {"stale": 0, "too_long": 0, "temperature": 0, "hint_only": 0, "held_out": 0}
        self._warned_temperature = False
        # packed (rows, length) pairs batched so far (compiled by the trainer): reused when nearly as small
        self.seen_shapes: dict[str, set[tuple[int, int]]] = {"student": set(), "teacher": set()}

    def _keep(self, sample: Sample, current_version: int | None) -> bool:
        if is_held_out(sample.sample_id, self.spec.holdout_every):   # the gate's replay set: never trained on
            self.dropped["held_out"] += 1
            return False
        if not self.spec.uses_hints and sample.kind == "opd":  # no reward: nothing for GRPO to learn
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
            # targets would be wrong for this sample (docs/design.md §6)
            self.dropped["temperature"] += 1
            if not self._warned_temperature:
                self._warned_temperature = True
                log.warning("refusing sample %s: sampled at temperature %g but the trainer's tau is %g (the rollout "
                            "log-probs and tau must match: samples from another source must be drawn at gateway.temperature, and "
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
        for i in range(0, len(kept), self.spec.samples_per_step):
            yield pack(kept[i:i + self.spec.samples_per_step], self.spec, current_version=current_version,
                       seen=self.seen_shapes)

    @property
    def tail(self) -> SampleTail:
        if self._tail is None:
            self._tail = SampleTail(self.store_dir)
        return self._tail

    def close(self) -> None:
        if self._owns_tail and self._tail is not None:
            self._tail.close()
            self._tail = None
