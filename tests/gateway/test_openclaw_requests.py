"""What the real OpenClaw (2026.9.6) sends, through the gateway: fields, streaming, sessions, the judge's view.

The request shapes and texts here were recorded from `openclaw agent --local` (minimal tools
profile) against a capturing server on 2026-11-25: the body keys, the three tool schemas, the
user-message wrapper (timestamp prefix, relocated `Runtime:` line) and a tool-result request
(two parallel calls, two `tool` messages with `tool_call_id` and no `name`). The injected-context
shapes (marker `⟦openclaw:ctx⟧`, `System:` event lines, delivery hints, active memory) follow
OpenClaw's own builders and stripper (dist/strip-inbound-meta-*.mjs, dist/inbound-meta-*.mjs).
Recordings made later by scripts/openclaw.sh under tests/fixtures/openclaw/ are also checked
when present. Servers are real (gateway + scripted SGLang worker on 127.0.0.1); the streaming
checks use the official `openai` client.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openclaw_jax.gateway.judge import HINT_SEPARATOR, NextState, RuleJudge, eval_vote_messages, \
    hint_vote_messages
from openclaw_jax.gateway.openclaw_text import INBOUND_CONTEXT_MARKER, person_words
from openclaw_jax.gateway.sessions import SessionTracker, TurnRecord, next_state_from_messages
from openclaw_jax.wire import openai as O
from tests.helpers.scripted_pool import Reply
from tests.gateway.test_gateway import Env, loop_thread, make_env, tokenizer  # noqa: F401 (fixtures)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openclaw"
OPENCLAW_SHOWS = 196  # OpenClaw cuts a provider's error message to 200 characters ("..." included); measured

# ----------------------------------------------------------------------------- recorded text
RUNTIME = ("Runtime: agent=main | session=agent:main:explicit:s1 | sessionId=s1 | host=vm | os=Linux 6.18.44-fc-v669 "
           "(x64) | node=v24.21.0 | active_node=unknown | model=ocj/smollm2 | default_model=ocj/smollm2 | shell=bash")
TURN1_USER = f"[Wed 2026-11-25 09:33 UTC] What is 2 + 3?\n\n{RUNTIME}"
TURN2_USER = "[Wed 2026-11-25 09:33 UTC] No, that's wrong. Please answer with just the digit."
TOOLS = json.loads(
    '[{"type":"function","function":{"name":"tool_call","description":"Call an exact Tool Search result id or name '
    'through OpenClaw.","parameters":{"type":"object","required":["id"],"properties":{"id":{"type":"string",'
    '"description":"Tool search result id or tool name."},"args":{"type":"object","patternProperties":{"^.*$":{}},'
    '"description":"Tool input."}}}}},{"type":"function","function":{"name":"tool_describe","description":"Load the '
    'full schema and metadata for one search result when its input is not already clear.","parameters":{"type":'
    '"object","required":["id"],"properties":{"id":{"type":"string","description":"Tool search result id or tool '
    'name."}}}}},{"type":"function","function":{"name":"tool_search","description":"Search the effective Tool Search '
    'catalog.","parameters":{"type":"object","properties":{"query":{"anyOf":[{"type":"string"},{"type":"null"}],'
    '"description":"Single search query, in English."},"limit":{"anyOf":[{"type":"integer","minimum":1},{"type":'
    '"null"}]}}}}}]')
SESSION_STATUS = ('[\n  {\n    "id": "openclaw:core:session_status",\n    "source": "openclaw",\n    "sourceName": '
                  '"core",\n    "name": "session_status",\n    "label": "Session Status"\n  }\n]')
TOOL_TURN = [  # the tail of the recorded second request of a tool-calling run
    {"role": "assistant", "content": "Let me search.", "tool_calls": [
        {"id": "call0", "type": "function", "function": {"name": "tool_search", "arguments": '{"query":"time"}'}},
        {"id": "call1", "type": "function", "function": {"name": "tool_search", "arguments": '{"query":"weather"}'}}]},
    {"role": "tool", "content": SESSION_STATUS, "tool_call_id": "call0"},
    {"role": "tool", "content": "[]", "tool_call_id": "call1"}]
SYSTEM = {"role": "system", "content": "<!-- openclaw:attempt:STABLE -->\nYou are a personal assistant running inside "
                                      "OpenClaw.\n## Tooling\nTools policy-filtered. Names case-sensitive; call exact."}


def openclaw_body(messages, **extra):
    """A request body with exactly the keys OpenClaw sends (minimal profile), plus ``extra``."""
    return {"model": "smollm2", "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "tools": TOOLS, "tool_choice": "auto", "max_completion_tokens": 256, **extra}


def recorded(name):
    """A request recorded from the real OpenClaw by tests/fixtures/openclaw/record.py: (headers, body)."""
    data = json.loads((FIXTURES / name).read_text())
    return data["headers"], data["body"]


# What the person typed in each recorded request (record.py's messages), and the tool result's tool.
RECORDED_WORDS = {"minimal_turn1.json": "What is 2 + 3?", "minimal_turn2.json": "No, that's wrong. Show the steps.",
                  "default_turn1.json": "What is 2 + 3?",
                  "tool_call.json": "Search your tools for one that tells the current time."}


# ----------------------------------------------------------------------------- person_words

@pytest.mark.parametrize("text, words", [
    (TURN1_USER, "What is 2 + 3?"),
    (TURN2_USER, "No, that's wrong. Please answer with just the digit."),
    ("[Wed 2026-11-25 07:50 UTC] thanks!", "thanks!"),
    ("[Mon 2026-11-23 18:04:09 GMT+1] Two\nlines.\n\n" + RUNTIME, "Two\nlines."),
    # queued system events before the text (OpenClaw's drainFormattedSystemEvents)
    ("[Wed 2026-11-25 07:50 UTC] System: [2026-11-25 07:49:58 UTC] Exec finished (exit 0)\nSystem: cron ran\n\n"
     "Did the backup run?", "Did the backup run?"),
    # inbound context blocks from a channel: fenced JSON and paragraph forms, and the trailing Context block
    (f"[Wed 2026-11-25 07:50 UTC] Conversation info (untrusted metadata): {INBOUND_CONTEXT_MARKER}\n```json\n"
     '{"conversation_label": "family"}\n```\n\n'
     f"Sender: {INBOUND_CONTEXT_MARKER}\nAda (@ada)\n\nPlease book the table for four.",
     "Please book the table for four."),
    (f"Move the call to 3pm.\n\nContext: {INBOUND_CONTEXT_MARKER}\nChat history since last reply:\n- Bob: ok",
     "Move the call to 3pm."),
    ("Context:\n<active_memory_plugin>\nUser prefers metric units.\n</active_memory_plugin>\n\nHow tall is it?",
     "How tall is it?"),
    ("Delivery: to send a message, use the `message` tool.\nSay hi to Bob.", "Say hi to Bob."),
    # text from another client, or words that only look like parts of the wrapper, stay
    ("What does Runtime: mean here?", "What does Runtime: mean here?"),
    ("[draft] System: ready?", "[draft] System: ready?"),
    ("  plain  ", "plain"),
    ("", ""),
])
def test_person_words_strips_only_openclaws_wrapper(text, words):
    assert person_words(text) == words


def wrap_like_openclaw(words: str, dow: str, stamp: str, runtime: bool) -> str:
    """OpenClaw's wrapping (injectTimestamp, then the relocated runtime region), written out independently."""
    out = f"[{dow} {stamp} UTC] {words}"
    return f"{out}\n\n{RUNTIME}" if runtime else out


