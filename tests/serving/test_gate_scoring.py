"""The promotion gate's check, against independent references.

* `ops.kl_divergence` against a float64 NumPy KL of the same logits (chunking, temperature, padding).
* `serving.scoring.replay_terms` against HF transformers (PyTorch, float64) on two different tiny
  Qwen3 checkpoints standing for the served and the candidate version: the per-token log-prob change
  of the response, the drift KL(served || candidate) over the whole vocabulary and the hinted
  teacher's KL gain, each a masked mean over the response positions.
* `aggregate` / `decide`: the score formula of the module docstring, term by term, and each rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from openclaw_jax.ops import kl_divergence
from openclaw_jax.serving.scoring import (ReplayCheck, TurnTerms, aggregate, bucket, decide, not_replayed,
                                          replay_arrays, replay_terms, signal_count)


def _log_softmax64(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def _kl64(zp: np.ndarray, zq: np.ndarray) -> np.ndarray:
    lp, lq = _log_softmax64(zp), _log_softmax64(zq)
    return (np.exp(lp) * (lp - lq)).sum(-1)


@pytest.mark.parametrize("chunk,tau", [(4, 1.0), (3, 0.7), (64, 1.3)])
def test_kl_divergence_matches_numpy(chunk, tau):
    rng = np.random.default_rng(0)
    hp, hq = rng.normal(size=(2, 7, 8)).astype(np.float32), rng.normal(size=(2, 7, 6)).astype(np.float32)
    wp, wq = rng.normal(size=(8, 50)).astype(np.float32), rng.normal(size=(6, 50)).astype(np.float32)
    got = np.asarray(kl_divergence(hp, wp, hq, wq, temperature=tau, chunk_size=chunk))
    want = _kl64(hp.astype(np.float64) @ wp / tau, hq.astype(np.float64) @ wq / tau)
    assert got.shape == (2, 7)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)
    assert np.asarray(kl_divergence(hp, wp, hp, wp, temperature=tau, chunk_size=chunk)).max() < 1e-5   # KL(p||p) = 0


def _torch_logits(model_dir, ids):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _reference(served_dir, cand_dir, prompt, response, hints, tau):
    """dlogp, drift, teacher gain in float64 from transformers' logits (teacher: the served model, hinted)."""
    T = len(response)
    rows = slice(len(prompt) - 1, len(prompt) - 1 + T)
    zs = _torch_logits(served_dir, prompt + response)[rows] / tau
    zc = _torch_logits(cand_dir, prompt + response)[rows] / tau
    ls, lc = _log_softmax64(zs), _log_softmax64(zc)
    dlogp = np.mean(lc[np.arange(T), response] - ls[np.arange(T), response])
    drift = np.mean(_kl64(zs, zc))
    gains = []
    for hint in hints:
        zt = _torch_logits(served_dir, hint + response)[len(hint) - 1:len(hint) - 1 + T] / tau
        gains.append(np.mean(_kl64(zt, zs) - _kl64(zt, zc)))
    return dlogp, drift, float(np.mean(gains))


def test_replay_terms_match_transformers(tiny_qwen3_dir, tiny_qwen3_dir_b):
    from flax import nnx

    from openclaw_jax.models.weights import load_hf_checkpoint

    served_model, _ = load_hf_checkpoint(tiny_qwen3_dir, dtype="float32", param_dtype="float32")
    cand_model, _ = load_hf_checkpoint(tiny_qwen3_dir_b, dtype="float32", param_dtype="float32")
    graphdef, served = nnx.split(served_model)
    _, candidate = nnx.split(cand_model)
    prompt, response = [5, 17, 33, 101, 7, 250], [40, 41, 42, 9, 77, 12, 3]
    hints = [[5, 17, 33, 101, 7, 88, 89, 250], [5, 17, 33, 101, 7, 90, 250]]
    tau = 0.7
    arrays = replay_arrays(prompt, response, None, hints, max_candidates=3, min_length=16, min_response=8)
    # padding: a bucketed length, a padding candidate, masked positions past the response
    assert arrays.ids.shape == (1, 16) and arrays.hint_ids.shape == (1, 3, 16) and arrays.mask.sum() == len(response)
    batch = {k: v for k, v in vars(arrays).items() if v is not None}
    out = replay_terms(graphdef, served, candidate, batch, temperature=tau, chunk_size=3,
                       teacher_graphdef=graphdef, teacher=served)
    dlogp, drift, gain = _reference(tiny_qwen3_dir, tiny_qwen3_dir_b, prompt, response, hints, tau)
    np.testing.assert_allclose(float(out["dlogp"][0]), dlogp, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(out["drift"][0]), drift, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(out["teacher"][0]), gain, rtol=1e-4, atol=1e-5)
    assert drift > 0.01 and abs(dlogp) > 1e-3    # two different models: the check is not trivially zero

    same = replay_terms(graphdef, served, served, batch, temperature=tau, chunk_size=3)
    assert float(same["dlogp"][0]) == 0.0 and abs(float(same["drift"][0])) < 1e-6 and "teacher" not in same


