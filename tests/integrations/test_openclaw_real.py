"""The real OpenClaw agent (npm `openclaw@2026.9.6`, our plugin on) against our real gateway and the
embedded JAX server on a tiny random model with the SmolLM2 tokenizer. No scripted replies: every
answer OpenClaw shows is what the model generated.

One OpenClaw scenario is played once per module (`played`: each OpenClaw CLI process costs seconds of
Node CPU) and the tests check what the gateway stored:

* `oc-local`: one `openclaw agent --local` turn (the per-process mode; the plugin names no person);
* then OpenClaw's own gateway daemon for another state dir, whose plugin has `personId: alice`, and
  through it two interleaved sessions `oc-a` / `oc-b` (A1, B1, A2, B2): A2 corrects A1 with an
  instruction, B2 thanks B1;
* a heartbeat run (`openclaw system event --mode now`: OpenClaw's housekeeping path);
* `/new` in `oc-b` (OpenClaw ends the session; the plugin tells the gateway, as alice).

Needs `bash scripts/openclaw.sh setup` (.openclaw/): under CI (env CI set) the tests FAIL without it,
elsewhere they are skipped with that command.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from openclaw_jax.samples import SampleStore
from tests.helpers.scripted_pool import LoopThread

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "openclaw"
SETUP_HINT = "bash scripts/openclaw.sh setup"
MAX_TOKENS = 8  # OpenClaw's maxTokens: a tiny model's reply needs no more
A1, A2 = "What is 2 + 3?", "No, that's wrong. You should show the steps."
B1, B2 = "Name a prime number.", "Thanks, that's perfect!"
PERSON = "alice"   # the daemon agent's plugin personId


def require_openclaw() -> None:
    """Fail (CI) or skip (local) with the setup command when .openclaw/ is not ready."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "openclaw.sh"), "check"], capture_output=True, text=True)
    if proc.returncode == 0:
        return
    message = f"OpenClaw is not installed ({proc.stderr.strip()}); install it once with `{SETUP_HINT}` (about a minute)"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@dataclasses.dataclass