PLAIN = st.text(st.characters(categories=("L", "N", "P", "Zs"), exclude_characters="\u27e6\u27e7"), min_size=1,
                max_size=60).filter(lambda s: s.strip() and not s.lstrip().startswith(("[", "System: ")))


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(PLAIN, min_size=1, max_size=3), dow=st.sampled_from(["Mon", "Wed", "Sun"]),
       stamp=st.sampled_from(["2026-11-25 07:50", "2027-01-02 23:59"]), runtime=st.booleans())
def test_person_words_inverts_the_wrapper(lines, dow, stamp, runtime):
    words = "\n".join(lines).strip()
    assert person_words(wrap_like_openclaw(words, dow, stamp, runtime)) == words


@pytest.mark.parametrize("name", sorted(RECORDED_WORDS) + ["tool_result.json"])
def test_next_state_of_recorded_requests(name):
    _, body = recorded(name)
    messages = O.parse_messages(body)  # as the gateway normalises them
    state = next_state_from_messages(messages)
    if name == "tool_result.json":
        assert state.role == "tool" and state.name == "tool_search" and state.raw is None
        assert state.content == messages[-1]["content"]
        return
    assert state.role == "user" and state.content == RECORDED_WORDS[name]
    assert state.raw.startswith("[Wed 2026-11-25 ") and RECORDED_WORDS[name] in state.raw
    for msg in messages:
        if msg["role"] == "user":
            words = person_words(msg["content"])
            assert words in msg["content"] and "Runtime: agent=" not in words and "OPENCLAW_INTERNAL" not in words


