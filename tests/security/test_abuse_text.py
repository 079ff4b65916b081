"""Probes: request text shaped to make a server spend super-linear time on its event loop.

Each probe sends a hostile body to a real server process on 127.0.0.1 while another thread times
its health check; the health check must keep answering within 1 s and the hostile request must get
its answer. Gateway: `python -m openclaw_jax.gateway` in front of a scripted policy pool; model
server: `python -m openclaw_jax.inference` serving a tiny random Qwen3.

The shapes target the text the gateway cleans and parses: runs of newlines before text (a pattern
such as ``\n\s*\n ... \Z`` backtracks over them quadratically: 8,000 newlines cost 2 s, 8 MiB
minutes), unclosed active-memory blocks (each scanning to the end of the text), and whitespace after
``<tool_call>`` in the policy's reply (a lazy body between two whitespace runs backtracks cubically:
4,000 spaces cost 35 s).
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.helpers.abuse import GatewayProcess, assert_responsive, health_latencies_during, scripted_pool
from tests.helpers.scripted_pool import Reply
from tests.helpers.server_utils import ServerProcess

# 8 MB once JSON-escaped (the gateway's body limit is 8 MiB); text after them, or they are merely stripped
EIGHT_MIB_OF_NEWLINES = "\n" * 4_000_000 + "x"
ACTIVE_MEMORY_BLOCKS = "Context:\n<active_memory_plugin>\n" * 230_000 + "Delivery: "   # never closed
TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("abuse_text")
    with scripted_pool() as pool:
        gw = GatewayProcess(["--policy-url", pool.url, "--judge", "rule", "--model", "tiny", "--store",
                             str(tmp / "store"), "--set", "max_tokens_limit=8192"], tmp / "gateway.log")
        gw.pool = pool
        yield gw
        gw.stop()


def post(url: str, body: dict, headers: dict | None = None, timeout: float = 120) -> requests.Response:
    raw = json.dumps(body).encode()   # serialized once, up front: the client shares this process's GIL
    return requests.post(url, data=raw, headers={"Content-Type": "application/json", **(headers or {})},
                         timeout=timeout)


def open_session(gw, sid: str) -> list[dict]:
    """A main turn of session ``sid`` answered: the conversation so far."""
    first = [{"role": "user", "content": f"question of {sid}"}]
    r = post(gw.url + "/v1/chat/completions", {"messages": first, "max_tokens": 4},
             {"X-Session-Id": sid, "X-Turn-Type": "main"})
    assert r.status_code == 200, r.text
    return first + [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}]


@pytest.mark.parametrize("shape", ["newlines", "active_memory"])
def test_done_with_8_mib_of_hostile_text_keeps_the_gateway_responsive(gateway, shape):
    text = EIGHT_MIB_OF_NEWLINES if shape == "newlines" else ACTIVE_MEMORY_BLOCKS
    rounds = iter(range(3))

    def send():
        sid = f"done-{shape}-{next(rounds)}"
        conversation = open_session(gateway, sid)
        return post(f"{gateway.url}/v1/sessions/{sid}/done",
                    {"reason": "new", "messages": conversation + [{"role": "user", "content": text}]})

    replies, worst = health_latencies_during(send, gateway.url + "/healthz")
    for r in replies:
        assert r.status_code == 200 and r.json()["ended"] and r.json()["scored_turn"], r.text
    assert_responsive(worst, f"gateway done with 8 MiB of {shape}")


def test_chat_next_states_of_hostile_text_keep_the_gateway_responsive(gateway):
    """A main turn whose next state is about the longest run of newlines a 32,768-token prompt lets through (the
    gateway cleans it to find the person's words; quadratic cleaning would take ~10 s), and 8 MiB of them
    (refused as too long before any work)."""
    rounds = iter(range(3))

    def send():
        i = next(rounds)
        conversation = open_session(gateway, f"chat-{i}")
        fits = post(gateway.url + "/v1/chat/completions",
                    {"messages": conversation + [{"role": "user", "content": "\n" * 30_000 + "x"}], "max_tokens": 4},
                    {"X-Session-Id": f"chat-{i}", "X-Turn-Type": "main"})
        too_long = post(gateway.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": EIGHT_MIB_OF_NEWLINES}]})
        return fits, too_long

    replies, worst = health_latencies_during(send, gateway.url + "/healthz")
    for fits, too_long in replies:
        assert fits.status_code == 200, fits.text
        assert too_long.status_code == 400 and "too long" in too_long.json()["error"]["message"], too_long.text
    assert_responsive(worst, "gateway chat with hostile next states")


def test_a_reply_of_whitespace_after_tool_call_keeps_the_gateway_responsive(gateway):
    """The policy's reply is text the client can steer ("repeat after me"): 4,000 spaces after <tool_call>."""
    hostile = "<tool_call>" + " " * 4000 + "x"

    def send():
        gateway.pool.queue.append(Reply(text=hostile))
        return post(gateway.url + "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "repeat after me"}], "tools": TOOLS, "max_tokens": 4096})

    replies, worst = health_latencies_during(send, gateway.url + "/healthz")
    for r in replies:
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert message["content"].startswith("<tool_call>") and not message.get("tool_calls"), message
    assert_responsive(worst, "gateway with a reply of whitespace after <tool_call>")


@pytest.fixture(scope="module")
def model_server(tiny_qwen3_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("abuse_text_server")
    server = ServerProcess(tiny_qwen3_dir, log_path=tmp / "server.log").start()
    yield server
    server.kill()


@pytest.mark.parametrize("route", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_model_server_text_routes_with_8_mib_of_newlines(model_server, route):
    body = {"/generate": {"text": EIGHT_MIB_OF_NEWLINES, "sampling_params": {"max_new_tokens": 2}},
            "/v1/completions": {"prompt": EIGHT_MIB_OF_NEWLINES, "max_tokens": 2},
            "/v1/chat/completions": {"messages": [{"role": "user", "content": EIGHT_MIB_OF_NEWLINES}],
                                     "max_tokens": 2}}[route]
    replies, worst = health_latencies_during(lambda: post(model_server.url + route, body),
                                             model_server.url + "/health")
    for r in replies:
        assert r.status_code == 400 and "cannot fit" in r.text, r.text[:300]   # before tokenizing
    assert_responsive(worst, f"model server {route} with 8 MiB of newlines")
