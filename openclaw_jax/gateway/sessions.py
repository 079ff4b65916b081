"""Session and turn bookkeeping: which main turn gets which next state (docs/design.md §9 and §14).

Rules:
* Only **main** turns train. Main turns of a session are numbered 0, 1, 2, ... in the
  order their requests *arrive*. Side requests (``X-Turn-Type: side`` or none: OpenClaw's
  heartbeat, memory, cron runs) never open a turn, never give a next state and never train,
  even when they carry the session's id.
* The **next state** of main turn k comes from main request k+1 of the same session:
  - it ends with role ``user`` messages: the person's own words in them (`person_words`: OpenClaw's
    timestamp prefix, ``Runtime:`` line and injected context removed). All the trailing user
    messages count (those after the last non-user message: OpenClaw's default profile sends its
    runtime context as a user message of its own after the person's), their words joined by a
    blank line; the texts as sent, joined the same way, are kept in ``NextState.raw``;
    A trailing user message with no words of the person at all (OpenClaw's runtime-context
    message, which it may also append after tool results) does not hide what comes before it:
    tool results before it are still the next state;
  - it ends with role ``tool`` messages: the tool results of turn k's calls. All the trailing
    tool messages (those after the last non-tool message: OpenClaw sends one per call, in call
    order) form the next state together: one result as it is; several as
    ``[result i of n: <tool name>]`` sections joined by a blank line, and the names joined by
    ", ". A tool's name is the message's ``name`` or, as OpenClaw sends none, the name of the
    call with that ``tool_call_id`` in the conversation.
  - any other last role: turn k has no next state and is dropped.
* A turn is ready to be judged when both are known: its own response (the turn
  completed) and its next state (request k+1 arrived). They can happen in either order
  when a client pipelines requests; both orders pair the same way.
* A turn whose generation failed (pool error, client gone) is forgotten; its next state,
  if one arrives, is ignored.
* **Session end** (``X-Session-Done`` on a request, ``POST /v1/sessions/{id}/done``, the idle
  timeout, or too many sessions): completed turns still waiting for a next state are dropped
  (unscored: nothing followed them, so there is nothing to judge them by); turns in flight
  that already have their next state are still judged when they complete; other in-flight
  turns are dropped when they complete. A later request with the same session id starts a
  fresh session.
* **Idle timeout** (``gateway.session_idle_timeout_s``): a session with no turn in flight and no
  request for longer than the timeout is ended as above, so its **last turn is dropped** (it
  has no next state), and the session's memory (its turn records, prompt ids included) is
  freed. A session with a turn in flight is not idle.
* **Owners**: a session belongs to the person who opened it (gateway/auth.py). Sessions are kept
  per person: the same session id sent by another person is another session, so nobody can
  continue, supply the next state of, or end someone else's. A person holds at most
  ``max_sessions_per_person`` sessions; beyond it, or when the whole table is full, a new session
  ends that person's own least recently active idle session, never another person's (and is
  refused with :class:`SessionLimitError` when all of theirs have a turn in flight).
* **Memory**: an idle session holds its last completed turn (prompt ids as 4-byte integers, the
  messages they were rendered from, references to its images, which wait on disk) and nothing
  else; a next state is cut to ``max_next_state_chars`` (its head and tail) when it is made.

Everything here is synchronous and in-memory (the gateway calls it from its event loop,
one thread); pending turns do not survive a gateway restart. A completed turn that is dropped
unscored is handed to ``on_drop`` (the gateway releases its spooled images there).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from openclaw_jax.counters import counters
from openclaw_jax.gateway.judge import NextState
from openclaw_jax.gateway.openclaw_text import person_words
from openclaw_jax.samples.person import DEFAULT_PERSON

DEFAULT_MAX_NEXT_STATE_CHARS = 32768
_UNSET: Any = object()


class SessionLimitError(Exception):
    """A person cannot open another session now: every one they hold has a turn in flight."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnRecord:
    """One completed main turn, as the policy server produced it (exact tokens)."""

    session_id: str
    turn_index: int
    prompt_messages: list[dict[str, Any]]   # normalised messages the prompt was rendered from
    tools: list[dict[str, Any]] | None
    chat_template_kwargs: dict[str, Any]
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    response_text: str
    weight_version: str | None
    temperature: float
    finish_reason: str
    created_at: float = field(default_factory=time.time)
    top_p: float = 1.0
    top_k: int = -1
    last_weight_version: str | None = None  # differs from weight_version when weights changed mid-response
    images: tuple[Any, ...] = ()   # the prompt's images, in order (the gateway's `image_spool.SpooledImage`s)
    person: str = DEFAULT_PERSON   # who opened the session (gateway/auth.py)
    adapter: str | None = None        # the LoRA adapter that served it (a person id); None: the base model
    adapter_steps: int | None = None  # that adapter's optimizer steps when the turn began


