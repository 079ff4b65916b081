"""Bounded step shapes and padding of packed batches.

- The shapes a config can compile (`shape_ladder`) are the sets this test derives from the config
  by its own arithmetic; for configs/cpu_demo.yaml that is 448 (224 student + 224 teacher).
- Hundreds of random batches (varied sample counts, prompt/response/hint lengths; packing with
  and without micro-batches and batch shards, unpacked, shared prefix) only ever produce shapes in
  those sets, never more distinct ones than the bound, and every sequence is where `row`/`offset`
  say.
- The batches of a real CPU-demo run (their sample lengths, tests/fixtures/cpu_demo_batch_lengths.json,
  recorded when the demo took 8 samples per step) pack with a padding fraction of at most 0.15 on
  average and per step.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from openclaw_jax.config import load_experiment_config
from openclaw_jax.samples import Sample
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import pack, shape_ladder
from openclaw_jax.trainer.train_step import batch_spec


def _demo_spec() -> BatchSpec:
    cfg = load_experiment_config([os.path.join(ROOT, "configs", "cpu_demo.yaml")])
    return batch_spec(cfg, cfg.sample_spec())


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lengths(minimum: int, maximum: int, quantum: int) -> set[int]:
    """Bucket lengths: minimum * 2^i while <= quantum (or always, quantum 0), multiples of the quantum
    beyond, the largest clipped to `maximum`."""
    out, size = set(), minimum
    while size < maximum and (quantum == 0 or size <= quantum):
        out.add(size)
        size *= 2
    if quantum:
        out |= {m for m in range(quantum, maximum + 1, quantum) if m > max(quantum, minimum) or m == minimum}
    return {x for x in out if x < maximum} | {maximum}


def _rows(sequences: int, groups: int, row_multiple: int) -> set[int]:
    """Rows per group k0 * {1, 2, 3, 4, 6, 8, 12, ...} up to the first that gives every sequence its own row."""
    per_group = -(-sequences // groups)
    k0 = next(k for k in range(1, row_multiple + 1) if k * groups % row_multiple == 0)
    counts = sorted({m * k0 for i in range(12) for m in (2 ** i, 3 * 2 ** i // 2) if m >= 1})
    first_full = next(k for k in counts if k >= per_group)
    return {k * groups for k in counts if k <= first_full}


def _expected(spec: BatchSpec) -> tuple[set, set]:
    """(student shapes, teacher shapes) as (rows, length, T) sets."""
    b, c, q, top = spec.samples_per_step, spec.max_candidates, spec.bucket_quantum, spec.max_seq_len
    t = _lengths(spec.min_response_bucket, top, 0)
    lengths = _lengths(spec.min_seq_bucket, top, q)
    groups = (lambda n: n // spec.micro_batch_size if 0 < spec.micro_batch_size < n else 1)
    if spec.packing:
        s_rows, t_rows = _rows(b, groups(b), spec.row_multiple), _rows(b * c, groups(b * c), spec.row_multiple)
    else:
        s_rows, t_rows = {b}, {b * c}
    student = {(r, n, x) for r in s_rows for n in lengths for x in t}
    # one row per sample, its candidates' suffixes back to back, when a sample can have 2+ candidates
    # (one candidate shares nothing: the packed layout)
    teacher = {(r, n, x) for r in t_rows for n in lengths for x in t}
    if spec.shared_prefix_teacher and spec.uses_hints and c >= 2:   # up to C whole sequences when nothing is shared
        # (C + 1 with a KL anchor: the un-hinted prompt rides in the row for the reference log-probs);
        # the packed layout stays possible only with a batch prefix (the batcher takes the smaller)
        shared = {("s", b, n, x) for n in _lengths(spec.min_seq_bucket, (c + spec.reference) * top, q) for x in t}
        teacher = shared | (teacher if spec.packing and spec.batch_prefix_min > 0 else set())
    return student, teacher


def _flat_key(key) -> tuple:
    shape = key[1]
    if key[0] == "teacher_shared":   # one row per sample (another program than packed rows of that shape)
        return ("s", shape[0], shape[1], key[2])
    if len(shape) == 3:      # unpacked teacher [B, C, Lt]
        return (shape[0] * shape[1], shape[2], key[2])
    return (shape[0], shape[1], key[2])


def test_the_cpu_demo_states_a_small_bound():
    cfg = load_experiment_config([os.path.join(ROOT, "configs", "cpu_demo.yaml")])
    t = cfg.trainer
    spec = batch_spec(cfg, cfg.sample_spec())
    ladder = shape_ladder(spec)
    # by hand from the config: 16 samples, 1 candidate each, no micro-batches -> rows 1, 2, 3, 4, 6, 8,
    # 12, 16; lengths 256..512 in steps of the 64-token quantum (min_seq_bucket 256 >= quantum) -> 5;
    # T = 64, 128, 256, 512 (powers of two from min_response_bucket to max_seq_len) -> 4
    assert (t.samples_per_step, cfg.gateway.max_candidates, t.micro_batch_size) == (16, 1, 0)
    assert t.min_seq_bucket >= t.bucket_quantum
    rows = [1, 2, 3, 4, 6, 8, 12, 16]
    lengths = list(range(t.min_seq_bucket, t.max_seq_len + 1, t.bucket_quantum))
    responses = [t.min_response_bucket * 2 ** i for i in range(8) if t.min_response_bucket * 2 ** i <= t.max_seq_len]
    by_hand = 2 * len(rows) * len(lengths) * len(responses)
    assert by_hand == 320
    assert ladder.bound == by_hand
    student, teacher = _expected(spec)
    assert len(student) + len(teacher) == by_hand


def _random_samples(rng: np.random.Generator, spec: BatchSpec) -> list[Sample]:
    n = int(rng.integers(1, spec.samples_per_step + 1))
    system = [int(x) for x in rng.integers(1, 1000, 64)]   # with a batch prefix: prompts start alike
    out = []
    for i in range(n):
        top = spec.max_seq_len // int(rng.choice([1, 2, 4, 8]))   # short and long samples
        r = int(rng.integers(1, top // 2))
        p = int(rng.integers(1, (top - r) // 2 + 1))
        hints = int(rng.integers(0, spec.max_candidates + 1))
        prompt = [int(x) for x in rng.integers(1, 1000, p)]
        if spec.batch_prefix_min:
            prompt[:p - 1] = system[:p - 1]
        hint_prompts = [prompt[:-1] + [7] * int(rng.integers(1, top - p - r + 1)) + prompt[-1:]
                        for _ in range(hints)]
        out.append(Sample(session_id=f"r{i}", turn_index=0, kind="opd+rl" if hints else "rl",
                          reward=float(rng.choice([-1.0, 1.0])), prompt_ids=prompt,
                          response_ids=[int(x) for x in rng.integers(1, 1000, r)], rollout_logprobs=[-1.0] * r,
                          hints=[f"hint {j} is long enough" for j in range(hints)], hint_prompt_ids=hint_prompts))
    return out


SPECS = {
    "demo": None,  # configs/cpu_demo.yaml
    "micro_shards": BatchSpec(samples_per_step=8, max_candidates=3, min_seq_bucket=64, min_response_bucket=32,
                              max_seq_len=1024, packing=True, bucket_quantum=128, micro_batch_size=4, row_multiple=2,
                              rl_only_teacher="none"),
    "pow2_shards3": BatchSpec(samples_per_step=6, max_candidates=2, min_seq_bucket=16, min_response_bucket=8,
                              max_seq_len=256, packing=True, bucket_quantum=0, row_multiple=3),
    "unpacked": BatchSpec(samples_per_step=4, max_candidates=2, min_seq_bucket=32, min_response_bucket=16,
                          max_seq_len=512, packing=False, bucket_quantum=64),
    "shared_prefix": BatchSpec(samples_per_step=4, max_candidates=3, min_seq_bucket=32, min_response_bucket=16,
                               max_seq_len=512, packing=True, bucket_quantum=64, shared_prefix_teacher=True),
    "shared_prefix_micro": BatchSpec(samples_per_step=8, max_candidates=2, min_seq_bucket=32, min_response_bucket=16,
                                     max_seq_len=512, packing=True, bucket_quantum=64, shared_prefix_teacher=True,
                                     micro_batch_size=2, row_multiple=2),
    "shared_prefix_reference": BatchSpec(samples_per_step=4, max_candidates=2, min_seq_bucket=32,
                                         min_response_bucket=16, max_seq_len=256, packing=True, bucket_quantum=64,
                                         shared_prefix_teacher=True, micro_batch_size=2, kl_coef=0.05,
                                         rl_only_teacher="none"),
    "shared_prefix_batch_prefix": BatchSpec(samples_per_step=4, max_candidates=2, min_seq_bucket=32,
                                            min_response_bucket=16, max_seq_len=512, packing=True, bucket_quantum=64,
                                            shared_prefix_teacher=True, batch_prefix_min=16, micro_batch_size=2),
    "shared_prefix_one_candidate": BatchSpec(samples_per_step=4, max_candidates=1, min_seq_bucket=32,
                                             min_response_bucket=16, max_seq_len=512, packing=True,
                                             bucket_quantum=64, shared_prefix_teacher=True),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_random_batches_stay_within_the_stated_shapes(name):
    spec = SPECS[name] or _demo_spec()
    rng = np.random.default_rng(sorted(SPECS).index(name))
    student_ok, teacher_ok = _expected(spec)
    bound = shape_ladder(spec).bound
    assert bound == len(student_ok) + len(teacher_ok)
    seen_by_batcher = {"student": set(), "teacher": set()}   # as SampleBatcher keeps them over a run
    keys = set()
    for _ in range(150):
        samples = _random_samples(rng, spec)
        packed = pack(samples, spec, seen=seen_by_batcher)
        student, teacher = packed.phase_keys()
        assert _flat_key(student) in student_ok, student
        assert teacher is None or _flat_key(teacher) in teacher_ok, teacher
        assert (teacher is None) == (not any(s.hint_prompt_ids for s in samples) and spec.rl_only_teacher == "none"
                                     and not (spec.reference and "prefix_len" in packed.teacher))
        keys.update(k for k in (student, teacher) if k is not None)
        st = packed.student
        if spec.packing:  # every sequence where row/offset say, in its micro-batch's rows
            b, m = spec.samples_per_step, spec.micro_batch_size
            groups = b // m if 0 < m < b else 1
            assert st["input_ids"].shape[0] % groups == 0 and st["input_ids"].shape[0] % spec.row_multiple == 0
            for i, s in enumerate(samples):
                seq = s.prompt_ids + s.response_ids
                r, o = int(st["row"][i]) * groups + i % groups, int(st["offset"][i])
                p0 = int((st["segment_ids"][r] < 0).sum())   # the batch prefix, once at the row's start
                assert p0 == 0 or spec.batch_prefix_min <= p0 <= o
                assert st["input_ids"][r, :p0].tolist() + st["input_ids"][r, o:o + len(seq) - p0].tolist() == seq
                assert int(st["response_start"][i]) == len(s.prompt_ids) - p0
            assert int(np.count_nonzero(st["segment_ids"])) == packed.real_tokens["student"]
        te = packed.teacher
        if "prefix_len" in te:  # row i: sample i's prefix, then its candidates' rests; row = i within its micro-batch
            b, m = spec.samples_per_step, spec.micro_batch_size
            groups = b // m if 0 < m < b else 1
            for i, s in enumerate(samples):
                n = int(te["prefix_len"][i])
                assert te["segment_ids"][i, :n].tolist() == [-1] * n
                unhinted = [s.prompt_ids] if spec.rl_only_teacher == "unhinted" else []
                for c, prompt in enumerate(s.hint_prompt_ids or unhinted):
                    rest, o = prompt[n:] + s.response_ids, int(te["offset"][i, c])
                    assert te["input_ids"][i, :n].tolist() + te["input_ids"][i, o:o + len(rest)].tolist() == (
                        prompt + s.response_ids)
                    assert te["positions"][i, o:o + len(rest)].tolist() == list(range(n, len(prompt + s.response_ids)))
                    assert set(te["segment_ids"][i, o:o + len(rest)].tolist()) == {c + 1}
                    assert int(te["row"][i, c]) == i // groups
                if spec.reference:   # the un-hinted prompt, for the reference log-probs
                    seq, o = s.prompt_ids + s.response_ids, int(te["reference_offset"][i])
                    assert te["input_ids"][i, :n].tolist() + te["input_ids"][i, o:o + len(seq) - n].tolist() == seq
    assert len(keys) <= bound


def _demo_batches():
    with open(os.path.join(ROOT, "tests", "fixtures", "cpu_demo_batch_lengths.json")) as f:
        steps = json.load(f)["steps"]
    rng = np.random.default_rng(0)
    out = []
    for step in steps:
        batch = []
        for i, (p, r, hints, kind) in enumerate(step):
            prompt = [int(x) for x in rng.integers(1, 1000, p)]
            batch.append(Sample(session_id=f"d{i}", turn_index=0, kind=kind, reward=-1.0 if hints else 1.0,
                                prompt_ids=prompt, response_ids=[5] * r, rollout_logprobs=[-1.0] * r,
                                hints=["keep it short please"] * len(hints),
                                hint_prompt_ids=[prompt[:-1] + [9] * (h - p) + prompt[-1:] for h in hints],
                                temperature=0.7))
        out.append(batch)
    return out


def test_the_cpu_demo_batches_pad_at_most_15_percent():
    spec = _demo_spec()
    seen = {"student": set(), "teacher": set()}
    fractions, keys = [], set()
    for samples in _demo_batches():
        packed = pack(samples, spec, seen=seen)
        fractions.append(packed.padding_fraction())
        keys.update(k for k in packed.phase_keys() if k is not None)
        # the measure: padded / all token slots the model runs over (no teacher pass: no teacher slots)
        slots = packed.student["input_ids"].size + (packed.teacher["input_ids"].size if packed.has_teacher else 0)
        real = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples) + sum(
            h + len(s.response_ids) for s in samples for h in map(len, s.hint_prompt_ids or []))
        assert packed.padding_fraction() == pytest.approx((slots - real) / slots)
    assert len(fractions) == 15
    # a step may pad more (up to ~0.45) to reuse a compiled shape: each new one compiles four phases
    assert np.mean(fractions) <= 0.15, fractions
    assert len(keys) <= 6   # distinct step shapes over the 15 steps (the bound: 320)
    # the fewest slots each time from the shortest rows (128), nothing reused: less padding, twice the shapes
    tight = dataclasses.replace(spec, shape_reuse_slack=0.0, min_seq_bucket=128)
    fresh_keys, fresh = set(), []
    for samples in _demo_batches():
        packed = pack(samples, tight)
        fresh.append(packed.padding_fraction())
        fresh_keys.update(k for k in packed.phase_keys() if k is not None)
    assert np.mean(fresh) < np.mean(fractions) and len(fresh_keys) >= 2 * len(keys)
