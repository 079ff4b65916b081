"""Task correctness (envs.grading) and the demo persona that wants short answers that are right.

The expected grades are worked out by hand from the answer text: the last number written in
the answer against the question's known answer.
"""

from __future__ import annotations

import math
import random

import pytest

from openclaw_jax.envs import grading as G
from openclaw_jax.envs import personas as P
from openclaw_jax.envs.questions import heldout_questions
from openclaw_jax.envs.simulated_user import FirstAnswer, score_first_answers


@pytest.mark.parametrize("answer, reference, expected", [
    ("6 + 4 = 10.", "10", True),                 # the final number is the result
    ("The answer: 12.", "10", False),            # short, complete, wrong
    ("The answer is 10.0", "10", True),          # same number, other spelling
    ("It earns 28,080 pounds a year.", "28080", True),
    ("3 - 7 = -4", "-4", True),                  # a sign touching the digits is kept
    ("3 - 7 = 4", "-4", False),                  # ... so the magnitude alone is not enough
    ("7 - 3 = 4", "4", True),                    # the operator is not a sign
    ("10, no wait, 11", "10", False),            # the *final* number counts
    ("I do not know.", "10", False),             # no number is wrong
    ("x2 is not a number", "2", False),          # a digit glued to a word is not a number
    ("10", "ten", None),                         # a non-numeric reference cannot be graded
    ("10", None, None),
])
def test_is_correct_by_hand(answer, reference, expected):
    assert G.is_correct(answer, reference) is expected


@pytest.mark.parametrize("answer, question, reference, states, by_restatement", [
    ("2 - 1 = 1", "What is 2 - 1?", "1", True, False),              # the result written after the expression
    ("The answer is 2 - 1.", "What is 2 - 1?", "1", False, True),   # right by the last-number rule only
    ("2-1", "What is 2 - 1?", "1", False, True),                    # any spacing around the operator
    ("0 + 9\n\nThe answer is 0 + 9.", "What is 0 + 9?", "9", False, True),
    ("The answer is 9.", "What is 0 + 9?", "9", True, False),
    ("2 - 1 is 3.", "What is 2 - 1?", "1", False, False),            # wrong, not a restatement that passed
    ("12 - 10 = 2", "What is 2 - 10?", "-8", False, False),          # "2 - 10" inside "12 - 10" is not the question
    ("Instead of 1 + 0, please add 1.", "What is 1 + 0?", "1", True, False),   # a 1 outside the expression
    ("She has 10.", "Ann has 6 apples and gets 4 more. How many?", "10", True, False),   # a word problem
    ("2 - 1", "What is 2 - 1?", "one", None, False),                 # a reference that is not a number
])
def test_states_result_and_right_by_restatement_by_hand(answer, question, reference, states, by_restatement):
    assert G.states_result(answer, question, reference) is states
    assert G.right_by_restatement(answer, question, reference) is by_restatement


def test_accuracy_leaves_ungradable_out():
    assert G.accuracy([True, False, None, True]) == pytest.approx(2 / 3)
    assert math.isnan(G.accuracy([None, None]))


def test_score_first_answers_grades_the_number_not_the_style():
    # Every answer satisfies a plain brevity persona; only two of four state the right number.
    qs = heldout_questions("arithmetic", 4, seed=0)
    texts = [f"The answer: {q.answer}." for q in qs[:2]] + [f"The answer: {int(q.answer) + 1}." for q in qs[2:]]
    answers = [FirstAnswer(q, t, "stop", 5) for q, t in zip(qs, texts)]
    plain = score_first_answers(P.make_persona("concise", max_chars=60), answers)
    assert plain.score == 1.0 and plain.accuracy == 0.5
    assert plain.correct == (True, True, False, False)
    right = score_first_answers(P.make_persona("concise", max_chars=60, correct=True), answers)
    assert right.score == 0.5 and right.accuracy == 0.5


def test_concise_correct_rules_and_scores():
    persona = P.persona_from_spec("concise:max_chars=20,correct=true")
    q = "What is 6 + 4?"
    ok = persona.check("6 + 4 = 10.", q, finish_reason="stop", reference="10")
    assert ok.satisfied and ok.score == 1.0
    wrong = persona.check("The answer: 12.", q, finish_reason="stop", reference="10")
    assert not wrong.satisfied and wrong.score == 0.5  # 2 of 3 rules, rounded down to a quarter
    assert wrong.instructions == ["6 + 4 should be 10, not 12."]   # a person names what was asked
    # a question without a plain expression (a word problem): the result alone
    story = persona.check("She has 12.", "Ann has 6 apples and gets 4 more. How many?", finish_reason="stop",
                          reference="10")
    assert story.instructions == ["The answer should be 10, not 12."]
    assert persona.check("I don't know.", q, finish_reason="stop", reference="10").instructions == ["6 + 4 should be 10."]
    long_right = persona.check("Six plus four makes ten, so it is 10", q, finish_reason="stop", reference="10")
    assert not long_right.satisfied and [r.name for r in long_right.rules if not r.passed] == ["short"]
    # Without a reference the correctness rule is not applied (as with an unknown finish reason).
    assert persona.check("The answer: 12.", q, finish_reason="stop").satisfied
    with pytest.raises(ValueError, match="correct"):
        P.make_persona("concise", correct="yes")


