"""`scripts/openclaw.sh connect` / `disconnect` on a person's real OpenClaw config (JSON5 with comments, other
providers, the person's own plugin and its allowlist, a channel, other settings), written and checked by the
installed OpenClaw 2026.9.6 itself, then a real OpenClaw turn through our gateway with the connected config.

The pure parts (the settings, the merge patch, the undo) are checked on plain dicts first.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openclaw_jax.envs.openclaw_agent import PLUGIN_DIR, node_bin, openclaw_bin, parse_result
from openclaw_jax.envs.openclaw_connect import (ConnectSpec, OpenClawCLI, applied, backup_path, merge_patch,
                                                our_settings, record_entry, record_path, undo)
from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from tests.helpers.scripted_pool import LoopThread
from tests.integrations.test_openclaw_real import require_openclaw

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "openclaw.sh"

PERSON_PLUGIN_MANIFEST = {"id": "person-notes", "name": "person-notes", "description": "the person's own plugin",
                          "configSchema": {"type": "object", "additionalProperties": False,
                                           "properties": {"folder": {"type": "string"}}}}
PERSON_PLUGIN_JS = ('export default { id: "person-notes", name: "person-notes", '
                    'description: "the person\'s own plugin", register(api) {} };\n')


def person_config(plugin_dir: Path) -> str:
    """A config a person might have: JSON5, comments, two providers, fallbacks, their plugin and allowlist."""
    return f"""// my OpenClaw
{{
  models: {{
    providers: {{
      ollama: {{baseUrl: "http://127.0.0.1:11434/v1", apiKey: "ollama-local", api: "openai-completions",
        models: [{{id: "llama3.2", name: "Llama 3.2", reasoning: false, input: ["text"], contextWindow: 131072,
                   maxTokens: 4096, cost: {{input: 0, output: 0, cacheRead: 0, cacheWrite: 0}}}}]}},
      myproxy: {{baseUrl: "https://proxy.example.com/v1", apiKey: "sk-mine", api: "openai-completions",
        models: [{{id: "big", name: "Big", reasoning: true, input: ["text"], contextWindow: 200000, maxTokens: 8192,
                   cost: {{input: 1, output: 2, cacheRead: 0, cacheWrite: 0}}}}]}},
    }},
  }},
  agents: {{defaults: {{model: {{primary: "ollama/llama3.2", fallbacks: ["myproxy/big"]}}, workspace: "~/work"}}}},
  channels: {{discord: {{enabled: false, dmPolicy: "disabled"}}}},  // not yet
  plugins: {{
    allow: ["person-notes"],
    load: {{paths: ["{plugin_dir}"]}},
    entries: {{"person-notes": {{enabled: true, config: {{folder: "~/notes"}}}}}},
  }},
}}
"""


# ----------------------------------------------------------------------------- pure parts

ORIGINAL = {"models": {"providers": {"ollama": {"baseUrl": "u"}}},
            "agents": {"defaults": {"model": {"primary": "ollama/x", "fallbacks": ["p/y"]}}},
            "plugins": {"allow": ["mine"], "entries": {"mine": {"enabled": True}}}}
SPEC = ConnectSpec(gateway_url="http://127.0.0.1:8000/v1/", model_id="smollm2", profile="minimal")


def test_settings_extend_allowlists_that_exist_and_never_create_one():
    settings = {s.path: s for s in our_settings(SPEC, ORIGINAL)}
    assert settings[("plugins", "allow")].kind == "append"
    assert ("agents", "defaults", "modelPolicy", "allow") not in settings   # the person keeps no model allowlist
    assert ("plugins", "allow") not in {s.path for s in our_settings(SPEC, {})}
    assert settings[("models", "providers", "openclaw-jax")].value["baseUrl"] == "http://127.0.0.1:8000/v1"
    # a plain "provider/model" default becomes an object with our primary
    flat = {"agents": {"defaults": {"model": "ollama/x"}}}
    assert applied(flat, our_settings(SPEC, flat))["agents"]["defaults"]["model"] == {"primary": "openclaw-jax/smollm2"}


def test_merge_patch_turns_one_config_into_another_as_openclaw_applies_it():
    def apply_patch(tree, patch):   # RFC 7386, independently of merge_patch
        out = copy.deepcopy(tree)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif isinstance(v, dict) and isinstance(out.get(k), dict):
                out[k] = apply_patch(out[k], v)
            else:
                out[k] = v
        return out

    connected = applied(ORIGINAL, our_settings(SPEC, ORIGINAL))
    patch = merge_patch(ORIGINAL, connected)
    assert apply_patch(ORIGINAL, patch) == connected
    assert "ollama" not in json.dumps(patch)            # only what changes is sent
    assert patch["plugins"]["allow"] == ["mine", "openclaw-jax"]
    assert merge_patch(connected, connected) == {}


def test_a_person_id_goes_into_the_plugins_config_and_a_malformed_one_is_refused():
    def entry(spec: ConnectSpec) -> dict:
        return applied({}, our_settings(spec, {}))["plugins"]["entries"]["openclaw-jax"]["config"]

    assert "personId" not in entry(SPEC)   # nobody named: the gateway's default person, or the key's
    assert entry(ConnectSpec(gateway_url="http://127.0.0.1:8000", person_id="bob@home"))["personId"] == "bob@home"
    for bad in ("two words", "-x", "x" * 65, "a/b"):
        with pytest.raises(ValueError, match="--person-id=.* is not a person id: 1 to 64 letters"):
            ConnectSpec(gateway_url="http://127.0.0.1:8000", person_id=bad)


def test_undo_takes_out_ours_and_keeps_what_the_person_changed():
    entries = {".".join(s.path): record_entry(ORIGINAL, s) for s in our_settings(SPEC, ORIGINAL)}
    connected = applied(ORIGINAL, our_settings(SPEC, ORIGINAL))
    restored, undone, kept = undo(connected, entries)
    assert restored == ORIGINAL and kept == [] and "tools.profile" in undone   # `tools` was created, and removed
    changed = copy.deepcopy(connected)
    changed["agents"]["defaults"]["model"]["primary"] = "p/y"        # the person picked another model since
    changed["plugins"]["allow"].append("theirs")                      # and allowed another plugin
    changed["gateway"] = {"port": 1}
    result, _, kept = undo(changed, entries)
    assert kept == ["agents.defaults.model.primary"]
    expected = copy.deepcopy(ORIGINAL)
    expected["agents"]["defaults"]["model"]["primary"] = "p/y"
    expected["plugins"]["allow"].append("theirs")
    expected["gateway"] = {"port": 1}
    assert result == expected


# ----------------------------------------------------------------------------- the real OpenClaw


def _sh(*args: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _openclaw(env: dict, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([str(openclaw_bin()), *args], env=env, input=stdin, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _read(path: Path) -> dict:
    return OpenClawCLI(path).read(path)


@pytest.fixture
def person(tmp_path):
    """The person's OpenClaw home: their config, their plugin, an environment that points OpenClaw there."""
    require_openclaw()
    plugin = tmp_path / "person-notes"
    plugin.mkdir()
    (plugin / "openclaw.plugin.json").write_text(json.dumps(PERSON_PLUGIN_MANIFEST))
    (plugin / "package.json").write_text(json.dumps({"name": "person-notes", "version": "1.0.0", "type": "module",
                                                     "openclaw": {"extensions": ["./index.js"]}}))
    (plugin / "index.js").write_text(PERSON_PLUGIN_JS)
    state = tmp_path / "state"
    (state / "home").mkdir(parents=True)
    config = state / "openclaw.json"
    config.write_text(person_config(plugin))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
    env.update(OPENCLAW_STATE_DIR=str(state), HOME=str(state / "home"), NO_COLOR="1", PYTHON=sys.executable,
               PATH=f"{node_bin().parent}{os.pathsep}{env['PATH']}", OPENCLAW_CONFIG_PATH=str(config))
    original = _read(config)
    assert original["plugins"]["allow"] == ["person-notes"]   # the JSON5 parses as the person wrote it
    return config, env, plugin, original


