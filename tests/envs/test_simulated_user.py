"""Simulated user: session protocol against a scripted OpenAI-compatible asyncio server, and
(when the gateway and inference server exist) end to end through the real processes."""

from __future__ import annotations

import asyncio
import time
import json
import math

import pytest
from aiohttp import web

from openclaw_jax.envs import personas as P
from openclaw_jax.envs.questions import Question, heldout_questions
from openclaw_jax.envs.simulated_user import (
    SimulatedUser,
    SimulatedUserConfig,
    preference_score,
)

QS = [Question(f"q{i}", f"What is {i} + {i}?", str(2 * i), "arithmetic", "train") for i in range(20)]


class ScriptedServer:
    """A real aiohttp server speaking the OpenAI chat shape. It answers "It is N." unless the last
    user message asks to begin with "Sure", then "Sure, it is N." -- a model that follows hints."""

    def __init__(self):
        self.requests: list[tuple[dict, dict]] = []
        self.fail_after: int | None = None

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model", "created": 0, "owned_by": "test"}]})

    async def chat(self, request):
        body = await request.json()
        self.requests.append((request.headers.copy(), body))  # case-insensitive
        if self.fail_after is not None and len(self.requests) > self.fail_after:
            return web.json_response({"object": "error", "message": "boom", "type": "BadRequestError", "param": None, "code": 400}, status=400)
        last_user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        text = "Sure, it is 7." if 'begin your answer with "Sure"' in last_user else "It is 7."
        return web.json_response({
            "id": f"c{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        })


async def _serve(server: ScriptedServer):
    app = web.Application()
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    return runner


def with_scripted(test):
    """Run `async test(server)` with a live scripted server on an ephemeral port."""

    async def main():
        server = ScriptedServer()
        runner = await _serve(server)
        try:
            return await test(server)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def _messages(req):
    return [(m["role"], m["content"]) for m in req[1]["messages"]]


def test_session_protocol_correction_retry_and_close():
    persona = P.make_persona("starts_with", prefix="Sure")
    cfg = SimulatedUserConfig(turns_per_session=3, max_attempts_per_question=2, concurrency=1, max_tokens=17,
                              temperature=0.7, seed=3, system_prompt="Be brief.")

    async def test(server):
        async with SimulatedUser(persona, QS, base_url=server.url, config=cfg, session_prefix="s") as user:
            stats = await user.run(1)
        return server, user, stats

    server, user, stats = with_scripted(test)
    reqs = server.requests
    assert len(reqs) == 3  # first answer, retry after the correction, closing request
    for h, body in reqs:
        assert h["X-Session-Id"] == "s-0" and h["X-Turn-Type"] == "main"
        assert body["model"] == "scripted"  # resolved from /v1/models
        assert body["temperature"] == 0.7
    assert "X-Session-Done" not in reqs[0][0] and "X-Session-Done" not in reqs[1][0]
    assert reqs[2][0]["X-Session-Done"] == "1"
    assert [b["max_tokens"] for _, b in reqs] == [17, 17, 1]
    assert _messages(reqs[0]) == [("system", "Be brief."), ("user", QS[0].text)]
    # the correction is the next state of the first answer: the last user message of request 2
    m1 = _messages(reqs[1])
    assert m1[:3] == [("system", "Be brief."), ("user", QS[0].text), ("assistant", "It is 7.")]
    assert m1[3][0] == "user" and 'Please begin your answer with "Sure".' in m1[3][1]
    # the closing request carries the reaction to the retry (thanks) as the last message
    m2 = _messages(reqs[2])
    assert m2[:4] == m1 and m2[4] == ("assistant", "Sure, it is 7.")
    assert m2[5][0] == "user" and "thank" in m2[5][1].lower()
    r = user.results[0]
    assert [(t.attempt, t.satisfied) for t in r.turns] == [(0, False), (1, True)]
    assert r.closed and r.error is None and r.requests == 3
    assert stats.first_answers == 1 and stats.first_answer_satisfaction == 0.0
    assert stats.turns == 2 and stats.satisfied_turns == 1


def test_turn_budget_and_questions_per_session():
    # keyword persona: the scripted model never says "banana", so every answer is corrected.
    persona = P.make_persona("keyword", word="banana")
    cfg = SimulatedUserConfig(turns_per_session=5, max_attempts_per_question=2, questions_per_session=2,
                              concurrency=1, seed=0)

    async def test(server):
        async with SimulatedUser(persona, QS, base_url=server.url, config=cfg, session_prefix="t") as user:
            await user.run(1)
        return server, user

    server, user = with_scripted(test)
    r = user.results[0]
    # q0 twice (attempt limit), q1 twice, then the question list is used up: 4 answers + close
    assert [(t.question_id, t.attempt) for t in r.turns] == [("q0", 0), ("q0", 1), ("q1", 0), ("q1", 1)]
    assert r.requests == 5 and r.closed
    third = _messages(server.requests[2])[-1][1]
    assert third.endswith("Next question: " + QS[1].text) and 'word "banana"' in third
    assert server.requests[-1][0]["X-Session-Done"] == "1"

    cfg = SimulatedUserConfig(turns_per_session=3, max_attempts_per_question=10, concurrency=1)

    async def test2(server):
        async with SimulatedUser(persona, QS, base_url=server.url, config=cfg) as user:
            await user.run(1)
        return server, user

    server, user = with_scripted(test2)
    assert len(user.results[0].turns) == 3 and len(server.requests) == 4  # bounded by turns_per_session


def test_concurrent_sessions_are_reproducible_by_seed():
    persona = P.make_persona("starts_with", prefix="Sure")
    cfg = SimulatedUserConfig(turns_per_session=2, concurrency=4, seed=11)

    async def test(server):
        async with SimulatedUser(persona, QS, base_url=server.url, config=cfg, session_prefix="c") as user:
            await user.run(6)
        return sorted((h["X-Session-Id"], json.dumps(b, sort_keys=True)) for h, b in server.requests)

    a, b = with_scripted(test), with_scripted(test)
    assert a == b
    assert len({sid for sid, _ in a}) == 6
    # questions are handed out in session order whatever the interleaving
    firsts = {sid: json.loads(body)["messages"][0]["content"] for sid, body in a}
    assert [firsts[f"c-{i}"] for i in range(6)] == [q.text for q in QS[:6]]
    cfg2 = SimulatedUserConfig(turns_per_session=2, concurrency=4, seed=12)

    async def test_other_seed(server):
        async with SimulatedUser(persona, QS, base_url=server.url, config=cfg2, session_prefix="c") as user:
            await user.run(6)
        return sorted((h["X-Session-Id"], json.dumps(b, sort_keys=True)) for h, b in server.requests)

    assert with_scripted(test_other_seed) != a  # reactions and request seeds follow the seed


def test_server_errors_end_the_session_and_are_counted():
    persona = P.make_persona("starts_with", prefix="Sure")

    async def test(server):
        server.fail_after = 1
        async with SimulatedUser(persona, QS, base_url=server.url, config=SimulatedUserConfig(concurrency=1)) as user:
            stats = await user.run(2)
        return user, stats

    user, stats = with_scripted(test)
    assert stats.failed_sessions == 2 and stats.sessions == 2
    assert "400" in user.results[0].error or "boom" in user.results[0].error
    assert stats.first_answers == 1  # the one answer that came back before the failures


def test_preference_score_uses_greedy_side_turns():
    async def test(server):
        sure = await preference_score(server.url, P.make_persona("starts_with", prefix="Sure"), QS[:5], max_tokens=9)
        it = await preference_score(server.url, P.make_persona("starts_with", prefix="It"), QS[:5], max_tokens=9)
        return server, sure, it

    server, sure, it = with_scripted(test)
    assert sure.score == 0.0 and it.score == 1.0 and it.n == 5
    for h, body in server.requests:
        assert h["X-Turn-Type"] == "side" and h["X-Session-Done"] == "1"
        assert body["temperature"] == 0.0 and body["max_tokens"] == 9
        assert len(body["messages"]) == 1
    assert len({h["X-Session-Id"] for h, _ in server.requests}) == 10


def test_env_runner_from_the_experiment_config(tmp_path):
    """`runs.users.env_runner` hands the envs their own `env:` section plus the values they need from
    the rest of the run (the gateway's temperature, the backlog of two steps' samples, the policy's
    batch size for the held-out concurrency)."""
    from openclaw_jax.config import ExperimentConfig
    from openclaw_jax.envs.config import EnvConfig
    from openclaw_jax.runs.users import env_runner

    cfg = ExperimentConfig(run_dir=str(tmp_path), env=EnvConfig(persona="concise", questions="arithmetic",
                                                                concurrency=3, heldout_questions=2))
    runner = env_runner(cfg, "http://127.0.0.1:9/", store_dir=str(tmp_path / "samples"), offset_fn=lambda: 0)
    try:
        assert runner.env is cfg.env and runner.base_url == "http://127.0.0.1:9/v1" and runner.daemon is None
        assert runner.people[0].persona.name == "concise" and len(runner.heldout) == 2
        (person,) = runner.people
        assert person.person_id == "" and person.user.config.person_id == ""   # one person, who names nobody
        assert person.user.config.temperature == cfg.gateway.temperature and person.user.config.concurrency == 3
        assert runner.backlog == 2 * 4  # two steps of the trainer's default 4 samples
        assert runner.policy_batch_size == cfg.policy.max_batch_size
    finally:
        asyncio.run(runner.close())


def test_stats_nan_before_answers():
    from openclaw_jax.envs.simulated_user import UserStats

    assert math.isnan(UserStats().first_answer_satisfaction)


def test_stats_and_preference_score_reach_tensorboard(tmp_path):
    from tensorboardX import SummaryWriter

    from tests.helpers.tb_events import read_event_tags

    persona = P.make_persona("starts_with", prefix="Sure")

    async def test(server):
        writer = SummaryWriter(str(tmp_path))
        async with SimulatedUser(persona, QS, base_url=server.url, config=SimulatedUserConfig(concurrency=2)) as user:
            await user.run(4, writer=writer, step=7)
        await preference_score(server.url, persona, QS[:4], writer=writer, step=9)
        writer.close()

    with_scripted(test)
    tags = read_event_tags(tmp_path)
    # the scripted model never starts with "Sure" unprompted: every first answer fails
    assert [(s, v.simple_value) for s, v in tags["simuser/first_answer_satisfaction"]] == [(7, 0.0)]
    assert [(s, v.simple_value) for s, v in tags["simuser/sessions"]] == [(7, 4.0)]
    # retries follow the hint and satisfy: 4 of 8 answers
    assert [(s, v.simple_value) for s, v in tags["simuser/turn_satisfaction"]] == [(7, 0.5)]
    assert [(s, v.simple_value) for s, v in tags["eval/satisfied_fraction"]] == [(9, 0.0)]
    assert [(s, v.simple_value) for s, v in tags["eval/preference_score"]] == [(9, 0.0)]
    # "It is 7." is never the right result of "What is i + i?" (an even number): accuracy 0
    assert [(s, v.simple_value) for s, v in tags["eval/accuracy"]] == [(9, 0.0)]


# ---------------------------------------------------------------------------------------------
# End to end: real inference server (tiny random checkpoint) + real gateway (rule judge)
# ---------------------------------------------------------------------------------------------

SERVER_ARGS = ["--min-prompt-bucket", "128", "--min-cache-bucket", "256", "--max-running-requests", "4",
               "--min-batch-bucket", "4"]  # one bucket of each kind: the tiny server compiles once


@pytest.fixture(scope="module")
def live_stack(tiny_qwen3_dir, tmp_path_factory):
    import re
    import subprocess
    import sys

    from openclaw_jax.eval.server import EmbeddedServer

    work = tmp_path_factory.mktemp("live_stack")
    inference = EmbeddedServer(str(tiny_qwen3_dir), extra_args=SERVER_ARGS, log_path=work / "inference.log").start()
    store = work / "samples"
    gw_log = open(work / "gateway.log", "wb")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "openclaw_jax.gateway", "--policy-url", inference.url, "--judge", "rule",
         "--model", str(tiny_qwen3_dir), "--store", str(store), "--port", "0"],
        stdout=subprocess.PIPE, stderr=gw_log, text=True)
    try:
        line = gateway.stdout.readline()
        m = re.search(r"listening on (http://\S+)", line)
        assert m, f"gateway did not start: {line!r}; log: {(work / 'gateway.log').read_text()[-2000:]}"
        yield {"gateway": m.group(1), "inference": inference.url, "store": store}
    finally:
        gateway.terminate()
        gateway.wait(60)
        gw_log.close()
        inference.stop()


