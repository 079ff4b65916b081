"""Personas: deterministic checks on hand-written answers, and reactions a judge can use."""

from __future__ import annotations

import random

import pytest

from openclaw_jax.envs import personas as P

QUESTION = (
    "A carpenter works for 2 weeks every month and for 6 days every week. If he gets paid £195 "
    "every day, how much does he earn if he works for a year? Give the result as your final answer."
)
# Plain prose, one calculation per sentence: what the student asked for.
PROSE = (
    "He works 6 days a week for 2 weeks, so he works 6 times 2, which is 12 days a month. "
    "At 195 pounds a day he earns 195 times 12, which is 2340 pounds a month. "
    "Over 12 months that is 2340 times 12, which comes to 28080 pounds. So he earns 28080 in a year."
)
# Typical chat-model markdown: heading, numbered list, bold, bullets, code fence.
MARKDOWN = (
    "## Solution\n"
    "1. Days per month: 6 * 2 = 12\n"
    "2. Monthly pay: **195 * 12 = 2340**\n"
    "- Yearly: 2340 * 12 = 28080\n\n"
    "```\n28080\n```"
)
FRIENDLY = (
    "Great question! He works 6 days a week for 2 weeks, so that is 12 days a month, and at £195 a "
    "day he makes £2340 a month. Over a year he earns 28080, well done for asking."
)


def rule(verdict, name):
    return next(r for r in verdict.rules if r.name == name)


# ---------------------------------------------------------------- quantisation


def test_quantize_score_rounds_down_to_quarters():
    assert P.quantize_score(1.0) == 1.0
    assert P.quantize_score(3 / 4) == 0.75
    assert P.quantize_score(2 / 3) == 0.5  # 2 of 3 rules: not yet 0.75
    assert P.quantize_score(0.999) == 0.75  # only a perfect answer scores 1
    assert P.quantize_score(0.0) == 0.0
    with pytest.raises(ValueError, match="1.5"):
        P.quantize_score(1.5)


# ---------------------------------------------------------------- student_prose


def test_student_accepts_plain_prose_with_steps():
    v = P.make_persona("student_prose").check(PROSE, QUESTION)
    assert v.satisfied and v.score == 1.0 and v.violations == [] and v.instructions == []


def test_student_rejects_markdown_and_lists():
    v = P.make_persona("student_prose").check(MARKDOWN, QUESTION)
    assert not v.satisfied
    assert not rule(v, "no_markdown").passed
    assert not rule(v, "no_lists").passed
    assert not rule(v, "prose").passed  # bare equations on lines are not sentences
    # it does show numbers it computed, so only "every_step" holds: 1 of 4 rules
    assert rule(v, "every_step").passed
    assert v.score == 0.25


@pytest.mark.parametrize(
    "answer, failing",
    [
        (PROSE.replace("6 times 2", "**6 times 2**"), "no_markdown"),
        (PROSE.replace("6 times 2", "`6*2`"), "no_markdown"),
        ("# Answer\n" + PROSE, "no_markdown"),
        (PROSE.replace("At 195", "\\(195\\) at"), "no_markdown"),
        ("- " + PROSE, "no_lists"),
        ("1. " + PROSE.replace(". At", ".\n2. At"), "no_lists"),
        ("Step 1: " + PROSE, "no_lists"),
        (PROSE + "\n2340 x 12 = 28080", "prose"),  # an equation on its own line
        ("The answer is 28080.", "prose"),  # one sentence is not an explanation
        ("He earns a lot of money every single year. It is a big amount of money in total.", "every_step"),
    ],
)
def test_student_single_violation(answer, failing):
    v = P.make_persona("student_prose").check(answer, QUESTION)
    failed = [r.name for r in v.rules if not r.passed]
    assert failing in failed
    assert not v.satisfied and v.score < 1.0