@pytest.fixture
def gateway_stack(tmp_path, tiny_smollm2_dir):
    """The embedded server (a tiny random model, SmolLM2's tokenizer) and our gateway, the rule judge."""
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_jax.inference", "--model", str(tiny_smollm2_dir),
                             "--port", "0", "--log-level", "warning", "--min-prompt-bucket", "4096",
                             "--min-cache-bucket", "4096"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    lt = LoopThread()
    gateway = runner = None
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        cfg = GatewayConfig(port=0, policy_urls=(line.split()[1],), judge="rule", store_dir=str(tmp_path / "store"),
                            model=str(tiny_smollm2_dir), request_timeout_s=300.0, pool_max_retries=1)
        gateway, runner, url = lt.run(start_gateway(cfg), timeout=300)
        yield gateway, url
    finally:
        if gateway is not None:
            lt.run(stop_gateway(gateway, runner, grace_s=5))
        lt.stop()
        proc.terminate()
        proc.wait(60)
        proc.stdout.close()


def _without_meta(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "meta"}   # OpenClaw stamps its version on every write


def test_connect_merges_into_the_persons_config_a_real_turn_works_and_disconnect_restores_it(person, gateway_stack):
    config, env, plugin, original = person
    gateway, url = gateway_stack
    original_bytes = config.read_bytes()

    out = _sh("connect", "--gateway", url, "--model-id", "model", "--max-tokens", "8", "--profile", "minimal",
              "--person-id", "alice", "--openclaw-config", str(config), env=env)
    assert "connected" in out.stderr
    connected = _read(config)
    assert backup_path(config).read_bytes() == original_bytes and record_path(config).exists()
    # ours is in; everything of the person's is as it was
    assert connected["models"]["providers"]["ollama"] == original["models"]["providers"]["ollama"]
    assert connected["models"]["providers"]["myproxy"] == original["models"]["providers"]["myproxy"]
    assert connected["models"]["providers"]["openclaw-jax"]["baseUrl"] == url + "/v1"
    assert connected["agents"]["defaults"]["model"] == {"primary": "openclaw-jax/model", "fallbacks": ["myproxy/big"]}
    assert connected["agents"]["defaults"]["workspace"] == "~/work"
    assert connected["channels"] == original["channels"]
    assert connected["plugins"]["allow"] == ["person-notes", "openclaw-jax"]
    assert connected["plugins"]["load"]["paths"] == [str(plugin), str(PLUGIN_DIR)]
    assert connected["plugins"]["entries"]["person-notes"] == original["plugins"]["entries"]["person-notes"]
    assert connected["plugins"]["entries"]["openclaw-jax"]["hooks"] == {"allowConversationAccess": True}
    assert connected["plugins"]["entries"]["openclaw-jax"]["config"]["personId"] == "alice"
    assert connected["tools"] == {"profile": "minimal"}
    # OpenClaw accepts it and loads both plugins
    assert json.loads(_openclaw(env, "config", "validate", "--json"))["valid"] is True
    listed = _openclaw(env, "plugins", "list", "--json")
    loaded = {p["id"]: p for p in json.loads(listed[listed.find("{"):])["plugins"]}
    assert loaded["person-notes"]["enabled"] and loaded["openclaw-jax"]["enabled"], listed[:2000]

    # running it again changes nothing: not a byte, not even the file's time
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    again = _sh("connect", "--gateway", url, "--model-id", "model", "--max-tokens", "8", "--profile", "minimal",
                "--person-id", "alice", "--openclaw-config", str(config), env=env)
    assert "unchanged" in again.stderr and (config.read_bytes(), config.stat().st_mtime_ns) == before

    # a real OpenClaw turn with the connected config reaches our gateway, tagged by our plugin with the
    # session id and the person
    t = time.monotonic()
    turn = _openclaw(env, "agent", "--local", "--session-id", "connected-1", "-m", "What is 2 + 3?", "--json",
                     "--timeout", "500")
    result = parse_result(turn)
    assert result["meta"].get("stopReason") not in (None, "error"), turn[-2000:]
    stats = httpx.get(url + "/healthz", timeout=10).json()["stats"]
    assert stats["main_turns"] >= 1 and ("alice", "connected-1") in gateway.sessions, (stats, time.monotonic() - t)

    # nothing changed since connect: disconnect puts the person's file back byte for byte
    out = _sh("disconnect", "--openclaw-config", str(config), env=env)
    assert "restored" in out.stderr
    assert config.read_bytes() == original_bytes
    assert not backup_path(config).exists() and not record_path(config).exists()
    assert json.loads(_openclaw(env, "config", "validate", "--json"))["valid"] is True


