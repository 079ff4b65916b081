"""Gateway end to end: real servers on 127.0.0.1, the official `openai` client, the sample store.

Two policy back-ends:
  * a scripted SGLang-shaped worker (tests/helpers/scripted_pool.py) whose outputs the test
    controls (tool calls, failures, delays) and records;
  * the embedded JAX server (`python -m openclaw_jax.inference`) on a tiny random
    model, as a real subprocess, for the main three-case conversation.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.samples import SampleStore
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from openclaw_jax.models.tokenizer import tiny_test_tokenizer
from tests.helpers.scripted_pool import LoopThread, RecordingProxy, Reply, ScriptedPool, serve_app
from tests.conftest import make_tiny_qwen3_checkpoint

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HINT_MARK = "\n\n[user's hint / instruction]\n"


@pytest.fixture(scope="module")
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_test_tokenizer()


class Env:
    """A scripted policy pool + a gateway, both on the loop thread."""

    def __init__(self, loop_thread, tokenizer, tmp_path, *, judge_pool: ScriptedPool | None = None,
                 policy_urls=None, load_tokenizer: bool = False, **cfg_changes):
        self.lt = loop_thread
        self.tokenizer = tokenizer
        self.pool = ScriptedPool(tokenizer)
        self.pool_runner, self.pool_url = self.lt.run(serve_app(self.pool.app()))
        self.judge_pool = judge_pool
        self.judge_runner = None
        judge_urls: tuple[str, ...] = ()
        if judge_pool is not None:
            self.judge_runner, judge_url = self.lt.run(serve_app(judge_pool.app()))
            judge_urls = (judge_url,)
        self.store_dir = str(tmp_path / "store")
        settings_ = dict(port=0, policy_urls=tuple(policy_urls or (self.pool_url,)), judge="rule",
                         judge_urls=judge_urls, store_dir=self.store_dir, model="tiny", default_max_tokens=16,
                         request_timeout_s=5.0, pool_max_retries=1)
        if judge_pool is not None:
            settings_["judge"] = "model"
        settings_.update(cfg_changes)
        self.cfg = GatewayConfig(**settings_)
        components = {} if load_tokenizer else {"tokenizer": tokenizer}
        self.gateway, self.runner, self.url = self.lt.run(start_gateway(self.cfg, **components), timeout=120)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=self.cfg.api_key or "none", max_retries=0,
                                    timeout=30)
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def chat(self, messages, session=None, turn="main", done=False, **kw):
        headers = {}
        if session is not None:
            headers["X-Session-Id"] = session
            headers["X-Turn-Type"] = turn
        if done:
            headers["X-Session-Done"] = "true"
        return self.client.chat.completions.create(model="tiny", messages=messages, extra_headers=headers, **kw)

    def drain(self):
        self.lt.run(self.gateway.drain(30))

    def samples(self):
        with SampleStore(self.store_dir, readonly=True) as store:
            return store.read(0)

    def answer_for(self, prompt_ids):
        """The pool's final answer to the request whose input_ids were prompt_ids."""
        hits = [a for r, a in self.pool.exchanges if r.get("input_ids") == prompt_ids]
        assert len(hits) == 1, f"expected exactly one pool request with these prompt ids, found {len(hits)}"
        return hits[0]

    def close(self):
        self.client.close()
        self.http.close()
        self.lt.run(stop_gateway(self.gateway, self.runner, grace_s=5))
        self.lt.run(self.pool_runner.cleanup())
        if self.judge_runner is not None:
            self.lt.run(self.judge_runner.cleanup())


@pytest.fixture
def make_env(loop_thread, tokenizer, tmp_path):
    envs = []

    def make(**kw):
        env = Env(loop_thread, tokenizer, tmp_path / f"env{len(envs)}", **kw)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def render(tokenizer, messages, tools=None):
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)


# ----------------------------------------------------------------------------- the three cases