@dataclass(frozen=True)
class ScoringJob:
    """A turn and its next state: ready for the judge."""

    turn: TurnRecord
    next_state: NextState


def _tool_names_by_call_id(messages: Sequence[dict[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for msg in messages:
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(call.get("id"), str) and isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names[call["id"]] = fn["name"]
    return names


def _tool_results_state(messages: Sequence[dict[str, Any]]) -> NextState:
    """The trailing run of tool messages as one next state (see the module docstring)."""
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    by_id = _tool_names_by_call_id(messages[:start])
    results = []
    for msg in messages[start:]:
        name = msg.get("name") if isinstance(msg.get("name"), str) else by_id.get(msg.get("tool_call_id"))
        content = msg.get("content")
        results.append((name, content if isinstance(content, str) else ""))
    if len(results) == 1:
        return NextState(role="tool", content=results[0][1], name=results[0][0])
    names = list(dict.fromkeys(n or "tool" for n, _ in results))
    text = "\n\n".join(f"[result {i} of {len(results)}: {n or 'tool'}]\n{c}" for i, (n, c) in enumerate(results, 1))
    return NextState(role="tool", content=text, name=", ".join(names))


def clip_text(text: str, max_chars: int) -> str:
    """``text``, or its head and tail with a note of how much is left out between them when it is longer."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[len(text) - half:]}"


def next_state_from_messages(messages: Sequence[dict[str, Any]],
                             max_chars: int = DEFAULT_MAX_NEXT_STATE_CHARS) -> NextState | None:
    """The next state a request carries for the previous main turn (see the module docstring), its
    texts cut to ``max_chars`` (`clip_text`)."""
    state = _next_state(messages)
    if state is None or (len(state.content) <= max_chars and len(state.raw or "") <= max_chars):
        return state
    return NextState(role=state.role, content=clip_text(state.content, max_chars), name=state.name,
                     raw=None if state.raw is None else clip_text(state.raw, max_chars))


def _next_state(messages: Sequence[dict[str, Any]]) -> NextState | None:
    end = len(messages)
    # OpenClaw may append a user message that is all wrapper (its runtime context), even after tool results.
    while end > 0 and messages[end - 1].get("role") == "user" and not person_words(_text(messages[end - 1])):
        end -= 1
    if end < len(messages) and (end == 0 or messages[end - 1].get("role") not in ("user", "tool")):
        end = len(messages)  # nothing but wrapper follows the reply: judged as the (empty) user message it is
    if end == 0:
        return None
    role = messages[end - 1].get("role")
    if role == "tool":
        return _tool_results_state(messages[:end])
    if role != "user":
        return None
    start = end
    while start > 0 and messages[start - 1].get("role") == "user":
        start -= 1
    raws = [_text(m) for m in messages[start:len(messages)]]
    words = "\n\n".join(w for w in map(person_words, raws) if w)
    raw = "\n\n".join(raws)
    return NextState(role="user", content=words, name=None, raw=raw if words != raw else None)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


@dataclass(frozen=True)
class TurnTicket:
    """Handle of an open main turn; pass it back to complete_turn / fail_turn."""

    session_id: str
    session_key: int  # which incarnation of the session (ids are reused after a session ends)
    turn_index: int
    person: str = DEFAULT_PERSON


@dataclass
class _Session:
    key: int
    next_index: int = 0
    in_flight: set[int] = field(default_factory=set)
    completed: dict[int, TurnRecord] = field(default_factory=dict)      # waiting for a next state
    early_next_states: dict[int, NextState] = field(default_factory=dict)  # arrived before the turn completed
    no_next_state: set[int] = field(default_factory=set)  # in flight, but the next request gave no next state
    ending: bool = False
    last_active: float = 0.0


SessionStats = counters(
    "SessionStats", "sessions turns_opened jobs dropped_without_next_state dropped_at_session_end failed_turns "
    "evicted_at_person_limit evicted_table_full refused_at_limit",
    "The session tracker's counters: sessions and turns opened, scoring jobs made, turns dropped unscored, sessions "
    "ended to make room (always their own person's) and sessions refused.")

SessionKey = tuple[str, str]   # (person, session id)


def _key(session: str | SessionKey, person: str | None = None) -> SessionKey:
    if isinstance(session, tuple):
        return session
    return (DEFAULT_PERSON if person is None else person, session)


class SessionTracker:
    """In-memory session table, one namespace per person; see the module docstring for the rules."""

    def __init__(self, *, idle_timeout_s: float = 6 * 3600.0, max_sessions: int = 100_000,
                 max_sessions_per_person: int | None = None, max_next_state_chars: int = DEFAULT_MAX_NEXT_STATE_CHARS,
                 clock: Callable[[], float] = time.monotonic,
                 on_drop: Callable[[TurnRecord], None] | None = None) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self.max_sessions_per_person = max_sessions_per_person or max_sessions
        self.max_next_state_chars = max_next_state_chars
        self.on_drop = on_drop
        self._clock = clock
        self._active: "OrderedDict[SessionKey, _Session]" = OrderedDict()  # least recently active first
        self._by_person: dict[str, "OrderedDict[str, None]"] = {}   # each person's session ids, same order
        self._by_key: dict[int, _Session] = {}  # every incarnation that is active or has turns in flight
        self._next_key = 0
        self.stats = SessionStats()

    # ----------------------------------------------------------------- queries
    def __contains__(self, session: str | SessionKey) -> bool:
        """``(person, session id)``, or a session id of the default person."""
        return _key(session) in self._active

    def __len__(self) -> int:
        return len(self._active)

    def sessions_of(self, person: str) -> int:
        return len(self._by_person.get(person, ()))

    def pending_turns(self) -> int:
        """Turns in flight or completed and waiting for their next state, over all sessions."""
        return sum(len(s.in_flight) + len(s.completed) for s in self._by_key.values())

    # ----------------------------------------------------------------- internals
    def _drop(self, record: TurnRecord) -> None:
        if self.on_drop is not None:
            self.on_drop(record)

    def _touch(self, key: SessionKey) -> _Session:
        session = self._active.get(key)
        person, sid = key
        if session is None:
            self._make_room(person)
            session = _Session(key=self._next_key)
            self._next_key += 1
            self._active[key] = session
            self._by_person.setdefault(person, OrderedDict())[sid] = None
            self._by_key[session.key] = session
            self.stats.sessions += 1
        self._active.move_to_end(key)
        self._by_person[person].move_to_end(sid)
        session.last_active = self._clock()
        return session

    def _make_room(self, person: str) -> None:
        """Before ``person`` opens a session: end their own oldest idle one if they are at their limit or the
        table is full (never another person's); SessionLimitError if none of theirs is idle."""
        own = self._by_person.get(person, ())
        if len(own) >= self.max_sessions_per_person:
            why, limit, counter = "their session limit", self.max_sessions_per_person, "evicted_at_person_limit"
        elif len(self._active) >= self.max_sessions:
            why, limit, counter = "the session table is full", self.max_sessions, "evicted_table_full"
        else:
            return
        victim = next((sid for sid in own if not self._active[(person, sid)].in_flight), None)
        if victim is None:
            self.stats.refused_at_limit += 1
            raise SessionLimitError(f"person {person!r} cannot open another session: {why} ({limit}) and every "
                                    f"session of theirs ({len(own)}) has a turn in flight")
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        logger.warning("%s (%d): ending person %s's least recently active idle session %s", why, limit, person, victim)
        self.end_session(victim, person=person)

    def _forget_if_done(self, session: _Session) -> None:
        if session.ending and not session.in_flight:
            self._by_key.pop(session.key, None)

    def next_state(self, messages: Sequence[dict[str, Any]]) -> NextState | None:
        return next_state_from_messages(messages, self.max_next_state_chars)

    # ----------------------------------------------------------------- main-turn lifecycle
    def open_main_turn(self, session_id: str, messages: Sequence[dict[str, Any]], *, person: str = DEFAULT_PERSON,
                       next_state: NextState | None = _UNSET) -> tuple[TurnTicket, ScoringJob | None]:
        """A main request of ``person`` arrived. Returns (its ticket, a job for the previous turn if that is
        now ready). ``next_state``: what the request carries for the previous turn, when the caller made it
        already (`next_state`, off the event loop for long messages). SessionLimitError: no room."""
        session = self._touch((person, session_id))
        index = session.next_index
        session.next_index += 1
        session.in_flight.add(index)
        self.stats.turns_opened += 1
        job = None
        prev = index - 1
        if prev >= 0:
            if next_state is _UNSET:
                next_state = self.next_state(messages)
            if next_state is None:
                role = messages[-1].get("role") if messages else None
                if prev in session.completed:
                    self._drop(session.completed.pop(prev))
                    self.stats.dropped_without_next_state += 1
                    logger.info("session %s turn %d dropped: the next main request ends with role %r, not user/tool",
                                session_id, prev, role)
                elif prev in session.in_flight:
                    session.no_next_state.add(prev)
            elif prev in session.completed:
                job = ScoringJob(session.completed.pop(prev), next_state)
                self.stats.jobs += 1
            elif prev in session.in_flight:
                session.early_next_states[prev] = next_state
        return TurnTicket(session_id, session.key, index, person), job

    def complete_turn(self, ticket: TurnTicket, record: TurnRecord) -> ScoringJob | None:
        """A main turn's response is done. Returns a job if its next state already arrived."""
        session = self._by_key.get(ticket.session_key)
        index = ticket.turn_index
        if session is None or index not in session.in_flight:
            self.stats.dropped_at_session_end += 1
            self._drop(record)
            return None
        session.in_flight.discard(index)
        session.last_active = self._clock()
        job = None
        if index in session.early_next_states:
            job = ScoringJob(record, session.early_next_states.pop(index))
            self.stats.jobs += 1
        elif index in session.no_next_state:
            session.no_next_state.discard(index)
            self.stats.dropped_without_next_state += 1
            self._drop(record)
        elif session.ending:
            self.stats.dropped_at_session_end += 1
            self._drop(record)
        else:
            session.completed[index] = record
        self._forget_if_done(session)
        return job

    def fail_turn(self, ticket: TurnTicket) -> None:
        """The turn's generation failed or was abandoned: it will never be scored."""
        session = self._by_key.get(ticket.session_key)
        if session is None:
            return
        index = ticket.turn_index
        if index in session.in_flight:
            session.in_flight.discard(index)
            session.early_next_states.pop(index, None)
            session.no_next_state.discard(index)
            self.stats.failed_turns += 1
        self._forget_if_done(session)

    def end_with_next_state(self, session_id: str, messages: Sequence[dict[str, Any]], *,
                            person: str = DEFAULT_PERSON, next_state: NextState | None = _UNSET
                            ) -> tuple[ScoringJob | None, int]:
        """The session's last reaction arrives without a request for a reply (the done endpoint with
        `messages`): as a main request would, it is the next state of the last main turn; then the
        session ends. Returns (a job for that turn if it is ready, turns dropped unscored)."""
        session = self._active.get((person, session_id))
        if session is None:
            return None, 0
        job = None
        last = session.next_index - 1
        if next_state is _UNSET:
            next_state = self.next_state(messages)
        if last >= 0 and next_state is not None:
            if last in session.completed:
                job = ScoringJob(session.completed.pop(last), next_state)
                self.stats.jobs += 1
            elif last in session.in_flight:   # scored when it completes (before the session's end drops it)
                session.early_next_states[last] = next_state
        return job, self.end_session(session_id, person=person)

    def end_session(self, session_id: str, *, person: str = DEFAULT_PERSON) -> int:
        """End ``person``'s session: drop completed turns without a next state. Returns how many were dropped.

        In-flight turns finish under the ended incarnation; a new request with this id
        starts a fresh session (turn indices from 0 again).
        """
        session = self._active.pop((person, session_id), None)
        if session is None:
            return 0
        own = self._by_person[person]
        del own[session_id]
        if not own:
            del self._by_person[person]
        dropped = len(session.completed)
        for record in session.completed.values():
            self._drop(record)
        session.completed.clear()
        session.ending = True
        self.stats.dropped_at_session_end += dropped
        if dropped:
            logger.info("session %s ended: %d unscored turn(s) dropped", session_id, dropped)
        self._forget_if_done(session)
        return dropped

    # ----------------------------------------------------------------- limits
    def expire_idle(self) -> list[str]:
        """End sessions idle for longer than idle_timeout_s (no turn in flight). Returns their ids."""
        now = self._clock()
        expired = [key for key, s in self._active.items()
                   if not s.in_flight and now - s.last_active > self.idle_timeout_s]
        for person, sid in expired:
            self.end_session(sid, person=person)
        return [sid for _, sid in expired]