def test_replay_arrays_mask_and_buckets():
    arrays = replay_arrays([1, 2, 3], [4, 5], [1, 0], min_length=4, min_response=1)
    assert arrays.ids.tolist() == [[1, 2, 3, 4, 5, 0, 0, 0]]
    assert arrays.idx.tolist() == [[2, 3]] and arrays.targets.tolist() == [[4, 5]]
    assert arrays.mask.tolist() == [[1.0, 0.0]]   # an agentic turn's context tokens are not scored
    assert [bucket(n, 16) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]


def test_aggregate_is_the_documented_score():
    turns = [TurnTerms("a", 1, 0.2, 0.01, None), TurnTerms("b", -1, 0.3, 0.03, 0.5),
             TurnTerms("c", 0, -0.4, 0.02, 0.1), TurnTerms("d", 0, 0.9, 0.04, None),
             TurnTerms("e", -1, -0.1, 0.05, None)]
    check = aggregate(turns, w_rl=1.0, w_opd=0.5)
    rbar = (1 - 1 - 1) / 3                     # the mean verdict of the turns judged +-1
    # turns with a signal: a, e (reward), b (reward + hint), c (hint only); d has neither
    reward = [(1 - rbar) * 0.2, (-1 - rbar) * 0.3, 0.0, (-1 - rbar) * -0.1]
    teacher = [0.0, 0.5 * 0.5, 0.5 * 0.1, 0.0]
    assert check.with_signal == 4 and check.replayed == 5
    assert check.reward_term == pytest.approx(np.mean(reward)) and check.teacher_term == pytest.approx(np.mean(teacher))
    assert check.score == pytest.approx(np.mean(reward) + np.mean(teacher))
    assert check.drift == pytest.approx(np.mean([0.01, 0.03, 0.02, 0.04, 0.05]))   # every replayed turn
    assert check.agreement == pytest.approx(0.5)   # a (0.2) above e (-0.1), not above b (0.3)
    rl_only = aggregate(turns, w_rl=1.0, w_opd=0.0)                                # `rl`: hints carry no signal
    assert rl_only.with_signal == 3 and rl_only.score == pytest.approx(np.mean([reward[0], reward[1], reward[3]]))


def test_a_move_shared_by_every_answer_is_not_credit():
    """The baseline: lifting accepted and corrected answers alike scores 0, lifting the accepted ones
    relative to the corrected ones scores > 0, the reverse < 0, whatever the verdicts' mean."""
    verdicts = [1, -1, -1, -1, -1]
    same = aggregate([TurnTerms(str(i), v, 0.3, 0.0) for i, v in enumerate(verdicts)], w_rl=1.0, w_opd=0.0)
    assert same.score == pytest.approx(0.0) and same.agreement == 0.5
    better = aggregate([TurnTerms(str(i), v, 0.3 + 0.1 * v, 0.0) for i, v in enumerate(verdicts)], w_rl=1.0, w_opd=0.0)
    worse = aggregate([TurnTerms(str(i), v, 0.3 - 0.1 * v, 0.0) for i, v in enumerate(verdicts)], w_rl=1.0, w_opd=0.0)
    assert better.score > 0 > worse.score and better.agreement == 1.0 and worse.agreement == 0.0


def test_decide_names_the_rule_that_failed():
    def check(**kw):
        base = dict(replayed=4, with_signal=4, score=0.01, drift=0.01, reward_term=0.01, teacher_term=0.0,
                    agreement=1.0)
        return ReplayCheck(**{**base, **kw})

    rules = dict(min_replay=2, min_score=0.0, max_kl=0.05)
    assert decide(check(), **rules)[0] is None
    assert decide(check(score=0.0), **rules)[0] is None        # not worse is enough
    assert decide(check(with_signal=1), **rules)[0] == "min_replay"
    failed, why = decide(check(score=-1e-6), **rules)
    assert failed == "min_score" and "-1e-06" in why
    assert decide(check(drift=0.06), **rules)[0] == "max_kl"
    assert decide(check(score=float("nan")), **rules)[0] == "min_score"   # a broken check never promotes


@pytest.mark.parametrize("w_rl,w_opd,teacher", [(1.0, 0.5, True), (1.0, 0.0, True), (0.0, 1.0, True),
                                                (1.0, 0.5, False)])
def test_the_signal_known_before_replay_is_what_the_replay_counts(w_rl, w_opd, teacher):
    """The gate refuses for too little evidence without replaying; it must count what `aggregate` would."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        verdicts = rng.integers(-1, 2, size=rng.integers(0, 8)).tolist()
        hints = rng.random(len(verdicts)) < 0.5
        # the replay gives a teacher term exactly where the teacher reads the turn's hints
        turns = [TurnTerms(str(i), v, 0.1, 0.0, 0.2 if (teacher and w_opd > 0 and h) else None)
                 for i, (v, h) in enumerate(zip(verdicts, hints))]
        assert signal_count(verdicts, hints.tolist(), w_rl=w_rl, w_opd=w_opd, teacher=teacher) == \
            aggregate(turns, w_rl=w_rl, w_opd=w_opd).with_signal
    check = not_replayed(3)
    assert check.replayed == 0 and decide(check, min_replay=4, min_score=0.0, max_kl=0.1)[0] == "min_replay"