def scripted_conversation(env):
    """Two interleaved main sessions plus a side turn; returns {(session, turn): messages sent}."""
    sent = {}
    s1 = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
    s2 = [SYSTEM, {"role": "user", "content": "Write a haiku."}]

    def turn(session, history, index, **kw):
        reply = env.chat(history, session=session, **kw)
        sent[(session, index)] = [dict(m) for m in history]
        return reply.choices[0].message.content

    r = turn("s1", s1, 0)
    r2 = turn("s2", s2, 0)
    s1 += [{"role": "assistant", "content": r},
           {"role": "user", "content": "No, that's wrong. You should answer in French."}]
    r = turn("s1", s1, 1)                                  # s1 turn 0: eval -1 + hint -> opd+rl
    # A side turn in the middle of s1 neither scores nor consumes anything.
    env.chat([SYSTEM, {"role": "user", "content": "Thanks, perfect! Summarise this."}], session="s1", turn="side")
    s2 += [{"role": "assistant", "content": r2}, {"role": "user", "content": "That is wrong, redo it."}]
    r2 = turn("s2", s2, 1)                                 # s2 turn 0: eval -1, no hint -> rl
    s1 += [{"role": "assistant", "content": r}, {"role": "user", "content": "Thanks, that's perfect!"}]
    r = turn("s1", s1, 2)                                  # s1 turn 1: eval +1 -> rl
    s1 += [{"role": "assistant", "content": r},
           {"role": "user", "content": "For future reference: please always use bullet points for lists."}]
    r = turn("s1", s1, 3)                                  # s1 turn 2: hint only -> opd
    s1 += [{"role": "assistant", "content": r}, {"role": "user", "content": "Interesting."}]
    r = turn("s1", s1, 4)                                  # s1 turn 3: eval 0, no hint -> nothing
    s1 += [{"role": "assistant", "content": r}, {"role": "user", "content": "Great, thanks. Bye!"}]
    turn("s1", s1, 5, done=True)                           # s1 turn 4: +1 -> rl; turn 5 dropped (end)
    # s2 ends without a next state for its turn 1: dropped at session end.
    s2 += [{"role": "assistant", "content": r2}, {"role": "user", "content": "ok"}]
    turn("s2", s2, 2, done=True)                           # s2 turn 1: eval 0 -> nothing; turn 2 dropped
    return sent


EXPECTED = {
    ("s1", 0): ("opd+rl", -1, ["You should answer in French."]),
    ("s2", 0): ("rl", -1, []),
    ("s1", 1): ("rl", 1, []),
    ("s1", 2): ("opd", 0, ["For future reference: please always use bullet points for lists."]),
    ("s1", 4): ("rl", 1, []),
}


def check_samples(env, samples, sent, answer_of):
    got = {(s.session_id, s.turn_index): s for s in samples}
    assert set(got) == set(EXPECTED), f"sample keys {sorted(got)} != {sorted(EXPECTED)}"
    assert len(samples) == len(EXPECTED)
    for key, (kind, reward, hints) in EXPECTED.items():
        s = got[key]
        assert (s.kind, s.reward, s.hints) == (kind, reward, hints), key
        # Exact prompt tokens: the chat template over exactly the messages the agent sent.
        assert s.prompt_ids == render(env.tokenizer, sent[key])
        out_ids, out_lps, version = answer_of(s.prompt_ids)
        assert s.response_ids == out_ids and s.rollout_logprobs == out_lps
        assert s.weight_version == version
        assert s.judge == "rule" and len(s.judge_raw["eval"]) == 1
        # Hint-augmented prompt: the hint appended to the last user message, re-rendered.
        for hint, ids in zip(s.hints, s.hint_prompt_ids):
            msgs = [dict(m) for m in sent[key]]
            last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
            msgs[last_user]["content"] = msgs[last_user]["content"] + HINT_MARK + hint
            assert ids == render(env.tokenizer, msgs)
            assert ids != s.prompt_ids
    assert got[("s1", 0)].next_state == {"role": "user", "content": "No, that's wrong. You should answer in French."}


def test_three_cases_interleaved_sessions_and_session_end_scripted_pool(make_env):
    env = make_env()
    sent = scripted_conversation(env)
    env.drain()

    def answer_of(prompt_ids):
        a = env.answer_for(prompt_ids)
        return a["output_ids"], [e[0] for e in a["meta_info"]["output_token_logprobs"]], a["meta_info"]["weight_version"]

    check_samples(env, env.samples(), sent, answer_of)
    # Main turns are sampled with the gateway's temperature, and ask for log-probs.
    main_requests = [r for r in env.pool.requests if r["return_logprob"]]
    assert len(main_requests) == len(env.pool.requests)
    assert all(r["sampling_params"]["temperature"] == env.cfg.temperature for r in main_requests)
    assert env.gateway.sessions.pending_turns() == 0 and len(env.gateway.sessions) == 0