def test_student_every_step_needs_a_computed_number_when_question_known():
    # Only restates the question's numbers (2, 6, 195): no computed value, so no steps shown.
    answer = "He works 6 days a week for 2 weeks each month. He is paid 195 pounds for every day he works."
    persona = P.make_persona("student_prose")
    assert not rule(persona.check(answer, QUESTION), "every_step").passed
    # Without the question the rule can only count sentences with numbers, which this has.
    assert rule(persona.check(answer), "every_step").passed


# ---------------------------------------------------------------- teacher_friendly


def test_teacher_accepts_friendly_specific_comment():
    v = P.make_persona("teacher_friendly").check(FRIENDLY, QUESTION)
    assert v.satisfied and v.score == 1.0


def test_teacher_partial_scores():
    t = P.make_persona("teacher_friendly")
    # correct and specific but not friendly: 3 of 4 rules
    v = t.check(PROSE, QUESTION)
    assert [r.name for r in v.rules if not r.passed] == ["friendly"] and v.score == 0.75
    # terse, unfriendly, no problem numbers; only the result is specific: 1 of 4
    v = t.check("The answer is 28080.", QUESTION)
    assert sorted(r.name for r in v.rules if not r.passed) == ["friendly", "full_comments", "refers_to_problem"]
    assert v.score == 0.25
    # friendly but vague: no numbers at all
    v = t.check("Great question! You can work this out by multiplying things together. Good luck with it!", QUESTION)
    assert not rule(v, "refers_to_problem").passed and not rule(v, "specific_result").passed
    assert rule(v, "friendly").passed and v.score == 0.5


def test_teacher_friendly_marker_is_a_whole_phrase():
    t = P.make_persona("teacher_friendly")
    # "gladiator" contains "glad" but is not friendly; "Nice" is.
    assert not rule(t.check("The gladiator earns 28080 from 6 days and 2 weeks of work.", QUESTION), "friendly").passed
    assert rule(t.check("Nice! The carpenter earns 28080.", QUESTION), "friendly").passed


def test_teacher_refers_hint_names_problem_numbers():
    v = P.make_persona("teacher_friendly").check("Great question! It is 28080 in the end, well done.", QUESTION)
    hint = next(i for i in v.instructions if "numbers" in i)
    assert "2 and 6" in hint  # the first two numbers of this question


# ---------------------------------------------------------------- simple personas


def test_starts_with():
    p = P.make_persona("starts_with", prefix="Sure")
    assert p.check("Sure, 3 + 4 = 7.").satisfied
    assert p.check("  \nSure thing").satisfied  # leading whitespace is not content
    assert not p.check("sure, 7").satisfied  # case-sensitive by default
    assert P.make_persona("starts_with", prefix="Sure", case_sensitive=False).check("sure, 7").satisfied
    v = p.check("It is 7.")
    assert v.score == 0.0 and v.instructions == ['Please begin your answer with "Sure".']


def test_concise():
    p = P.make_persona("concise", max_chars=10)
    assert p.check("7.", finish_reason="stop").satisfied
    assert p.check("7.").satisfied  # finish reason unknown: only the length rule applies
    v = p.check("short", finish_reason="length")  # cut off by the token limit
    assert not v.satisfied and v.score == 0.5
    v = p.check("x" * 11, finish_reason="length")
    assert v.score == 0.0 and len(v.violations) == 2


def test_keyword():
    p = P.make_persona("keyword", word="answer")
    assert p.check("The Answer: 7").satisfied
    assert not p.check("The answers are 7").satisfied  # whole word by default
    assert P.make_persona("keyword", word="answer", whole_word=False).check("The answers are 7").satisfied


