"""The plugin's main/side rule and header names, run in the pinned Node (integrations/openclaw/index.js).

Real OpenClaw runs through the plugin are in tests/integrations/test_openclaw_real.py (user turns, a heartbeat, `/new`);
this file covers every trigger, provenance and config case of the rule in ~0.2 s of Node. Needs
`bash scripts/openclaw.sh setup` for Node 24 (CI: fails without it; elsewhere: skipped).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "integrations" / "openclaw"
NODE = Path(os.environ.get("OPENCLAW_JAX_DIR") or REPO / ".openclaw") / "n24" / "bin" / "node"


def node_eval(script: str):
    if not NODE.exists():
        message = f"Node 24 is not installed at {NODE}; install it once with `bash scripts/openclaw.sh setup`"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    code = f'import * as P from {json.dumps((PLUGIN / "index.js").as_uri())};\n{script}'
    proc = subprocess.run([str(NODE), "--input-type=module", "-e", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


RULE_CASES = [  # (run as the prompt hooks saw it, expected turn type)
    ({"trigger": "user"}, "main"),
    ({"trigger": "manual"}, "main"),
    ({"trigger": "user", "provenance": "external_user"}, "main"),
    ({"trigger": "heartbeat"}, "side"),
    ({"trigger": "cron"}, "side"),
    ({"trigger": "memory"}, "side"),
    ({"trigger": "overflow"}, "side"),
    ({}, "side"),
    ({"trigger": "user", "provenance": "inter_session"}, "side"),
    ({"trigger": "user", "provenance": "internal_system"}, "side"),
    ({"trigger": "user", "compacting": True}, "side"),
    (None, "side"),  # a request outside any known run
    ({"trigger": "user", "sessionKey": "agent:main:openai-user:heldout-1a2b-3"}, "side"),  # an evaluation session
    ({"trigger": "user", "sessionKey": "heldout-7"}, "side"),
    ({"trigger": "user", "sessionKey": "agent:main:openai-user:sim-concise-0"}, "main"),
    ({"trigger": "user", "sessionKey": "agent:main:openai-user:x-heldout"}, "main"),  # a prefix, not a substring
]


def test_turn_type_rule_for_every_trigger():
    runs = json.dumps([r for r, _ in RULE_CASES])
    got = node_eval(f"const cfg = P.resolveConfig({{sideSessionPrefixes: ['heldout']}});\n"
                    f"console.log(JSON.stringify({runs}.map(r => P.turnType(cfg, r ?? undefined))));")
    assert got == [t for _, t in RULE_CASES]


def test_request_headers_default_and_configured_names():
    got = node_eval("""
const runs = new Map([["s1", {trigger: "user"}], ["s2", {trigger: "heartbeat"}]]);
const d = P.resolveConfig({});
const c = P.resolveConfig({sessionIdHeader: "X-Conv", turnTypeHeader: "X-Kind", mainTriggers: ["cron"]});
console.log(JSON.stringify([P.requestHeaders(d, runs, "s1"), P.requestHeaders(d, runs, "s2"),
  P.requestHeaders(d, runs, undefined), P.requestHeaders(c, runs, "s1"),
  P.requestHeaders(c, new Map([["s3", {trigger: "cron"}]]), "s3")]));
""")
    assert got == [{"X-Session-Id": "s1", "X-Turn-Type": "main"}, {"X-Session-Id": "s2", "X-Turn-Type": "side"},
                   {"X-Turn-Type": "side"}, {"X-Conv": "s1", "X-Kind": "side"}, {"X-Conv": "s3", "X-Kind": "main"}]


def test_bad_plugin_config_is_refused_with_the_value():
    got = node_eval("""
const out = [];
for (const raw of [{sessionIdHeader: "X Session"}, {gatewayUrl: "127.0.0.1:8000"}, {sideSessionPrefixes: [""]}]) {
  try { P.resolveConfig(raw); out.push("accepted"); } catch (e) { out.push(String(e.message)); }
}
console.log(JSON.stringify(out));
""")
    assert 'sessionIdHeader="X Session"' in got[0] and 'gatewayUrl="127.0.0.1:8000"' in got[1]
    assert 'sideSessionPrefixes=[""]' in got[2]


def test_plain_http_only_to_this_machine_and_the_person_header():
    """The key and the person's conversation never cross the network in clear text; the configured person
    id goes with every request and every session-done notice."""
    got = node_eval("""