@pytest.fixture(scope="module")
def embedded_server(tmp_path_factory):
    """`python -m openclaw_jax.inference` on a tiny random Qwen3 (tiny tokenizer), as a subprocess."""
    model_dir = make_tiny_qwen3_checkpoint(tmp_path_factory.mktemp("gw_model") / "model", seed=3,
                                           max_positions=2048)
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_jax.inference", "--model", str(model_dir),
                             "--port", "0", "--weight-version", "v3", "--log-level", "warning",
                             # one prompt bucket and one cache bucket: few compilations on a small CPU
                             "--min-prompt-bucket", "1024", "--min-cache-bucket", "2048"],
                            stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY "), f"embedded server did not start: {line!r}"
        yield line.split()[1], str(model_dir)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stdout.close()


@pytest.mark.timeout(600)
def test_three_cases_with_the_embedded_server_and_openai_client(make_env, loop_thread, embedded_server):
    """The Done-when scenario on the real embedded JAX server: samples hold exactly what it returned."""
    server_url, model_dir = embedded_server
    proxy = RecordingProxy(server_url)
    runner, proxy_url = loop_thread.run(serve_app(proxy.app()))
    try:
        env = make_env(policy_urls=[proxy_url], model=model_dir, load_tokenizer=True, request_timeout_s=300.0)
        sent = scripted_conversation(env)
        # One more session, streamed, so the streaming path is covered on the real server too.
        # long enough that the closing request reuses at least one whole cached block (64 tokens)
        history = [SYSTEM, {"role": "user", "content": "Count to three, then say which number comes after three."}]
        chunks = list(env.chat(history, session="s3", stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        sent[("s3", 0)] = [dict(m) for m in history]
        closing = env.chat(history + [{"role": "assistant", "content": text},
                                      {"role": "user", "content": "Thanks, that's perfect!"}], session="s3", done=True)
        env.drain()
    finally:
        loop_thread.run(runner.cleanup())
        loop_thread.run(proxy.close())

    def answer_of(prompt_ids):
        hits = [body for payload, body in proxy.exchanges if payload["input_ids"] == prompt_ids]
        assert len(hits) == 1
        body = hits[0]
        return body["output_ids"], [e[0] for e in body["meta_info"]["output_token_logprobs"]], \
            body["meta_info"]["weight_version"]

    # the server's prefix-cache hits reach the client as OpenAI's usage.prompt_tokens_details.cached_tokens
    streamed_meta, closing_meta = proxy.exchanges[-2][1]["meta_info"], proxy.exchanges[-1][1]["meta_info"]
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == streamed_meta["cached_tokens"]
    assert closing.usage.prompt_tokens_details.cached_tokens == closing_meta["cached_tokens"] > 0

    samples = env.samples()
    streamed = [s for s in samples if s.session_id == "s3"]
    assert [(s.kind, s.reward) for s in streamed] == [("rl", 1)]
    s3_ids, s3_lps, _ = answer_of(streamed[0].prompt_ids)
    assert streamed[0].response_ids == s3_ids and streamed[0].rollout_logprobs == s3_lps
    assert env.tokenizer.decode(s3_ids, skip_special_tokens=True) == text
    check_samples(env, [s for s in samples if s.session_id != "s3"], sent, answer_of)
    assert all(s.weight_version == "v3" for s in samples)
    assert all(p["sampling_params"]["temperature"] == env.cfg.temperature for p, _ in proxy.exchanges)


def test_streaming_is_token_by_token_and_recorded_exactly(make_env):
    env = make_env()
    env.pool.queue.append(Reply(text="abcdefghij"))
    history = [SYSTEM, {"role": "user", "content": "Say the alphabet."}]
    stream = env.chat(history, session="st", stream=True, stream_options={"include_usage": True}, max_tokens=32)
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == "abcdefghij"
    assert len(deltas) >= 5  # token by token, not one blob at the end
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].usage.completion_tokens == len(env.pool.answers[0]["output_ids"])
    env.chat(history + [{"role": "assistant", "content": "abcdefghij"},
                        {"role": "user", "content": "Thanks, perfect."}], session="st")
    env.drain()
    [sample] = env.samples()
    answer = env.pool.answers[0]
    assert sample.response_ids == answer["output_ids"]
    assert sample.rollout_logprobs == [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
    assert sample.prompt_ids == render(env.tokenizer, history)
    assert sample.kind == "rl" and sample.reward == 1


def test_stream_with_stop_string_holds_back_the_partial_stop(make_env):
    env = make_env()
    # The scripted worker ignores stop strings; the gateway must not stream text past what the
    # final answer contains, so we hold back len(stop)-1 characters until the end.
    env.pool.queue.append(Reply(text="abcdefgh"))
    stream = env.chat([{"role": "user", "content": "x"}], stream=True, stop=["xyz"], max_tokens=32)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "abcdefgh"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
TOOL_TEXT = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_round_trip(make_env, stream):
    env = make_env()
    env.pool.queue.append(Reply(text=TOOL_TEXT))
    history = [SYSTEM, {"role": "user", "content": "Weather in Paris?"}]
    if stream:
        chunks = list(env.chat(history, session="t", tools=TOOLS, stream=True, max_tokens=64))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert "<tool_call>" not in content and content.strip() == "Let me check."
        name, arguments, call_id = calls[0].function.name, calls[0].function.arguments, calls[0].id
    else:
        reply = env.chat(history, session="t", tools=TOOLS, max_tokens=64)
        msg = reply.choices[0].message
        assert msg.content == "Let me check."
        finish = [reply.choices[0].finish_reason]
        calls = msg.tool_calls
        name, arguments, call_id = calls[0].function.name, calls[0].function.arguments, calls[0].id
    assert len(calls) == 1 and finish == ["tool_calls"]
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    # The agent runs the tool and sends the result: the tool message is the next state.
    history += [{"role": "assistant", "content": "Let me check.",
                 "tool_calls": [{"id": call_id, "type": "function",
                                 "function": {"name": name, "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": call_id, "content": "Error: weather service not found"}]
    env.chat(history, session="t", tools=TOOLS)
    env.drain()
    [sample] = env.samples()
    assert sample.kind == "rl" and sample.reward == -1
    assert sample.next_state["role"] == "tool"
    assert sample.response_ids == env.pool.answers[0]["output_ids"]
    assert env.tokenizer.decode(sample.response_ids, skip_special_tokens=True) == TOOL_TEXT


def test_models_healthz_and_api_key(make_env):
    env = make_env(api_key="s3cret-key")
    assert env.http.get("/healthz").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"},
                    {"Authorization": "Bearer s3cret-keyy"}, {"Authorization": "Basic s3cret-key"}):
        r = env.http.post("/v1/chat/completions", headers=headers,
                          json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert env.http.get("/v1/models", headers=headers).status_code == 401
    models = env.client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    reply = env.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    bad = openai.OpenAI(base_url=env.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])


BAD_BODIES = [
    b"", b"{", b"[]", b"null", b"42", b'"text"', b"\xff\xfe", b'{"messages": NaN}',
    b'{"messages": []}', b'{"messages": "hi"}', b'{"messages": [1]}', b'{"messages": [{}]}',
    b'{"messages": [{"role": "wizard", "content": "hi"}]}',
    b'{"messages": [{"role": "user"}]}',
    b'{"messages": [{"role": "user", "content": 5}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": true}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 9}',
    b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 0}',
    b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}',
    b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "stop": [1]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "tools": {}}',
    b'{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "session_id": 5, "turn_type": "main"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "turn_type": "main"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "session_done": "maybe", "session_id": "a"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"chat_template": "{{x}}"}}',
    b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", '
    b'"arguments": "{not json"}}]}, {"role": "user", "content": "hi"}]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "seed": 1' + b"0" * 30 + b"}",
    b"[" * 100000 + b"]" * 100000,
]


@pytest.mark.parametrize("raw", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_bad_bodies_are_400_with_openai_error(make_env, raw):
    env = make_env()
    r = env.http.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert env.pool.requests == []  # nothing reached the policy


@pytest.mark.parametrize("headers", [
    {"X-Turn-Type": "primary", "X-Session-Id": "a"},
    {"X-Turn-Type": "main"},                                   # main turn without a session
    {"X-Session-Id": "a", "X-Session-Done": "perhaps"},
    {"X-Session-Id": "a" * 300, "X-Turn-Type": "main"},
    {"X-Session-Id": "", "X-Turn-Type": "main"},
    {"X-Session-Done": "1"},                                   # end of which session?
])
def test_bad_session_headers_are_400(make_env, headers):
    env = make_env()
    r = env.http.post("/v1/chat/completions", headers=headers, json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] in ("session_id", "turn_type", None)


def test_oversize_body_is_413_and_unknown_routes_are_json(make_env):
    env = make_env(max_body_bytes=4096)
    big = {"messages": [{"role": "user", "content": "x" * 10000}]}
    r = env.http.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

    # Chunked upload (no Content-Length): aiohttp's own limit, still our JSON shape.
    def chunks():
        for _ in range(10):
            yield b"x" * 1000

    r = env.http.post("/v1/chat/completions", content=chunks())
    assert r.status_code == 413 and "error" in r.json()
    r = env.http.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = env.http.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()
    # Still serving.
    assert env.chat([{"role": "user", "content": "hi"}]).choices[0].message.content is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pool_down_is_503_and_no_sample(make_env):
    env = make_env(policy_urls=[f"http://127.0.0.1:{free_port()}"])
    history = [{"role": "user", "content": "hello"}]
    with pytest.raises(openai.APIStatusError) as info:
        env.chat(history, session="d")
    assert info.value.status_code == 503
    assert "no healthy worker" in info.value.body["message"] if isinstance(info.value.body, dict) else True
    with pytest.raises(openai.APIStatusError) as info:
        env.chat(history, session="d", stream=True)
    assert info.value.status_code == 503
    env.drain()
    assert env.samples() == []
    assert env.http.get("/healthz").json()["policy"]["healthy"] == []


@pytest.mark.parametrize("reply,status", [
    (Reply(status=500), 502),                 # retried, then given up
    (Reply(status=400, error="prompt too long"), 400),
    (Reply(delay_s=3.0), 504),                # over request_timeout_s
    (Reply(abort=True), 502),
])
def test_pool_failures_map_to_status_and_record_nothing(make_env, reply, status):
    env = make_env(request_timeout_s=1.0)
    env.pool.default = reply
    first = [{"role": "user", "content": "hello"}]
    with pytest.raises(openai.APIStatusError) as info:
        env.chat(first, session="f")
    assert info.value.status_code == status
    # The failed turn is never scored, even when a next state follows.
    env.pool.default = Reply()
    env.chat(first + [{"role": "assistant", "content": "?"}, {"role": "user", "content": "Thanks, perfect."}],
             session="f")
    env.drain()
    assert env.samples() == []
    assert env.gateway.stats.pool_errors >= 1


def test_stream_broken_mid_way_reports_error_in_band_and_records_nothing(make_env):
    env = make_env()
    env.pool.queue.append(Reply(text="abcdefghijklmnop", break_after=3))
    history = [{"role": "user", "content": "go"}]
    with env.http.stream("POST", "/v1/chat/completions", headers={"X-Session-Id": "b", "X-Turn-Type": "main"},
                         json={"messages": history, "stream": True, "max_tokens": 64}) as resp:
        assert resp.status_code == 200
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert any('"content":"a' in e.replace(" ", "") for e in events)  # partial output was streamed
    error = json.loads(events[-2][6:])["error"]
    assert error["code"] == 502 and "broke" in error["message"]
    assert events[-1] == "data: [DONE]"
    env.chat(history + [{"role": "assistant", "content": "abc"}, {"role": "user", "content": "Thanks, perfect."}],
             session="b")
    env.drain()
    assert env.samples() == []


def test_client_disconnect_mid_stream_records_nothing(make_env):
    env = make_env()
    env.pool.queue.append(Reply(text="abcdefghijklmnopqrstuvwxyz"))
    env.pool.stream_chunk_delay_s = 0.05
    history = [{"role": "user", "content": "go"}]
    with env.http.stream("POST", "/v1/chat/completions", headers={"X-Session-Id": "c", "X-Turn-Type": "main"},
                         json={"messages": history, "stream": True, "max_tokens": 64}) as resp:
        for line in resp.iter_lines():
            if '"content":"a' in line.replace(" ", ""):
                break  # hang up after the first token
    time.sleep(2.0)
    env.chat(history + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "Thanks, perfect."}],
             session="c")
    env.drain()
    assert env.samples() == []