def _wait_for_samples(store_dir, count, timeout_s=120.0):
    import time

    from openclaw_jax.samples import SampleStore

    deadline = time.monotonic() + timeout_s
    while True:
        if store_dir.exists():
            store = SampleStore(store_dir, readonly=True)
            try:
                samples = store.read()
            finally:
                store.close()
            if len(samples) >= count or time.monotonic() > deadline:
                return samples
        elif time.monotonic() > deadline:
            return []
        time.sleep(0.25)


def _three_sessions(live_stack, cfg: SimulatedUserConfig, prefix: str):
    """Three sessions of a persona a random model never satisfies (answers must open with "Sure") against
    the live gateway; returns (the user, the stats)."""
    from openclaw_jax.envs.questions import train_questions

    async def drive():
        async with SimulatedUser(P.make_persona("starts_with", prefix="Sure"), train_questions("arithmetic", seed=cfg.seed),
                                 base_url=live_stack["gateway"], config=cfg, session_prefix=prefix) as user:
            stats = await user.run(3)
        return user, stats

    return asyncio.run(drive())


@pytest.mark.slow
def test_sessions_through_real_gateway_become_samples_with_hints(live_stack):
    cfg = SimulatedUserConfig(turns_per_session=2, max_attempts_per_question=2, concurrency=2, max_tokens=8, seed=5)
    user, stats = _three_sessions(live_stack, cfg, "e2e")
    assert stats.failed_sessions == 0 and stats.sessions == 3 and stats.requests == 9
    turns = {(t.session_id, t.turn_index): t for r in user.results for t in r.turns}
    assert len(turns) == 6
    # A random model does not open with "Sure" (checked, not assumed): every turn is corrected,
    # so the rule judge scores -1 and takes the persona's instruction as the hint.
    assert not any(t.satisfied for t in turns.values())
    samples = _wait_for_samples(live_stack["store"], 6)
    assert len(samples) == 6  # both answers of each session have a next state (the closing request)
    for s in samples:
        t = turns[(s.session_id, s.turn_index)]
        assert s.response_text == t.answer  # the gateway recorded what the user saw
        assert s.next_state == {"role": "user", "content": t.reaction}  # our reaction is the next state
        assert s.kind == "opd+rl" and s.reward == -1
        assert s.hints == ['Please begin your answer with "Sure".']


