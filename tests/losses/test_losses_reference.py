"""hybrid_loss (and its siblings) against the independent NumPy float64 loop reference."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from openclaw_jax.losses import (
    LOSS_METRIC_NAMES,
    METRIC_NAMES,
    HybridBatch,
    LossConfig,
    get_loss,
    hybrid_loss,
    hybrid_loss_with_stats,
    merge_metric_stats,
    finalize_metrics,
    overlap_counts,
    select_hint,
)
from tests.helpers.loss_reference import batch_arrays, log_softmax, make_case, reference_kstar, reference_loss

VALUE_RTOL = 1e-5


def _batch(case: dict, **kw) -> HybridBatch:
    return HybridBatch(**{k: (None if v is None else jnp.asarray(v)) for k, v in batch_arrays(case, **kw).items()})


def _assert_grad_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5) -> None:
    """Elementwise within ``rtol`` of the gradient's scale (max |want|) -- a 1e-5 relative bound."""
    scale = float(np.max(np.abs(want)))
    assert scale > 0
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    assert err <= rtol * scale, f"max |grad - ref| = {err:.3e} > {rtol:g} * {scale:.3e}"


def _run(kind_name: str, case: dict, cfg: LossConfig, *, drop=()):
    loss_fn = get_loss(kind_name)
    batch = _batch(case, drop=drop)

    @jax.jit
    def f(logits, batch):
        return jax.value_and_grad(lambda z: loss_fn.dense(z, batch, cfg), has_aux=True)(logits)

    (loss, metrics), grad = f(jnp.asarray(case["logits"], jnp.float32), batch)
    return float(loss), np.asarray(grad), {k: float(v) for k, v in metrics.items()}


def _check(case: dict, cfg: LossConfig, kind: str = "hybrid", name: str = "combine", drop=()):
    ref_case = {k: (None if k in drop else v) for k, v in case.items()}
    loss, grad, metrics = _run(name, case, cfg, drop=drop)
    ref_loss, ref_grad, ref_metrics = reference_loss(case["logits"], ref_case, dataclasses.asdict(cfg), kind)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
    np.testing.assert_allclose(loss, ref_loss, rtol=VALUE_RTOL, atol=1e-7)
    _assert_grad_close(grad, ref_grad)
    for key, value in metrics.items():
        np.testing.assert_allclose(value, ref_metrics[key], rtol=VALUE_RTOL, atol=1e-6, err_msg=key)
    return metrics, ref_metrics


CASE = make_case(0)
CASE_SEG = make_case(1, segments=True)
GRID = list(itertools.product(("shortest", "token_optimal", "sequence_optimal"),
                              ("student", "teacher", "overlap"), (1.0, 0.0)))


@pytest.mark.parametrize("selection,subset,diff_clip", GRID)
def test_hybrid_loss_matches_reference(selection, subset, diff_clip):
    cfg = LossConfig(hint_selection=selection, subset_mode=subset, adv_diff_clip=diff_clip)
    metrics, ref = _check(CASE, cfg)
    hybrid_names = set(LOSS_METRIC_NAMES) | {"kl_loss"}
    assert set(metrics) == hybrid_names, set(metrics) ^ hybrid_names
    # the corner cases are really exercised by this batch
    assert ref["opd_pg_clipfrac"] > 0 and ref["grpo_pg_clipfrac"] > 0
    if subset == "overlap":
        assert ref["opd_subset_size"] < 4.0  # some intersections are partial or empty


@pytest.mark.parametrize("subset", ["student", "teacher", "overlap"])
def test_sequence_optimal_with_segments_matches_reference(subset):
    cfg = LossConfig(hint_selection="sequence_optimal", subset_mode=subset)
    _check(CASE_SEG, cfg)


def test_entropy_and_kl_terms_match_reference():
    cfg = LossConfig(entropy_coef=0.03, kl_coef=0.2, w_rl=0.7, w_opd=1.3, eps_clip=0.1, eps_clip_high=0.3)
    metrics, _ = _check(CASE, cfg)
    assert metrics["entropy_loss"] > 0 and metrics["kl_loss"] > 0


