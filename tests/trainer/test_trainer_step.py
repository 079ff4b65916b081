"""The trainer's step phases against an independent reference, and the batcher.

Reference: the decoder's full forward on each sequence separately (its logits are checked
against HF transformers in test_decoder_parity), then NumPy float64 log-softmax, argsort and
gathers written out per sample, per candidate, per token.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from openclaw_jax.samples import Sample
from openclaw_jax.losses import LossConfig, hybrid_loss, overlap_counts, select_hint
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.trainer import advantages as A
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batch import BatchSpec, bucket_length
from openclaw_jax.trainer.batcher import pack, parse_version

VOCAB = 96
TAU = 0.7


def _model(seed: int) -> Decoder:
    cfg = ModelConfig(family="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=False)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def _samples(rng: np.random.Generator) -> list[Sample]:
    def ids(n):
        return [int(x) for x in rng.integers(1, VOCAB, n)]

    out = []
    # opd+rl with two hints of different lengths, opd with one hint, rl without hints
    for i, (kind, reward, n_hints) in enumerate([("opd+rl", -1.0, 2), ("opd", 0.0, 1), ("rl", 1.0, 0)]):
        p, r = 4 + 2 * i, 5 + i
        hints = [f"hint number {j} is long enough" for j in range(n_hints)]
        out.append(Sample(session_id=f"s{i}", turn_index=0, kind=kind, reward=reward, prompt_ids=ids(p),
                          response_ids=ids(r), rollout_logprobs=list(-rng.random(r) - 0.5), hints=hints,
                          hint_prompt_ids=[ids(p + 3 + 2 * j) for j in range(n_hints)], weight_version=str(i)))
    return out


def _log_softmax64(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    m = row.max()
    return row - m - np.log(np.exp(row - m).sum())


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    student, teacher = _model(0), _model(1)
    samples = _samples(rng)
    spec = BatchSpec(samples_per_step=4, max_candidates=3, min_seq_bucket=16, min_response_bucket=8)
    packed = pack(samples, spec)
    settings = S.StepSettings(loss=LossConfig(), temperature=TAU, chunk_size=4)
    inputs = S.StudentInputs(**{k: jnp.asarray(v) for k, v in packed.student.items()})
    tinputs = S.TeacherInputs(**{k: jnp.asarray(v) for k, v in packed.teacher.items()})
    gd, state = nnx.split(student)
    tgd, tstate = nnx.split(teacher)
    old = jax.jit(functools.partial(S.old_pass, settings=settings))(gd, state, inputs)
    teach = jax.jit(functools.partial(S.teacher_pass, settings=settings))(tgd, tstate, tinputs, inputs.response_ids,
                                                                           old.topk_ids)
    old_at = jax.jit(functools.partial(S.old_logprobs_at, settings=settings))(gd, state, old.hidden, teach.topk_ids)
    return dict(student=student, teacher=teacher, samples=samples, spec=spec, packed=packed, settings=settings,
                inputs=inputs, tinputs=tinputs, old=old, teach=teach, old_at=old_at)


def _reference_logp(model, prompt, response):
    """[R, V] float64 log-softmax(logits / tau) predicting each response token, one sequence alone."""
    seq = jnp.asarray([list(prompt) + list(response)], jnp.int32)
    logits = np.asarray(model(seq))[0]
    return np.stack([_log_softmax64(logits[len(prompt) - 1 + t] / TAU) for t in range(len(response))])


def test_old_pass_matches_reference(setup):
    old, samples = setup["old"], setup["samples"]
    k = setup["settings"].top_k
    for b, s in enumerate(samples):
        ref = _reference_logp(setup["student"], s.prompt_ids, s.response_ids)
        for t, token in enumerate(s.response_ids):
            assert abs(float(old.old_logprobs[b, t]) - ref[t, token]) < 1e-5
            want = np.argsort(-ref[t], kind="stable")[:k]
            np.testing.assert_array_equal(np.asarray(old.topk_ids[b, t]), want)
            np.testing.assert_allclose(np.asarray(old.topk_logprobs[b, t]), ref[t, want], atol=1e-5)


def test_teacher_pass_and_old_at_teacher_ids_match_reference(setup):
    teach, old, old_at, samples = setup["teach"], setup["old"], setup["old_at"], setup["samples"]
    k = setup["settings"].top_k
    for b, s in enumerate(samples):
        prompts = s.hint_prompt_ids or [s.prompt_ids]  # RL-only: the un-hinted prompt (rl_only_teacher=unhinted)
        old_ref = _reference_logp(setup["student"], s.prompt_ids, s.response_ids)
        for c, prompt in enumerate(prompts):
            ref = _reference_logp(setup["teacher"], prompt, s.response_ids)
            for t, token in enumerate(s.response_ids):
                want = np.argsort(-ref[t], kind="stable")[:k]
                np.testing.assert_array_equal(np.asarray(teach.topk_ids[b, c, t]), want)
                np.testing.assert_allclose(np.asarray(teach.topk_logprobs[b, c, t]), ref[t, want], atol=1e-5)
                np.testing.assert_allclose(np.asarray(teach.logprobs_at_student_ids[b, c, t]),
                                           ref[t, np.asarray(old.topk_ids[b, t])], atol=1e-5)
                assert abs(float(teach.logprobs_at_tokens[b, c, t]) - ref[t, token]) < 1e-5
                np.testing.assert_allclose(np.asarray(old_at[b, c, t]), old_ref[t, want], atol=1e-5)
        assert setup["packed"].teacher["candidate_mask"][b].sum() == len(prompts)


@pytest.mark.parametrize("packing", [False, True])
def test_reference_pass_matches_reference(setup, packing):
    """The KL anchor's log-probs: the frozen model on each sample's own (un-hinted) prompt and response."""
    spec = BatchSpec(samples_per_step=4, max_candidates=3, min_seq_bucket=16, min_response_bucket=8, packing=packing)
    packed = pack(setup["samples"], spec)
    inputs = S.StudentInputs(**{k: jnp.asarray(v) for k, v in packed.student.items()})
    tgd, tstate = nnx.split(setup["teacher"])
    ref = jax.jit(functools.partial(S.reference_pass, settings=setup["settings"]))(tgd, tstate, inputs)
    assert ref.shape == inputs.response_ids.shape
    for b, s in enumerate(setup["samples"]):
        want = _reference_logp(setup["teacher"], s.prompt_ids, s.response_ids)
        got = np.asarray(ref[b, :len(s.response_ids)])
        np.testing.assert_allclose(got, want[np.arange(len(s.response_ids)), s.response_ids], atol=1e-5)


@pytest.mark.parametrize("loss_name,kl_coef", [("combine", 0.0), ("rl", 0.0), ("opd", 0.0), ("combine", 0.3)])
def test_train_step_matches_dense_loss(setup, loss_name, kl_coef):
    """Chunked train step == dense `hybrid_loss` on full logits: value, metrics and the update (with
    the KL anchor: reference log-probs from the teacher's reference pass)."""
    settings = S.StepSettings(loss=LossConfig(name=loss_name, kl_coef=kl_coef), temperature=TAU, chunk_size=4)
    inputs, tinputs = setup["inputs"], setup["tinputs"]
    ref = None
    if kl_coef:
        tgd, tstate = nnx.split(setup["teacher"])
        ref = S.reference_pass(tgd, tstate, inputs, settings)
    batch = S.assemble_batch(inputs, tinputs, setup["old"], setup["teach"], setup["old_at"], ref_logprobs=ref)
    gd, trainable, frozen = nnx.split(setup["student"], nnx.Param, ...)
    tx = optax.sgd(1.0)  # the update is then exactly -grad
    schedule = optax.constant_schedule(1.0)
    opt_state = tx.init(trainable)
    update = jax.jit(functools.partial(S.update_step, settings=settings, optimizer=tx, lr_schedule=schedule))
    new, _, metrics, k_star = update(gd, trainable, frozen, opt_state, inputs, batch)

    cfg = LossConfig(w_opd=0.0) if loss_name == "rl" else LossConfig(w_rl=0.0) if loss_name == "opd" else LossConfig()
    cfg = dataclasses.replace(cfg, kl_coef=kl_coef)

    def dense(params):
        model = nnx.merge(gd, params, frozen)
        logits = model(inputs.input_ids) / TAU
        resp = S.gather_response(logits, inputs.response_start, inputs.response_ids.shape[1])
        return hybrid_loss(resp, batch, cfg)

    (loss, dense_metrics), grads = jax.value_and_grad(dense, has_aux=True)(trainable)
    assert abs(float(metrics["loss"]) - float(loss)) < 1e-5 * max(1.0, abs(float(loss)))
    for name, value in dense_metrics.items():
        assert abs(float(metrics[name]) - float(value)) < 1e-4, name
    assert ("kl_loss" in metrics) == bool(kl_coef) and (not kl_coef or float(metrics["kl_loss"]) > 0)
    # the applied update is minus the dense gradient (same tree, leaf by leaf)
    chex.assert_trees_all_close(jax.tree.map(jnp.subtract, trainable, new), grads, atol=1e-5, rtol=0)
    assert float(metrics["grad_norm"]) == pytest.approx(float(optax.global_norm(grads)), rel=1e-4)
    assert float(metrics["lr"]) == pytest.approx(1.0)
    # k*, the hint the loss chose per token, comes back from the step: the selection on this batch
    overlap = overlap_counts(batch.student_topk_ids, batch.teacher_topk_ids)
    want = select_hint(overlap, batch.candidate_mask, batch.response_mask, settings.loss.hint_selection)
    assert k_star.shape == batch.response_ids.shape
    np.testing.assert_array_equal(np.asarray(k_star), np.asarray(want))


def test_make_optimizer_clips_then_warms_up():
    tx, schedule = S.make_optimizer(1e-3, warmup_steps=4, grad_clip=1.0)
    assert float(schedule(0)) == pytest.approx(2.5e-4) and float(schedule(10)) == pytest.approx(1e-3)
    params = {"w": jnp.zeros(3)}
    state = tx.init(params)
    # a huge gradient is clipped to norm 1 first: Adam's first step is then lr * sign(g) regardless
    updates, _ = tx.update({"w": jnp.asarray([300.0, -400.0, 0.0])}, state, params)
    np.testing.assert_allclose(np.asarray(updates["w"]), [-2.5e-4, 2.5e-4, 0.0], rtol=1e-3, atol=1e-9)


def test_make_optimizer_cosine_decay_reaches_the_final_ratio_at_decay_steps():
    import math

    lr, warmup, total, ratio = 3e-5, 2, 15, 0.1
    _, schedule = S.make_optimizer(lr, warmup_steps=warmup, decay_steps=total, final_lr_ratio=ratio)
    for step in range(total + 3):
        if step < warmup:  # the linear warm-up is unchanged
            want = lr / warmup + (lr - lr / warmup) * step / warmup
        else:  # half a cosine from lr down to ratio * lr over the remaining steps, then flat
            frac = min(step - warmup, total - warmup) / (total - warmup)
            want = lr * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * frac)))
        assert float(schedule(step)) == pytest.approx(want, rel=1e-5), step
    # without decay steps the learning rate stays at its peak
    _, flat = S.make_optimizer(lr, warmup_steps=warmup)
    assert float(flat(100)) == pytest.approx(lr)


