"""Personas: simulated users with a stable, checkable preference about *how* they are answered.

A persona is pure: `check` is a deterministic function of the answer text (plus, optionally, the
question and the finish reason), and `react` turns a verdict into the user's next message using
only the `random.Random` it is given. Nothing here does I/O.

A persona's preference is a list of rules. Each rule either holds or not; a failed rule carries a
human-readable violation and an explicit instruction (the sentence the user would type to fix it).
The score is the fraction of rules that hold, rounded *down* to the benchmark's rubric levels
{0, 0.25, 0.5, 0.75, 1}; so a score of 1 means every rule holds, i.e. the persona is satisfied.

Reactions are written so the judge of docs/design.md §9 can read them: a satisfied persona thanks
and moves on (every phrasing contains "thank"), an unsatisfied one complains and states the
instruction as its own imperative sentence (> 10 characters), which is what a judge extracts as
the hint.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from typing import Any, Callable, Sequence

from openclaw_jax.envs.answer_text import (
    LIST_PATTERNS,
    MARKUP_PATTERNS,
    TERMINAL_PUNCT_RE,
    extract_numbers,
    nonempty_lines,
    split_sentences,
    word_count,
)
from openclaw_jax.envs.grading import correction
from openclaw_jax.registry import Registry

RUBRIC_LEVELS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


def quantize_score(fraction: float) -> float:
    """Round a fraction in [0, 1] down to the nearest rubric level (so 1 only when all rules hold)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"score fraction must lie in [0, 1], got {fraction!r}")
    # The epsilon keeps exact quarters (e.g. 3/4 computed as 0.7499999) on their own level.
    return math.floor(fraction * 4 + 1e-9) / 4


@dataclasses.dataclass(frozen=True)
class RuleResult:
    """Outcome of one preference rule on one answer."""

    name: str
    passed: bool
    violation: str = ""  # what is wrong, for logs and reports ("uses bullet points")
    instruction: str = ""  # what the user asks for instead, as an imperative sentence


@dataclasses.dataclass(frozen=True)
class PreferenceVerdict:
    """A persona's judgement of one answer.

    `violations` are short descriptions of the failed rules; `instructions` are the matching
    sentences a user would say to get the answer fixed (same order).
    """

    satisfied: bool
    score: float
    violations: list[str] = dataclasses.field(default_factory=list)
    instructions: list[str] = dataclasses.field(default_factory=list)
    rules: tuple[RuleResult, ...] = ()

    @classmethod
    def from_rules(cls, results: Sequence[RuleResult]) -> "PreferenceVerdict":
        if not results:
            raise ValueError("a verdict needs at least one rule result")
        passed = sum(1 for r in results if r.passed)
        failed = [r for r in results if not r.passed]
        return cls(
            satisfied=not failed,
            score=quantize_score(passed / len(results)),
            violations=[r.violation or r.name for r in failed],
            instructions=[r.instruction for r in failed if r.instruction],
            rules=tuple(results),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "satisfied": self.satisfied,
            "score": self.score,
            "violations": list(self.violations),
            "instructions": list(self.instructions),
        }


# ----------------------------------------------------------------------------- base class

_THANKS = (
    "Thanks, that's exactly what I wanted!",
    "Perfect, thank you.",
    "Great, that's clear. Thanks!",
    "That works for me, thanks.",
    "Thank you, that's just right.",
    "Got it, thanks a lot!",
    "Lovely, thank you so much.",
    "Nice, thanks! That's how I like it.",
)
# Every opener states the rejection in words a judge reads as a correction ("not", "no"), and
# no opener or closer contains an instruction word ("please", "should", "use", ...): the only
# instruction sentences in a correction are the persona's hints, so a judge that extracts
# instruction sentences as the hint gets exactly those.
_COMPLAINT_OPENERS = (
    "Hmm, that's not how I wanted it.",
    "That's not quite what I asked for.",
    "No, that is not the style I need.",
    "That is not what I was looking for.",
    "Not quite what I asked for.",
    "No, that's not how I like my answers.",
)
_RETRY_CLOSERS = (
    "Can you redo it?",
    "Could you try again?",
    "Can you redo your answer?",
    "Could you try again that way?",
)


_WRONG_OPENERS = (
    "Hmm, that's not right.",
    "No, that's wrong.",
    "That's incorrect.",
    "Wait, that is not right.",
)
_WRONG_CLOSERS = ("Can you redo it?", "Could you try again?", "Can you fix that?")
CORRECT_RULE = "correct"