def test_model_judge_votes_and_hints_through_a_judge_pool(make_env, tokenizer):
    judge_pool = ScriptedPool(tokenizer)
    answers = {"eval": ["\\boxed{-1}", "\\boxed{-1}", "\\boxed{1}"],
               "hint": ["\\boxed{1} [HINT_START]Answer in French, please.[HINT_END]",
                        "\\boxed{1} [HINT_START]Reply in French.[HINT_END]",
                        "\\boxed{1} [HINT_START]Reply in French.[HINT_END]"]}
    counters = {"eval": 0, "hint": 0}

    def responder(prompt_text):
        kind = "hint" if "[HINT_START]" in prompt_text else "eval"
        text = answers[kind][counters[kind] % 3]
        counters[kind] += 1
        return Reply(text=text)

    judge_pool.responder = responder
    env = make_env(judge_pool=judge_pool, judge_votes=3, judge_max_new_tokens=200)
    history = [SYSTEM, {"role": "user", "content": "Capital of France?"}]
    r = env.chat(history, session="m").choices[0].message.content
    history += [{"role": "assistant", "content": r}, {"role": "user", "content": "Wrong language!"}]
    env.chat(history, session="m")
    env.drain()
    [s] = env.samples()
    assert s.kind == "opd+rl" and s.reward == -1
    assert s.eval_votes == [-1, -1, 1] or sorted(s.eval_votes) == [-1, -1, 1]
    assert s.hints == ["Reply in French.", "Answer in French, please."]
    assert len(s.judge_raw["eval"]) == 3 and len(s.judge_raw["hint"]) == 3
    assert s.judge.startswith("model")
    judge_requests = judge_pool.requests
    assert len(judge_requests) == 6
    assert len({r["sampling_params"]["sampling_seed"] for r in judge_requests}) == 6
    assert all(r["sampling_params"]["temperature"] == env.cfg.judge_temperature for r in judge_requests)
    # The judge saw the reply and the next state.
    eval_prompt = tokenizer.decode(judge_requests[0]["input_ids"])
    assert r in eval_prompt and "Wrong language!" in eval_prompt