def test_next_state_of_a_user_message_is_the_persons_words():
    state = next_state_from_messages([SYSTEM, {"role": "user", "content": TURN1_USER},
                                      {"role": "assistant", "content": "Five."},
                                      {"role": "user", "content": TURN2_USER}])
    assert state == NextState("user", "No, that's wrong. Please answer with just the digit.", raw=TURN2_USER)
    assert state.to_dict()["raw"] == TURN2_USER
    # The rule judge gives a leading "No" -1 only when it reads the words, not the timestamp before them.
    no = "[Wed 2026-11-25 09:33 UTC] No."
    assert RuleJudge().judge_now("Five.", NextState("user", no)).eval_score == 0
    assert RuleJudge().judge_now("Five.", next_state_from_messages([{"role": "user", "content": no}])).eval_score == -1


def test_judge_prompts_show_the_words_not_the_wrapper():
    _, body = recorded("default_turn1.json")  # the person's message, then OpenClaw's runtime-context message
    state = next_state_from_messages(O.parse_messages(body))
    for messages in (eval_vote_messages("5", state), hint_vote_messages("5", state)):
        prompt = messages[-1]["content"]
        assert "What is 2 + 3?" in prompt
        for wrapper in ("[Wed 2026-11-25", "Runtime:", "sessionId=", "OPENCLAW_INTERNAL_CONTEXT", "Active exec"):
            assert wrapper not in prompt


def test_next_state_of_tool_results_is_every_trailing_tool_message():
    messages = [SYSTEM, {"role": "user", "content": TURN1_USER}, *TOOL_TURN]
    state = next_state_from_messages(messages)
    assert state.role == "tool" and state.name == "tool_search"
    assert state.content == f"[result 1 of 2: tool_search]\n{SESSION_STATUS}\n\n[result 2 of 2: tool_search]\n[]"
    one = next_state_from_messages(messages[:-1])
    assert one == NextState("tool", SESSION_STATUS, "tool_search")
    # OpenClaw's runtime-context message (default profile) may follow the tool results: they stay the state.
    _, default = recorded("default_turn1.json")
    carrier = O.parse_messages(default)[-1]
    assert carrier["role"] == "user" and carrier["content"].startswith("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>")
    assert next_state_from_messages(messages[:-1] + [carrier]) == NextState("tool", SESSION_STATUS, "tool_search")
    assert next_state_from_messages(messages[:2] + [carrier]).content == "What is 2 + 3?"
    # An earlier tool message belongs to an earlier turn: only the trailing run counts.
    later = messages + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call2", "type": "function", "function": {"name": "tool_call", "arguments": "{}"}}]},
        {"role": "tool", "content": "done", "tool_call_id": "call2"}]
    assert next_state_from_messages(later) == NextState("tool", "done", "tool_call")


# ----------------------------------------------------------------------------- idle sessions

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(ticket, prompt=(1, 2, 3)) -> TurnRecord:
    return TurnRecord(session_id=ticket.session_id, turn_index=ticket.turn_index, prompt_messages=[],
                      tools=None, chat_template_kwargs={}, prompt_ids=list(prompt), response_ids=[4, 5],
                      rollout_logprobs=[-0.1, -0.2], response_text="hi", weight_version="0", temperature=1.0,
                      finish_reason="stop")


