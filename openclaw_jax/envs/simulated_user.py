"""Simulated users: drive live conversations through an OpenAI-compatible gateway.

A `SimulatedUser` plays a `Persona` against the gateway with the official `openai` client,
exactly as a real agent would, and sends the session headers of docs/design.md §9:

    X-Session-Id: <id>      one id per conversation
    X-Turn-Type: main       every request of a training conversation
    X-Session-Done: 1       on the last request of the conversation

One session:
    user asks a question -> assistant answers -> user reacts (the persona's thanks or
    correction is the *next state* of that turn, sent as the last user message of the next main
    request) -> the assistant answers again (a retry after a correction, or the next question)
    -> ... -> a closing request that carries the final reaction and `X-Session-Done: 1`.

The closing request exists so that the last answer also gets a next state (turns without one
are dropped at session end); its own reply is not needed, so it asks for `close_max_tokens`
tokens only.

`preference_score` measures the persona's preference on held-out questions: greedy first
answers (temperature 0) sent as side turns (`X-Turn-Type: side`, never trained on), the score
being the fraction the persona is satisfied with. It is deterministic for a deterministic server.

Everything is bounded: a session makes at most `turns_per_session` answering requests plus one
closing request; failures end the session and are counted, never retried forever.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import uuid
from typing import Any, Iterable, Iterator, Sequence

from openclaw_jax.envs.grading import accuracy, is_correct
from openclaw_jax.envs.personas import Persona, PreferenceVerdict
from openclaw_jax.envs.questions import Question

log = logging.getLogger(__name__)

SESSION_ID_HEADER = "X-Session-Id"
TURN_TYPE_HEADER = "X-Turn-Type"
SESSION_DONE_HEADER = "X-Session-Done"
PERSON_ID_HEADER = "X-Person-Id"

# The same tags as the benchmark CLI (`python -m openclaw_jax.eval`): the mean rubric grade of
# first answers, and the fraction of first answers that fully satisfy the persona.
METRIC_PREFERENCE_SCORE = "eval/preference_score"
METRIC_SATISFIED_FRACTION = "eval/satisfied_fraction"
# Fraction of first answers whose final number is the question's known answer (envs.grading).
METRIC_ACCURACY = "eval/accuracy"
METRIC_PREFIX_SIMUSER = "simuser/"


def session_headers(session_id: str, *, turn_type: str = "main", done: bool = False) -> dict[str, str]:
    """Headers of docs/design.md §9 for one request."""
    if turn_type not in ("main", "side"):
        raise ValueError(f"turn_type must be 'main' or 'side', got {turn_type!r}")
    headers = {SESSION_ID_HEADER: session_id, TURN_TYPE_HEADER: turn_type}
    if done:
        headers[SESSION_DONE_HEADER] = "1"
    return headers


def make_client(base_url: str, *, api_key: str | None = None, timeout_s: float = 300.0, max_retries: int = 2,
                person_id: str = ""):
    """An `openai.AsyncOpenAI` for a server root ("http://127.0.0.1:8000") or its "/v1" URL; with
    `person_id`, every request names that person (`X-Person-Id`, docs/household.md)."""
    import openai  # a slow import (pydantic models), needed only once a client is made

    url = base_url.rstrip("/")
    if not url.endswith("/v1"):
        url += "/v1"
    headers = {PERSON_ID_HEADER: person_id} if person_id else None
    # The official client insists on a key; local servers without auth ignore the placeholder.
    return openai.AsyncOpenAI(base_url=url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=max_retries,
                              default_headers=headers)


async def resolve_model(client: Any, model: str | None) -> str:
    """`model`, or the first model the server lists when None."""
    if model:
        return model
    page = await client.models.list()
    models = [m.id for m in page.data]
    if not models:
        raise RuntimeError(f"the server at {client.base_url} lists no models; pass model= explicitly")
    return models[0]


@dataclasses.dataclass(frozen=True)
class ChatReply:
    text: str
    finish_reason: str | None
    completion_tokens: int | None


async def chat(
    client: Any,
    *,
    model: str,
    messages: Sequence[dict[str, str]],
    headers: dict[str, str],
    max_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int | None = None,
    user: str | None = None,
) -> ChatReply:
    """One non-streaming chat completion; the reply's text, finish reason and token count.

    `user` is OpenAI's end-user field; an agent that keeps the history (OpenClaw's own gateway)
    names its session by it.
    """
    kwargs: dict[str, Any] = {}
    if seed is not None:
        kwargs["seed"] = seed
    if user is not None:
        kwargs["user"] = user
    resp = await client.chat.completions.create(
        model=model,
        messages=list(messages),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        extra_headers=headers,
        **kwargs,
    )
    if not resp.choices:
        raise RuntimeError(f"chat completion returned no choices (id={resp.id!r})")
    choice = resp.choices[0]
    usage = getattr(resp, "usage", None)
    return ChatReply(
        text=choice.message.content or "",
        finish_reason=choice.finish_reason,
        completion_tokens=getattr(usage, "completion_tokens", None),
    )


# ----------------------------------------------------------------------------- records and stats


@dataclasses.dataclass(frozen=True)
class RatedAnswer:
    """One assistant answer inside a session and how the persona took it."""

    session_id: str
    turn_index: int  # position of this answer in the session (0-based)
    question_id: str
    attempt: int  # 0 = first answer to this question, 1 = first retry, ...
    answer: str
    finish_reason: str | None
    score: float
    satisfied: bool
    reaction: str
    correct: bool | None = None  # final number == the question's answer (None: not gradable)


@dataclasses.dataclass
class SessionResult:
    session_id: str
    index: int
    turns: list[RatedAnswer] = dataclasses.field(default_factory=list)
    requests: int = 0  # answering requests plus the closing request
    closed: bool = False  # the request with X-Session-Done was sent and answered
    error: str | None = None


@dataclasses.dataclass
class UserStats:
    """Running totals over sessions; `first_answer_satisfaction` is the headline number."""

    sessions: int = 0
    failed_sessions: int = 0
    requests: int = 0
    turns: int = 0
    satisfied_turns: int = 0
    first_answers: int = 0
    first_answers_satisfied: int = 0
    first_answer_score_sum: float = 0.0
    first_answers_graded: int = 0
    first_answers_correct: int = 0

    def add(self, result: SessionResult) -> None:
        self.sessions += 1
        self.failed_sessions += result.error is not None
        self.requests += result.requests
        for t in result.turns:
            self.turns += 1
            self.satisfied_turns += t.satisfied
            if t.attempt == 0:
                self.first_answers += 1
                self.first_answers_satisfied += t.satisfied
                self.first_answer_score_sum += t.score
                if t.correct is not None:
                    self.first_answers_graded += 1
                    self.first_answers_correct += t.correct

    @property
    def first_answer_satisfaction(self) -> float:
        """Fraction of first answers (to a question) that satisfied the persona; NaN before any."""
        return self.first_answers_satisfied / self.first_answers if self.first_answers else float("nan")

    @property
    def mean_first_answer_score(self) -> float:
        return self.first_answer_score_sum / self.first_answers if self.first_answers else float("nan")

    def metrics(self) -> dict[str, float]:
        return {
            "first_answer_satisfaction": self.first_answer_satisfaction,
            "first_answer_score": self.mean_first_answer_score,
            "first_answer_accuracy": (self.first_answers_correct / self.first_answers_graded
                                      if self.first_answers_graded else float("nan")),
            "turn_satisfaction": self.satisfied_turns / self.turns if self.turns else float("nan"),
            "sessions": float(self.sessions),
            "failed_sessions": float(self.failed_sessions),
            "requests": float(self.requests),
        }


def log_scalars(writer: Any, step: int, values: dict[str, float], prefix: str = "") -> None:
    """Write scalars to a tensorboardX `SummaryWriter` (add_scalar) or the trainer's `MetricsWriter`."""
    if writer is None:
        return
    if hasattr(writer, "scalars"):
        writer.scalars(step, values, prefix=prefix)
        return
    for name, value in values.items():
        if value == value:  # skip NaN (nothing measured yet)
            writer.add_scalar(f"{prefix}{name}", float(value), step)


