"""What the status page shows, gathered from where it lives (docs/gate_and_status.md).

* **Sessions** (`SessionActivity`): every chat request's person, session id and turn type, counted per
  session (main and side turns, first and last request; the most recent ``max_sessions`` kept) and per
  person since the gateway started (sessions, main and side requests, last request; the ``max_people``
  most recently active kept); whether a session is still open comes from the gateway's session tracker.
* **Scored turns and satisfaction** (`StoreSummary`): the sample store, followed forward by one
  read-only `SampleTail` (each record decoded once, off the event loop): per weight version, and per
  person and version, the turns the judge scored +1 (satisfied) and -1 (corrected), the last ``recent``
  scored turns with their person, reward, hint and the person's reaction (shortened), how many are held
  out for the gate, and the store's size on disk.
* **People** (`people_rows`): the two above joined per person: their sessions and requests, open
  sessions, scored turns, satisfied, corrected, the satisfaction rate satisfied / (satisfied + corrected)
  overall and per weight version.
* **Trainer steps, versions, gate decisions** (`serving.versions.VersionLog`): the event log the trainer
  side writes beside the store, and the kept weight versions.

`status_body` puts them together as the ``GET /v1/status`` JSON (the HTML page renders the same dict).
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field
from typing import Any

from openclaw_jax.samples import Sample, SampleTail
from openclaw_jax.samples.holdout import is_held_out
from openclaw_jax.serving.versions import VersionLog, VersionStore

SHORT_CHARS = 160      # hints and reactions are cut to this many characters on the page
RECENT_EVENTS = 100    # version events shown, newest first


def shorten(text: str, limit: int = SHORT_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1].rstrip() + "\u2026"


def version_key(version: Any) -> tuple:
    """Sort key of weight versions: numbers numerically (``"10"`` after ``"9"``), then other names."""
    text = str(version)
    tail = text.rsplit("-", 1)[-1]
    return (0, int(tail), text) if tail.isdigit() else (1, 0, text)


@dataclass
class _SessionSeen:
    main: int = 0
    side: int = 0
    first: float = 0.0
    last: float = 0.0
    done: bool = False


@dataclass
class _PersonSeen:
    sessions: int = 0
    main: int = 0
    side: int = 0
    last: float = 0.0


class SessionActivity:
    """Requests per (person, session id) (main and side turns), the ``max_sessions`` most recently active
    kept, and per person (sessions, requests), the ``max_people`` most recently active kept. A person's
    ``sessions`` counts each session id the first time it is seen, and again after it was ended (a later
    request with the same id starts a new session) or left the ``max_sessions`` most recent ones."""

    def __init__(self, max_sessions: int = 200, max_people: int = 1000):
        self.max_sessions = max_sessions
        self.max_people = max_people
        self._seen: collections.OrderedDict[tuple[str, str], _SessionSeen] = collections.OrderedDict()
        self._people: collections.OrderedDict[str, _PersonSeen] = collections.OrderedDict()
        self.anonymous = {"main": 0, "side": 0}   # requests without a session id

    def note(self, person: str, session_id: str | None, turn_type: str, done: bool = False) -> None:
        now = time.time()
        who = self._people.pop(person, None) or _PersonSeen()
        setattr(who, turn_type, getattr(who, turn_type) + 1)
        who.last = now
        self._people[person] = who
        while len(self._people) > self.max_people:
            self._people.popitem(last=False)
        if not session_id:
            self.anonymous[turn_type] = self.anonymous.get(turn_type, 0) + 1
            return
        seen = self._seen.pop((person, session_id), None)
        if seen is None or seen.done:
            seen = _SessionSeen(first=now)
            who.sessions += 1
        setattr(seen, turn_type, getattr(seen, turn_type) + 1)
        seen.last, seen.done = now, done
        self._seen[(person, session_id)] = seen
        while len(self._seen) > self.max_sessions:
            self._seen.popitem(last=False)

    def ended(self, person: str, session_id: str) -> None:
        """The session was ended without a chat request (``POST /v1/sessions/{id}/done``)."""
        seen = self._seen.get((person, session_id))
        if seen is not None:
            seen.done = True

    def rows(self, open_sessions: Any) -> list[dict[str, Any]]:
        """Most recent first; ``open_sessions`` answers ``(person, id) in open_sessions`` (the session tracker)."""
        return [{"person": person, "session_id": sid, "main_turns": s.main, "side_turns": s.side,
                 "first_seen": s.first, "last_seen": s.last, "open": (person, sid) in open_sessions and not s.done}
                for (person, sid), s in reversed(self._seen.items())]

    def people(self) -> dict[str, dict[str, Any]]:
        return {person: {"sessions": p.sessions, "main_requests": p.main, "side_requests": p.side,
                         "last_request": p.last} for person, p in self._people.items()}


@dataclass
class _VersionTally:
    satisfied: int = 0
    corrected: int = 0
    hint_only: int = 0

    def add(self, eval_score: int) -> None:
        if eval_score > 0:
            self.satisfied += 1
        elif eval_score < 0:
            self.corrected += 1
        else:
            self.hint_only += 1


def satisfaction_rows(by_version: dict[str, _VersionTally]) -> list[dict[str, Any]]:
    """One row per weight version, in version order: satisfied, corrected, hint only and the rate."""
    rows = []
    for version in sorted(by_version, key=version_key):
        t = by_version[version]
        judged = t.satisfied + t.corrected
        rows.append({"version": version, "satisfied": t.satisfied, "corrected": t.corrected,
                     "hint_only": t.hint_only, "rate": t.satisfied / judged if judged else None})
    return rows


@dataclass
class _PersonTally:
    held_out: int = 0
    last: float = 0.0
    by_version: dict[str, _VersionTally] = field(default_factory=dict)


@dataclass
class StoreSummary:
    """The sample store's numbers for the page, updated by `refresh` (blocking: call it off the loop)."""

    store_dir: str
    holdout_every: int = 0
    recent: int = 50
    position: int = 0
    held_out: int = 0
    by_version: dict[str, _VersionTally] = field(default_factory=dict)
    by_person: dict[str, _PersonTally] = field(default_factory=dict)
    turns: collections.deque = field(default_factory=collections.deque)
    _tail: SampleTail | None = None

    def __post_init__(self) -> None:
        self.turns = collections.deque(maxlen=self.recent)

    def refresh(self, holdout_every: int | None = None) -> None:
        """Read the records appended since the last call. ``holdout_every`` (the gate's, from the event log)
        marks the held-out turns; when it changes, the store is read again from the start."""
        if holdout_every is not None and holdout_every != self.holdout_every:
            self.close()
            self.holdout_every, self.position, self.held_out = holdout_every, 0, 0
            self.by_version.clear()
            self.by_person.clear()
            self.turns.clear()
        if self._tail is None:
            if not os.path.isdir(self.store_dir):
                return
            self._tail = SampleTail(self.store_dir)
        end = self._tail.refresh()
        while self.position < end:
            stop = min(end, self.position + 256)
            for offset, sample in enumerate(self._tail.read(self.position, stop), start=self.position):
                self._add(offset, sample)
            self.position = stop

    def _add(self, offset: int, sample: Sample) -> None:
        held = is_held_out(sample.sample_id, self.holdout_every)
        self.held_out += held
        version = str(sample.weight_version)
        self.by_version.setdefault(version, _VersionTally()).add(sample.eval_score)
        person = self.by_person.setdefault(sample.person, _PersonTally())
        person.by_version.setdefault(version, _VersionTally()).add(sample.eval_score)
        person.held_out += held
        person.last = max(person.last, sample.created_at)
        reaction = (sample.next_state or {}).get("content", "")
        self.turns.append({"offset": offset, "person": sample.person, "session_id": sample.session_id,
                           "turn_index": sample.turn_index,
                           "kind": sample.kind, "reward": sample.reward, "eval_score": sample.eval_score,
                           "hint": shorten(sample.hints[0]) if sample.hints else "", "hints": len(sample.hints),
                           "reaction": shorten(reaction) if isinstance(reaction, str) else "",
                           "weight_version": sample.weight_version, "held_out": held, "time": sample.created_at})

    def satisfaction(self) -> list[dict[str, Any]]:
        return satisfaction_rows(self.by_version)

    def disk_bytes(self) -> int:
        try:
            return sum(e.stat().st_size for e in os.scandir(self.store_dir) if e.is_file())
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None


