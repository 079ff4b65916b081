"""Pure scoring logic of the personalisation benchmark."""

from __future__ import annotations

import json
import math

import pytest

from openclaw_jax.envs import personas as P
from openclaw_jax.eval import scoring as S


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The reply uses markdown. \\boxed{0.25}", 0.25),
        ("first \\boxed{1} then on reflection \\boxed{0.5}", 0.5),  # the last box counts
        ("\\boxed{1.0}", 1.0),
        ("\\boxed{ .75 }", 0.75),
        ("\\boxed{0.50}", 0.5),
        ("\\boxed{0}", 0.0),
        ("\\boxed{0.3}", None),  # off the rubric
        ("\\boxed{-1}", None),
        ("\\boxed{2}", None),
        ("\\boxed{good}", None),
        ("no box at all: 0.75", None),
        ("\\boxed{0.75} and a cut-off \\boxed{0.2", 0.75),  # unclosed last box: the one before
        ("", None),
        (None, None),
    ],
)
def test_parse_rubric_score(text, expected):
    assert S.parse_rubric_score(text) == expected


def test_average_votes_ignores_invalid():
    assert S.average_votes([1.0, None, 0.5]) == 0.75
    assert S.average_votes([None, None]) is None
    assert S.average_votes([0.25]) == 0.25


def test_rubric_prompt_states_preference_scale_question_and_answer():
    persona = P.make_persona("student_prose")
    msgs = S.rubric_messages(persona, "What is 2 + 2?", "**4**")
    assert [m["role"] for m in msgs] == ["system", "user"]
    for level in ("0.25", "0.5", "0.75"):
        assert level in msgs[0]["content"]
    assert "\\boxed{" in msgs[0]["content"]
    assert persona.preference in msgs[1]["content"]
    assert "What is 2 + 2?" in msgs[1]["content"] and "**4**" in msgs[1]["content"]


@pytest.mark.parametrize(
    "path, step",
    [
        ("runs/demo/export/step_120", 120),
        ("runs/demo/export/step_120/", 120),
        ("runs/step_5/export/step_00042", 42),
        ("ckpt/step-7", 7),
        ("checkpoints/global_step300", 300),  # DeepSpeed-style names count too
        ("runs/stepwise/model", None),
        ("models/smollm2", None),
    ],
)
def test_step_from_path(path, step):
    assert S.step_from_path(path) == step


def _item(score, rule_score, satisfied, qid="q"):
    return S.ItemScore(qid, "Q?", "A.", "stop", score, (score,), rule_score, satisfied, ())


def test_summarize_and_report_roundtrip(tmp_path):
    items = [_item(1.0, 1.0, True, "a"), _item(0.5, 0.5, False, "b"), _item(None, 0.25, False, "c")]
    s = S.summarize(items)
    assert s["n"] == 3 and s["graded"] == 2
    assert s["mean_score"] == 0.75  # the ungraded item is left out, not counted as 0
    assert s["satisfied_fraction"] == pytest.approx(1 / 3)
    assert s["rule_mean_score"] == pytest.approx((1 + 0.5 + 0.25) / 3)
    assert s["score_histogram"]["1.0"] == 1 and s["score_histogram"]["0.5"] == 1
    persona = P.make_persona("starts_with", prefix="Sure")
    rep = S.build_report(persona=persona, persona_spec="starts_with:prefix=Sure", evaluator={"kind": "rule"}, seed=0,
                         source="arithmetic", target={"kind": "model", "model": "m"}, step=12,
                         generation={"max_tokens": 8}, items=items)
    text = json.dumps(rep)  # JSON-serialisable (no NaN)
    assert "NaN" not in text
    name = S.report_filename(rep)
    assert name == "report_starts_with-prefix-Sure_rule_step00000012.json"
    (tmp_path / name).write_text(text)
    (tmp_path / "report.json").write_text("{}")  # the invocation summary is not a per-step report
    loaded = S.load_reports(tmp_path)
    assert len(loaded) == 1 and loaded[0]["step"] == 12
    assert S.score_series(loaded) == {"starts_with:prefix=Sure (rule)": [(12, 0.75, pytest.approx(1 / 3))]}


def test_summarize_empty_is_nan():
    s = S.summarize([])
    assert s["n"] == 0 and math.isnan(s["mean_score"])
