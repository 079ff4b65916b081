"""A person's turn announced before its request: the gateway's ``POST /v1/sessions/{id}/turn_starting``
(our OpenClaw plugin sends it as the person's message arrives) asks the policy server (``/expect_request``)
to hold its background work until the turn's request comes. Real gateway, real embedded server and engine
on a tiny model (tests/helpers/served_stack.py). The hold itself, on the recompute: test_prefix_cache.py."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.test_gateway_hardening import wait_for
from tests.helpers.served_stack import API_KEY, MESSAGES, Served

PERSON = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def served(tiny_qwen3_dir, tmp_path_factory):
    stack = Served(tiny_qwen3_dir, tmp_path_factory.mktemp("turn_notice"))
    yield stack
    stack.close()


def test_a_turn_notice_holds_the_policy_servers_background_work_until_the_turn_comes(served):
    http = served.http
    assert http.post("/v1/sessions/s1/turn_starting").status_code == 401  # a person's key, like any session route
    bad = http.post("/v1/sessions/%20/turn_starting", headers=PERSON)
    assert bad.status_code == 400 and "session id in the path" in bad.json()["error"]["message"], bad.text
    assert served.engine.expecting_request_s == 0
    ok = http.post("/v1/sessions/s1/turn_starting", headers=PERSON)
    assert ok.status_code == 202 and ok.json() == {"session_id": "s1", "held_s": 10.0}, ok.text
    wait_for(lambda: served.engine.expecting_request_s > 5, 10.0, "the gateway's ask to reach the engine")
    turn = http.post("/v1/chat/completions", headers={**PERSON, "X-Session-Id": "s1"},
                     json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4})
    assert turn.status_code == 200, turn.text
    assert served.engine.expecting_request_s == 0  # the turn came: the hold ended with it


def test_the_policy_servers_expect_request_route_checks_its_body(served):
    url = served.gateway.cfg.policy_urls[0]
    for body, says in (({}, '{"within_s": seconds}'), ({"within_s": "5"}, "must be a number"),
                       ({"within_s": -1}, "between 0 and 600"), ({"within_s": 1e9}, "between 0 and 600"), ([], "")):
        reply = httpx.post(url + "/expect_request", json=body, timeout=30)
        assert reply.status_code == 400 and says in reply.json()["error"]["message"], (body, reply.text)
    reply = httpx.post(url + "/expect_request", json={"within_s": 2.5}, timeout=30)
    assert reply.status_code == 200 and reply.json() == {"status": "ok", "held_s": 2.5}, reply.text
    info = httpx.get(url + "/get_server_info", timeout=30).json()
    assert 1.0 < info["expecting_request_s"] <= 2.5, info
