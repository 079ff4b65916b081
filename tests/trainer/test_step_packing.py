"""Sequence packing: the batcher's packed layout, and packed steps equal unpacked ones.

The unpacked step is itself checked against an independent NumPy/HF reference
(test_trainer_step, test_step_reference); here the packed step must reproduce it to float
tolerance in every phase (old pass, teacher pass, old log-probs at the teacher's ids) and in the
train step (loss, metrics, updated params), with and without micro-batches, and a sample's
log-probs must not move when another sample sharing its row changes (no leak across segments).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.samples import Sample
from openclaw_jax.losses import LossConfig
from openclaw_jax.models import attention as A
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batch import BatchSpec, bucket_length
from openclaw_jax.trainer.batcher import pack, pack_rows
from openclaw_jax.trainer.prefix_rows import batch_prefix

from tests.trainer.test_trainer_step import TAU, VOCAB, _model  # the same tiny Qwen3 model


def _samples(rng: np.random.Generator, n: int = 6) -> list[Sample]:
    """Samples of varied prompt/response lengths and 0-2 hints (RL-only ones get the un-hinted prompt)."""
    def ids(k):
        return [int(x) for x in rng.integers(1, VOCAB, k)]

    out = []
    for i in range(n):
        p, r, n_hints = int(rng.integers(3, 20)), int(rng.integers(2, 12)), i % 3
        out.append(Sample(session_id=f"s{i}", turn_index=0, kind=("rl", "opd", "opd+rl")[n_hints],
                          reward=(1.0, 0.0, -1.0)[n_hints], prompt_ids=ids(p), response_ids=ids(r),
                          rollout_logprobs=list(-rng.random(r) - 0.5), hints=[f"hint {j} long enough" for j in
                                                                               range(n_hints)],
                          hint_prompt_ids=[ids(p + 2 + 3 * j) for j in range(n_hints)], weight_version="0"))
    return out


def _spec(packing: bool, micro: int = 0) -> BatchSpec:
    return BatchSpec(samples_per_step=8, max_candidates=2, min_seq_bucket=8, min_response_bucket=4, max_seq_len=64,
                     packing=packing, micro_batch_size=micro)


def _inputs(packed):
    return (S.StudentInputs(**{k: jnp.asarray(v) for k, v in packed.student.items()}),
            S.TeacherInputs(**{k: jnp.asarray(v) for k, v in packed.teacher.items()}))


@functools.lru_cache(maxsize=None)
def _phases(micro: int):
    """The jitted phases for one setting, shared by the tests (a shape compiles once per module)."""
    settings = S.StepSettings(loss=LossConfig(), temperature=TAU, chunk_size=4,
                              micro_batch_size=micro)
    tx, schedule = S.make_optimizer(1e-2, eps=1e-3)
    return (tx, jax.jit(functools.partial(S.old_pass, settings=settings)),
            jax.jit(functools.partial(S.teacher_pass, settings=settings)),
            jax.jit(functools.partial(S.old_logprobs_at, settings=settings)),
            jax.jit(functools.partial(S.update_step, settings=settings, optimizer=tx, lr_schedule=schedule)))


@functools.lru_cache(maxsize=None)
def _models():
    return nnx.split(_model(0), nnx.Param, ...), nnx.split(_model(1))


def _step(packed, micro: int = 0, train: bool = True):
    tx, old_pass, teacher_pass, old_logprobs_at, train_step = _phases(micro)
    inputs, tinputs = _inputs(packed)
    (gd, trainable, frozen), (tgd, tstate) = _models()
    old = old_pass(gd, (trainable, frozen), inputs)
    teach = teacher_pass(tgd, tstate, tinputs, inputs.response_ids, old.topk_ids)
    if not train:
        return dict(old=old, teach=teach)
    old_at = old_logprobs_at(gd, (trainable, frozen), old.hidden, teach.topk_ids)
    batch = S.assemble_batch(inputs, tinputs, old, teach, old_at)
    new, _, metrics, k_star = train_step(gd, trainable, frozen, tx.init(trainable), inputs, batch)
    params = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(new)}
    before = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(trainable)}
    return dict(old=old, teach=teach, old_at=old_at, metrics={k: float(v) for k, v in metrics.items()},
                params=params, before=before)


def test_pack_rows_first_fit_decreasing_within_groups():
    row, offset, rows = pack_rows([5, 3, 4, 0, 2, 6], [0, 1, 0, 1, 0, 1], 2, 8, row_multiple=3)
    # group 0: 5 -> row 0, 4 -> row 1, 2 -> row 0 @5; group 1: 6 -> row 0, 3 -> row 1; padding: row 0 @0
    assert row.tolist() == [0, 1, 1, 0, 0, 0] and offset.tolist() == [0, 0, 0, 0, 5, 0]
    assert rows == 6  # 2 rows per group, 2 groups, a multiple of 3
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows([9], [0], 1, 8)


def test_bucket_quantum_bounds_the_shapes():
    assert [bucket_length(n, 16, quantum=128) for n in (1, 17, 100, 129, 300, 512)] == [16, 32, 128, 256, 384, 512]
    assert bucket_length(300, 16) == 512  # no quantum: powers of two
    shapes = {bucket_length(n, 64, 2048, quantum=128) for n in range(1, 2049)}
    assert len(shapes) == 2048 // 128 + 1  # 64 and the 16 multiples of 128


@pytest.mark.parametrize("micro", [0, 4])
def test_packed_layout_holds_every_sequence_once(micro):
    samples = _samples(np.random.default_rng(0))
    packed = pack(samples, _spec(True, micro))
    st, te = packed.student, packed.teacher
    n = 8 // micro if micro else 1
    rows = st["input_ids"].shape[0]
    assert rows < 8 and rows % n == 0  # fewer rows than samples: they were packed together
    seen = set()
    for b, s in enumerate(samples):
        r = int(st["row"][b]) * n + b % n
        o, seq = int(st["offset"][b]), s.prompt_ids + s.response_ids
        assert st["input_ids"][r, o:o + len(seq)].tolist() == seq
        assert st["positions"][r, o:o + len(seq)].tolist() == list(range(len(seq)))
        seg = st["segment_ids"][r, o:o + len(seq)]
        assert len(set(seg.tolist())) == 1 and seg[0] > 0 and (r, int(seg[0])) not in seen
        seen.add((r, int(seg[0])))
    assert int(np.count_nonzero(st["segment_ids"])) == packed.real_tokens["student"]
    nt = 16 // micro if micro else 1
    for b, s in enumerate(samples):
        for c, prompt in enumerate(s.hint_prompt_ids or [s.prompt_ids]):
            r, o = int(te["row"][b, c]) * nt + (b * 2 + c) % nt, int(te["offset"][b, c])
            seq = prompt + s.response_ids
            assert te["input_ids"][r, o:o + len(seq)].tolist() == seq
            assert te["positions"][r, o:o + len(seq)].tolist() == list(range(len(seq)))
    unpacked = pack(samples, _spec(False))
    assert packed.real_tokens == unpacked.real_tokens
    assert packed.padding_fraction() < unpacked.padding_fraction()
    slots = st["input_ids"].size + te["input_ids"].size
    real = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples) + sum(
        len(p) + len(s.response_ids) for s in samples for p in (s.hint_prompt_ids or [s.prompt_ids]))
    assert packed.padding_fraction() == pytest.approx((slots - real) / slots)


def _assert_phases_equal(a, b, packed):
    mask = packed.student["response_mask"] > 0
    np.testing.assert_allclose(np.asarray(a["old"].old_logprobs)[mask], np.asarray(b["old"].old_logprobs)[mask],
                               atol=2e-5)
    np.testing.assert_array_equal(np.asarray(a["old"].topk_ids)[mask], np.asarray(b["old"].topk_ids)[mask])
    cand = (packed.teacher["candidate_mask"][:, :, None] > 0) & mask[:, None, :]
    for name in ("topk_logprobs", "logprobs_at_student_ids", "logprobs_at_tokens"):
        np.testing.assert_allclose(np.asarray(getattr(a["teach"], name))[cand],
                                   np.asarray(getattr(b["teach"], name))[cand], atol=2e-5, err_msg=name)
    np.testing.assert_array_equal(np.asarray(a["teach"].topk_ids)[cand], np.asarray(b["teach"].topk_ids)[cand])
    np.testing.assert_allclose(np.asarray(a["old_at"])[cand], np.asarray(b["old_at"])[cand], atol=2e-5)


@pytest.fixture(scope="module")
def unpacked_step():
    return _step(pack(_samples(np.random.default_rng(1)), _spec(False)))


@pytest.mark.parametrize("micro", [0, 4])
def test_packed_step_equals_unpacked(micro, unpacked_step):
    samples = _samples(np.random.default_rng(1))
    packed = pack(samples, _spec(True, micro))
    assert packed.student["input_ids"].shape[0] < 8 and packed.teacher["input_ids"].shape[0] < 16
    ref = unpacked_step
    got = _step(packed, micro)
    _assert_phases_equal(got, ref, packed)
    assert set(got["metrics"]) == set(ref["metrics"]) and ref["metrics"]["loss"] != 0.0
    for name, value in ref["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    moved = 0
    for k, v in ref["params"].items():
        np.testing.assert_allclose(got["params"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
        moved += int(np.any(v != ref["before"][k]))
    assert moved > 0


def test_a_sample_does_not_see_its_row_neighbours():
    """Changing one sample's tokens leaves every other sample of its row unchanged (old and teacher)."""
    samples = _samples(np.random.default_rng(1))   # the shapes of test_packed_step_equals_unpacked: no compile
    packed = pack(samples, _spec(True))
    rows = packed.student["row"][:len(samples)]
    # the sample sharing a row with the most others, its first neighbour placed after it (it would see us)
    victim = next(b for b in range(len(samples)) if any(
        rows[o] == rows[b] and packed.student["offset"][o] > packed.student["offset"][b]
        for o in range(len(samples))))
    changed = list(samples)
    s = samples[victim]
    rng = np.random.default_rng(3)
    changed[victim] = dataclasses.replace(
        s, prompt_ids=[int(x) for x in rng.integers(1, VOCAB, len(s.prompt_ids))],
        hint_prompt_ids=[[int(x) for x in rng.integers(1, VOCAB, len(p))] for p in s.hint_prompt_ids])
    packed2 = pack(changed, _spec(True))
    np.testing.assert_array_equal(packed2.student["row"], packed.student["row"])  # same layout
    np.testing.assert_array_equal(packed2.teacher["row"], packed.teacher["row"])
    a, b = _step(packed, train=False), _step(packed2, train=False)
    mask = packed.student["response_mask"] > 0
    others = [i for i in range(len(samples)) if i != victim]
    for i in others:
        np.testing.assert_allclose(np.asarray(a["old"].old_logprobs[i])[mask[i]],
                                   np.asarray(b["old"].old_logprobs[i])[mask[i]], atol=1e-6)
        np.testing.assert_allclose(np.asarray(a["teach"].logprobs_at_tokens[i, 0])[mask[i]],
                                   np.asarray(b["teach"].logprobs_at_tokens[i, 0])[mask[i]], atol=1e-6)
    # the victim's own log-probs did move (the perturbation reaches the model)
    assert np.abs(np.asarray(a["old"].old_logprobs[victim]) - np.asarray(b["old"].old_logprobs[victim]))[
        mask[victim]].max() > 1e-3