def correctness_rule(answer: str, question: str | None, reference: str | None, *,
                     result_stated: bool = False) -> RuleResult | None:
    """The rule "the result is right" (`envs.grading.correction`: its instruction is the correction a
    person gives, "9 + 2 should be 11, not 12."); None when `reference` is not a number. With
    `result_stated`, an answer that only restates the question ("The answer is 2 - 1.") is not right."""
    found = correction(answer, question, reference, restatement_right=not result_stated)
    return None if found is None else RuleResult(CORRECT_RULE, *found)


def _check_flag(persona: str, value: object, option: str = "correct") -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{persona}: {option} must be true or false, got {value!r}")
    return value


def _check_result_stated(persona: str, result_stated: object, correct: bool) -> bool:
    """`result_stated` (refuse an answer that only restates the question) refines `correct`."""
    stated = _check_flag(persona, result_stated, "result_stated")
    if stated and not correct:
        raise ValueError(f"{persona}: result_stated=true refines the correctness rule; set correct=true as well")
    return stated


PersonaFactory = Callable[..., "Persona"]
PERSONAS: Registry[PersonaFactory] = Registry("persona")


def register_persona(name: str, *, overwrite: bool = False) -> Callable[[PersonaFactory], PersonaFactory]:
    """Decorator: register a `Persona` subclass (or a `factory(**kwargs) -> Persona`) under `name`; a
    subclass gets `name` as its `name` attribute, so the name is written once."""
    def decorate(factory: PersonaFactory) -> PersonaFactory:
        if isinstance(factory, type):
            factory.name = name
        return PERSONAS.register(name, overwrite=overwrite)(factory)

    return decorate


class Persona:
    """A simulated user's stable preference.

    Subclasses implement `rules(answer, question, finish_reason) -> list[RuleResult]`; the base
    class turns them into a verdict and a reaction.
    """

    name: str = "persona"
    description: str = ""
    #: a one-line statement of the preference in the user's own words, used by LLM evaluators
    preference: str = ""
    thanks_phrases: tuple[str, ...] = _THANKS
    complaint_openers: tuple[str, ...] = _COMPLAINT_OPENERS
    retry_closers: tuple[str, ...] = _RETRY_CLOSERS
    #: at most this many instructions per correction, so each correction stays one clear hint
    max_instructions: int = 2

    def rules(self, answer: str, question: str | None, finish_reason: str | None,
              reference: str | None = None) -> list[RuleResult]:
        raise NotImplementedError

    def check(
        self, answer_text: str, question: str | None = None, *, finish_reason: str | None = None,
        reference: str | None = None,
    ) -> PreferenceVerdict:
        """Judge `answer_text`. Deterministic; `question` lets rules refer to the problem's numbers,
        `finish_reason` ("stop" / "length") lets rules ask for a complete answer, `reference` (the
        question's known answer) lets rules ask for a right one."""
        if not isinstance(answer_text, str):
            raise TypeError(f"{self.name}: answer_text must be str, got {type(answer_text).__name__}")
        return PreferenceVerdict.from_rules(self.rules(answer_text, question, finish_reason, reference))

    def react(
        self, question: str | None, answer: str, verdict: PreferenceVerdict, rng: random.Random
    ) -> str:
        """The user's next message after seeing `answer`.

        Satisfied: a thank-you that moves on. Not satisfied: a complaint, the instruction
        sentence(s) that would fix the answer, and a request to redo it.
        """
        del question, answer  # the verdict already holds everything the reaction needs
        if verdict.satisfied:
            return rng.choice(self.thanks_phrases)
        instructions = list(verdict.instructions[: self.max_instructions])
        if not instructions:  # a rule without an instruction still deserves an explicit ask
            instructions = [f"Please fix this: {v}." for v in verdict.violations[: self.max_instructions]]
        if any(r.name == CORRECT_RULE and not r.passed for r in verdict.rules):
            # A person who spots a wrong result says so first, then what the result is (the hint).
            return " ".join([rng.choice(_WRONG_OPENERS), *instructions, rng.choice(_WRONG_CLOSERS)])
        return " ".join([rng.choice(self.complaint_openers), *instructions, rng.choice(self.retry_closers)])

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "preference": self.preference}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# ----------------------------------------------------------------------------- rich personas