def test_gather_response_positions():
    x = jnp.arange(2 * 6, dtype=jnp.float32).reshape(2, 6)[..., None]
    got = S.gather_response(x, jnp.asarray([2, 4]), 3)[..., 0]
    np.testing.assert_array_equal(np.asarray(got), [[1, 2, 3], [9, 10, 11]])


def test_gather_response_reads_packed_rows():
    # three sequences packed into two rows: (row, first response slot) = (0, 2), (1, 1), (0, 5)
    x = jnp.arange(2 * 8, dtype=jnp.float32).reshape(2, 8)[..., None]
    got = S.gather_response(x, jnp.asarray([2, 1, 5]), 3, row=jnp.asarray([0, 1, 0]))[..., 0]
    # slot s predicts the token at s + 1; indices past the row are clamped to its last slot
    np.testing.assert_array_equal(np.asarray(got), [[1, 2, 3], [8, 9, 10], [4, 5, 6]])
    got = S.gather_response(x, jnp.asarray([7]), 3, row=jnp.asarray([1]))[..., 0]
    np.testing.assert_array_equal(np.asarray(got), [[14, 15, 15]])


def test_importance_weights_truncate():
    old = jnp.log(jnp.asarray([[0.5, 0.9, 0.1]]))
    rollout = jnp.log(jnp.asarray([[0.25, 0.3, 0.2]]))
    w = A.importance_weights(old, rollout, jnp.asarray([[1.0, 1.0, 0.0]]), cap=2.0)
    np.testing.assert_allclose(np.asarray(w), [[2.0, 2.0, 1.0]], rtol=1e-6)
    w = A.importance_weights(old, rollout, jnp.ones((1, 3)), cap=5.0)
    np.testing.assert_allclose(np.asarray(w), [[2.0, 3.0, 0.5]], rtol=1e-5)
    # the same arithmetic on host arrays (NumPy float64): the module takes the arrays' own namespace
    w = A.importance_weights(np.log([[0.5, 0.9, 0.1]]), np.log([[0.25, 0.3, 0.2]]), np.ones((1, 3)), cap=5.0)
    assert w.dtype == np.float64 and isinstance(w, np.ndarray)
    np.testing.assert_allclose(w, [[2.0, 3.0, 0.5]], rtol=1e-12)


