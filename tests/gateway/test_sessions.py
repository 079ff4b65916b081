"""Session bookkeeping: next-state association, pipelining, failures, session end, limits."""

from __future__ import annotations

from openclaw_jax.gateway.judge import NextState
from openclaw_jax.gateway.sessions import SessionTracker, TurnRecord, next_state_from_messages


def record(ticket, text="reply") -> TurnRecord:
    return TurnRecord(session_id=ticket.session_id, turn_index=ticket.turn_index, prompt_messages=[],
                      tools=None, chat_template_kwargs={}, prompt_ids=[1], response_ids=[2], rollout_logprobs=[-0.1],
                      response_text=text, weight_version="0", temperature=1.0, finish_reason="stop")


def user(text):
    return [{"role": "system", "content": "s"}, {"role": "user", "content": text}]


def test_next_state_from_messages():
    assert next_state_from_messages(user("hi")) == NextState("user", "hi")
    assert next_state_from_messages([{"role": "tool", "content": "ok", "name": "sh"}]) == NextState("tool", "ok", "sh")
    assert next_state_from_messages([{"role": "assistant", "content": "x"}]) is None
    assert next_state_from_messages([]) is None


def test_sequential_turns_pair_with_the_next_request():
    t = SessionTracker()
    t0, job = t.open_main_turn("a", user("q0"))
    assert job is None and t0.turn_index == 0
    assert t.complete_turn(t0, record(t0, "r0")) is None
    t1, job = t.open_main_turn("a", user("thanks"))
    assert t1.turn_index == 1
    assert job.turn.turn_index == 0 and job.turn.response_text == "r0"
    assert job.next_state == NextState("user", "thanks")
    assert t.complete_turn(t1, record(t1, "r1")) is None
    t2, job = t.open_main_turn("a", user("q1") + [{"role": "assistant", "content": "r1"},
                                                   {"role": "tool", "content": "exit code 0"}])
    assert job.turn.turn_index == 1 and job.next_state == NextState("tool", "exit code 0")
    assert t.stats.jobs == 2


def test_pipelined_request_pairs_when_turn_completes():
    t = SessionTracker()
    t0, _ = t.open_main_turn("a", user("q0"))
    t1, job = t.open_main_turn("a", user("next"))  # arrives before turn 0 is done
    assert job is None
    job = t.complete_turn(t0, record(t0, "r0"))
    assert job.turn.turn_index == 0 and job.next_state.content == "next"


def test_next_request_without_user_or_tool_last_message_drops_the_turn():
    t = SessionTracker()
    t0, _ = t.open_main_turn("a", user("q0"))
    t.complete_turn(t0, record(t0))
    t1, job = t.open_main_turn("a", user("q") + [{"role": "assistant", "content": "prefill"}])
    assert job is None and t.stats.dropped_without_next_state == 1
    # Same when that request arrives while turn 1 is in flight.
    t2, job = t.open_main_turn("a", [{"role": "assistant", "content": "x"}])
    assert t.complete_turn(t1, record(t1)) is None
    assert t.stats.dropped_without_next_state == 2


def test_failed_turn_is_never_scored():
    t = SessionTracker()
    t0, _ = t.open_main_turn("a", user("q0"))
    t.fail_turn(t0)
    t1, job = t.open_main_turn("a", user("thanks"))
    assert job is None
    # A failed turn that already had its next state loses it too.
    t2, _ = t.open_main_turn("a", user("more"))
    t.fail_turn(t1)
    assert t.complete_turn(t1, record(t1)) is None
    assert t.stats.failed_turns == 2


def test_interleaved_sessions_stay_separate():
    t = SessionTracker()
    a0, _ = t.open_main_turn("a", user("a q0"))
    b0, _ = t.open_main_turn("b", user("b q0"))
    t.complete_turn(b0, record(b0, "b r0"))
    t.complete_turn(a0, record(a0, "a r0"))
    b1, job_b = t.open_main_turn("b", user("b thanks"))
    a1, job_a = t.open_main_turn("a", user("a wrong"))
    assert (job_a.turn.session_id, job_a.turn.response_text, job_a.next_state.content) == ("a", "a r0", "a wrong")
    assert (job_b.turn.session_id, job_b.turn.response_text, job_b.next_state.content) == ("b", "b r0", "b thanks")
    assert a1.turn_index == 1 and b1.turn_index == 1


def test_session_end_drops_unscored_turns_and_restarts_numbering():
    t = SessionTracker()
    t0, _ = t.open_main_turn("a", user("q0"))
    t.complete_turn(t0, record(t0))
    # The final request scores turn 0 and ends the session; its own turn is dropped.
    t1, job = t.open_main_turn("a", user("thanks, bye"))
    assert job.turn.turn_index == 0
    assert t.end_session("a") == 0  # turn 1 is still in flight
    assert "a" not in t
    assert t.complete_turn(t1, record(t1)) is None
    assert t.pending_turns() == 0
    # A completed turn waiting for its next state is dropped at session end.
    n0, _ = t.open_main_turn("a", user("new q"))
    assert n0.turn_index == 0 and n0.session_key != t0.session_key
    t.complete_turn(n0, record(n0))
    assert t.pending_turns() == 1
    assert t.end_session("a") == 1
    assert t.pending_turns() == 0
    assert t.end_session("unknown") == 0


def test_session_end_still_judges_in_flight_turn_with_known_next_state():
    t = SessionTracker()
    t0, _ = t.open_main_turn("a", user("q0"))
    t1, job = t.open_main_turn("a", user("that is wrong"))  # next state of turn 0, before it completes
    t.end_session("a")
    job = t.complete_turn(t0, record(t0, "r0"))
    assert job is not None and job.next_state.content == "that is wrong"
    # The new session with the same id does not see the old one's turns.
    n0, job = t.open_main_turn("a", user("hello again"))
    assert job is None and n0.turn_index == 0
    assert t.complete_turn(t1, record(t1)) is None


def test_idle_sessions_expire():
    now = [0.0]
    t = SessionTracker(idle_timeout_s=10.0, clock=lambda: now[0])
    a0, _ = t.open_main_turn("a", user("q"))
    t.complete_turn(a0, record(a0))
    b0, _ = t.open_main_turn("b", user("q"))  # stays in flight
    now[0] = 11.0
    assert t.expire_idle() == ["a"]  # b has a turn in flight
    assert "a" not in t and "b" in t
    assert t.stats.dropped_at_session_end == 1


def test_max_sessions_evicts_least_recently_active_idle_session():
    t = SessionTracker(max_sessions=2)
    for sid in ("a", "b"):
        tk, _ = t.open_main_turn(sid, user("q"))
        t.complete_turn(tk, record(tk))
    t.open_main_turn("a", user("more"))  # a is now the most recent
    t.open_main_turn("c", user("q"))
    assert "b" not in t and "a" in t and "c" in t