# ----------------------------------------------------------------------------- the simulated user


@dataclasses.dataclass(frozen=True)
class SimulatedUserConfig:
    """How a simulated user converses.

    turns_per_session: at most this many assistant answers per session (retries included).
    max_attempts_per_question: answers to one question before moving on (1 = never ask to redo).
    questions_per_session: questions asked in one session; after the last, the session closes.
        With more than one, the next question follows the reaction in the same user message; a
        judge then sees the new question as part of the next state (a rule judge may take
        instruction-like sentences of the question as hints), so 1 is the default.
    concurrency: sessions in flight at once (several users in parallel).
    close_max_tokens: token budget of the closing request (its reply is thrown away).
    """

    turns_per_session: int = 3
    max_attempts_per_question: int = 2
    questions_per_session: int = 1
    concurrency: int = 2
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    system_prompt: str | None = None
    model: str | None = None
    close_max_tokens: int = 1
    # End each session through the gateway's `POST /v1/sessions/{id}/done` with the conversation (the final
    # reaction scores the last answer there) instead of a closing chat request: no prefill of the whole
    # conversation for a reply nobody reads. Only our gateway has the endpoint.
    close_by_endpoint: bool = False
    send_seed: bool = True  # pass a per-request `seed` so seeded servers are reproducible
    next_question_intro: str = "Next question:"
    timeout_s: float = 300.0
    person_id: str = ""  # who this user is to the gateway (X-Person-Id on every request); "" names nobody
    # The server is an agent that keeps each conversation itself (OpenClaw's gateway, whose
    # OpenAI endpoint continues the session named by the request's `user`): every request
    # sends only the person's newest message, and the agent (with our OpenClaw plugin) tags its
    # own model requests with the session headers, so none are sent here.
    agent_keeps_history: bool = False

    def __post_init__(self) -> None:
        for name in ("turns_per_session", "max_attempts_per_question", "questions_per_session",
                     "concurrency", "max_tokens", "close_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"SimulatedUserConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"SimulatedUserConfig.temperature must be >= 0, got {self.temperature}")
        if self.agent_keeps_history and self.close_by_endpoint:
            raise ValueError("SimulatedUserConfig.close_by_endpoint needs our gateway's session ids; an agent that "
                             "keeps the history (agent_keeps_history=True) names and ends its own sessions")
        if self.agent_keeps_history and self.system_prompt:
            raise ValueError("SimulatedUserConfig.system_prompt cannot be sent to an agent that keeps the history "
                             "(agent_keeps_history=True): the agent writes its own system prompt")