def test_without_clamp_matches_reference():
    _check(CASE, LossConfig(log_ratio_clamp=None, hint_selection="token_optimal"))


def test_optional_fields_absent():
    cfg = LossConfig()
    metrics, _ = _check(CASE, cfg, drop=("rollout_logprobs", "ref_logprobs", "teacher_logprobs_at_tokens"))
    assert "train_rollout_logprob_abs_diff" not in metrics and "kl_loss" not in metrics
    with pytest.raises(ValueError, match="ref_logprobs"):
        _run("combine", CASE, LossConfig(kl_coef=0.1), drop=("ref_logprobs",))


@pytest.mark.parametrize("name,kind", [("combine", "hybrid"), ("rl", "hybrid"), ("token_combine", "token_combine"),
                                       ("tail_kl", "tail_kl")])
def test_constant_token_normaliser_matches_reference(name, kind):
    """``sample_norm_tokens=N``: each sample's terms are its token sum / N (the reference divides by N
    instead of the sample's token count); on this batch, whose samples differ in length, that is not
    the token mean's loss."""
    extra = dict(w_opd=0.5) if name == "token_combine" else {}
    cfg = LossConfig(name=name, sample_norm_tokens=16, entropy_coef=0.03, kl_coef=0.2, **extra)
    _check(CASE, cfg, kind=kind, name=name)
    lengths = {int(n) for n, real in zip(CASE["response_mask"].sum(-1), CASE["sample_mask"]) if real > 0}
    assert len(lengths) > 1, lengths
    mean_loss, _, _ = _run(name, CASE, dataclasses.replace(cfg, sample_norm_tokens=0))
    summed_loss, _, _ = _run(name, CASE, cfg)
    assert abs(summed_loss - mean_loss) > 1e-3 * abs(mean_loss)


def test_constant_token_normaliser_weighs_every_token_alike():
    """The length bias it removes: two wrong samples (advantage -1) of 2 and 8 trained tokens, on-policy.
    Under the token mean the short sample's tokens get 4x the long one's gradient; with a constant N
    each token gets 1 / (N * samples) whatever its sample's length."""
    B, T, V = 2, 8, 16
    mask = np.zeros((B, T), np.float32)
    mask[0, :2], mask[1, :] = 1.0, 1.0
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(B, T, V)), jnp.float32)
    ids = jnp.asarray(np.random.default_rng(4).integers(0, V, (B, T)), jnp.int32)
    old = jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], -1)[..., 0]
    K, C = 2, 1
    zeros_ids, zeros_lp = jnp.zeros((B, C, T, K), jnp.int32), jnp.zeros((B, C, T, K), jnp.float32)
    batch = HybridBatch(response_ids=ids, response_mask=jnp.asarray(mask), old_logprobs=old,
                        advantages=-jnp.ones((B, T)), student_topk_ids=zeros_ids[:, 0],
                        student_topk_logprobs=zeros_lp[:, 0], teacher_topk_ids=zeros_ids, teacher_topk_logprobs=zeros_lp,
                        teacher_logprobs_at_student_ids=zeros_lp, old_logprobs_at_teacher_ids=zeros_lp,
                        candidate_mask=jnp.zeros((B, C)), sample_mask=jnp.ones((B,)))

    def per_token_weight(norm):
        cfg = LossConfig(name="rl", sample_norm_tokens=norm)
        grad = jax.grad(lambda z: get_loss("rl").dense(z, batch, cfg)[0])(logits)
        # on-policy (ratio 1) the gradient at a trained token is w * A * d l_cur(y) / d z, A = -1:
        # its component at y is w * (1 - p(y)) with w the token's weight in the loss
        p_y = np.exp(np.asarray(old, np.float64))
        g_y = np.take_along_axis(np.asarray(grad, np.float64), np.asarray(ids)[..., None], -1)[..., 0]
        return g_y / (1.0 - p_y)

    mean_w = per_token_weight(0)
    np.testing.assert_allclose(mean_w[0, :2], 1.0 / (2 * 2), rtol=1e-5)
    np.testing.assert_allclose(mean_w[1, :], 1.0 / (8 * 2), rtol=1e-5)
    const_w = per_token_weight(10)
    np.testing.assert_allclose(const_w[0, :2], 1.0 / (10 * 2), rtol=1e-5)
    np.testing.assert_allclose(const_w[1, :], 1.0 / (10 * 2), rtol=1e-5)
    np.testing.assert_allclose(const_w[0, 2:], 0.0, atol=1e-12)   # masked tokens carry nothing


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_constant_token_normaliser_must_be_a_count(bad):
    with pytest.raises(ValueError, match="sample_norm_tokens"):
        LossConfig(sample_norm_tokens=bad)