const out = [];
for (const url of ["http://10.0.0.5:8000", "http://gw.example.com", "http://127.0.0.1.example.com:8000",
                   "http://127.0.0.1:8000", "http://127.9.9.9", "http://[::1]:8000", "http://localhost:8000",
                   "https://gw.example.com"]) {
  try { P.resolveConfig({gatewayUrl: url}); out.push("accepted"); } catch (e) { out.push(String(e.message)); }
}
const cfg = P.resolveConfig({personId: "alice"});
out.push(P.requestHeaders(cfg, new Map([["s1", {trigger: "user"}]]), "s1"));
try { P.resolveConfig({personId: "two words"}); out.push("accepted"); } catch (e) { out.push(String(e.message)); }
console.log(JSON.stringify(out));
""")
    refused, accepted = got[:3], got[3:8]
    assert all("plain http:// to another host" in message for message in refused), refused
    assert accepted == ["accepted"] * 5
    assert got[8] == {"X-Session-Id": "s1", "X-Turn-Type": "main", "X-Person-Id": "alice"}
    assert 'personId="two words"' in got[9]


def test_a_persons_run_sends_one_turn_notice_as_it_begins():
    """The first hook of a person's run (`before_model_resolve`, before OpenClaw loads the session and builds
    the prompt) POSTs one turn-starting notice to the gateway, with the session, key and person; the later
    hooks of the same run send none; a heartbeat run sends none; the next run of the session sends its own;
    an empty `turnStartingPath` turns the notices off. (Real OpenClaw firing the hook: test_openclaw_real.py.)"""
    got = node_eval("""
import http from "node:http";
const seen = [];
const server = http.createServer((req, res) => {
  let body = "";
  req.on("data", (c) => { body += c; });
  req.on("end", () => { seen.push({path: req.url, session: req.headers["x-session-id"], type: req.headers["x-turn-type"],
                                   auth: req.headers.authorization, person: req.headers["x-person-id"], body});
                        res.writeHead(202, {"Content-Type": "application/json"}); res.end("{}"); });
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const url = `http://127.0.0.1:${server.address().port}`;
function plugin(config) {
  const hooks = {};
  P.default.register({pluginConfig: config, logger: {}, on: (name, fn) => { hooks[name] = fn; }, registerProvider: () => {}});
  return hooks;
}
const settle = () => new Promise((r) => setTimeout(r, 300));
const h = plugin({gatewayUrl: url, apiKey: "k1", personId: "alice"});
const counts = [];
h.before_model_resolve({}, {sessionId: "s 1", trigger: "user"}); await settle(); counts.push(seen.length);
h.before_prompt_build({}, {sessionId: "s 1", trigger: "user"}); h.before_agent_run({}, {sessionId: "s 1", trigger: "user"});
await settle(); counts.push(seen.length);
h.agent_end({}, {sessionId: "s 1"});
h.before_model_resolve({}, {sessionId: "hb", trigger: "heartbeat"}); await settle(); counts.push(seen.length);
h.before_model_resolve({}, {sessionId: "s 1", trigger: "user"}); await settle(); counts.push(seen.length);
const off = plugin({gatewayUrl: url, turnStartingPath: ""});
off.before_model_resolve({}, {sessionId: "s2", trigger: "user"}); await settle(); counts.push(seen.length);
server.close();
console.log(JSON.stringify({counts, seen}));
""")
    assert got["counts"] == [1, 1, 1, 2, 2], got
    assert got["seen"][0] == {"path": "/v1/sessions/s%201/turn_starting", "session": "s 1", "type": "side",
                              "auth": "Bearer k1", "person": "alice", "body": "{}"}
    assert got["seen"][1] == got["seen"][0]