class SimulatedUser:
    """A persona that converses with a gateway; call `await run(num_sessions)`.

    `questions` is any iterable of `Question` (e.g. `questions.train_questions("gsm", seed)`);
    it is consumed in session order, so a run is reproducible for a fixed seed and a
    deterministic server. `client` is an `openai.AsyncOpenAI` (or pass `base_url`).
    """

    def __init__(
        self,
        persona: Persona,
        questions: Iterable[Question],
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        config: SimulatedUserConfig = SimulatedUserConfig(),
        session_prefix: str | None = None,
    ):
        if (client is None) == (base_url is None):
            raise ValueError("SimulatedUser needs exactly one of client= or base_url=")
        self.persona = persona
        self.config = config
        self._own_client = client is None
        # An agent run is not idempotent (a retry is a second run beside the first): no retries there.
        self.client = client if client is not None else make_client(
            base_url, api_key=api_key, timeout_s=config.timeout_s, max_retries=0 if config.agent_keeps_history else 2,
            person_id=config.person_id)
        self._questions: Iterator[Question] = iter(questions)
        # A random tag keeps session ids unique across runs against the same gateway.
        self.session_prefix = session_prefix or f"sim-{persona.name}-{uuid.uuid4().hex[:8]}"
        self.stats = UserStats()
        self.results: list[SessionResult] = []
        self._next_index = 0
        self._model: str | None = config.model

    async def close(self) -> None:
        if self._own_client:
            await self.client.close()

    async def __aenter__(self) -> "SimulatedUser":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # ---------------------------------------------------------------- running

    async def run(self, num_sessions: int, *, writer: Any = None, step: int | None = None) -> UserStats:
        """Run `num_sessions` sessions (at most `config.concurrency` at once).

        Returns the stats of these sessions (`self.stats` keeps the running totals); logs them,
        and writes them under "simuser/" to `writer` at `step` when given.
        """
        if num_sessions < 0:
            raise ValueError(f"num_sessions must be >= 0, got {num_sessions}")
        self._model = await resolve_model(self.client, self._model)
        # Questions are drawn up front, in session order, so concurrency cannot reorder them.
        plans = []
        for _ in range(num_sessions):
            qs = [q for _, q in zip(range(self.config.questions_per_session), self._questions)]
            if not qs:
                log.warning("question source exhausted after %d sessions", len(plans))
                break
            plans.append((self._next_index, qs))
            self._next_index += 1
        sem = asyncio.Semaphore(self.config.concurrency)

        async def bounded(index: int, qs: list[Question]) -> SessionResult:
            async with sem:
                return await self.run_session(index, qs)

        results = await asyncio.gather(*(bounded(i, qs) for i, qs in plans))
        batch = UserStats()
        for r in results:
            batch.add(r)
            self.stats.add(r)
        self.results.extend(results)
        log.info(
            "simulated user %s: %d sessions (%d failed), %d first answers, satisfaction %.3f, score %.3f",
            self.persona.name, batch.sessions, batch.failed_sessions, batch.first_answers,
            batch.first_answer_satisfaction, batch.mean_first_answer_score,
        )
        if writer is not None:
            log_scalars(writer, self.stats.sessions if step is None else step, batch.metrics(), METRIC_PREFIX_SIMUSER)
        return batch

    def _request_seed(self, index: int, request: int) -> int | None:
        if not self.config.send_seed:
            return None
        # A stable 31-bit seed per (user seed, session, request).
        return random.Random(f"{self.config.seed}:{index}:{request}").getrandbits(31)

    async def run_session(self, index: int, questions: Sequence[Question]) -> SessionResult:
        """One bounded conversation about `questions`; never raises for server errors."""
        cfg = self.config
        session_id = f"{self.session_prefix}-{index}"
        result = SessionResult(session_id=session_id, index=index)
        rng = random.Random(f"{cfg.seed}:{self.persona.name}:{index}")
        model = self._model or await resolve_model(self.client, cfg.model)
        messages: list[dict[str, str]] = []
        if cfg.system_prompt:
            messages.append({"role": "system", "content": cfg.system_prompt})
        messages.append({"role": "user", "content": questions[0].text})

        async def send(done: bool, max_tokens: int) -> ChatReply:
            if cfg.agent_keeps_history:
                sent, headers, user = messages[-1:], {}, session_id
            else:
                sent, headers, user = messages, session_headers(session_id, turn_type="main", done=done), None
            reply = await chat(
                self.client, model=model, messages=sent, headers=headers,
                max_tokens=max_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                seed=self._request_seed(index, result.requests), user=user,
            )
            result.requests += 1
            return reply

        try:
            q_pos, attempt = 0, 0
            while True:
                question = questions[q_pos]
                reply = await send(False, cfg.max_tokens)
                verdict: PreferenceVerdict = self.persona.check(reply.text, question.text, finish_reason=reply.finish_reason,
                                                                reference=question.answer)
                reaction = self.persona.react(question.text, reply.text, verdict, rng)
                result.turns.append(RatedAnswer(
                    session_id, len(result.turns), question.id, attempt, reply.text,
                    reply.finish_reason, verdict.score, verdict.satisfied, reaction,
                    is_correct(reply.text, question.answer),
                ))
                messages.append({"role": "assistant", "content": reply.text})
                out_of_turns = len(result.turns) >= cfg.turns_per_session
                move_on = verdict.satisfied or attempt + 1 >= cfg.max_attempts_per_question
                if out_of_turns or (move_on and q_pos + 1 >= len(questions)):
                    # The final reaction is the last answer's next state; this request ends the session.
                    messages.append({"role": "user", "content": reaction})
                    if cfg.close_by_endpoint:
                        await self._close_by_endpoint(session_id, messages)
                    else:
                        await send(True, cfg.close_max_tokens)
                    result.closed = True
                    break
                if move_on:
                    q_pos, attempt = q_pos + 1, 0
                    content = f"{reaction} {cfg.next_question_intro} {questions[q_pos].text}"
                else:
                    attempt += 1
                    content = reaction
                messages.append({"role": "user", "content": content})
        except Exception as e:  # noqa: BLE001 - a failed session is recorded, the run goes on
            result.error = f"{type(e).__name__}: {e}"
            log.warning("session %s failed after %d requests: %s", session_id, result.requests, result.error)
        return result

    async def _close_by_endpoint(self, session_id: str, messages: list[dict[str, str]]) -> None:
        """`POST /v1/sessions/{id}/done` with the conversation: the gateway scores the last answer with
        the final reaction and ends the session, without generating."""
        answer = await self.client.post(f"/sessions/{session_id}/done", cast_to=object,
                                        body={"reason": "closed", "messages": messages})
        if not isinstance(answer, dict) or not answer.get("ended"):
            raise RuntimeError(f"the gateway did not end session {session_id}: {str(answer)[:200]}")