@register_persona("student_prose")
class StudentProse(Persona):
    """A student who wants natural prose with every step, and no markdown.

    Rules (score = passed / 4):
      1. no markup: no '#', '*', '__', '~~', backticks/code fences, tables, LaTeX;
      2. no lists: no bullet lines ('-', '+', bullets), numbered lines ('1.', '2)'), 'Step 1:' labels;
      3. prose: at least `min_sentences` sentences of >= 4 words, and every non-empty line ends
         like a sentence (. ! ? :) -- bare equations on their own line are not prose;
      4. every step shown: at least `min_step_sentences` sentences that contain a number, and
         (when the question is known) at least one number that is not in the question, i.e. a
         computed intermediate or final value;
      5. with `correct=True`, right: the final number is the question's known answer (checked first;
         a wrong result draws the correction a person gives, see `Concise`); with `result_stated=True`
         as well, an answer that only restates the question is not right (see `Concise`).
    """

    description = "A student who wants natural prose with every step and no markdown."
    preference = (
        "I am a student. I want the solution explained in natural, plain prose, one sentence per "
        "step, showing every calculation, with no markdown at all: no headings, no bold, no "
        "bullet points, no numbered lists, no code blocks, no LaTeX."
    )

    def __init__(self, min_sentences: int = 2, min_step_sentences: int = 2, correct: bool = False,
                 result_stated: bool = False):
        if min_sentences < 1 or min_step_sentences < 1:
            raise ValueError(
                f"min_sentences and min_step_sentences must be >= 1, got {min_sentences}, {min_step_sentences}"
            )
        self.min_sentences = min_sentences
        self.min_step_sentences = min_step_sentences
        self.correct = _check_flag("student_prose", correct)
        self.result_stated = _check_result_stated("student_prose", result_stated, self.correct)
        if correct:
            self.preference += " And the result must be right" + (", stated as a result." if result_stated else ".")

    def rules(self, answer: str, question: str | None, finish_reason: str | None,
              reference: str | None = None) -> list[RuleResult]:
        markup = [desc for pat, desc in MARKUP_PATTERNS if pat.search(answer)]
        lists = [desc for pat, desc in LIST_PATTERNS if pat.search(answer)]
        sentences = split_sentences(answer)
        long_sentences = [s for s in sentences if word_count(s) >= 4]
        lines = nonempty_lines(answer)
        unterminated = [ln for ln in lines if not TERMINAL_PUNCT_RE.search(ln)]
        is_prose = len(long_sentences) >= self.min_sentences and not unterminated
        step_sentences = [s for s in sentences if extract_numbers(s)]
        computed_ok = True
        if question is not None:
            q_numbers = set(extract_numbers(question))
            computed_ok = any(n not in q_numbers for n in extract_numbers(answer))
        steps_ok = len(step_sentences) >= self.min_step_sentences and computed_ok

        prose_problem = (
            f"has only {len(long_sentences)} full sentence(s)"
            if len(long_sentences) < self.min_sentences
            else f"has {len(unterminated)} line(s) that are not sentences"
        )
        right = (correctness_rule(answer, question, reference, result_stated=self.result_stated)
                 if self.correct else None)
        return ([right] if right is not None else []) + [
            RuleResult(
                "no_markdown",
                not markup,
                "; ".join(markup),
                "Please don't use markdown like headings, bold, asterisks or code; write plain text.",
            ),
            RuleResult(
                "no_lists",
                not lists,
                "; ".join(lists),
                "Please don't use bullet points or numbered lists; write the steps as ordinary sentences.",
            ),
            RuleResult(
                "prose",
                is_prose,
                "" if is_prose else prose_problem,
                "Please write in full sentences, as a paragraph, like you are explaining it to me.",
            ),
            RuleResult(
                "every_step",
                steps_ok,
                "" if steps_ok else "does not show each calculation step",
                "Please show every step of the calculation in its own sentence before giving the answer.",
            ),
        ]


DEFAULT_FRIENDLY_MARKERS: tuple[str, ...] = (
    "great question",
    "good question",
    "happy to help",
    "glad to help",
    "glad you asked",
    "let's",
    "let us",
    "great job",
    "well done",
    "nice work",
    "hope this helps",
    "you've got this",
    "good luck",
    "of course",
    "sure thing",
    "no problem",
    "great",
    "nice",
    "happy",
    "glad",
)