@pytest.mark.parametrize("long_suffix", [False, True])
def test_shared_prefix_teacher_pass_equals_the_full_one(long_suffix):
    """Hints are appended inside the last user message: the candidates share the prompt up to it.
    Running that prefix once (a segment of the sample's row that every candidate's segment sees)
    and only each candidate's rest after it gives the teacher outputs of the full per-candidate
    forward (long suffixes: rows over several blocks of the blockwise kernel, 128 tokens on CPU)."""
    rng = np.random.default_rng(4)
    spec = dataclasses.replace(_spec(False), max_seq_len=128 if long_suffix else 64)

    def ids(k):
        return [int(x) for x in rng.integers(1, VOCAB, k)]

    samples = []
    for i, n_hints in enumerate([2, 1, 0, 2]):
        prompt, tail = ids(int(rng.integers(6, 20))), ids(3)  # tail: end of turn + header
        r = int(rng.integers(64, 72)) if long_suffix else int(rng.integers(2, 10))
        samples.append(Sample(
            session_id=f"p{i}", turn_index=0, kind="opd" if n_hints else "rl", reward=0.0 if n_hints else 1.0,
            prompt_ids=prompt + tail, response_ids=ids(r), rollout_logprobs=[-1.0] * r,
            hints=[f"hint {j} long enough" for j in range(n_hints)],
            hint_prompt_ids=[prompt + ids(2 + 3 * j) + tail for j in range(n_hints)], weight_version="0"))
    full = pack(samples, spec)
    shared = pack(samples, dataclasses.replace(spec, shared_prefix_teacher=True))
    # two hints: the prompt before them; one candidate: all of its prompt but the last token
    assert shared.teacher["prefix_len"].tolist()[:4] == [
        len(s.prompt_ids) - 3 if len(s.hints) > 1 else len((s.hint_prompt_ids or [s.prompt_ids])[0]) - 1
        for s in samples]
    # a sample's candidates share one row (segments 1, 2, ...) after its prefix
    assert shared.teacher["input_ids"].shape[0] == spec.samples_per_step
    assert (shared.teacher["input_ids"].shape[1] > A.CPU_BLOCK) is long_suffix
    assert [sorted(set(r) - {0}) for r in shared.teacher["segment_ids"][:4].tolist()] == [
        [A.SHARED_SEGMENT] + list(range(1, int(n) + 1)) for n in full.teacher["candidate_mask"][:4].sum(1)]
    assert (shared.teacher["segment_ids"] == A.SHARED_SEGMENT).sum(1).tolist() == shared.teacher["prefix_len"].tolist()
    assert shared.real_tokens["teacher"] < full.real_tokens["teacher"]
    a, b = _step(full, train=False), _step(shared, train=False)
    mask = full.student["response_mask"] > 0
    cand = (full.teacher["candidate_mask"][:, :, None] > 0) & mask[:, None, :]
    assert cand.sum() > 0
    for name in ("topk_logprobs", "logprobs_at_student_ids", "logprobs_at_tokens"):
        np.testing.assert_allclose(np.asarray(getattr(b["teach"], name))[cand],
                                   np.asarray(getattr(a["teach"], name))[cand], atol=2e-5, err_msg=name)
    np.testing.assert_array_equal(np.asarray(b["teach"].topk_ids)[cand], np.asarray(a["teach"].topk_ids)[cand])