@pytest.mark.slow
def test_sessions_closed_through_the_done_endpoint_score_their_last_answer(live_stack):
    """close_by_endpoint: the final reaction reaches the gateway's done endpoint with the conversation, so
    the last answer is scored as after a closing request, but no closing reply is generated."""
    import httpx

    cfg = SimulatedUserConfig(turns_per_session=2, max_attempts_per_question=2, concurrency=2, max_tokens=8, seed=6,
                              close_by_endpoint=True)

    def main_turns():
        return httpx.get(live_stack["gateway"] + "/healthz", timeout=30).json()["stats"]["main_turns"]

    before = main_turns()
    user, stats = _three_sessions(live_stack, cfg, "endpoint")
    assert stats.failed_sessions == 0 and stats.sessions == 3 and stats.requests == 6
    assert all(r.closed for r in user.results)
    assert main_turns() - before == 6   # the answers only: no closing request reached the policy
    turns = {(t.session_id, t.turn_index): t for r in user.results for t in r.turns}
    deadline = time.monotonic() + 120
    while True:
        samples = [s for s in _wait_for_samples(live_stack["store"], 0, timeout_s=0) if s.session_id.startswith("endpoint")]
        if len(samples) >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert sorted((s.session_id, s.turn_index) for s in samples) == sorted(turns)
    for s in samples:   # the last answer of each session too: its next state came through the endpoint
        assert s.next_state == {"role": "user", "content": turns[(s.session_id, s.turn_index)].reaction}
        assert s.reward == -1