def test_judge_never_blocks_user_requests(make_env, tokenizer):
    judge_pool = ScriptedPool(tokenizer, default=Reply(text="\\boxed{1}", delay_s=4.0))
    env = make_env(judge_pool=judge_pool, judge_votes=2)
    history = [{"role": "user", "content": "q"}]
    for i in range(4):
        r = env.chat(history, session="slow").choices[0].message.content
        history += [{"role": "assistant", "content": r}, {"role": "user", "content": f"next {i}"}]
    # Three judgements are now running on a judge that takes 4 s per vote; users are not held up.
    t0 = time.perf_counter()
    for _ in range(3):
        env.chat([{"role": "user", "content": "quick"}], session="other", turn="side")
    assert time.perf_counter() - t0 < 2.0
    assert env.gateway._active_jobs + env.gateway._queue.qsize() >= 1
    env.drain()
    assert len(env.samples()) == 3


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)


def weighted(common, rare, rare_in_10=1):
    """``common`` nine times in ten (by default), else ``rare``."""
    return st.sampled_from(range(10)).flatmap(lambda i: rare if i < rare_in_10 else common)


def maybe(valid):
    """Mostly valid values, sometimes anything at all."""
    return weighted(valid, JSON_VALUES)


TEXT = st.text(max_size=40)
GOOD_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant"]),
                                      "content": TEXT})
