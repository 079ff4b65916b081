"""The gateway and the model judge against a real SGLang 0.5.23 worker on CPU.

The gateway runs the scripted conversation of tests/gateway/test_gateway.py (two interleaved sessions, a
side turn, the three sample kinds, a streamed session) with the official `openai` client; the
policy is a real SGLang worker behind a recording pass-through, so every stored sample is compared
with exactly what SGLang answered. The judge votes m times on a real worker.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import pytest

from openclaw_jax.gateway.judge import (
    EVAL_VOTE_REGEX,
    HINT_END,
    HINT_START,
    HINT_VOTE_REGEX,
    ModelJudge,
    NextState,
)
from openclaw_jax.models.tokenizer import load_tokenizer
from openclaw_jax.pool.client import PoolClient
from tests.helpers.scripted_pool import RecordingProxy, serve_app
from tests.gateway.test_gateway import (SYSTEM, check_samples, loop_thread, make_env,  # noqa: F401 (fixtures)
                                        scripted_conversation, tokenizer)

pytestmark = pytest.mark.sglang


@pytest.fixture
def base_worker(sglang_workers, sglang_model_dir):
    import requests

    w = sglang_workers[0]
    r = requests.post(w.url + "/update_weights_from_disk",
                      json={"model_path": str(sglang_model_dir), "weight_version": "base"}, timeout=300)
    assert r.status_code == 200 and r.json()["success"], r.text
    return w


def test_gateway_records_exactly_what_sglang_returned(base_worker, make_env, loop_thread, sglang_model_dir):
    proxy = RecordingProxy(base_worker.url)
    runner, proxy_url = loop_thread.run(serve_app(proxy.app()))
    try:
        env = make_env(policy_urls=[proxy_url], model=str(sglang_model_dir), load_tokenizer=True,
                       request_timeout_s=300.0)
        sent = scripted_conversation(env)
        # a streamed session with log-probs, through the official client
        history = [SYSTEM, {"role": "user", "content": "Count to three."}]
        chunks = list(env.chat(history, session="s3", stream=True, logprobs=True, top_logprobs=2))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        streamed_lps = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
                        for e in c.choices[0].logprobs.content]
        env.chat(history + [{"role": "assistant", "content": text},
                            {"role": "user", "content": "Thanks, that's perfect!"}], session="s3", done=True)
        # a non-streamed reply with log-probs: the OpenAI log-probs are SGLang's, value for value
        reply = env.chat([SYSTEM, {"role": "user", "content": "Hello there"}], logprobs=True, top_logprobs=2)
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

    samples = env.samples()
    streamed = [s for s in samples if s.session_id == "s3"]
    assert [(s.kind, s.reward) for s in streamed] == [("rl", 1)]
    s3_ids, s3_lps, _ = answer_of(streamed[0].prompt_ids)
    assert streamed[0].response_ids == s3_ids and streamed[0].rollout_logprobs == s3_lps
    assert streamed_lps == s3_lps
    assert env.tokenizer.decode(s3_ids, skip_special_tokens=True) == text
    check_samples(env, [s for s in samples if s.session_id != "s3"], sent, answer_of)
    assert all(s.weight_version == "base" for s in samples)
    assert all(p["sampling_params"]["temperature"] == env.cfg.temperature for p, _ in proxy.exchanges)
    # SGLang's extra meta_info fields reached the gateway and did not disturb it
    assert all("weight_versions" in body["meta_info"] for _, body in proxy.exchanges)
    last_payload, last_body = proxy.exchanges[-1]
    assert [e.logprob for e in reply.choices[0].logprobs.content] == \
        [e[0] for e in last_body["meta_info"]["output_token_logprobs"]]
    assert [[t.logprob for t in e.top_logprobs] for e in reply.choices[0].logprobs.content] == \
        [[t[0] for t in pos] for pos in last_body["meta_info"]["output_top_logprobs"]]


def _majority(votes):
    """Independent restatement of the rule: most common valid vote; a tie or none gives 0."""
    valid = [v for v in votes if v in (-1, 0, 1)]
    if not valid:
        return 0
    counts = Counter(valid).most_common()
    return 0 if len(counts) > 1 and counts[0][1] == counts[1][1] else counts[0][0]


def test_model_judge_votes_m_times_on_sglang(base_worker, sglang_model_dir):
    tok = load_tokenizer(sglang_model_dir)
    reply, nxt = "The answer is 4.", NextState("user", "Wrong, it is 5. Always show the steps.")

    async def main():
        async with PoolClient([base_worker.url], health_interval_s=0) as pool:
            # regex-constrained votes: every call must come back in the parseable format
            constrained = ModelJudge(pool, tok, votes=5, temperature=1.0, max_new_tokens=300, timeout_s=240,
                                     eval_regex=EVAL_VOTE_REGEX, hint_regex=HINT_VOTE_REGEX)
            judged = [await constrained.judge(reply, nxt, seed=10 * i) for i in range(2)]
            # unconstrained: a tiny random model writes garbage, which is no vote
            free = await ModelJudge(pool, tok, votes=3, temperature=1.0, max_new_tokens=24).judge(reply, nxt)
        # a judge whose pool is down: every call fails, no vote, no exception
        async with PoolClient(["http://127.0.0.1:9"], health_interval_s=0, max_retries=0) as dead:
            down = await ModelJudge(dead, tok, votes=3, timeout_s=10).judge(reply, nxt)
        return judged, free, down

    judged, free, down = asyncio.run(main())
    for j in judged:
        assert len(j.raw["eval"]) == len(j.eval_votes) == 5 and len(j.raw["hint"]) == len(j.hint_votes) == 5
        for text, vote in zip(j.raw["eval"], j.eval_votes):
            assert re.fullmatch(EVAL_VOTE_REGEX, text), text
            assert vote == int(re.search(r"\\boxed\{(-1|0|1)\}$", text).group(1))
        assert j.eval_score == _majority(j.eval_votes)
        accepted = []
        for text, vote in zip(j.raw["hint"], j.hint_votes):
            assert re.fullmatch(HINT_VOTE_REGEX, text), text
            assert vote == (1 if text.startswith("\\boxed{1}") else -1)
            if vote == 1:
                hint = text[text.index(HINT_START) + len(HINT_START):text.index(HINT_END)].strip()
                if len(hint) > 10 and " ".join(hint.split()) not in {" ".join(h.split()) for h in accepted}:
                    accepted.append(hint)
        assert list(j.hints) == sorted(accepted, key=len)[:3]
        assert j.kind == ({True: "opd+rl", False: "opd"}[j.eval_score != 0] if j.hints
                          else ("rl" if j.eval_score != 0 else None))
    # the votes are samples, not copies: over 10 constrained eval votes, more than one answer text
    assert len({t for j in judged for t in j.raw["eval"]}) > 1
    assert len(free.raw["eval"]) == 3 and all(isinstance(t, str) for t in free.raw["eval"] + free.raw["hint"])
    assert free.eval_score == _majority(free.eval_votes)
    assert down.eval_votes == (None, None, None) and down.eval_score == 0 and down.hints == ()