def test_disconnect_after_the_person_changed_things_takes_out_only_what_connect_added(person):
    config, env, plugin, original = person
    _sh("connect", "--gateway", "http://127.0.0.1:8000", "--openclaw-config", str(config), env=env)
    # the person changes their config through OpenClaw: a new provider, a setting, and our default model
    change = {"models": {"providers": {"lmstudio": {"baseUrl": "http://127.0.0.1:1234/v1", "apiKey": "lm",
                                                    "api": "openai-completions",
                                                    "models": [{"id": "qwen", "name": "Qwen"}]}}},
              "agents": {"defaults": {"workspace": "~/elsewhere", "model": {"primary": "myproxy/big"}}}}
    _openclaw(env, "config", "patch", "--stdin", stdin=json.dumps(change))

    out = _sh("disconnect", "--openclaw-config", str(config), env=env)
    assert "undone" in out.stderr and "kept, changed by you since connect: agents.defaults.model.primary" in out.stderr
    after = _without_meta(_read(config))
    expected = copy.deepcopy(original)
    expected["models"]["providers"]["lmstudio"] = after["models"]["providers"]["lmstudio"]
    assert after["models"]["providers"]["lmstudio"]["baseUrl"] == "http://127.0.0.1:1234/v1"
    expected["agents"]["defaults"].update(workspace="~/elsewhere", model={"primary": "myproxy/big",
                                                                           "fallbacks": ["myproxy/big"]})
    assert after == expected
    assert backup_path(config).exists() and not record_path(config).exists()   # the old file stays for reference
    assert json.loads(_openclaw(env, "config", "validate", "--json"))["valid"] is True
    # nothing left to undo
    proc = subprocess.run(["bash", str(SCRIPT), "disconnect", "--openclaw-config", str(config)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1 and "nothing to undo" in proc.stderr