@pytest.mark.slow
def test_preference_score_side_turns_greedy_and_untrained(live_stack):
    persona = P.make_persona("keyword", word="the", whole_word=False)
    questions = heldout_questions("arithmetic", 6, seed=0)
    before = len(_wait_for_samples(live_stack["store"], 0, timeout_s=0))

    async def measure():
        via_gateway = await preference_score(live_stack["gateway"], persona, questions, max_tokens=8)
        again = await preference_score(live_stack["gateway"], persona, questions, max_tokens=8)
        direct = await preference_score(live_stack["inference"], persona, questions, max_tokens=8)
        return via_gateway, again, direct

    via_gateway, again, direct = asyncio.run(measure())
    texts = [a.text for a in via_gateway.answers]
    assert texts == [a.text for a in again.answers]  # deterministic
    assert texts == [a.text for a in direct.answers]  # greedy: the gateway adds nothing
    expected = sum("the" in t.lower() for t in texts) / len(texts)
    assert via_gateway.score == expected
    import time

    time.sleep(2.0)  # side turns never open a judgement; give a wrong one time to show up
    assert len(_wait_for_samples(live_stack["store"], 0, timeout_s=0)) == before


def test_env_runner_backs_off_while_the_gateway_is_down_and_records_each_session(tmp_path):
    """Nothing listens at the gateway's address: every session of a round fails at once. The runner records
    each one (an unsatisfied session for the person) and waits 1 s, 2 s, ... before the next round instead of
    starting thousands of sessions."""
    import json

    from openclaw_jax.config import ExperimentConfig
    from openclaw_jax.envs.config import EnvConfig
    from openclaw_jax.runs.users import env_runner
    from openclaw_jax.samples import SampleStore

    cfg = ExperimentConfig(run_dir=str(tmp_path), env=EnvConfig(persona="concise", questions="arithmetic",
                                                                concurrency=2, request_timeout_s=5))
    SampleStore(tmp_path / "samples").close()
    runner = env_runner(cfg, "http://127.0.0.1:9/", store_dir=str(tmp_path / "samples"), offset_fn=lambda: 0)
    runner.people[0].user.client = runner.people[0].user.client.with_options(max_retries=0)
    runner.people[0].user._model = "smollm2"   # as through OpenClaw: the model is named, not listed from the server

    async def drive_for(seconds: float) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(runner.drive(stop))
        await asyncio.sleep(seconds)
        stop.set()
        await task
        await runner.close()

    asyncio.run(drive_for(2.5))
    records = [json.loads(line) for line in (tmp_path / "sessions.jsonl").read_text().splitlines()]
    # rounds at ~0 s and ~1 s (then a 2 s pause): at most 3 rounds of 2 sessions in 2.5 s, whatever the speed
    assert 2 <= len(records) <= 6 and len(records) % 2 == 0
    assert all(not r["satisfied"] and r["answers"] == 0 and "Connection" in r["error"] for r in records)