def test_check_is_deterministic_and_typed():
    p = P.make_persona("student_prose")
    assert p.check(MARKDOWN, QUESTION) == p.check(MARKDOWN, QUESTION)
    with pytest.raises(TypeError, match="answer_text must be str"):
        p.check(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------- registry


def test_registry_and_specs():
    assert {"student_prose", "teacher_friendly", "starts_with", "concise", "keyword"} <= set(P.persona_names())
    p = P.persona_from_spec("concise:max_chars=12")
    assert isinstance(p, P.Concise) and p.max_chars == 12
    p = P.persona_from_spec("starts_with:prefix=Hello,case_sensitive=false")
    assert p.prefix == "Hello" and p.case_sensitive is False
    with pytest.raises(ValueError, match="unknown persona 'nope'.*student_prose"):
        P.make_persona("nope")
    with pytest.raises(TypeError, match="bad options"):
        P.make_persona("concise", max_tokens=3)
    with pytest.raises(ValueError, match="key=value"):
        P.persona_from_spec("concise:12")


# ---------------------------------------------------------------- reactions

ALL_FAILING = [
    ("student_prose", {}, MARKDOWN),
    ("teacher_friendly", {}, "28080"),
    ("starts_with", {"prefix": "Sure"}, "It is 7."),
    ("concise", {"max_chars": 5}, "this is far too long"),
    ("keyword", {"word": "answer"}, "It is 7."),
]


@pytest.mark.parametrize("name, kwargs, answer", ALL_FAILING)
def test_correction_carries_explicit_instruction(name, kwargs, answer):
    persona = P.make_persona(name, **kwargs)
    verdict = persona.check(answer, QUESTION, finish_reason="length")
    assert not verdict.satisfied
    for seed in range(5):
        text = persona.react(QUESTION, answer, verdict, random.Random(seed))
        # The first instruction appears verbatim, as its own sentence, long enough to pass the
        # judge's hint filter (stripped text > 10 characters).
        first = verdict.instructions[0]
        assert first in text and len(first.strip()) > 10
        assert first.startswith("Please")
        assert "thank" not in text.lower()  # a correction must not read as satisfaction


@pytest.mark.parametrize("name", ["student_prose", "teacher_friendly", "starts_with", "keyword"])
def test_thanks_when_satisfied_is_varied(name):
    persona = P.make_persona(name)
    answer = {"student_prose": PROSE, "teacher_friendly": FRIENDLY}.get(name, "Sure, the answer is 7.")
    verdict = persona.check(answer, QUESTION)
    assert verdict.satisfied
    texts = {persona.react(QUESTION, answer, verdict, random.Random(s)) for s in range(20)}
    assert len(texts) >= 3  # varied phrasings
    for t in texts:
        assert "thank" in t.lower() and "please" not in t.lower()


def test_reaction_is_a_function_of_the_rng():
    persona = P.make_persona("student_prose")
    v = persona.check(MARKDOWN, QUESTION)
    a = persona.react(QUESTION, MARKDOWN, v, random.Random(7))
    b = persona.react(QUESTION, MARKDOWN, v, random.Random(7))
    assert a == b
    assert len(v.instructions) == 3
    assert sum(i in a for i in v.instructions) == persona.max_instructions  # at most two hints


# ---------------------------------------------------------------- against the gateway's rule judge


@pytest.mark.parametrize("name, kwargs, answer", ALL_FAILING)
def test_rule_judge_reads_corrections_as_minus_one_with_the_instruction_as_hint(name, kwargs, answer):
    from openclaw_jax.gateway.judge import NextState, RuleJudge

    persona = P.make_persona(name, **kwargs)
    verdict = persona.check(answer, QUESTION, finish_reason="length")
    judge = RuleJudge()
    for seed in range(12):  # every opener / closer combination is reached
        text = persona.react(QUESTION, answer, verdict, random.Random(seed))
        j = judge.judge_now(answer, NextState("user", text))
        assert j.eval_score == -1, text
        # the hint is exactly the persona's instruction sentence(s), nothing from opener/closer
        assert j.hints == (" ".join(verdict.instructions[: persona.max_instructions]),), text


@pytest.mark.parametrize("name", ["student_prose", "teacher_friendly", "starts_with", "concise", "keyword"])
def test_rule_judge_reads_thanks_as_plus_one_without_hint(name):
    from openclaw_jax.gateway.judge import NextState, RuleJudge

    persona = P.make_persona(name)
    for text in persona.thanks_phrases:
        j = RuleJudge().judge_now("whatever", NextState("user", text))
        assert j.eval_score == 1 and j.hints == (), text