def people_rows(summary: StoreSummary, activity: SessionActivity, open_sessions: Any) -> list[dict[str, Any]]:
    """Per person (everyone with a scored turn in the store or a request since the gateway started), by
    person id: their requests and sessions since the start, open sessions now (``open_sessions.sessions_of``,
    the session tracker), and from the store their scored turns, satisfied (+1), corrected (-1), hint only,
    held out, the rate satisfied / (satisfied + corrected), overall and per weight version."""
    seen = activity.people()
    rows = []
    for person in sorted(set(seen) | set(summary.by_person)):
        requests = seen.get(person, {"sessions": 0, "main_requests": 0, "side_requests": 0, "last_request": None})
        tally = summary.by_person.get(person, _PersonTally())
        versions = satisfaction_rows(tally.by_version)
        satisfied, corrected = sum(v["satisfied"] for v in versions), sum(v["corrected"] for v in versions)
        hint_only = sum(v["hint_only"] for v in versions)
        rows.append({"person": person, **requests, "open_sessions": open_sessions.sessions_of(person),
                     "scored_turns": satisfied + corrected + hint_only, "satisfied": satisfied,
                     "corrected": corrected, "hint_only": hint_only, "held_out": tally.held_out,
                     "rate": satisfied / (satisfied + corrected) if satisfied + corrected else None,
                     "last_scored": tally.last or None, "satisfaction": versions})
    return rows