@register_persona("teacher_friendly")
class TeacherFriendly(Persona):
    """A teacher who wants specific, friendly comments.

    Rules (score = floor(passed / 4 * 4) / 4 = passed / 4):
      1. friendly: contains a friendly marker (case-insensitive phrase from `friendly_markers`);
      2. refers to the problem: mentions at least `min_problem_numbers` of the question's numbers
         (all of them when the question has fewer; any numbers when the question is unknown);
      3. specific result: states a number that is not in the question (the computed result);
      4. comments, not fragments: at least two sentences of >= 4 words.
    """

    description = "A teacher who wants specific, friendly comments."
    preference = (
        "I am a teacher. I want friendly, encouraging comments that are specific: they refer to "
        "the actual numbers in the problem and clearly state the computed result, in full sentences."
    )
    thanks_phrases = (
        "Thanks, that's exactly the kind of comment I wanted!",
        "Lovely, thank you. Clear and kind.",
        "Perfect, thanks! My students will like that.",
        "Thank you, that's friendly and to the point.",
        "Great, thanks a lot!",
        "That's just right, thank you.",
    )

    def __init__(self, min_problem_numbers: int = 2, friendly_markers: Sequence[str] = DEFAULT_FRIENDLY_MARKERS):
        if min_problem_numbers < 1:
            raise ValueError(f"min_problem_numbers must be >= 1, got {min_problem_numbers}")
        if not friendly_markers:
            raise ValueError("friendly_markers must not be empty")
        self.min_problem_numbers = min_problem_numbers
        self.friendly_markers = tuple(m.lower() for m in friendly_markers)

    def rules(self, answer: str, question: str | None, finish_reason: str | None,
              reference: str | None = None) -> list[RuleResult]:
        lower = answer.lower()
        friendly = any(re.search(r"(?<![a-z])" + re.escape(m) + r"(?![a-z])", lower) for m in self.friendly_markers)
        answer_numbers = extract_numbers(answer)
        if question is not None:
            q_numbers = list(dict.fromkeys(extract_numbers(question)))
            needed = min(self.min_problem_numbers, len(q_numbers))
            cited = [n for n in q_numbers if n in set(answer_numbers)]
            refers = len(cited) >= needed
            example = " and ".join(q_numbers[:2]) if q_numbers else "the given values"
            specific = any(n not in set(q_numbers) for n in answer_numbers)
        else:
            refers = len(set(answer_numbers)) >= self.min_problem_numbers
            example = "the given values"
            specific = bool(answer_numbers)
        sentences = [s for s in split_sentences(answer) if word_count(s) >= 4]
        return [
            RuleResult(
                "friendly",
                friendly,
                "" if friendly else "is not friendly or encouraging",
                "Please be friendly and encouraging, for example start with 'Great question!'.",
            ),
            RuleResult(
                "refers_to_problem",
                refers,
                "" if refers else "does not refer to the numbers in the problem",
                f"Please refer to the actual numbers in the problem, like {example}, in your explanation.",
            ),
            RuleResult(
                "specific_result",
                specific,
                "" if specific else "does not state a specific computed result",
                "Please be specific and state the final result as a number.",
            ),
            RuleResult(
                "full_comments",
                len(sentences) >= 2,
                "" if len(sentences) >= 2 else "is too terse to be a comment",
                "Please write your comments as at least two full sentences.",
            ),
        ]


# ----------------------------------------------------------------------------- simple personas
# These are what a tiny random model can learn within a few dozen training steps: each is a
# single, local property of the text that a policy gradient can find.


@register_persona("starts_with")
class StartsWith(Persona):
    """The answer must begin with `prefix` (after leading whitespace)."""

    description = "A user who wants every answer to begin with a given phrase."

    def __init__(self, prefix: str = "Sure", case_sensitive: bool = True):
        if not prefix.strip():
            raise ValueError("starts_with: prefix must be a non-empty phrase")
        self.prefix = prefix
        self.case_sensitive = case_sensitive
        self.preference = f'I want every answer to begin with "{prefix}".'

    def rules(self, answer: str, question: str | None, finish_reason: str | None,
              reference: str | None = None) -> list[RuleResult]:
        text = answer.lstrip()
        ok = text.startswith(self.prefix) if self.case_sensitive else text.lower().startswith(self.prefix.lower())
        return [
            RuleResult(
                "starts_with",
                ok,
                "" if ok else f'does not begin with "{self.prefix}"',
                f'Please begin your answer with "{self.prefix}".',
            )
        ]