TOOL_CALL = st.fixed_dictionaries({"id": maybe(TEXT), "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": maybe(st.sampled_from(["get_weather", ""])),
     "arguments": maybe(st.sampled_from(['{"city": "Paris"}', "{}", "", "[1]", "{bad"]))})})
ODD_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "bogus", "USER", 3, None])},
    optional={"content": maybe(TEXT | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                                        "text": maybe(TEXT)}), max_size=2)),
              "tool_calls": maybe(st.lists(TOOL_CALL, max_size=2)), "name": maybe(TEXT),
              "tool_call_id": maybe(TEXT)})
BODY = st.fixed_dictionaries(
    {"messages": maybe(st.lists(weighted(GOOD_MESSAGE, ODD_MESSAGE, 3), min_size=1, max_size=4))},
    optional={"model": maybe(TEXT), "max_tokens": maybe(st.integers(1, 40)), "temperature": maybe(st.floats(0, 2)),
              "top_p": maybe(st.floats(0.01, 1)), "stream": maybe(st.booleans()),
              "stop": maybe(st.lists(TEXT, max_size=3) | TEXT), "tools": maybe(st.just(TOOLS)),
              "tool_choice": maybe(st.sampled_from(["auto", "none", "required"])),
              "logprobs": maybe(st.booleans()), "top_logprobs": maybe(st.integers(0, 20)),
              "seed": maybe(st.integers(-2**63, 2**63 - 1)), "session_id": maybe(st.sampled_from(["b1", "b2"])),
              "turn_type": maybe(st.sampled_from(["main", "side"])), "session_done": maybe(st.booleans()),
              "stream_options": maybe(st.fixed_dictionaries({"include_usage": st.booleans()})),
              "n": maybe(st.just(1)), "presence_penalty": maybe(st.just(0)),
              "chat_template_kwargs": maybe(st.dictionaries(st.sampled_from(["enable_thinking", "x"]), JSON_VALUES)),
              "response_format": maybe(st.just({"type": "text"}))})
