"""What sampling the held-out evaluation gets through the real OpenClaw (npm `openclaw@2026.9.6`).

The held-out evaluation asks OpenClaw's OpenAI endpoint for greedy first answers (`collect_first_answers`,
temperature 0). OpenClaw forwards a request's `temperature` to its provider, and our gateway honours a
client's sampling on side turns (main turns always sample at the trainer's temperature), so the held-out
answers through OpenClaw are greedy. A request that names no temperature reaches the provider without
one (the gateway's own then applies). The provider here is the capture server that recorded
`tests/fixtures/openclaw/` (real aiohttp on 127.0.0.1, recording each request), so the test reads the very
bodies OpenClaw sent. Also checked: OpenClaw stamps each question with the time and names the session in
it, so two evaluations of the same weights do not see the same prompt tokens.

Needs `bash scripts/openclaw.sh setup` (.openclaw/): under CI the test fails without it, elsewhere it skips.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
from pathlib import Path

import openai

from openclaw_jax.envs.openclaw_agent import AGENT_MODEL, OpenClawAgent, OpenClawDaemon
from openclaw_jax.envs.questions import heldout_questions
from openclaw_jax.envs.simulated_user import collect_first_answers
from tests.integrations.test_openclaw_real import REPO, require_openclaw

RECORDER = REPO / "tests" / "fixtures" / "openclaw" / "record.py"


def _recorder_class():
    spec = importlib.util.spec_from_file_location("openclaw_record", RECORDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Recorder, module.REPLY_TEXT


def test_heldout_questions_through_openclaw_reach_the_provider_greedy(tmp_path: Path):
    require_openclaw()
    recorder_class, reply_text = _recorder_class()

    async def play() -> tuple[list, list[dict]]:
        rec = recorder_class()
        await rec.start()
        agent = OpenClawAgent(rec.url, tmp_path / "oc", max_tokens=48, timeout_s=300,
                              side_session_prefixes=("heldout",))
        daemon = await asyncio.to_thread(OpenClawDaemon(agent).start)
        try:
            client = openai.AsyncOpenAI(base_url=daemon.base_url, api_key="none", timeout=300)
            questions = heldout_questions("arithmetic", 2, seed=0)
            answers = await collect_first_answers(client, questions, model=AGENT_MODEL, max_tokens=48,
                                                  concurrency=1, session_prefix="heldout-t0",
                                                  agent_keeps_history=True)
            # a request that names no temperature, as a person's own client may send
            await client.chat.completions.create(model=AGENT_MODEL, user="heldout-none", max_tokens=48,
                                                 messages=[{"role": "user", "content": "What is 6 + 1?"}])
        finally:
            await asyncio.to_thread(daemon.stop)
            await rec.stop()
        return answers, [r["body"] for r in rec.requests if r["path"] == "/v1/chat/completions"]

    questions = [q.text for q in heldout_questions("arithmetic", 2, seed=0)]
    answers, bodies = asyncio.run(play())
    assert [a.text for a in answers] == [reply_text, reply_text]
    asked = {_question_of(b): b for b in bodies if _question_of(b)}
    assert set(asked) == {*questions, "What is 6 + 1?"}, bodies
    assert [asked[q].get("temperature") for q in questions] == [0, 0]
    assert "temperature" not in asked["What is 6 + 1?"]
    # each question behind OpenClaw's time stamp, with its session named in the message
    text = _text(asked[questions[0]]["messages"][-1]["content"])
    assert re.match(r"^\[\w{3} \d{4}-\d\d-\d\d \d\d:\d\d [A-Z]+\] " + re.escape(questions[0]), text), text
    assert "heldout-t0-0" in text


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def _question_of(body: dict) -> str | None:
    found = re.search(r"What is -?\d+ [-+*] -?\d+\?", _text(body["messages"][-1]["content"]))
    return found.group(0) if found else None
