"""Rows that run a shared prompt prefix once (the batcher's layouts; module doc of batcher.py).

- `batch_prefix`: the tokens every sequence of a batch starts with (OpenClaw's system prompt), written
  once per packed row as a segment every sequence of the row sees.
- `shared_prefix_teacher`: one row per sample, its candidates' common prompt prefix once, then each
  candidate's rest (and the un-hinted prompt's, for the reference log-probs with a KL anchor).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from openclaw_jax.models.segments import SHARED_SEGMENT  # keys every segment of a row sees
from openclaw_jax.samples import Sample
from openclaw_jax.trainer.batch import BatchSpec, bucket_length, num_micro_batches


def rows_held(packed: dict[str, np.ndarray]) -> int:
    return int((packed["segment_ids"] > 0).any(axis=1).sum())


def batch_prefix(seqs: Sequence[Sequence[int] | None], prompt_lengths: Sequence[int], minimum: int) -> list[int]:
    """The tokens every sequence of a batch starts with (e.g. OpenClaw's system prompt, the same for
    every turn of every session), stopping one short of the shortest prompt (every rest keeps the
    position that predicts its first response token); empty when shorter than `minimum` (0: never)."""
    real = [q for q in seqs if q is not None]
    if minimum <= 0 or len(real) < 2:
        return []
    n = min(_common_prefix(real), min(prompt_lengths) - 1)
    return list(real[0][:n]) if n >= minimum else []


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(q) for q in seqs)
    for i in range(n):
        if any(q[i] != seqs[0][i] for q in seqs[1:]):
            return i
    return n


def shared_prefix_teacher(samples: Sequence[Sample], spec: BatchSpec, prompts: Sequence[Sequence[list[int]]]
                          ) -> tuple[dict[str, np.ndarray], int]:
    """Teacher arrays with each sample's common candidate-prompt prefix run once (`TeacherInputs`): row i
    of input_ids [B, Ls] holds sample i's prefix (segment `SHARED_SEGMENT`, seen by every segment of
    the row), then its candidates' rests (the prompt past the prefix + the response) back to back,
    one segment each (1, 2, ...) at positions continuing after the prefix; prefix_len [B]. With
    `spec.reference` the un-hinted prompt is one more sequence of the row (unless it is a candidate
    already): reference_offset / reference_start [B] say where. The prefix stops one token short of
    the shortest prompt, so every rest holds the position that predicts the first response token.
    `prompts`: each sample's teacher prompts (`batcher.teacher_prompts`). Returns (arrays, real teacher
    tokens)."""

    b, c = spec.samples_per_step, spec.max_candidates
    n_cand = [len(ps) for ps in prompts]
    ref_index = [0] * len(samples)
    if spec.reference:   # the un-hinted prompt: a candidate already (RL-only samples) or one more sequence
        for i, (s, ps) in enumerate(zip(samples, prompts)):
            ref_index[i] = ps.index(list(s.prompt_ids)) if list(s.prompt_ids) in ps else len(ps)
            prompts[i] = ps + [list(s.prompt_ids)] if ref_index[i] == len(ps) else ps
    plen = [min(_common_prefix(ps), min(len(p) for p in ps) - 1) if ps else 0 for ps in prompts]
    rests = [[p[n:] + list(s.response_ids) for p in ps] for s, ps, n in zip(samples, prompts, plen)]
    used = [n + sum(map(len, r)) for n, r in zip(plen, rests)]
    ls = bucket_length(max(used + [1]), spec.min_seq_bucket, (c + spec.reference) * spec.max_seq_len,
                       spec.bucket_quantum)
    n_micro = num_micro_batches(b, spec.micro_batch_size)
    teacher = {"input_ids": np.full((b, ls), spec.pad_id, np.int32), "response_start": np.ones((b, c), np.int32),
               "candidate_mask": np.zeros((b, c), np.float32), "prefix_len": np.zeros((b,), np.int32),
               "segment_ids": np.zeros((b, ls), np.int32),
               "positions": np.broadcast_to(np.arange(ls, dtype=np.int32), (b, ls)).copy(),
               # the sample's own row, indexed within its micro-batch (rows i, i + n, ...)
               "row": np.broadcast_to((np.arange(b, dtype=np.int32) // n_micro)[:, None], (b, c)).copy(),
               "offset": np.zeros((b, c), np.int32)}
    if spec.reference:
        teacher.update(reference_offset=np.zeros((b,), np.int32), reference_start=np.ones((b,), np.int32))
    for i, (ps, n, rest) in enumerate(zip(prompts, plen, rests)):
        if not ps:   # padding row
            continue
        teacher["input_ids"][i, :n] = ps[0][:n]
        teacher["segment_ids"][i, :n] = SHARED_SEGMENT
        teacher["prefix_len"][i] = n
        o = n
        for j, (p, r) in enumerate(zip(ps, rest)):
            teacher["input_ids"][i, o:o + len(r)] = r
            teacher["segment_ids"][i, o:o + len(r)] = j + 1
            teacher["positions"][i, o:o + len(r)] = n + np.arange(len(r))
            if j < n_cand[i]:   # a hint candidate (else the appended un-hinted prompt)
                teacher["offset"][i, j] = o
                teacher["response_start"][i, j] = len(p) - n
                teacher["candidate_mask"][i, j] = 1.0
            if spec.reference and j == ref_index[i]:
                teacher["reference_offset"][i], teacher["reference_start"][i] = o, len(p) - n
            o += len(r)
        teacher["positions"][i, o:] = np.arange(ls - o)   # the padding tail (segment 0), as in packed rows
    return teacher, sum(used)