# ----------------------------------------------------------------------------- preference score


@dataclasses.dataclass(frozen=True)
class FirstAnswer:
    question: Question
    text: str
    finish_reason: str | None
    completion_tokens: int | None


async def collect_first_answers(
    client: Any,
    questions: Sequence[Question],
    *,
    model: str | None = None,
    max_tokens: int = 256,
    system_prompt: str | None = None,
    concurrency: int = 4,
    session_prefix: str = "heldout",
    agent_keeps_history: bool = False,
) -> list[FirstAnswer]:
    """Greedy (temperature 0) first answers to `questions`, in order, as side turns (never trained).

    Each question is its own one-request session, marked done so the gateway can forget it. With
    `agent_keeps_history` (OpenClaw's gateway) the session is named by the request's `user` and
    the agent tags its own requests: its plugin must count sessions named `session_prefix...` as
    side (`sideSessionPrefixes`), and the gateway ends them on its idle timeout.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    model = await resolve_model(client, model)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, q: Question) -> FirstAnswer:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": q.text}
        ]
        session_id = f"{session_prefix}-{i}"
        async with sem:
            reply = await chat(
                client, model=model, messages=messages,
                headers={} if agent_keeps_history else session_headers(session_id, turn_type="side", done=True),
                max_tokens=max_tokens, temperature=0.0, user=session_id if agent_keeps_history else None,
            )
        return FirstAnswer(q, reply.text, reply.finish_reason, reply.completion_tokens)

    return list(await asyncio.gather(*(one(i, q) for i, q in enumerate(questions))))


@dataclasses.dataclass(frozen=True)
class PreferenceScore:
    """`score` = fraction of first answers that satisfy the persona; `mean_score` = mean rubric score;
    `accuracy` = fraction of first answers whose final number is the question's answer (NaN when no
    question has a numeric answer), `correct` per answer (None: not gradable)."""

    persona: str
    score: float
    mean_score: float
    answers: tuple[FirstAnswer, ...]
    verdicts: tuple[PreferenceVerdict, ...]
    correct: tuple[bool | None, ...] = ()
    accuracy: float = float("nan")

    @property
    def n(self) -> int:
        return len(self.answers)


def score_first_answers(persona: Persona, answers: Sequence[FirstAnswer]) -> PreferenceScore:
    """Pure: the persona's verdicts on collected answers."""
    if not answers:
        raise ValueError("no answers to score; pass at least one held-out question")
    verdicts = tuple(persona.check(a.text, a.question.text, finish_reason=a.finish_reason, reference=a.question.answer)
                     for a in answers)
    correct = tuple(is_correct(a.text, a.question.answer) for a in answers)
    return PreferenceScore(
        persona=persona.name,
        score=sum(v.satisfied for v in verdicts) / len(verdicts),
        mean_score=sum(v.score for v in verdicts) / len(verdicts),
        answers=tuple(answers),
        verdicts=verdicts,
        correct=correct,
        accuracy=accuracy(correct),
    )