def _prefix_samples(rng: np.random.Generator, n: int = 8) -> list[Sample]:
    """Samples whose 0-2 hint prompts are the prompt with a hint inserted before its last 3 tokens
    (hints go at the end of the last user message), responses of varied lengths; RL-only samples
    get the un-hinted prompt as their one candidate."""
    def ids(k):
        return [int(x) for x in rng.integers(1, VOCAB, k)]

    out = []
    for i in range(n):
        prompt, tail, n_hints = ids(int(rng.integers(6, 20))), ids(3), i % 3
        r = int(rng.integers(2, 12))
        out.append(Sample(session_id=f"q{i}", turn_index=0, kind=("rl", "opd", "opd+rl")[n_hints],
                          reward=(1.0, 0.0, -1.0)[n_hints], prompt_ids=prompt + tail, response_ids=ids(r),
                          rollout_logprobs=list(-rng.random(r) - 0.5),
                          hints=[f"hint {j} long enough" for j in range(n_hints)],
                          hint_prompt_ids=[prompt + ids(2 + 3 * j) + tail for j in range(n_hints)], weight_version="0"))
    return out


@pytest.fixture(scope="module")
def unshared_step():
    """The reference: unpacked, no shared prefix, the whole batch at once."""
    return _step(pack(_prefix_samples(np.random.default_rng(6)), _spec(False)))