def test_idle_session_ends_its_last_turn_is_dropped_and_its_memory_freed():
    clock = Clock()
    tracker = SessionTracker(idle_timeout_s=60.0, clock=clock)
    user = [{"role": "user", "content": "hi"}]
    t0, _ = tracker.open_main_turn("a", user)
    tracker.complete_turn(t0, record(t0))
    t1, job = tracker.open_main_turn("a", user)
    assert job is not None and job.turn.turn_index == 0
    tracker.complete_turn(t1, record(t1, prompt=range(5000)))  # the last turn, waiting for a next state
    busy, _ = tracker.open_main_turn("b", user)                 # in flight: never idle
    clock.now += 60.0
    assert tracker.expire_idle() == []                          # not longer than the timeout yet
    clock.now += 0.5
    assert tracker.expire_idle() == ["a"]
    assert "a" not in tracker and "b" in tracker
    assert tracker.stats.dropped_at_session_end == 1 and tracker.pending_turns() == 1  # only b's turn is left
    assert all(not s.completed for s in tracker._by_key.values())  # a's records (prompt ids) are gone
    tracker.complete_turn(busy, record(busy))
    clock.now += 61.0
    assert tracker.expire_idle() == ["b"] and tracker.pending_turns() == 0 and not tracker._by_key
    # The same id later starts a fresh session at turn 0.
    again, job = tracker.open_main_turn("a", user)
    assert again.turn_index == 0 and job is None


# ----------------------------------------------------------------------------- through the gateway



def post(env, body, session=None, turn="main", **headers):
    if session is not None:
        headers = {"X-Session-Id": session, "X-Turn-Type": turn, **headers}
    return env.http.post("/v1/chat/completions", json=body, headers=headers)


def sse_payloads(text):
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def test_openclaw_body_streams_like_openai(make_env):
    env = make_env()
    body = openclaw_body([SYSTEM, {"role": "user", "content": TURN1_USER}], store=False,
                         prompt_cache_key="agent:main:explicit:s1")
    r = post(env, body, session="s1")
    assert r.status_code == 200, r.text
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finishing] == ["stop"]
    usage = chunks[-1]  # include_usage: one last chunk with no choices and the token counts
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == len(env.pool.requests[0]["input_ids"])
    assert usage["usage"]["completion_tokens"] == len(env.pool.answers[0]["output_ids"])
    assert env.pool.requests[0]["sampling_params"]["max_new_tokens"] == 256


def session_headers(headers):
    """The plugin's headers of a recorded request (and nothing else of OpenClaw's)."""
    return {k: v for k, v in headers.items() if k.lower() in ("x-session-id", "x-turn-type", "x-session-done")}


def test_recorded_openclaw_session_through_the_gateway(make_env):
    env = make_env(max_body_bytes=1 << 20, max_prompt_tokens=1 << 16)
    # A recorded heartbeat (side, tagged by our plugin) comes between the two turns, once as recorded
    # (the agent's main session) and once under the conversation's own id: neither opens a turn.
    hb_headers, _ = recorded("heartbeat.json")
    for name, extra in (("minimal_turn1.json", {}), ("heartbeat.json", {}),
                        ("heartbeat.json", {"x-session-id": "rec-minimal"}), ("minimal_turn2.json", {}),
                        ("tool_call.json", {}), ("tool_result.json", {})):
        headers, body = recorded(name)
        r = env.http.post("/v1/chat/completions", json=body, headers={**session_headers(headers), **extra})
        assert r.status_code == 200 and sse_payloads(r.text)[-1] == "[DONE]", (name, r.text[:300])
        assert json.loads(sse_payloads(r.text)[-2])["usage"]["completion_tokens"] > 0
    env.drain()
    assert env.gateway.stats.side_turns == 2 and env.gateway.stats.main_turns == 4
    assert hb_headers["x-turn-type"] == "side" and hb_headers["x-session-id"] not in env.gateway.sessions
    assert {s.session_id for s in env.samples()} == {"rec-minimal"}
    by_session = {(s.session_id, s.turn_index): s for s in env.samples()}
    # rec-minimal turn 0 is judged by turn 2's words: the rule judge reads "No, that's wrong." as -1.
    first = by_session[("rec-minimal", 0)]
    assert first.next_state["content"] == "No, that's wrong. Show the steps." and first.reward == -1
    assert first.prompt_ids == env.pool.requests[0]["input_ids"]
    # rec-tool turn 0 (the call) gets the tool result as its next state; the rule judge finds no
    # success or error word in it, and tool results give no hint: no sample.
    assert ("rec-tool", 0) not in by_session and env.gateway.stats.judgements == 2