# Printable ASCII without surrounding whitespace: what an HTTP client will put on the wire.
HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30).map(str.strip)
HEADERS = st.fixed_dictionaries({}, optional={
    "X-Session-Id": weighted(st.sampled_from(["h1", "h2"]), HEADER_TEXT),
    "X-Turn-Type": weighted(st.sampled_from(["main", "side", "MAIN", "Side"]), HEADER_TEXT),
    "X-Session-Done": weighted(st.sampled_from(["1", "true", "no", "0", "off"]), HEADER_TEXT),
    "Content-Type": HEADER_TEXT, "Authorization": HEADER_TEXT})


def test_fuzzed_bodies_and_headers_never_5xx(make_env):
    env = make_env(default_max_tokens=4)

    statuses = []

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    @given(body=weighted(BODY, st.one_of(JSON_VALUES, st.binary(max_size=40)), 2), headers=HEADERS)
    def check(body, headers):
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = env.http.post("/v1/chat/completions", content=content, headers=headers)
        statuses.append(r.status_code)
        assert r.status_code < 500, (r.status_code, r.text, content[:300], headers)
        if r.status_code >= 400:
            assert "error" in r.json()
        elif isinstance(body, dict) and body.get("stream") is True:
            assert r.text.rstrip().endswith("data: [DONE]")
        else:
            assert r.json()["choices"][0]["message"]["role"] == "assistant"

    check()
    # The fuzz reached the success path too, not only validation errors.
    assert statuses.count(200) >= 20 and statuses.count(400) >= 20
    assert env.chat([{"role": "user", "content": "still there?"}]).choices[0].message.content is not None
    env.drain()  # the judge coped with whatever the fuzz produced
    assert env.http.get("/healthz").json()["stats"]["requests"] >= 300
    assert env.gateway.stats.judge_errors == 0


def test_client_that_hangs_up_before_the_reply_is_not_trained_on(make_env):
    env = make_env()
    env.pool.queue.append(Reply(delay_s=1.5))
    history = [{"role": "user", "content": "slow one"}]
    with pytest.raises(httpx.ReadTimeout):
        env.http.post("/v1/chat/completions", json={"messages": history}, timeout=0.5,
                      headers={"X-Session-Id": "h", "X-Turn-Type": "main"})
    time.sleep(1.5)  # the gateway finishes generating for a client that is gone
    env.chat(history + [{"role": "assistant", "content": "?"}, {"role": "user", "content": "Thanks, perfect."}],
             session="h")
    env.drain()
    assert env.samples() == []
    assert env.gateway.sessions.stats.failed_turns == 1
