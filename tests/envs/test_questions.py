"""Question sources: disjoint train / held-out splits, reproducible by seed."""

from __future__ import annotations

import itertools
import re

import pytest

from openclaw_jax.envs import questions as Q


def _texts(qs):
    return [" ".join(q.text.lower().split()) for q in qs]


def test_gsm_heldout_reproducible_and_seed_dependent():
    a = Q.heldout_questions("gsm", 20, seed=0)
    b = Q.heldout_questions("gsm", 20, seed=0)
    c = Q.heldout_questions("gsm", 20, seed=1)
    assert a == b
    assert len(set(_texts(a))) == 20
    assert not set(_texts(a)) & set(_texts(c))
    # a smaller held-out set is a prefix of a larger one (so n can grow without reshuffling)
    assert Q.heldout_questions("gsm", 5, seed=0) == a[:5]
    for q in a:
        assert q.split == "heldout" and q.source == "gsm"
        assert re.fullmatch(r"-?\d+(\.\d+)?", q.answer), q.answer


def test_gsm_train_disjoint_from_heldout_pool():
    seed = 3
    heldout = set(_texts(Q.heldout_questions("gsm", Q.GSM_HELDOUT_POOL, seed=seed)))
    train = list(itertools.islice(Q.train_questions("gsm", seed=seed), 600))  # crosses chunk boundaries
    train_texts = _texts(train)
    assert len(set(train_texts)) == 600  # no repeats in the stream
    assert not heldout & set(train_texts)
    assert train == list(itertools.islice(Q.train_questions("gsm", seed=seed), 600))


def test_gsm_dedup_check_removes_planted_collision(monkeypatch):
    # Make the training generator return a held-out question: the de-dup check must drop it.
    heldout = Q.gsm_heldout(Q.GSM_HELDOUT_POOL, seed=0)
    real = Q._gsm_items

    def colliding(dataset_seed, size):
        items = real(dataset_seed, size)
        if dataset_seed < Q._GSM_HELDOUT_BASE:
            items[0] = {"question": heldout[7].text.upper(), "answer": heldout[7].answer}
        return items

    monkeypatch.setattr(Q, "_gsm_items", colliding)
    train = list(itertools.islice(Q.gsm_train_stream(0), 300))
    assert heldout[7].text.lower() not in {q.text.lower() for q in train}


def test_arithmetic_splits_disjoint_and_cover_space():
    train = Q.arithmetic_pool("train")
    held = Q.arithmetic_pool("heldout")
    assert not set(_texts(train)) & set(_texts(held))
    assert len(train) + len(held) == 2 * 10 * 10  # every a op b with 0..9 and + -
    assert 0.1 < len(held) / 200 < 0.3  # one in five held out, by hash


def test_arithmetic_answers_are_right():
    for q in Q.heldout_questions("arithmetic", 30, seed=0, ops="+-*"):
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", q.text).groups()
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert q.answer == str(expected)


def test_arithmetic_reproducible_and_train_stream_disjoint():
    h0 = Q.heldout_questions("arithmetic", 20, seed=0)
    assert h0 == Q.heldout_questions("arithmetic", 20, seed=0)
    assert h0 != Q.heldout_questions("arithmetic", 20, seed=1)
    assert len(set(_texts(h0))) == 20
    stream = list(itertools.islice(Q.train_questions("arithmetic", seed=0), 400))  # > 2 passes
    assert not set(_texts(stream)) & set(_texts(Q.arithmetic_pool("heldout")))
    assert stream == list(itertools.islice(Q.train_questions("arithmetic", seed=0), 400))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="only .* exist"):
        Q.heldout_questions("arithmetic", 10_000)
    with pytest.raises(ValueError, match="unknown question source 'math'"):
        Q.heldout_questions("math", 3)
    with pytest.raises(ValueError, match="ops"):
        Q.arithmetic_pool("train", ops="/")