def test_recorded_default_profile_request_gets_the_advice(make_env):
    """Default profile, contextWindow 8192: OpenClaw asks for max_completion_tokens 1 (recorded)."""
    env = make_env(max_body_bytes=1 << 20, max_prompt_tokens=1 << 16)
    headers, body = recorded("default_turn1.json")
    assert body["max_completion_tokens"] == 1 and len(body["tools"]) == 12
    r = env.http.post("/v1/chat/completions", json=body, headers=session_headers(headers))
    assert r.status_code == 400 and 'tools.profile: "minimal"' in r.json()["error"]["message"]


def test_openclaw_tool_call_streams_in_openai_shape_and_its_results_are_the_next_state(make_env):
    env = make_env()
    env.pool.queue.append(Reply(text='Let me search.<tool_call>\n{"name": "tool_search", "arguments": '
                                     '{"query": "time"}}\n</tool_call>'))
    client = openai.OpenAI(base_url=env.url + "/v1", api_key="none", max_retries=0, timeout=30)
    history = [SYSTEM, {"role": "user", "content": TURN1_USER}]
    stream = client.chat.completions.create(
        model="smollm2", messages=history, stream=True, stream_options={"include_usage": True}, tools=TOOLS,
        tool_choice="auto", max_completion_tokens=64, extra_headers={"X-Session-Id": "t1", "X-Turn-Type": "main"})
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].type == "function" and calls[0].id
    assert calls[0].function.name == "tool_search" and json.loads(calls[0].function.arguments) == {"query": "time"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].usage is not None and not chunks[-1].choices
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Let me search."
    # OpenClaw runs the tool and sends its result (it renames the call id, as recorded).
    history += [{"role": "assistant", "content": "Let me search.", "tool_calls": [
        {"id": "call0", "type": "function", "function": {"name": "tool_search", "arguments": '{"query":"time"}'}}]},
        {"role": "tool", "content": "Error: tool search failed", "tool_call_id": "call0"}]
    assert post(env, openclaw_body(history), session="t1").status_code == 200
    env.drain()
    [sample] = env.samples()
    assert sample.next_state == {"role": "tool", "content": "Error: tool search failed", "name": "tool_search"}
    assert sample.kind == "rl" and sample.reward == -1


def test_judge_reads_the_words_and_the_prompt_keeps_the_wrapper(make_env):
    env = make_env()
    first = [SYSTEM, {"role": "user", "content": TURN1_USER}]
    post(env, openclaw_body(first), session="s1")
    second = first + [{"role": "assistant", "content": "Five."}, {"role": "user", "content": TURN2_USER}]
    post(env, openclaw_body(second), session="s1")
    env.drain()
    [sample] = env.samples()
    words = "No, that's wrong. Please answer with just the digit."
    assert sample.next_state == {"role": "user", "content": words, "raw": TURN2_USER}
    assert sample.hints == ["Please answer with just the digit."]
    # The training prompt is the exact ids the policy was given (wrapper and Runtime line included) ...
    assert sample.prompt_ids == env.pool.requests[0]["input_ids"]
    prompt_text = env.tokenizer.decode(sample.prompt_ids)
    assert TURN1_USER in prompt_text
    # ... and the teacher's hint goes after the whole user message as sent, Runtime line included.
    hinted = env.tokenizer.decode(sample.hint_prompt_ids[0])
    assert TURN1_USER + HINT_SEPARATOR + sample.hints[0] in hinted