class Stack:
    lt: LoopThread
    gateway: Any
    url: str
    store_dir: Path

    def samples(self):
        with SampleStore(str(self.store_dir), readonly=True) as store:
            return store.read(0)

    def stats(self):
        return dict(httpx.get(self.url + "/healthz", timeout=10).json()["stats"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_smollm2_dir):
    require_openclaw()
    start = time.monotonic()
    root = tmp_path_factory.mktemp("openclaw_real")
    model_dir = tiny_smollm2_dir  # tests/conftest.py: a random 2-layer model with SmolLM2's tokenizer
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_jax.inference", "--model", str(model_dir),
                             "--port", "0", "--weight-version", "v1", "--log-level", "warning",
                             # OpenClaw's prompts (2.2-2.6 k tokens) fit one prompt and one cache bucket
                             "--min-prompt-bucket", "4096", "--min-cache-bucket", "4096"],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    lt = LoopThread()
    gateway = runner = None
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY "), f"embedded server did not start: {line!r}"
        cfg = GatewayConfig(port=0, policy_urls=(line.split()[1],), judge="rule", store_dir=str(root / "store"),
                            model=str(model_dir), request_timeout_s=300.0, pool_max_retries=1)
        gateway, runner, url = lt.run(start_gateway(cfg), timeout=300)
        logger.warning("model, embedded server and gateway up in %.1f s", time.monotonic() - start)
        yield Stack(lt, gateway, url, root / "store")
    finally:
        if gateway is not None:
            lt.run(stop_gateway(gateway, runner, grace_s=5))
        lt.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stdout.close()


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def played(stack, tmp_path_factory):
    """Play the OpenClaw scenario once; returns what each step gave and the gateway's counters."""
    from openclaw_jax.envs.openclaw_agent import OpenClawAgent, OpenClawDaemon

    start, phases = time.monotonic(), {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - start - sum(phases.values()), 1)

    root = tmp_path_factory.mktemp("oc_state")
    # Two people's OpenClaw agents: one --local process per turn, one behind OpenClaw's own daemon
    # (whose start overlaps the --local turn).
    local = OpenClawAgent(stack.url, root / "local", max_tokens=MAX_TOKENS, context_window=8192, timeout_s=300)
    agent = OpenClawAgent(stack.url, root / "daemon", max_tokens=MAX_TOKENS, context_window=8192, timeout_s=300,
                          person_id=PERSON)
    out: dict[str, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        local_turn = pool.submit(local.run_turn, "oc-local", "What is 7 + 5?")
        daemon = OpenClawDaemon(agent).start()
        out["local"] = local_turn.result()
    out["local_pending"] = "oc-local" in stack.gateway.sessions
    phase("local turn + daemon start")
    try:
        for key, sid, text in (("A1", "oc-a", A1), ("B1", "oc-b", B1), ("A2", "oc-a", A2), ("B2", "oc-b", B2)):
            out[key] = agent.run_turn(sid, text)
        phase("A1 B1 A2 B2")
        out["stats_before_heartbeat"] = before = stack.stats()
        out["heartbeat"] = agent.system_event("Reminder: check the build.")
        _wait_for(lambda: stack.stats()["side_turns"] > before["side_turns"], 180, "the heartbeat's model request")
        out["stats_after_heartbeat"] = stack.stats()
        phase("heartbeat")
        out["b_open_before_new"] = (PERSON, "oc-b") in stack.gateway.sessions
        out["new"] = agent.run_turn("oc-b", "/new")
        _wait_for(lambda: (PERSON, "oc-b") not in stack.gateway.sessions, 30,
                  "the plugin's session-done notice for oc-b")
        phase("/new")
        out["daemon_cpu_s"] = daemon.cpu_s()
    finally:
        daemon.stop()
    # what the plugin sends on a reset, for the sessions still open (as their person)
    for sid, person in (("oc-a", PERSON), ("oc-local", None)):
        r = httpx.post(f"{stack.url}/v1/sessions/{sid}/done", headers={"X-Person-Id": person} if person else {},
                       timeout=30)
        assert r.status_code == 200 and r.json()["ended"], r.text
    stack.lt.run(stack.gateway.drain(60), timeout=90)
    out["stats"] = stack.stats()
    phase("drain")
    turns = [v for v in out.values() if hasattr(v, "cpu_s")]
    logger.warning("OpenClaw scenario: %.1f s wall %s; CLI turns wall %s s, CPU %s s; daemon CPU %.1f s",
                   time.monotonic() - start, phases, [round(t.wall_s, 1) for t in turns],
                   [round(t.cpu_s, 1) for t in turns], out["daemon_cpu_s"])
    return out


def _oc_samples(stack) -> list:
    """The samples of the OpenClaw scenario (the replay test adds its own sessions)."""
    return [s for s in stack.samples() if s.session_id.startswith("oc-")]


def _by_session(samples) -> dict[str, list]:
    got: dict[str, list] = {}
    for s in samples:
        got.setdefault(s.session_id, []).append(s)
    return got


def test_every_openclaw_turn_ends_normally_with_the_models_reply(played, stack):
    turns = [played[k] for k in ("local", "A1", "B1", "A2", "B2")]
    assert all(t.ok and t.stop_reason in ("stop", "length") for t in turns), [t.stop_reason for t in turns]
    by = {s.session_id: s for s in _oc_samples(stack) if s.turn_index == 0}
    # OpenClaw streamed the reply from the gateway and shows exactly what the model generated (plus,
    # after a length stop, its own truncation notice).
    for key, sid in (("A1", "oc-a"), ("B1", "oc-b")):
        raw = played[key].result["meta"]["finalAssistantRawText"].strip()
        assert raw == by[sid].response_text.strip() and played[key].text.startswith(raw)
    assert played["local_pending"], "the --local turn was not recorded under its OpenClaw session id"


def test_interleaved_sessions_are_stored_under_their_openclaw_session_ids(played, stack):
    by = _by_session(_oc_samples(stack))
    assert sorted(by) == ["oc-a", "oc-b"]
    # the person the plugin was configured with, on every request of the daemon's agent
    assert {s.person for s in by["oc-a"] + by["oc-b"]} == {PERSON}
    assert [s.turn_index for s in by["oc-a"]] == [0] and [s.turn_index for s in by["oc-b"]] == [0]
    tok = stack.gateway.tokenizer
    prompt_a, prompt_b = (tok.decode(by[sid][0].prompt_ids) for sid in ("oc-a", "oc-b"))
    assert A1 in prompt_a and B1 not in prompt_a
    assert B1 in prompt_b and A1 not in prompt_b
    assert played["stats"]["main_turns"] == 5  # local, A1, B1, A2, B2: nothing else was a main turn


def test_each_persons_run_announced_itself_before_its_request(played):
    """The plugin's turn-starting notice (from OpenClaw's first hook of a run): one per person's run, the
    --local process's and the daemon's, none for the heartbeat's side run."""
    assert played["stats_before_heartbeat"]["turn_notices"] == 5, played["stats_before_heartbeat"]
    assert played["stats_after_heartbeat"]["turn_notices"] == 5, played["stats_after_heartbeat"]


def test_next_states_are_the_persons_following_messages(played, stack):
    by = {s.session_id: s for s in _oc_samples(stack)}
    a, b = by["oc-a"], by["oc-b"]
    # The person's own words, without OpenClaw's "[Wed 2026-11-25 09:39 UTC] " prefix (docs/design.md §14).
    # The raw message (as OpenClaw sent it) is kept beside the words the judge reads.
    for sample, words in ((a, A2), (b, B2)):
        assert (sample.next_state["role"], sample.next_state["content"]) == ("user", words)
        assert sample.next_state.get("raw", words).endswith(words)
    assert (a.kind, a.reward, a.hints) == ("opd+rl", -1, ["You should show the steps."])
    assert (b.kind, b.reward, b.hints) == ("rl", 1, [])
    assert all(s.weight_version == "v1" for s in (a, b))


def test_a_heartbeat_run_is_side_and_never_trained(played, stack):
    before, after = played["stats_before_heartbeat"], played["stats"]
    assert played["heartbeat"].get("ok") is True
    assert after["side_turns"] >= before["side_turns"] + 1
    assert after["main_turns"] == before["main_turns"] == 5
    assert {s.session_id for s in _oc_samples(stack)} == {"oc-a", "oc-b"}


def test_new_session_command_marks_the_session_done(played, stack):
    assert played["b_open_before_new"]
    assert "New session" in played["new"].text
    assert (PERSON, "oc-b") not in stack.gateway.sessions  # B2 (no next state) was dropped, not kept waiting
    assert stack.gateway.sessions.pending_turns() == 0 and len(stack.gateway.sessions) == 0


def _replay(client, name: str, session: str, *, stream: bool, done: bool = False):
    recorded = json.loads((FIXTURES / f"{name}.json").read_text())
    body = {**recorded["body"], "stream": stream, "max_completion_tokens": MAX_TOKENS}
    if not stream:
        body.pop("stream_options", None)
    headers = {"X-Session-Id": session, "X-Turn-Type": "main", **({"X-Session-Done": "1"} if done else {})}
    return client.chat.completions.create(**body, extra_headers=headers)


@pytest.fixture
def client(stack):
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c


def test_recorded_openclaw_requests_replayed_streaming_and_not(played, stack, client):
    """The recorded requests, as OpenClaw sent them, through the official client: both transports."""
    chunks = list(_replay(client, "minimal_turn1", "replay-1", stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1  # stream_options honoured
    reply = _replay(client, "minimal_turn2", "replay-1", stream=False, done=True)
    assert reply.choices[0].message.role == "assistant" and reply.usage.prompt_tokens > 1000
    stack.lt.run(stack.gateway.drain(60), timeout=90)
    replayed = [s for s in stack.samples() if s.session_id == "replay-1"]
    # the correction's words after its verdict ("No, that's wrong.") are the hint the rule judge extracts
    assert [(s.turn_index, s.kind, s.reward, s.hints) for s in replayed] == [(0, "opd+rl", -1, ["Show the steps."])]
    assert replayed[0].response_text == text
    assert replayed[0].next_state["content"] == "No, that's wrong. Show the steps."


def test_recorded_tool_result_request_is_accepted(played, stack, client):
    """OpenClaw's request after a tool call (assistant tool_calls with content null + the tool result)."""
    tool = _replay(client, "tool_result", "replay-2", stream=False, done=True)
    assert tool.choices[0].finish_reason in ("stop", "length", "tool_calls")


# ----------------------------------------------------------------------------- the run mode (env.client: openclaw)

@pytest.fixture(scope="module")
def person_through_openclaw(played, stack, tmp_path_factory):
    """`EnvRunner` as `python -m openclaw_jax.train` builds it with `env.client: openclaw`: a simulated
    person holds a session through OpenClaw's daemon and its OpenAI endpoint, then the held-out
    evaluation asks one question the same way. Runs after `played` (its samples are counted apart)."""
    from openclaw_jax.config import ExperimentConfig
    from openclaw_jax.envs.config import EnvConfig
    from openclaw_jax.runs.users import env_runner

    before = {s.session_id for s in stack.samples()}
    stats_before = stack.stats()
    run_dir = tmp_path_factory.mktemp("oc_run")
    cfg = ExperimentConfig(
        run_dir=str(run_dir), gateway=stack.gateway.cfg.replace(temperature=1.0),
        env=EnvConfig(client="openclaw", persona="concise:max_chars=60,correct=true", questions="arithmetic",
                      concurrency=1, turns_per_session=2, max_tokens=MAX_TOKENS, heldout_questions=1))

    async def play() -> dict[str, Any]:
        runner = env_runner(cfg, stack.url, store_dir=str(stack.store_dir), offset_fn=lambda: 0)
        await runner.start()
        try:
            user_stats = await runner.people[0].user.run(1)
            graded = await runner.heldout_eval()
        finally:
            await runner.close()
        return {"user": user_stats, "graded": graded, "result": runner.people[0].user.results[0]}

    out = stack.lt.run(play(), timeout=600)
    stack.lt.run(stack.gateway.drain(60), timeout=90)
    # The person never types /new: their session would end on the gateway's idle timeout.
    new = [s for s in stack.samples() if s.session_id not in before]
    out.update(new_samples=new, stats_before=stats_before, stats=stack.stats())
    return out


def test_a_person_through_openclaws_endpoint_trains_under_openclaws_session_id(person_through_openclaw, stack):
    out = person_through_openclaw
    result = out["result"]
    assert result.error is None and result.closed and len(result.turns) >= 1
    samples = out["new_samples"]
    assert samples, "no sample from the person's session"
    # One OpenClaw session (its own id, a UUID, not the person's conversation name), turns in order.
    assert len({s.session_id for s in samples}) == 1
    sid = samples[0].session_id
    assert not sid.startswith("sim-") and len(sid) == 36
    assert [s.turn_index for s in samples] == list(range(len(samples)))
    # Each next state is the person's reaction, in their own words (OpenClaw's wrapper stripped).
    for sample, turn in zip(samples, result.turns):
        assert sample.next_state["content"] == turn.reaction
    # The prompt is OpenClaw's: its system prompt, the question behind OpenClaw's timestamp.
    prompt = stack.gateway.tokenizer.decode(samples[0].prompt_ids)
    assert "OpenClaw" in prompt and len(samples[0].prompt_ids) > 1000


def test_heldout_answers_through_openclaw_are_side_and_never_trained(person_through_openclaw):
    out = person_through_openclaw
    assert out["graded"]["preference_score"] in (0.0, 1.0)  # one question, graded
    added_main = out["stats"]["main_turns"] - out["stats_before"]["main_turns"]
    # The person's answering requests and closing request were main; the held-out question was side.
    assert added_main == out["result"].requests
    assert out["stats"]["side_turns"] >= out["stats_before"]["side_turns"] + 1
