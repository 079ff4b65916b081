"""Sessions to a stable effect (`envs/sessions.py`): the counting, the person's rule per session, and the
records a run keeps (`sessions.jsonl`, TensorBoard).

The counting is checked on hand-made sequences whose answers follow from the definition (the first of
three satisfied sessions in a row, 1-based), and against a brute-force reading of the same definition
over every sequence of up to 10 sessions.
"""

from __future__ import annotations

import itertools
import json

import pytest

from openclaw_jax.envs.sessions import (
    METRIC_SESSION_SATISFIED,
    METRIC_SESSIONS_TO_STABLE,
    SessionLog,
    describe_stable,
    session_satisfied,
    sessions_to_stable,
)
from openclaw_jax.envs.simulated_user import RatedAnswer, SessionResult
from openclaw_jax.trainer.metrics import MetricsWriter
from tests.helpers.tb_events import read_event_tags


@pytest.mark.parametrize("flags, expected", [
    ("", None),
    ("111", 1),             # satisfied from the first session on
    ("011", None),          # two in a row are not three
    ("0110111", 5),         # the run 5-6-7; the pair 2-3 does not count
    ("11011111", 4),        # the first run of three starts at 4, however long it goes on
    ("000000111", 7),
    ("1101101101", None),   # never three in a row
    ("0111000111", 2),      # the first run, not the last
])
def test_first_session_of_the_first_run_of_three(flags, expected):
    assert sessions_to_stable([c == "1" for c in flags]) == expected


def test_matches_a_brute_force_reading_of_the_definition():
    for n in range(11):
        for flags in itertools.product((False, True), repeat=n):
            starts = [i + 1 for i in range(n - 2) if all(flags[i:i + 3])]
            assert sessions_to_stable(flags) == (starts[0] if starts else None), flags


def test_other_run_lengths_and_bad_ones():
    assert sessions_to_stable([False, True, False], run=1) == 2
    assert sessions_to_stable([True, True, False, True, True], run=2) == 1
    assert sessions_to_stable([True] * 4, run=5) is None
    with pytest.raises(ValueError, match="run=0"):
        sessions_to_stable([True], run=0)
    assert describe_stable(4, 20) == "4" and describe_stable(None, 20) == "not within 20"


def _answer(satisfied: bool, attempt: int = 0, correct: bool | None = True) -> RatedAnswer:
    return RatedAnswer("s", attempt, "q", attempt, "7.", "stop", 1.0 if satisfied else 0.0, satisfied,
                       "Thanks!" if satisfied else "No, that's wrong. 3 + 4 should be 7, not 8.", correct)


def _session(*satisfied: bool, error: str | None = None, index: int = 0) -> SessionResult:
    return SessionResult(f"sim-{index}", index, [_answer(s, i) for i, s in enumerate(satisfied)], error=error)


def test_a_session_satisfies_the_person_only_without_any_correction():
    assert session_satisfied(_session(True))
    assert not session_satisfied(_session(False, True))   # right after a correction is still a correction
    assert not session_satisfied(_session(False, False))
    assert not session_satisfied(_session())              # no answer at all
    assert not session_satisfied(_session(True, error="APITimeoutError: timed out"))


def test_the_log_records_sessions_in_order_and_continues_after_a_restart(tmp_path):
    path = tmp_path / "sessions.jsonl"
    writer = MetricsWriter(tmp_path / "tb")
    log = SessionLog(path, writer=writer)
    log.add([_session(False, True, index=0), _session(True, index=1)], step=0)
    log.add([_session(True, index=2), _session(error="RuntimeError: no reply", index=3)], step=1)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["session"] for r in records] == [1, 2, 3, 4]
    assert [r["satisfied"] for r in records] == [False, True, True, False]
    assert [(r["answers"], r["corrections"], r["step"]) for r in records] == [(2, 1, 0), (1, 0, 0), (1, 0, 1), (0, 0, 1)]
    assert records[3]["error"] == "RuntimeError: no reply" and records[3]["first_answer_correct"] is None
    assert log.summary() == {"sessions": 4, "sessions_satisfied": 2, "sessions_to_stable": None}

    again = SessionLog(path, writer=writer)   # a resumed run: sessions 5, 6, 7 satisfy the person
    again.add([_session(True, index=i) for i in range(4, 7)], step=2)
    assert again.summary() == {"sessions": 7, "sessions_satisfied": 5, "sessions_to_stable": 5}
    again.add([_session(True, index=7)], step=3)   # the measure is written once, when reached
    writer.close()

    scalars = {tag: sorted((step, v.simple_value) for step, v in values)
               for tag, values in read_event_tags(tmp_path / "tb").items()}
    assert scalars[METRIC_SESSION_SATISFIED] == [(n, float(ok)) for n, ok in
                                                  enumerate([0, 1, 1, 0, 1, 1, 1, 1], start=1)]
    assert scalars[METRIC_SESSIONS_TO_STABLE] == [(7, 5.0)]   # at the session that completed the run