def test_side_runs_never_train_even_in_the_session(make_env):
    env = make_env()
    first = [SYSTEM, {"role": "user", "content": TURN1_USER}]
    post(env, openclaw_body(first), session="s1")
    heartbeat = [SYSTEM, {"role": "user", "content": "[Wed 2026-11-25 09:40 UTC] Read HEARTBEAT.md if it exists. "
                                                     "Thanks, perfect."}]
    assert post(env, openclaw_body(heartbeat), session="s1", turn="side").status_code == 200
    assert post(env, openclaw_body(heartbeat), session="s1", turn="side").status_code == 200
    second = first + [{"role": "assistant", "content": "Five."}, {"role": "user", "content": TURN2_USER}]
    post(env, openclaw_body(second), session="s1")
    post(env, openclaw_body(heartbeat), session="s1", turn="side")
    env.drain()
    [sample] = env.samples()  # turn 0, paired with the main request's words, not the heartbeat's
    assert sample.turn_index == 0 and sample.next_state["content"].startswith("No, that's wrong")
    assert env.gateway.stats.side_turns == 3 and env.gateway.stats.main_turns == 2


def test_session_done_header_alone_and_the_done_endpoint(make_env):
    env = make_env(api_key="k")
    auth = {"Authorization": "Bearer k"}
    first = [SYSTEM, {"role": "user", "content": TURN1_USER}]
    for sid in ("a", "b"):
        assert post(env, openclaw_body(first), session=sid, **auth).status_code == 200
    # Only X-Session-Id and X-Session-Done (no turn type: a side request) ends the session; its last
    # main turn had no next state, so it is dropped.
    r = env.http.post("/v1/chat/completions", json=openclaw_body(first, stream=False),
                      headers={"X-Session-Id": "a", "X-Session-Done": "1", **auth})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    assert "a" not in env.gateway.sessions
    # The plugin's endpoint: same effect, idempotent, authenticated, the id checked.
    assert env.http.post("/v1/sessions/b/done").status_code == 401
    assert env.http.post("/v1/sessions/b/done", headers=auth).json() == {"session_id": "b", "ended": True,
                                                                         "dropped_turns": 1, "scored_turn": False}
    assert env.http.post("/v1/sessions/b/done", headers=auth, json={"session_id": "b", "reason": "reset"}
                         ).json()["ended"] is False
    for junk in (b"{", b'{"reason": 5}', b'{"messages": []}', b'{"messages": [{"role": "user"}]}', b'[1]'):
        r = env.http.post("/v1/sessions/b/done", headers=auth, content=junk)
        assert r.status_code == 400 and "error" in r.json()
    bad = env.http.post("/v1/sessions/" + "x" * 300 + "/done", headers=auth)
    assert bad.status_code == 400 and "session id" in bad.json()["error"]["message"]
    env.drain()
    assert env.samples() == [] and env.gateway.sessions.stats.dropped_at_session_end == 2
    # A new request with an ended id starts over at turn 0.
    r = post(env, openclaw_body(first, stream=False), session="b", **auth)
    assert r.json()["metadata"]["turn_index"] == 0


def test_done_endpoint_with_messages_scores_the_last_turn_without_a_reply(make_env):
    env = make_env()
    first = [SYSTEM, {"role": "user", "content": TURN1_USER}]
    assert post(env, openclaw_body(first, stream=False), session="c").status_code == 200
    calls = len(env.pool.requests)
    final = first + [{"role": "assistant", "content": "Five."}, {"role": "user", "content": TURN2_USER}]
    r = env.http.post("/v1/sessions/c/done", json={"reason": "closed", "messages": final})
    assert r.status_code == 200
    assert r.json() == {"session_id": "c", "ended": True, "dropped_turns": 0, "scored_turn": True}
    assert len(env.pool.requests) == calls   # nothing was generated for the closing reaction
    env.drain()
    [sample] = env.samples()
    assert sample.session_id == "c" and sample.turn_index == 0
    assert sample.next_state["content"] == person_words(TURN2_USER)
    assert "c" not in env.gateway.sessions