async def preference_score(
    client_or_base_url: Any,
    persona: Persona,
    heldout_questions: Sequence[Question],
    *,
    api_key: str | None = None,
    writer: Any = None,
    step: int | None = None,
    timeout_s: float = 300.0,
    person_id: str = "",
    **answer_options: Any,
) -> PreferenceScore:
    """Fraction of greedy first answers on `heldout_questions` that satisfy `persona`.

    `answer_options` are `collect_first_answers`'s keywords (model, max_tokens, system_prompt,
    concurrency, session_prefix), with its defaults; the session prefix defaults to a fresh
    `pref-<persona>-<id>`. `person_id` (with a URL) names whose answers these are (their adapter
    serves them). Uses side turns, so measuring never feeds the trainer. When `writer`
    and `step` are given,
    writes `eval/satisfied_fraction` (= `.score`, the fraction satisfied),
    `eval/preference_score` (= `.mean_score`, the mean rubric grade, as the benchmark CLI does) and
    `eval/accuracy` (= `.accuracy`, NaN -- not written -- when no question has a numeric answer).
    """
    own = isinstance(client_or_base_url, str)
    agent = answer_options.get("agent_keeps_history", False)
    client = (make_client(client_or_base_url, api_key=api_key, timeout_s=timeout_s, max_retries=0 if agent else 2,
                          person_id=person_id) if own else client_or_base_url)
    try:
        answer_options.setdefault("session_prefix", f"pref-{persona.name}-{uuid.uuid4().hex[:8]}")
        answers = await collect_first_answers(client, heldout_questions, **answer_options)
    finally:
        if own:
            await client.close()
    result = score_first_answers(persona, answers)
    log.info("preference score %s on %d held-out questions: %.3f (mean rubric %.3f), accuracy %.3f",
             persona.name, result.n, result.score, result.mean_score, result.accuracy)
    if writer is not None and step is not None:
        log_scalars(writer, step, {METRIC_SATISFIED_FRACTION: result.score, METRIC_PREFERENCE_SCORE: result.mean_score,
                                   METRIC_ACCURACY: result.accuracy})
    return result
