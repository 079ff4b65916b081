"""openclaw_jax.envs.openclaw_agent without OpenClaw: the config it writes, its checks, its output
parsing and process measurement, the CLI and scripts/openclaw.sh's answers when nothing is installed.
(The real OpenClaw runs in tests/integrations/test_openclaw_real.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openclaw_jax.envs import openclaw_agent as oa

REPO = Path(__file__).resolve().parents[2]


def config(**kw):
    return oa.OpenClawAgentConfig(**{"gateway_url": "http://127.0.0.1:8000", "state_dir": Path("/s"), **kw})


def test_minimal_profile_config_has_the_provider_and_our_plugin():
    out = oa.openclaw_config(config(api_key="KEY", max_tokens=64, context_window=4096))
    provider = out["models"]["providers"]["openclaw-jax"]
    assert provider["baseUrl"] == "http://127.0.0.1:8000/v1" and provider["api"] == "openai-completions"
    assert provider["apiKey"] == "KEY"
    assert provider["models"][0]["id"] == "smollm2"
    assert (provider["models"][0]["contextWindow"], provider["models"][0]["maxTokens"]) == (4096, 64)
    defaults = out["agents"]["defaults"]
    assert defaults == {"model": {"primary": "openclaw-jax/smollm2"}, "skills": [], "skipBootstrap": True}
    assert out["tools"] == {"profile": "minimal"}
    entry = out["plugins"]["entries"]["openclaw-jax"]
    assert entry["enabled"] and entry["hooks"] == {"allowConversationAccess": True}
    assert entry["config"] == {"gatewayUrl": "http://127.0.0.1:8000", "apiKey": "KEY"}
    assert out["plugins"]["load"]["paths"] == [str(REPO / "integrations" / "openclaw")]
    assert "gateway" not in out


def test_default_profile_keeps_openclaws_own_defaults_and_daemon_block():
    out = oa.openclaw_config(config(profile="default", notify_session_done=False), daemon_port=18789)
    assert "tools" not in out and out["agents"]["defaults"] == {"model": {"primary": "openclaw-jax/smollm2"}}
    assert out["plugins"]["entries"]["openclaw-jax"]["config"] == {"gatewayUrl": ""}
    assert out["gateway"] == {"mode": "local", "port": 18789, "bind": "loopback", "auth": {"mode": "none"},
                              "http": {"endpoints": {"chatCompletions": {"enabled": True}}}}


def test_side_session_prefixes_reach_the_plugin_config():
    out = oa.openclaw_config(config(side_session_prefixes=("heldout",)))
    assert out["plugins"]["entries"]["openclaw-jax"]["config"]["sideSessionPrefixes"] == ["heldout"]
    assert "sideSessionPrefixes" not in oa.openclaw_config(config())["plugins"]["entries"]["openclaw-jax"]["config"]


def test_a_person_id_reaches_the_plugin_config():
    out = oa.openclaw_config(config(person_id="bob@home"))
    assert out["plugins"]["entries"]["openclaw-jax"]["config"]["personId"] == "bob@home"
    assert "personId" not in oa.openclaw_config(config())["plugins"]["entries"]["openclaw-jax"]["config"]


def test_gateway_url_may_end_in_v1():
    assert config(gateway_url="http://h:1/v1/").gateway_url == "http://h:1"


@pytest.mark.parametrize("kw, words", [
    ({"gateway_url": "127.0.0.1:8000"}, "gateway_url='127.0.0.1:8000'"),
    ({"max_tokens": 8192}, "max_tokens=8192 must be below context_window=8192"),
    ({"context_window": 0}, "context_window=0"),
    ({"api_key": ""}, "api_key is empty"),
    ({"profile": "coding"}, "profile='coding'"),
    ({"model_id": "a/b"}, "model_id='a/b'"),
    ({"timeout_s": 0}, "timeout_s=0"),
    ({"person_id": "two words"}, "person_id='two words' is not a person id: 1 to 64 letters"),
])
def test_bad_configs_say_what_and_which_value(kw, words):
    with pytest.raises(ValueError) as err:
        config(**kw)
    assert words in str(err.value)


def test_parse_result_skips_logs_and_unwraps_the_daemon_envelope():
    turn = {"payloads": [{"text": "5"}], "meta": {"stopReason": "stop"}}
    assert oa.parse_result("[plugins] loaded\n" + json.dumps(turn)) == turn
    got = oa.parse_result(json.dumps({"runId": "r", "status": "ok", "result": turn}))
    assert got["payloads"] == turn["payloads"] and got["daemon"] == {"runId": "r", "status": "ok"}
    for bad, words in (("no json here", "no JSON object"), ("{oops", "does not parse"), ('{"a": 1}', "no 'payloads'")):
        with pytest.raises(oa.OpenClawError, match=words):
            oa.parse_result(bad)


def test_missing_install_names_the_setup_command(tmp_path):
    with pytest.raises(oa.OpenClawError) as err:
        oa.OpenClawAgent("http://127.0.0.1:1", tmp_path / "state", install=tmp_path / "none")
    assert "bash scripts/openclaw.sh setup" in str(err.value) and str(tmp_path / "none") in str(err.value)


def test_run_measured_reports_the_childs_cpu_and_enforces_the_timeout():
    busy = [sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
            "print('done')"]
    rc, cpu_s, out, _ = oa._run_measured(busy, dict(os.environ), 60)
    assert (rc, out.strip()) == (0, "done") and 0.4 <= cpu_s < 5
    with pytest.raises(oa.OpenClawError, match="timeout_s=0.5"):
        oa._run_measured([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), 0.5)


def test_a_turn_that_printed_its_result_and_lingers_is_ended_and_kept():
    """An agent process that prints its whole --json result and then stays up (as one `openclaw agent
    --local` did, on a failed SQLite maintenance worker) is killed after the grace period and its
    result kept; one still printing, or printing no result, runs into the timeout as before."""
    result = {"payloads": [{"text": "12"}], "meta": {"stopReason": "stop"}}
    lingering = [sys.executable, "-c", f"import json, sys, time\nprint('log line')\nprint(json.dumps({result!r}))\n"
                 "sys.stdout.flush()\ntime.sleep(60)"]
    start = time.monotonic()
    rc, _, out, _ = oa._run_measured(lingering, dict(os.environ), 30, finished=oa._has_result, linger_s=0.5)
    assert time.monotonic() - start < 10
    assert rc == 0 and oa.parse_result(out) == result
    half = [sys.executable, "-c", "import sys, time\nprint('{\"payloads\": [')\nsys.stdout.flush()\ntime.sleep(60)"]
    with pytest.raises(oa.OpenClawError, match="timeout_s=2"):
        oa._run_measured(half, dict(os.environ), 2, finished=oa._has_result, linger_s=0.5)
    # a process that exits by itself keeps its own exit code
    failing = [sys.executable, "-c", f"import json\nprint(json.dumps({result!r}))\nraise SystemExit(3)"]
    assert oa._run_measured(failing, dict(os.environ), 30, finished=oa._has_result, linger_s=5)[0] == 3


def test_cli_help_and_bad_arguments():
    run = lambda *a: subprocess.run([sys.executable, "-m", "openclaw_jax.envs.openclaw_agent", *a],
                                    capture_output=True, text=True, cwd=REPO)
    helped = run("--help")
    assert helped.returncode == 0 and "--session-id" in helped.stdout and "--profile" in helped.stdout
    bad = run("--gateway", "nope", "--session-id", "s", "--message", "hi")
    assert bad.returncode == 1 and "gateway_url='nope'" in bad.stderr


def test_script_help_and_check_without_an_install(tmp_path):
    script = str(REPO / "scripts" / "openclaw.sh")
    helped = subprocess.run(["bash", script, "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "setup" in helped.stdout and "agent --gateway URL" in helped.stdout
    env = {**os.environ, "OPENCLAW_JAX_DIR": str(tmp_path / "none")}
    checked = subprocess.run(["bash", script, "check"], capture_output=True, text=True, env=env)
    assert checked.returncode == 1
    assert "n24/bin/node" in checked.stderr and "bash scripts/openclaw.sh setup" in checked.stderr
    agent = subprocess.run(["bash", script, "agent", "--gateway", "http://x", "--session-id", "s", "--message", "m"],
                           capture_output=True, text=True, env=env)
    assert agent.returncode == 1 and "not ready" in agent.stderr
    wrong = subprocess.run(["bash", script, "serve"], capture_output=True, text=True)
    assert wrong.returncode == 1 and "unknown command 'serve'" in wrong.stderr