@pytest.mark.parametrize("name,w_rl,w_opd", [("rl", 1.0, 0.0), ("opd", 0.0, 1.0)])
def test_registered_rl_and_opd_match_reference(name, w_rl, w_opd):
    cfg = LossConfig(name=name, hint_selection="token_optimal")
    assert (cfg.w_rl, cfg.w_opd) == (w_rl, w_opd)   # resolved once, from the weights the loss fixes
    loss, grad, _ = _run(name, CASE, cfg)
    ref_loss, ref_grad, _ = reference_loss(CASE["logits"], CASE, dict(hint_selection="token_optimal", w_rl=w_rl,
                                                                      w_opd=w_opd))
    np.testing.assert_allclose(loss, ref_loss, rtol=VALUE_RTOL)
    _assert_grad_close(grad, ref_grad)


@pytest.mark.parametrize("selection", ["shortest", "sequence_optimal"])
def test_token_combine_matches_reference(selection):
    _check(CASE, LossConfig(name="token_combine", hint_selection=selection, w_opd=0.5), kind="token_combine", name="token_combine")


@pytest.mark.parametrize("selection", ["token_optimal", "sequence_optimal"])
def test_tail_kl_matches_reference(selection):
    metrics, _ = _check(CASE, LossConfig(name="tail_kl", hint_selection=selection, w_rl=0.5), kind="tail_kl", name="tail_kl")
    assert metrics["opd_loss"] > 0  # a reverse KL


def test_selection_and_overlap_match_reference():
    for case in (CASE, CASE_SEG):
        b = _batch(case)
        overlap = np.asarray(overlap_counts(b.student_topk_ids, b.teacher_topk_ids))
        for (bi, ci, ti), value in np.ndenumerate(overlap):
            want = len(set(case["student_topk_ids"][bi, ti]) & set(case["teacher_topk_ids"][bi, ci, ti]))
            assert value == want
        for mode in ("shortest", "token_optimal", "sequence_optimal"):
            got = np.asarray(select_hint(jnp.asarray(overlap), b.candidate_mask, b.response_mask, mode, b.segment_ids))
            np.testing.assert_array_equal(got[case["sample_mask"] > 0], reference_kstar(case, mode)[case["sample_mask"] > 0])


def test_reference_gradient_matches_finite_differences_small_vocab():
    """Central differences of the float64 reference value vs its hand-derived gradient and
    vs the JAX gradient, on a 16-word vocabulary, every logit of two samples."""
    case = make_case(3, T=6, V=16)
    cfg = dict(hint_selection="token_optimal", subset_mode="overlap", entropy_coef=0.05, kl_coef=0.1)
    _, ref_grad, _ = reference_loss(case["logits"], case, cfg)
    _, jax_grad, _ = _run("combine", case, LossConfig(**cfg))
    h = 1e-6
    for b in (0, 1):
        for t in range(case["logits"].shape[1]):
            for v in range(case["logits"].shape[2]):
                plus, minus = case["logits"].copy(), case["logits"].copy()
                plus[b, t, v] += h
                minus[b, t, v] -= h
                fd = (reference_loss(plus, case, cfg)[0] - reference_loss(minus, case, cfg)[0]) / (2 * h)
                assert abs(fd - ref_grad[b, t, v]) <= 1e-7 + 1e-5 * abs(fd), (b, t, v, fd, ref_grad[b, t, v])
                assert abs(fd - jax_grad[b, t, v]) <= 1e-5 * np.abs(ref_grad).max(), (b, t, v, fd, jax_grad[b, t, v])


