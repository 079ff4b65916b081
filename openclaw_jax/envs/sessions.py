"""Sessions to a stable effect: the measure a person feels, in the order they had their sessions.

A person notices that their agent has learnt when it keeps getting things right without being told.
Each session is judged by the person's own rule: **satisfied** when every answer in it satisfied the
persona, i.e. the person never had to correct it (`session_satisfied`). A session that failed (the
agent gave no answer) is not satisfied. **Sessions to a stable effect** (`sessions_to_stable`) is the
1-based number of the first session of the first run of `STABLE_RUN` (3) satisfied sessions in a row,
the upstream OpenClaw-RL measure ("sessions until the effect holds for three sessions in a row"); when
no such run exists among the N sessions seen, the effect was not reached within N (None).

Examples (1 = satisfied): 1 1 1 -> 1; 0 1 1 0 1 1 1 -> 5; 0 1 1 -> not reached within 3.

`SessionLog` writes one JSON line per session to `<run_dir>/sessions.jsonl` in session order (the
order the person started them; the sessions of one round run concurrently on the same weights) and,
given a TensorBoard writer (the trainer's `MetricsWriter` or a tensorboardX `SummaryWriter`), `sessions/satisfied` (0/1 at x = the session number) and
`sessions/to_stable` (the measure, written once, at x = the session that completed the run). Pure
functions plus a small file writer; imports nothing outside `envs/`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from openclaw_jax.envs.simulated_user import SessionResult, log_scalars

STABLE_RUN = 3  # satisfied sessions in a row that make the effect stable (the upstream measure)

METRIC_SESSION_SATISFIED = "sessions/satisfied"
METRIC_SESSIONS_TO_STABLE = "sessions/to_stable"


def session_satisfied(result: SessionResult) -> bool:
    """The person's own rule: the session had answers and every one of them satisfied the persona (no
    correction was needed). A failed session (an error before or after answers) is not satisfied."""
    return result.error is None and bool(result.turns) and all(t.satisfied for t in result.turns)


def sessions_to_stable(satisfied: Sequence[bool], run: int = STABLE_RUN) -> int | None:
    """The 1-based number of the first session of the first `run` consecutive satisfied sessions, or
    None when `satisfied` (the sessions in order) holds no such run."""
    if run < 1:
        raise ValueError(f"run={run} must be >= 1 (satisfied sessions in a row)")
    streak = 0
    for i, ok in enumerate(satisfied):
        streak = streak + 1 if ok else 0
        if streak == run:
            return i - run + 2
    return None


def describe_stable(first: int | None, seen: int) -> str:
    """"5" or "not within 28": the measure as a table shows it."""
    return str(first) if first is not None else f"not within {seen}"


def session_record(number: int, result: SessionResult, step: int | None) -> dict[str, Any]:
    """One `sessions.jsonl` line: the session's number (1-based, in order), whether it satisfied the
    person, how many answers and corrections it took, and the trainer step when it started."""
    first = result.turns[0] if result.turns else None
    return {
        "session": number,
        "name": result.session_id,
        "satisfied": session_satisfied(result),
        "answers": len(result.turns),
        "corrections": sum(not t.satisfied for t in result.turns),
        "first_answer_correct": None if first is None else first.correct,
        "step": step,
        "error": result.error,
    }


class SessionLog:
    """The person's sessions in order, appended to `path` (JSON lines) and to TensorBoard (`writer`).

    Reopening an existing file continues it (a resumed run keeps counting after the sessions already in it).
    `tag_prefix` goes before the metric names (`people/alice/` for one person of a household)."""

    def __init__(self, path: str | os.PathLike | None, *, writer: Any = None, run: int = STABLE_RUN,
                 tag_prefix: str = ""):
        self.path = Path(path) if path is not None else None
        self.writer = writer
        self.run = run
        self.tag_prefix = tag_prefix
        self.satisfied: list[bool] = []
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    self.satisfied.append(bool(json.loads(line)["satisfied"]))
        self._stable_written = self.sessions_to_stable is not None

    @property
    def count(self) -> int:
        return len(self.satisfied)

    @property
    def sessions_to_stable(self) -> int | None:
        return sessions_to_stable(self.satisfied, self.run)

    def add(self, results: Iterable[SessionResult], step: int | None = None) -> list[dict[str, Any]]:
        """Record `results` (in session order) as the next sessions; returns their records."""
        records = []
        for result in results:
            record = session_record(self.count + 1, result, step)
            record["time"] = round(time.time(), 3)
            self.satisfied.append(record["satisfied"])
            records.append(record)
        if self.path is not None and records:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in records))
        if self.writer is not None:
            for r in records:
                log_scalars(self.writer, r["session"], {self.tag_prefix + METRIC_SESSION_SATISFIED: float(r["satisfied"])})
            first = self.sessions_to_stable
            if first is not None and not self._stable_written:
                log_scalars(self.writer, first + self.run - 1, {self.tag_prefix + METRIC_SESSIONS_TO_STABLE: float(first)})
                self._stable_written = True
            if hasattr(self.writer, "flush"):
                self.writer.flush()
        return records

    def summary(self) -> dict[str, Any]:
        """`{"sessions": N, "sessions_satisfied": k, "sessions_to_stable": first or None}`."""
        return {"sessions": self.count, "sessions_satisfied": sum(self.satisfied),
                "sessions_to_stable": self.sessions_to_stable}


class HouseholdSessions:
    """Several people's `SessionLog`s (by person id) as one: the totals, and each person's own summary."""

    def __init__(self, logs: dict[str, SessionLog]):
        self.logs = logs

    def summary(self) -> dict[str, Any]:
        """`{"sessions": N, "sessions_satisfied": k, "people": {person: SessionLog.summary()}}` (no one
        sessions-to-stable number: each person has their own)."""
        people = {person: log.summary() for person, log in self.logs.items()}
        return {"sessions": sum(p["sessions"] for p in people.values()),
                "sessions_satisfied": sum(p["sessions_satisfied"] for p in people.values()), "people": people}