def test_pack_layout_and_buckets():
    rng = np.random.default_rng(1)
    samples = _samples(rng)
    spec = BatchSpec(samples_per_step=4, max_candidates=2, min_seq_bucket=8, min_response_bucket=4)
    packed = pack(samples, spec, current_version=3)
    st, te = packed.student, packed.teacher
    assert st["input_ids"].shape == (4, bucket_length(max(len(s.prompt_ids) + len(s.response_ids) for s in samples), 8))
    assert te["input_ids"].shape[:2] == (4, 2)
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert st["input_ids"][b, :p].tolist() == s.prompt_ids
        assert st["input_ids"][b, p:p + r].tolist() == s.response_ids
        assert st["response_start"][b] == p
        assert st["response_mask"][b].sum() == r
        assert np.all(st["advantages"][b, :r] == s.reward) and np.all(st["advantages"][b, r:] == 0)
        n_cands = min(len(s.hints), 2) or 1
        assert te["candidate_mask"][b].sum() == n_cands
    assert st["sample_mask"].tolist() == [1, 1, 1, 0]
    assert packed.staleness.tolist() == [3, 2, 1]
    assert packed.kinds == {"opd+rl": 1, "opd": 1, "rl": 1}
    none = pack(samples, BatchSpec(samples_per_step=4, rl_only_teacher="none"))
    assert none.teacher["candidate_mask"][2].sum() == 0  # RL-only sample: no teacher candidate
    with pytest.raises(ValueError):
        pack(samples, BatchSpec(samples_per_step=2))


def test_bucket_length_and_versions():
    assert [bucket_length(n, 16) for n in (1, 16, 17, 33)] == [16, 16, 32, 64]
    assert bucket_length(100, 16, maximum=120) == 120
    with pytest.raises(ValueError):
        bucket_length(130, 16, maximum=120)
    assert parse_version("7") == 7 and parse_version("step-3") == 3 and parse_version("default") is None