def test_tail_kl_gradient_matches_finite_differences():
    case = make_case(4, T=5, V=16)
    cfg = dict(hint_selection="sequence_optimal", w_rl=0.0)
    _, ref_grad, _ = reference_loss(case["logits"], case, cfg, "tail_kl")
    h = 1e-6
    for t in range(5):
        for v in range(16):
            plus, minus = case["logits"].copy(), case["logits"].copy()
            plus[0, t, v] += h
            minus[0, t, v] -= h
            fd = (reference_loss(plus, case, cfg, "tail_kl")[0] - reference_loss(minus, case, cfg, "tail_kl")[0]) / (2 * h)
            assert abs(fd - ref_grad[0, t, v]) <= 1e-8 + 1e-5 * abs(fd)


def test_metric_stats_merge_to_the_full_batch():
    """Two half batches, metrics merged as (sum, count), loss normalised by the total sample
    count: equal to the full batch (what gradient accumulation and multi-host rely on)."""
    cfg = LossConfig(hint_selection="token_optimal")
    batch = _batch(CASE)
    logits = jnp.asarray(CASE["logits"], jnp.float32)
    f = jax.jit(lambda z, b, n: hybrid_loss_with_stats(z, b, cfg, sample_count=n))
    full_loss, full_stats = jax.jit(lambda z, b: hybrid_loss_with_stats(z, b, cfg))(logits, batch)
    n_real = float(np.sum(CASE["sample_mask"]))
    halves = [jax.tree.map(lambda x: x[s], batch) for s in (slice(0, 3), slice(3, 6))]
    results = [f(logits[s], h, n_real) for s, h in zip((slice(0, 3), slice(3, 6)), halves)]
    np.testing.assert_allclose(float(results[0][0] + results[1][0]), float(full_loss), rtol=1e-6)
    merged = finalize_metrics(merge_metric_stats(results[0][1], results[1][1]))
    full = finalize_metrics(full_stats)
    for key in full:
        np.testing.assert_allclose(float(merged[key]), float(full[key]), rtol=1e-5, atol=1e-7, err_msg=key)


def test_no_retrace_with_same_shapes():
    cfg = LossConfig()
    traces = []

    @jax.jit
    def f(logits, batch):
        traces.append(1)
        return jax.value_and_grad(lambda z: hybrid_loss(z, batch, cfg)[0])(logits)

    batch = _batch(CASE)
    logits = jnp.asarray(CASE["logits"], jnp.float32)
    f(logits, batch)
    other = batch.replace(advantages=-batch.advantages, response_ids=(batch.response_ids + 1) % 64)
    f(logits * 0.5, other)
    assert len(traces) == 1
    # LossConfig is a static pytree: passing it as a jit argument works and keys the cache.
    g = jax.jit(hybrid_loss)
    g(logits, batch, cfg)
    g(logits, other, cfg)
    assert g._cache_size() == 1


def test_metric_names_constant():
    assert METRIC_NAMES[:3] == ("loss", "grpo_pg_loss", "opd_loss")
    assert "grad_norm" in METRIC_NAMES and "lr" in METRIC_NAMES
    assert len(set(METRIC_NAMES)) == 14


