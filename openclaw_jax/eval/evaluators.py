"""Evaluators of the personalisation benchmark: grade one first answer for one persona.

* `RuleEvaluator`: the persona's own deterministic check (offline, no model).
* `JudgeEvaluator`: an LLM judge asked, with our rubric prompt, for a grade in
  {0, 0.25, 0.5, 0.75, 1}; `votes` samples averaged (invalid votes ignored). It talks to any
  OpenAI-compatible endpoint (an SGLang worker or router, or our embedded server) through a
  `complete(messages, seed) -> text | None` function, so tests and the trainer can plug in
  their own transport; `openai_complete_fn` builds one over one or more judge URLs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from typing import Any, Awaitable, Callable, Protocol, Sequence

from openclaw_jax.envs.grading import is_correct
from openclaw_jax.envs.personas import Persona
from openclaw_jax.envs.simulated_user import FirstAnswer, make_client, resolve_model
from openclaw_jax.eval.scoring import ItemScore, average_votes, parse_rubric_score, rubric_messages

log = logging.getLogger(__name__)

CompleteFn = Callable[[list[dict[str, str]], int], Awaitable[str | None]]


class Evaluator(Protocol):
    kind: str

    def describe(self) -> dict[str, Any]: ...

    async def grade(self, persona: Persona, answer: FirstAnswer) -> ItemScore: ...


def _rule_fields(persona: Persona, answer: FirstAnswer) -> dict[str, Any]:
    verdict = persona.check(answer.text, answer.question.text, finish_reason=answer.finish_reason,
                            reference=answer.question.answer)
    return {
        "question_id": answer.question.id,
        "question": answer.question.text,
        "answer": answer.text,
        "finish_reason": answer.finish_reason,
        "rule_score": verdict.score,
        "satisfied": verdict.satisfied,
        "violations": tuple(verdict.violations),
        "correct": is_correct(answer.text, answer.question.answer),
    }


class RuleEvaluator:
    """Grade = the persona's own check score."""

    kind = "rule"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}

    async def grade(self, persona: Persona, answer: FirstAnswer) -> ItemScore:
        fields = _rule_fields(persona, answer)
        return ItemScore(score=fields["rule_score"], votes=(fields["rule_score"],), **fields)


class JudgeEvaluator:
    """Grade = mean of `votes` LLM-judge grades (parsed from the last `\\boxed{}`).

    Vote i of question q uses the sampling seed derived from (seed, q.id, i), so a judge server
    that honours seeds gives the same grades on a re-run.
    """

    kind = "judge"

    def __init__(self, complete: CompleteFn, *, votes: int = 3, seed: int = 0, description: dict[str, Any] | None = None):
        if votes < 1:
            raise ValueError(f"votes must be >= 1, got {votes}")
        self.complete = complete
        self.votes = votes
        self.seed = seed
        self._description = description or {}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "votes": self.votes, **self._description}

    def vote_seed(self, question_id: str, vote: int) -> int:
        return random.Random(f"judge:{self.seed}:{question_id}:{vote}").getrandbits(31)

    async def grade(self, persona: Persona, answer: FirstAnswer) -> ItemScore:
        messages = rubric_messages(persona, answer.question.text, answer.text)

        async def one(i: int) -> float | None:
            try:
                return parse_rubric_score(await self.complete(messages, self.vote_seed(answer.question.id, i)))
            except Exception as e:  # noqa: BLE001 - a failed judge call is no vote, like the gateway judge
                log.warning("judge vote %d on %s failed: %s: %s", i, answer.question.id, type(e).__name__, e)
                return None

        votes = tuple(await asyncio.gather(*(one(i) for i in range(self.votes))))
        return ItemScore(score=average_votes(votes), votes=votes, **_rule_fields(persona, answer))


def openai_complete_fn(
    urls: Sequence[str],
    *,
    model: str | None = None,
    temperature: float = 0.7,
    max_tokens: int = 512,
    api_key: str | None = None,
    concurrency: int = 8,
) -> tuple[CompleteFn, Callable[[], Awaitable[None]]]:
    """A `complete` over one or more OpenAI-compatible judge servers (round-robin) and its closer.

    Returns (complete, aclose). The model name is asked from each server's /v1/models once when
    not given.
    """
    if not urls:
        raise ValueError("the LLM judge needs at least one --judge-url")
    clients = [make_client(u, api_key=api_key) for u in urls]
    models: dict[int, str] = {}
    turn = itertools.cycle(range(len(clients)))
    sem = asyncio.Semaphore(concurrency)

    async def complete(messages: list[dict[str, str]], seed: int) -> str | None:
        i = next(turn)
        if i not in models:
            models[i] = await resolve_model(clients[i], model)
        async with sem:
            resp = await clients[i].chat.completions.create(
                model=models[i], messages=messages, max_tokens=max_tokens, temperature=temperature, seed=seed,
            )
        return resp.choices[0].message.content if resp.choices else None

    async def aclose() -> None:
        for c in clients:
            await c.close()

    return complete, aclose
