"""`gateway.judge: openai`: the PRM votes on an OpenAI-compatible chat endpoint, through the real `openai`
client, against real HTTP servers on 127.0.0.1 (a scripted server answering with judge answers written
in the shapes judges give, and our embedded inference server as a separate process)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import openai
import pytest

from openclaw_jax.configlib import ConfigError
from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.gateway.judge import ModelJudge, NextState, eval_vote_messages, hint_vote_messages
from openclaw_jax.gateway.openai_judge import JudgeEndpointError, OpenAIJudge, openai_judge_from_config
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from openclaw_jax.models.tokenizer import tiny_test_tokenizer
from openclaw_jax.samples import SampleStore
from tests.helpers.scripted_openai import ScriptedOpenAIServer
from tests.helpers.scripted_pool import LoopThread, ScriptedPool, serve_app
from tests.helpers.server_utils import ServerProcess

REPLY = "The answer is 12."
NEXT = NextState("user", "No, that's wrong: 9 + 2 is 11. Please check your sums before answering.")
# What judges write: reasoning, then the box; a vote without a box, a typographic minus, a hint vote
# that declines, one whose hint is too short to accept.
EVAL_ANSWERS = ["The user says the sum is wrong, a correction.\n\\boxed{-1}",
                "The user corrects the result. \\boxed{\u22121}",
                "I think the reply was fine."]
HINT_ANSWERS = ["\\boxed{1} [HINT_START]Check the arithmetic before stating a sum.[HINT_END]",
                "\\boxed{1}\n[HINT_START]Recheck.[HINT_END]",
                "\\boxed{-1}"]


def judged(judge: OpenAIJudge, next_state: NextState, seed: int):
    """One judgement, the client closed on the same event loop."""
    async def run():
        try:
            return await judge.judge(REPLY, next_state, seed=seed)
        finally:
            await judge.close()
    return asyncio.run(run())


def checked(judge: OpenAIJudge) -> None:
    async def run():
        try:
            await judge.check()
        finally:
            await judge.close()
    asyncio.run(run())


def scripted_judge(body: dict, headers: dict) -> str:
    """Answer by the vote's kind (its system prompt) and index (the gateway's seeds are multiples of 1000 plus
    the vote's index; the unit tests start at 1000)."""
    index = body["seed"] % 1000
    is_hint = body["messages"][0]["content"] == hint_vote_messages("", NEXT)[0]["content"]
    return HINT_ANSWERS[index - 3] if is_hint else EVAL_ANSWERS[index]


def test_openai_judge_casts_the_pool_judges_votes_and_parses_them_alike():
    with ScriptedOpenAIServer(scripted_judge, model="judge-7b", api_key="sk-test") as server:
        judge = OpenAIJudge(server.url + "/v1", "judge-7b", api_key="sk-test", votes=3, temperature=0.3,
                            max_new_tokens=200, max_retries=0)
        j = judged(judge, NEXT, 1000)
    bodies = [body for _, body in server.requests]
    assert len(bodies) == 6 and sorted(b["seed"] for b in bodies) == list(range(1000, 1006))
    assert all(b["model"] == "judge-7b" and b["temperature"] == 0.3 and b["max_completion_tokens"] == 200
               for b in bodies)
    assert all(h["Authorization"] == "Bearer sk-test" for h, _ in server.requests)
    # the same chat messages as the PRM pool judge renders with its chat template
    by_seed = {b["seed"]: b["messages"] for b in bodies}
    assert all(by_seed[1000 + i] == eval_vote_messages(REPLY, NEXT) for i in range(3))
    assert all(by_seed[1003 + i] == hint_vote_messages(REPLY, NEXT) for i in range(3))
    assert j.eval_votes == (-1, -1, None) and j.eval_score == -1
    assert j.hint_votes == (1, 1, -1)
    assert j.hints == ("Check the arithmetic before stating a sum.",)  # "Recheck." is not over 10 characters
    assert j.kind == "opd+rl" and j.judge == "openai:judge-7b"

    # the PRM pool judge, handed the same answers, decides the same (one parser, one vote rule)
    texts = {1000 + i: t for i, t in enumerate(EVAL_ANSWERS + HINT_ANSWERS)}

    class Pool:
        async def generate(self, input_ids, *, sampling_params=None, **kw):
            return SimpleNamespace(text=texts[sampling_params.sampling_seed])

    class Tok:
        def apply_chat_template(self, messages, **kw):
            return [1]

    pool_j = asyncio.run(ModelJudge(Pool(), Tok(), votes=3).judge(REPLY, NEXT, seed=1000))
    assert (pool_j.eval_votes, pool_j.hint_votes, pool_j.hints, pool_j.raw) == (j.eval_votes, j.hint_votes, j.hints,
                                                                                j.raw)


def test_failed_calls_are_no_votes_and_rl_only_asks_no_hints():
    def flaky(body, headers):
        if body["seed"] % 2:
            raise RuntimeError("scripted server error")  # aiohttp answers 500
        return "Thanks means it worked. \\boxed{1}"

    with ScriptedOpenAIServer(flaky, model="m") as server:
        judge = OpenAIJudge(server.url + "/v1", "m", votes=3, max_retries=0, hints=False)
        j = judged(judge, NextState("user", "thanks!"), 10)
    assert len(server.requests) == 3                    # no hint votes under an RL-only loss
    assert j.eval_votes == (1, None, 1) and j.eval_score == 1 and j.hints == () and j.kind == "rl"