def test_shape_errors_name_the_field():
    batch = _batch(CASE)
    bad = batch.replace(old_logprobs=batch.old_logprobs[:, :-1])
    with pytest.raises(ValueError, match="old_logprobs"):
        hybrid_loss(jnp.asarray(CASE["logits"], jnp.float32), bad)
    with pytest.raises(ValueError, match="subset_mode"):
        LossConfig(subset_mode="both")
    with pytest.raises(ValueError, match="hint_selection"):
        LossConfig(hint_selection="longest")


def test_reference_self_consistency():
    """Guard the reference itself: at old == cur, zero rewards, no hints, the loss is zero."""
    case = make_case(5)
    case = dict(case)
    case["candidate_mask"] = np.zeros_like(case["candidate_mask"])
    case["advantages"] = np.zeros_like(case["advantages"])
    loss, grad, _ = reference_loss(case["logits"], case, {})
    assert loss == 0 and not grad.any()
    assert np.allclose(np.exp(log_softmax(case["logits"])).sum(-1), 1.0)


def test_a_loss_file_registers_itself_with_the_decorator():
    """A new loss is one class with @loss_kind plus register_loss: here GRPO with a doubled advantage,
    checked against the reference GRPO-only loss (w_opd = 0) with the advantages doubled."""
    from openclaw_jax.losses import LossKind, available_losses, loss_kind, register_loss
    from openclaw_jax.losses.hybrid import grpo_sample_loss

    @loss_kind("test_double_grpo")
    class DoubleGrpo(LossKind):
        def gather(self, batch, cfg, *, tokens, kstar, active):
            return tokens, None

        def terms(self, cur_logprobs, batch, cfg, plan, *, old, rewards, raw_kl, stats):
            return grpo_sample_loss(raw_kl, 2.0 * rewards, cfg, plan, stats)

    register_loss("test_double_grpo", "test_double_grpo", None, "test only")
    assert "test_double_grpo" in available_losses()
    with pytest.raises(ValueError, match="already registered"):
        loss_kind("test_double_grpo")(DoubleGrpo)
    with pytest.raises(ValueError, match="kind 'nope' is not one of"):
        register_loss("test_nope", "nope")
    cfg = LossConfig(name="test_double_grpo", hint_selection="token_optimal")
    loss, grad, _ = _run("test_double_grpo", CASE, cfg)
    doubled = dict(CASE, advantages=2.0 * np.asarray(CASE["advantages"]))
    ref_loss, ref_grad, _ = reference_loss(CASE["logits"], doubled, dict(hint_selection="token_optimal", w_opd=0.0))
    np.testing.assert_allclose(loss, ref_loss, rtol=VALUE_RTOL)
    _assert_grad_close(grad, ref_grad)


@pytest.mark.parametrize("name,weight", [("rl", "w_opd"), ("opd", "w_rl")])
def test_a_loss_refuses_a_weight_that_conflicts_with_one_it_fixes(name, weight):
    """`rl` is GRPO only (w_opd = 0), `opd` top-K OPD only (w_rl = 0): an explicit other value is an
    error, not silently rewritten; the same value, or none, is accepted."""
    with pytest.raises(ValueError, match=f"loss.name='{name}' fixes loss.{weight}=0"):
        LossConfig(name=name, **{weight: 0.5})
    assert getattr(LossConfig(name=name, **{weight: 0.0}), weight) == 0.0
    assert getattr(LossConfig(name=name), weight) == 0.0
    assert getattr(LossConfig(name="combine", **{weight: 0.5}), weight) == 0.5


def test_loss_names_come_from_the_registry():
    from openclaw_jax.losses import available_losses

    with pytest.raises(ValueError, match="not a registered loss"):
        LossConfig(name="grpo")
    for name in available_losses():
        assert LossConfig(name=name).name == name


def test_a_loss_rejects_a_config_built_for_another_loss():
    with pytest.raises(ValueError, match="LossConfig for loss.name='combine'"):
        get_loss("rl").dense(jnp.zeros((1, 1, 4)), _batch(CASE), LossConfig())