@register_persona("concise")
class Concise(Persona):
    """The answer must be at most `max_chars` characters and complete (finished with EOS); with
    `correct=True` it must also be right.

    Completeness is read from `finish_reason`: "length" means the model was cut off by the token
    limit instead of ending the answer itself; when the finish reason is unknown that rule is
    not applied. Correctness (`correct=True`) is the final number the answer states against the
    question's known answer (`reference`, see `envs.grading`); without a numeric reference that
    rule is not applied.

    The last-number rule grades "The answer is 2 - 1." right for "What is 2 - 1?" (its last number is
    the result); a person does not. `result_stated=True` (with `correct=True`) refuses such an answer,
    right only by restating the question (`envs.grading.right_by_restatement`), with "2 - 1 should be 1,
    not 2 - 1.".

    A wrong answer draws a correction the way a person gives one: "No, that's wrong. The answer
    should be 10, not 12." -- the second sentence is the instruction (the judge's hint), and it
    carries the right result. A long or cut-off one draws the brevity instruction.
    """

    description = "A user who wants short, complete answers."

    def __init__(self, max_chars: int = 40, correct: bool = False, result_stated: bool = False):
        if max_chars < 1:
            raise ValueError(f"concise: max_chars must be >= 1, got {max_chars}")
        self.max_chars = max_chars
        self.correct = _check_flag("concise", correct)
        self.result_stated = _check_result_stated("concise", result_stated, self.correct)
        if correct:
            self.description = "A user who wants short, complete and right answers."
            result = "the correct result, stated, not the question repeated," if result_stated else "the correct result,"
            self.preference = (f"I want short answers that are right: {result} in at most {max_chars} "
                               "characters, finished, not cut off.")
        else:
            self.preference = f"I want short answers: at most {max_chars} characters, and finished, not cut off."

    def rules(self, answer: str, question: str | None, finish_reason: str | None,
              reference: str | None = None) -> list[RuleResult]:
        right = (correctness_rule(answer, question, reference, result_stated=self.result_stated)
                 if self.correct else None)
        results = [right] if right is not None else []
        length = len(answer.strip())
        results.append(
            RuleResult(
                "short",
                length <= self.max_chars,
                "" if length <= self.max_chars else f"is {length} characters long (limit {self.max_chars})",
                f"Please keep your answer under {self.max_chars} characters.",
            )
        )
        if finish_reason is not None:
            finished = finish_reason != "length"
            results.append(
                RuleResult(
                    "finished",
                    finished,
                    "" if finished else "was cut off instead of ending",
                    "Please stop as soon as you have answered, so the reply ends instead of being cut off.",
                )
            )
        return results


@register_persona("keyword")
class Keyword(Persona):
    """The answer must contain `word` (case-insensitive; as a whole word when `whole_word`)."""

    description = "A user who wants a given word in every answer."

    def __init__(self, word: str = "answer", whole_word: bool = True):
        if not word.strip():
            raise ValueError("keyword: word must be non-empty")
        self.word = word
        self.whole_word = whole_word
        self.preference = f'I want the word "{word}" in every answer.'
        pattern = re.escape(word.lower())
        self._pattern = re.compile(r"(?<!\w)" + pattern + r"(?!\w)" if whole_word else pattern)

    def rules(self, answer: str, question: str | None, finish_reason: str | None,
              reference: str | None = None) -> list[RuleResult]:
        ok = bool(self._pattern.search(answer.lower()))
        return [
            RuleResult(
                "keyword",
                ok,
                "" if ok else f'does not contain the word "{self.word}"',
                f'Please use the word "{self.word}" in your answer.',
            )
        ]


# ----------------------------------------------------------------------------- lookup


def persona_names() -> list[str]:
    return list(PERSONAS.names())


def make_persona(name: str, **kwargs: Any) -> Persona:
    """Build the persona registered under `name` with keyword options (e.g. prefix="Sure")."""
    factory = PERSONAS.get(name)
    try:
        return factory(**kwargs)
    except TypeError as e:
        raise TypeError(f"bad options {kwargs!r} for persona {name!r}: {e}") from None


def _parse_option_value(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def persona_from_spec(spec: str) -> Persona:
    """Build a persona from a CLI spec: "name" or "name:key=value,key=value" (e.g. "starts_with:prefix=Sure")."""
    name, _, opts = spec.partition(":")
    kwargs: dict[str, Any] = {}
    if opts:
        for item in opts.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"bad persona option {item!r} in {spec!r}; expected key=value")
            kwargs[key.strip()] = _parse_option_value(value)
    return make_persona(name.strip(), **kwargs)