def test_start_check_names_the_setting_to_fix():
    with ScriptedOpenAIServer(scripted_judge, model="judge-7b", api_key="sk-right") as server:
        wrong_key = OpenAIJudge(server.url + "/v1", "judge-7b", api_key="sk-wrong", max_retries=0)
        with pytest.raises(JudgeEndpointError, match="judge_api_key_env"):
            checked(wrong_key)
        unknown = OpenAIJudge(server.url + "/v1", "gpt-nope", api_key="sk-right", max_retries=0)
        with pytest.raises(JudgeEndpointError, match="judge_model='gpt-nope'.*judge-7b"):
            checked(unknown)
        checked(OpenAIJudge(server.url + "/v1", "judge-7b", api_key="sk-right"))
    # an endpoint that is down: a warning, not an error (its votes are no votes until it is up)
    checked(OpenAIJudge("http://127.0.0.1:9/v1", "judge-7b", max_retries=0, timeout_s=2))


def test_config_requires_endpoint_and_model_and_reads_the_key_from_the_environment(monkeypatch):
    with pytest.raises(ConfigError, match="judge_base_url"):
        GatewayConfig(judge="openai", judge_model="m")
    with pytest.raises(ConfigError, match="judge_model"):
        GatewayConfig(judge="openai", judge_base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ConfigError, match="http"):
        GatewayConfig(judge="openai", judge_model="m", judge_base_url="api.example.com/v1")
    cfg = GatewayConfig(judge="openai", judge_model="m", judge_base_url="http://127.0.0.1:1/v1",
                        judge_api_key_env="MY_JUDGE_KEY", judge_votes=5)
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-from-env")
    judge = openai_judge_from_config(cfg)
    assert judge.client.api_key == "sk-from-env" and judge.votes == 5 and judge.name == "openai:m"
    monkeypatch.delenv("MY_JUDGE_KEY")
    assert openai_judge_from_config(cfg).client.api_key == "none"


def test_gateway_with_openai_judge_stores_the_judges_verdict(tmp_path, monkeypatch):
    """A session of two main turns through the gateway (real openai client): the first turn's sample
    carries the endpoint's votes and hint."""
    lt = LoopThread()
    tok = tiny_test_tokenizer()
    pool = ScriptedPool(tok)
    with ScriptedOpenAIServer(scripted_judge, model="judge-7b", api_key="sk-j") as judge_server:
        pool_runner, pool_url = lt.run(serve_app(pool.app()))
        cfg = GatewayConfig(port=0, policy_urls=(pool_url,), judge="openai", judge_base_url=judge_server.url + "/v1",
                            judge_model="judge-7b", judge_api_key_env="TEST_OPENAI_JUDGE_KEY", store_dir=str(tmp_path),
                            model="tiny", default_max_tokens=8, request_timeout_s=10.0, pool_max_retries=0)
        monkeypatch.setenv("TEST_OPENAI_JUDGE_KEY", "sk-j")
        gateway, runner, url = lt.run(start_gateway(cfg, tokenizer=tok), timeout=60)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            headers = {"X-Session-Id": "s1", "X-Turn-Type": "main"}
            first = [{"role": "user", "content": "What is 9 + 2?"}]
            r1 = client.chat.completions.create(model="tiny", messages=first, extra_headers=headers)
            second = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                              {"role": "user", "content": NEXT.content}]
            client.chat.completions.create(model="tiny", extra_headers=headers, messages=second)
            lt.run(gateway.drain(30))
        finally:
            lt.run(stop_gateway(gateway, runner, grace_s=5))
            lt.run(pool_runner.cleanup())
            lt.stop()
    with SampleStore(str(tmp_path), readonly=True) as store:
        samples = store.read(0)
    assert len(samples) == 1
    s = samples[0]
    assert s.judge == "openai:judge-7b" and s.eval_votes == [-1, -1, None] and s.reward == -1
    assert s.hints == ["Check the arithmetic before stating a sum."] and s.kind == "opd+rl"
    assert s.next_state["content"] == NEXT.content
    assert json.loads(json.dumps(s.judge_raw))["eval"] == EVAL_ANSWERS


@pytest.mark.slow
def test_openai_judge_against_the_embedded_inference_server_process(tiny_smollm2_dir, tmp_path):
    """The real wire end to end: a separate server process answers every vote through its
    `/v1/chat/completions`; a random tiny model writes no box, so every vote parses as none and the turn
    scores 0 (no sample), exactly as the pool judge treats such answers."""
    server = ServerProcess(tiny_smollm2_dir, log_path=tmp_path / "server.log").start()
    try:
        model_id = openai.OpenAI(base_url=server.url + "/v1", api_key="none").models.list().data[0].id
        judge = OpenAIJudge(server.url + "/v1", model_id, votes=2, max_new_tokens=8, max_retries=0, timeout_s=120)

        async def run():
            await judge.check()
            try:
                return await judge.judge(REPLY, NEXT, seed=3)
            finally:
                await judge.close()

        j = asyncio.run(run())
    finally:
        server.kill()
    assert all(isinstance(t, str) for t in j.raw["eval"] + j.raw["hint"]), j.raw  # every call was answered
    assert len(j.raw["eval"]) == 2 and len(j.raw["hint"]) == 2
    assert all(v is None for v in j.eval_votes + j.hint_votes) and j.eval_score == 0 and j.kind is None