@pytest.mark.parametrize("micro", [0, 2, 4])
def test_shared_prefix_step_equals_the_unshared_unpacked_one(micro, unshared_step):
    """The shared-prefix teacher, packed student, with and without micro-batches (2 or 4 samples'
    prefix + suffix rows per micro-batch): every phase, the loss, metrics and updated params equal
    the unpacked step without a shared prefix."""
    samples = _prefix_samples(np.random.default_rng(6))
    packed = pack(samples, dataclasses.replace(_spec(True, micro), shared_prefix_teacher=True))
    assert packed.teacher["input_ids"].shape[0] == 8 and packed.teacher["prefix_len"].min() >= 5
    got, ref = _step(packed, micro), unshared_step
    _assert_phases_equal(got, ref, packed)
    assert set(got["metrics"]) == set(ref["metrics"]) and ref["metrics"]["loss"] != 0.0
    for name, value in ref["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for k, v in ref["params"].items():
        np.testing.assert_allclose(got["params"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("micro", [0, 2])
def test_the_teacher_pass_gives_the_reference_log_probs(micro):
    """With a KL anchor the shared-prefix row also holds the un-hinted prompt (RL-only samples: their
    one candidate; hinted ones: one more segment), so the teacher pass returns the reference pass's
    log-probs (the frozen model on the student's own rows) and the candidates' outputs are unchanged."""
    samples = _prefix_samples(np.random.default_rng(8))
    spec = dataclasses.replace(_spec(True, micro), shared_prefix_teacher=True)
    plain, folded = pack(samples, spec), pack(samples, dataclasses.replace(spec, kl_coef=0.05))
    te = folded.teacher
    for i, s in enumerate(samples):   # where the un-hinted prompt sits: a candidate's place or a segment after them
        n, o = int(te["prefix_len"][i]), int(te["reference_offset"][i])
        seq = s.prompt_ids + s.response_ids
        assert te["input_ids"][i, :n].tolist() + te["input_ids"][i, o:o + len(seq) - n].tolist() == seq
        assert int(te["reference_start"][i]) == len(s.prompt_ids) - n
        assert (o == int(te["offset"][i, 0])) is (not s.hint_prompt_ids)
    np.testing.assert_array_equal(te["candidate_mask"], plain.teacher["candidate_mask"])
    a, b = _step(plain, micro, train=False), _step(folded, micro, train=False)
    assert a["teach"].reference_logprobs is None
    settings = S.StepSettings(loss=LossConfig(), temperature=TAU, chunk_size=4)
    inputs, _ = _inputs(pack(samples, _spec(False)))
    _, (tgd, tstate) = _models()
    ref = np.asarray(jax.jit(functools.partial(S.reference_pass, settings=settings))(tgd, tstate, inputs))
    mask = folded.student["response_mask"] > 0
    np.testing.assert_allclose(np.asarray(b["teach"].reference_logprobs)[mask], ref[mask], atol=2e-5)
    cand = (te["candidate_mask"][:, :, None] > 0) & mask[:, None, :]
    for name in ("topk_logprobs", "logprobs_at_student_ids", "logprobs_at_tokens"):
        np.testing.assert_allclose(np.asarray(getattr(b["teach"], name))[cand],
                                   np.asarray(getattr(a["teach"], name))[cand], atol=2e-5, err_msg=name)


@pytest.fixture(scope="module")
def system_prompt_samples():
    """Samples whose prompts all start with one 24-token system prompt (as OpenClaw's do), and the
    step over them unpacked, without any shared prefix (the reference)."""
    rng = np.random.default_rng(9)
    system = [int(x) for x in rng.integers(1, VOCAB, 24)]
    samples = [dataclasses.replace(s, prompt_ids=system + s.prompt_ids,
                                   hint_prompt_ids=[system + h for h in s.hint_prompt_ids])
               for s in _prefix_samples(rng)]
    return samples, _step(pack(samples, _spec(False)))


@pytest.mark.parametrize("micro,shared", [(0, False), (4, False), (2, True)])
def test_a_batch_prefix_runs_once_per_row_and_the_step_is_unchanged(micro, shared, system_prompt_samples):
    """The prompt prefix common to every sample (the system prompt) is written once per packed row as a
    segment every sequence of the row sees; only the rests follow. Every phase, the loss and the
    update equal the unpacked step (student and packed teacher rows; or with the per-sample shared
    prefix teacher)."""
    samples, ref = system_prompt_samples
    spec = dataclasses.replace(_spec(True, micro), shared_prefix_teacher=shared, batch_prefix_min=8)
    packed, plain = pack(samples, spec), pack(samples, dataclasses.replace(spec, batch_prefix_min=0))
    st = packed.student
    held = (st["segment_ids"] > 0).any(1)
    assert (st["segment_ids"][held, :24] == A.SHARED_SEGMENT).all() and (st["segment_ids"][held, 24] > 0).all()
    assert packed.real_tokens["student"] == plain.real_tokens["student"] - 24 * (len(samples) - held.sum())
    assert packed.slots("student") <= plain.slots("student")
    assert ("prefix_len" in packed.teacher) is shared
    if not shared:
        assert (packed.teacher["segment_ids"][:, :24] == A.SHARED_SEGMENT).sum() == 24 * (
            packed.teacher["segment_ids"] > 0).any(1).sum()
    got = _step(packed, micro)
    _assert_phases_equal(got, ref, packed)
    for name, value in ref["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for k, v in ref["params"].items():
        np.testing.assert_allclose(got["params"][k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_batch_prefix_needs_every_sequence_and_the_minimum():
    assert batch_prefix([[1, 2, 3, 4, 9], [1, 2, 3, 5, 9], None], [4, 4], 2) == [1, 2, 3]
    assert batch_prefix([[1, 2, 3, 4, 9], [1, 2, 3, 4, 8]], [4, 2], 1) == [1]   # one short of the shortest prompt
    assert batch_prefix([[1, 2, 3, 4], [1, 2, 3, 4]], [4, 4], 4) == []          # shorter than the minimum
    assert batch_prefix([[1, 2, 3, 4]], [4], 1) == []                           # one sequence shares nothing


def test_one_candidate_keeps_the_packed_teacher_layout():
    """With one candidate per sample nothing is shared: the batcher keeps the packed layout."""
    samples = [dataclasses.replace(s, hints=s.hints[:1], hint_prompt_ids=s.hint_prompt_ids[:1])
               for s in _prefix_samples(np.random.default_rng(7))]
    spec = dataclasses.replace(_spec(True), max_candidates=1, shared_prefix_teacher=True)
    assert not spec.shares_prefix and dataclasses.replace(spec, max_candidates=2).shares_prefix
    packed = pack(samples, spec)
    assert "prefix_len" not in packed.teacher and packed.teacher["input_ids"].ndim == 2


def test_packed_rows_may_be_longer_than_the_longest_sequence_when_that_pads_less():
    samples = [Sample(session_id="b", turn_index=i, kind="opd", reward=0.0, prompt_ids=[1] * 128,
                      response_ids=[2] * 128, rollout_logprobs=[-1.0] * 128, hints=["h0 long enough", "h1 long enough"],
                      hint_prompt_ids=[[3] * (128 + 16 * (c + 1)) for c in range(2)]) for i in range(4)]
    spec = BatchSpec(samples_per_step=4, max_candidates=2, min_seq_bucket=64, min_response_bucket=32, max_seq_len=4096,
                     packing=True, bucket_quantum=128)
    packed = pack(samples, spec)
    # teacher sequences of 272 and 288 tokens bucket to 384: four per row of 1152 instead of one per 384
    assert packed.teacher["input_ids"].shape == (2, 1152)
    assert packed.padding_fraction("teacher") == pytest.approx(1 - 2240 / 2304)
    assert pack(samples, dataclasses.replace(spec, packing=False)).padding_fraction("teacher") == pytest.approx(
        1 - 2240 / (8 * 384))


def test_a_batch_without_candidates_trains_the_same_without_a_teacher_pass():
    """The trainer runs no teacher pass when no sample has a candidate (zeros in its place, as for
    `rl`): the loss, metrics and update must be those of the step that ran it."""
    samples = [dataclasses.replace(s, hints=[], hint_prompt_ids=[], kind="rl", reward=1.0 - 2 * (i % 2))
               for i, s in enumerate(_samples(np.random.default_rng(2)))]
    packed = pack(samples, dataclasses.replace(_spec(True), rl_only_teacher="none"))
    assert not packed.has_teacher and packed.slots("teacher") == 0 and packed.phase_keys()[1] is None
    with_teacher = _step(packed)
    tx, old_pass, _, _, train_step = _phases(0)
    inputs, tinputs = _inputs(packed)
    (gd, trainable, frozen), _ = _models()
    old = old_pass(gd, (trainable, frozen), inputs)
    b, c = packed.teacher["candidate_mask"].shape
    t, k = old.topk_ids.shape[1:]
    zeros = jnp.zeros((b, c, t, k), jnp.float32)
    teach = S.TeacherPassOutput(jnp.zeros((b, c, t, k), jnp.int32), zeros, zeros, jnp.zeros((b, c, t), jnp.float32))
    batch = S.assemble_batch(inputs, tinputs, old, teach, teach.logprobs_at_student_ids)
    new, _, metrics, k_star = train_step(gd, trainable, frozen, tx.init(trainable), inputs, batch)
    # the loss itself is 0 up to rounding here (rewards +-1 in equal numbers, ratio 1 at the first step),
    # so whether it comes out exactly 0.0 depends on the CPU; its gradient is not
    assert with_teacher["metrics"]["grad_norm"] > 1e-6
    for name, value in with_teacher["metrics"].items():
        assert float(metrics[name]) == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for p, x in jax.tree_util.tree_leaves_with_path(new):
        np.testing.assert_allclose(np.asarray(x), with_teacher["params"][jax.tree_util.keystr(p)], rtol=1e-5,
                                   atol=1e-7)