def holdout_every(events: list[dict[str, Any]]) -> int:
    """The hold-out rate of the run's latest start (0: the gate is off, nothing is held out)."""
    start = next((e for e in reversed(events) if e["event"] == "start"), None)
    value = start.get("holdout_every") if start else None
    return value if isinstance(value, int) and value >= 0 else 0


def trainer_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps and gate decisions from the event log."""
    steps = [e["step"] for e in events if isinstance(e.get("step"), int)]
    count = collections.Counter(e["event"] for e in events)
    start = next((e for e in reversed(events) if e["event"] == "start"), None)
    return {"last_step": max(steps) if steps else None, "candidates": count["promoted"] + count["refused"],
            "promoted": count["promoted"], "refused": count["refused"], "rollbacks": count["rollback"],
            "resets": count["reset"], "gate": bool(start.get("gate")) if start else None}


def status_body(*, summary: StoreSummary, activity: SessionActivity, open_sessions: Any, versions: VersionLog,
                kept: VersionStore, stats: dict[str, Any], model: str) -> dict[str, Any]:
    """The ``GET /v1/status`` body (blocking reads of the log and the versions directory: off the loop)."""
    events = versions.events()
    return {
        "time": time.time(),
        "model": model,
        "served_version": versions.served_version(events),
        "people": people_rows(summary, activity, open_sessions),
        "sessions": activity.rows(open_sessions),
        "requests": {"main": stats.get("main_turns", 0), "side": stats.get("side_turns", 0),
                     "judged": stats.get("judgements", 0), "samples_written": stats.get("samples", 0)},
        "scored_turns": list(reversed(summary.turns)),
        "satisfaction": summary.satisfaction(),
        "trainer": trainer_summary(events),
        "versions": list(reversed(events[-RECENT_EVENTS:])),
        "kept_versions": kept.kept(),
        "store": {"directory": summary.store_dir, "samples": summary.position, "held_out": summary.held_out,
                  "bytes": summary.disk_bytes()},
    }