def test_idle_timeout_in_the_gateway(make_env):
    env = make_env(session_idle_timeout_s=0.2)
    post(env, openclaw_body([SYSTEM, {"role": "user", "content": TURN1_USER}]), session="idle")
    assert "idle" in env.gateway.sessions and env.gateway.sessions.pending_turns() == 1
    deadline = time.monotonic() + 10
    while "idle" in env.gateway.sessions and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "idle" not in env.gateway.sessions and env.gateway.sessions.pending_turns() == 0


# ----------------------------------------------------------------------------- fields and refusals

@pytest.mark.parametrize("extra, status, needle", [
    ({"store": False, "prompt_cache_key": "k", "user": "u", "metadata": {"a": "b"}, "tool_stream": True}, 200, None),
    ({"store": True}, 400, "stored completions are not served"),
    ({"top_k": 5}, 400, "unsupported field 'top_k'"),
    ({"min_p": 0.1, "repetition_penalty": 1.1}, 400, "unsupported fields 'min_p', 'repetition_penalty'"),
    ({"reasoning_effort": "high"}, 400, "\"reasoning\": false"),
    ({"tool_choice": "required"}, 400, "cannot be enforced"),
    ({"tool_choice": {"type": "function", "function": {"name": "tool_call"}}}, 400, "cannot be enforced"),
    ({"prompt_cache_key": 5}, 400, "prompt_cache_key=5 must be a string"),
    ({"parallel_tool_calls": True}, 200, None),
    ({"parallel_tool_calls": False}, 400, "parallel_tool_calls=false cannot be enforced"),
])
def test_every_field_is_honoured_or_refused(make_env, extra, status, needle):
    env = make_env()
    r = post(env, openclaw_body([{"role": "user", "content": "hi"}], **extra), session="f")
    assert r.status_code == status, r.text
    if needle:
        assert needle in r.json()["error"]["message"] and env.pool.requests == []


def test_too_long_prompts_say_which_openclaw_settings_to_use(make_env):
    env = make_env(max_prompt_tokens=64)
    r = post(env, openclaw_body([SYSTEM, {"role": "user", "content": TURN1_USER * 4}]), session="c")
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "gateway.max_prompt_tokens" in message
    for setting in ('tools.profile: "minimal"', "agents.defaults.skills: []", "skipBootstrap", "contextWindow"):
        assert message.index(setting) < OPENCLAW_SHOWS  # OpenClaw shows a provider error's first 200 characters
    # A worker's own context refusal (SGLang's words) gets the same advice.
    env = make_env()
    env.pool.queue.append(Reply(status=400, error="The input (10534 tokens) is longer than the model's context "
                                                  "length (8192 tokens)."))
    r = post(env, openclaw_body([{"role": "user", "content": "hi"}]), session="c")
    assert r.status_code == 400 and "(10534 tokens)" in r.json()["error"]["message"]
    assert r.json()["error"]["message"].index("contextWindow") < OPENCLAW_SHOWS


def test_one_token_main_turn_is_refused_with_the_advice(make_env):
    """OpenClaw with contextWindow 8192 and a prompt that fills it asks for max_completion_tokens: 1."""
    env = make_env()
    body = openclaw_body([SYSTEM, {"role": "user", "content": TURN1_USER}], max_completion_tokens=1)
    r = post(env, body, session="m")
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"
    assert "leaves no room" in r.json()["error"]["message"]
    assert r.json()["error"]["message"].index("contextWindow") < OPENCLAW_SHOWS
    assert env.pool.requests == [] and "m" not in env.gateway.sessions
    assert post(env, body, session="m", turn="side").status_code == 200   # side runs are not trained: served
    assert post(env, {**body, "max_completion_tokens": 2}, session="m").status_code == 200
    # A closing request (X-Session-Done) only carries the last answer's next state; its own reply is
    # never trained, so a 1-token budget is served (the simulated person closes sessions so).
    r = post(env, body, session="m", **{"X-Session-Done": "1"})
    assert r.status_code == 200 and "m" not in env.gateway.sessions


# ----------------------------------------------------------------------------- the embedded server