@pytest.mark.parametrize("spec", ["concise:max_chars=60,correct=true,result_stated=true",
                                  "student_prose:correct=true,min_sentences=1,min_step_sentences=1,result_stated=true"])
def test_a_person_who_wants_the_result_stated_refuses_a_restated_question(spec):
    from openclaw_jax.gateway.judge import NextState, RuleJudge

    strict = P.persona_from_spec(spec)
    lenient = P.persona_from_spec(spec.replace(",result_stated=true", ""))
    q, ref = "What is 2 - 1?", "1"

    def correct_rule(persona, answer):
        verdict = persona.check(answer, q, finish_reason="stop", reference=ref)
        return next(r for r in verdict.rules if r.name == "correct")

    for restated in ("The answer is 2 - 1.", "2 - 1\n\nThe answer is 2 - 1."):
        # the last-number rule grades it right; the person who wants the result refuses it, naming the restatement
        assert correct_rule(lenient, restated).passed
        verdict = strict.check(restated, q, finish_reason="stop", reference=ref)
        assert not verdict.satisfied
        assert verdict.instructions[0] == "2 - 1 should be 1, not 2 - 1."
        assert "restates the question" in verdict.violations[0]
        text = strict.react(q, restated, verdict, random.Random(0))
        judged = RuleJudge().judge_now(restated, NextState("user", text))
        assert judged.eval_score == -1 and judged.hints[0].startswith("2 - 1 should be 1, not 2 - 1.")
    # a result written as a result passes the rule for both; a wrong one draws the usual correction from both
    assert correct_rule(strict, "So 2 - 1 = 1.").passed and correct_rule(lenient, "So 2 - 1 = 1.").passed
    for persona in (strict, lenient):
        wrong = persona.check("2 - 1 = 3.", q, finish_reason="stop", reference=ref)
        assert wrong.instructions[0] == "2 - 1 should be 1, not 3."
    # a word problem cannot be restated: its result is the only number an answer can end on
    story = strict.check("She has 10 apples in all now.", "Ann has 6 apples and gets 4 more. How many?",
                         finish_reason="stop", reference="10")
    assert [r.passed for r in story.rules if r.name == "correct"] == [True]
    assert "stated" in strict.preference


def test_result_stated_needs_the_correctness_rule():
    with pytest.raises(ValueError, match="set correct=true"):
        P.persona_from_spec("concise:max_chars=60,result_stated=true")
    with pytest.raises(ValueError, match="result_stated must be true or false"):
        P.make_persona("student_prose", correct=True, result_stated="yes")


def test_wrong_answer_draws_a_correction_with_the_result_that_the_judge_turns_into_reward_and_hint():
    from openclaw_jax.gateway.judge import NextState, RuleJudge

    persona = P.make_persona("concise", max_chars=60, correct=True)
    q = "What is 9 + 2?"
    cases = {
        # wrong and short: the correction names the right result
        "The answer: 5": ("9 + 2 should be 11, not 5.",),
        # right but cut off: the brevity instructions, no result
        "9 + 2 = 11. " * 10: ("Please keep your answer under 60 characters. Please stop as soon as you have "
                              "answered, so the reply ends instead of being cut off.",),
        # wrong and long: the result first, then the brevity instruction
        "Let me think about this one step by step: 9 plus 2 is 12, I think.": (
            "9 + 2 should be 11, not 12. Please keep your answer under 60 characters.",),
    }
    for answer, hints in cases.items():
        finish = "length" if answer.startswith("9 + 2 = 11.") else "stop"
        verdict = persona.check(answer, q, finish_reason=finish, reference="11")
        for seed in range(12):
            text = persona.react(q, answer, verdict, random.Random(seed))
            j = RuleJudge().judge_now(answer, NextState("user", text))
            assert j.eval_score == -1, text
            assert j.hints == hints, text
    right = persona.check("11", q, finish_reason="stop", reference="11")
    text = persona.react(q, "11", right, random.Random(0))
    j = RuleJudge().judge_now("11", NextState("user", text))
    assert j.eval_score == 1 and j.hints == ()