@pytest.fixture(scope="module")
def embedded(tiny_qwen3_dir):
    from openclaw_jax.inference.engine import Engine, EngineConfig
    from openclaw_jax.inference.server import InferenceServer
    from openclaw_jax.models.tokenizer import load_tokenizer
    from openclaw_jax.models.weights import load_hf_checkpoint
    from tests.helpers.server_utils import TINY_ENGINE_KW, ServerThread

    model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    tok = load_tokenizer(tiny_qwen3_dir)
    engine = Engine(model, tok, context_length=EMBEDDED_CONTEXT, seed=0, config=EngineConfig(**TINY_ENGINE_KW))
    thread = ServerThread(InferenceServer(engine, tok, model_path=str(tiny_qwen3_dir),
                                          served_model_name="smollm2").make_app()).start()
    thread.tok = tok
    yield thread
    thread.stop()


EMBEDDED_CONTEXT = 2048


def test_embedded_server_serves_openclaws_body(embedded):
    client = openai.OpenAI(base_url=embedded.url + "/v1", api_key="none", max_retries=0, timeout=120)
    body = openclaw_body([SYSTEM, {"role": "user", "content": TURN1_USER}], store=False,
                         prompt_cache_key="agent:main:explicit:s1", max_completion_tokens=8)
    chunks = list(client.chat.completions.create(**body))
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length", "tool_calls")
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens <= 8
    assert chunks[-1].usage.prompt_tokens == len(embedded.tok.apply_chat_template(
        body["messages"], tools=TOOLS, add_generation_prompt=True))


@pytest.mark.parametrize("extra, needle", [
    ({"max_completion_tokens": EMBEDDED_CONTEXT}, "Requested token count exceeds"),
    ({"messages": [{"role": "user", "content": "word " * EMBEDDED_CONTEXT}]}, "longer than the model's context"),
    ({"tool_choice": "required"}, "cannot be enforced"),
    ({"reasoning_effort": "low"}, "no reasoning mode"),
])
def test_embedded_server_refusals_say_what_to_change(embedded, extra, needle):
    body = {**openclaw_body([SYSTEM, {"role": "user", "content": "hi"}]), **extra}
    client = openai.OpenAI(base_url=embedded.url + "/v1", api_key="none", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**body)
    message = err.value.response.json()["message"]
    assert needle in message
    if "context" in needle or "token count" in needle:
        assert message.index('tools.profile: "minimal"') < message.index("contextWindow") < OPENCLAW_SHOWS


def test_replaced_sampling_is_reported_not_silent(make_env):
    env = make_env(temperature=0.7)
    for stream in (False, True):
        body = openclaw_body([{"role": "user", "content": "hi"}], stream=stream, temperature=1.0, top_p=0.7)
        main = post(env, body, session="t")
        assert main.headers["X-Sampling-Override"] == "temperature=1 -> 0.7, top_p=0.7 -> 1"
        assert env.pool.requests[-1]["sampling_params"]["temperature"] == 0.7
        assert "X-Sampling-Override" not in post(env, body, session="t", turn="side").headers  # side: as asked
        assert env.pool.requests[-1]["sampling_params"]["top_p"] == 0.7
    assert "X-Sampling-Override" not in post(env, openclaw_body([{"role": "user", "content": "hi"}]),
                                             session="t").headers
    capped = post(env, openclaw_body([{"role": "user", "content": "hi"}], max_completion_tokens=100_000), session="t")
    assert capped.headers["X-Sampling-Override"] == f"max_tokens=100000 -> {env.cfg.max_tokens_limit}"


def test_recorded_tool_result_renders_with_smollm2s_template(loop_thread, tmp_path):
    """OpenClaw sends the assistant's tool-call turn with content null; SmolLM2's template needs text."""
    from openclaw_jax.models.tokenizer import smollm2_tokenizer

    env = Env(loop_thread, smollm2_tokenizer(), tmp_path, max_body_bytes=1 << 20, max_prompt_tokens=1 << 16)
    try:
        headers, body = recorded("tool_result.json")
        assert body["messages"][-2]["content"] is None and body["messages"][-2]["tool_calls"]
        r = env.http.post("/v1/chat/completions", json=body, headers=session_headers(headers))
        assert r.status_code == 200, r.text[:500]
        prompt = env.tokenizer.decode(env.pool.requests[0]["input_ids"])
        assert "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n[" in prompt
    finally:
        env.close()
