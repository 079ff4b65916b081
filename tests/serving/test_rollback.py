"""Rollback: any kept version is served again, bit for bit.

Real servers on 127.0.0.1: the embedded inference server over a tiny random Qwen3, the gateway in
front of it, and a `PromotionGate` that promotes a second version (new weights, swapped into the
engine in process). The same greedy request with log-probs is asked under version 0, under the
promoted version 1, after `POST /v1/admin/rollback` to 0 (the engine loads the kept directory
through `/update_weights_from_disk`: the path SGLang workers take too), and after the CLI's rollback
to 1: the log-probs after each rollback equal, bit for bit, the first ones of that version. The
admin routes' refusals (no key, a wrong key, admin off, a malformed or unknown version) are checked
on the same gateway.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from openclaw_jax.serving.versions import VersionLog
from tests.helpers.served_stack import ADMIN_KEY, API_KEY, Served, perturbed
from tests.helpers.server_utils import REPO

@pytest.fixture(scope="module")
def served(tiny_qwen3_dir, tmp_path_factory):
    s = Served(tiny_qwen3_dir, tmp_path_factory.mktemp("rollback"))
    yield s
    s.close()


def test_rollback_serves_the_old_weights_bit_for_bit(served):
    version0, lp0, tokens0 = served.logprobs()
    assert version0 == "0" and len(lp0) > 0

    served.lt.run(served.gate(served.graphdef, perturbed(served.state0, 1), "1"))
    version1, lp1, tokens1 = served.logprobs()
    assert version1 == "1"
    assert lp1 != lp0   # other weights, other log-probs
    events = VersionLog(served.versions).events()
    assert [e["event"] for e in events] == ["start", "promoted"] and events[-1]["served_version"] == "1"

    reply = served.admin("POST", "/v1/admin/rollback", json={"version": "0", "reason": "test"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["served_version"] == "0" and reply.json()["from_version"] == "1"
    version, lp, tokens = served.logprobs()
    assert (version, tokens) == ("0", tokens0)
    assert lp == lp0    # exactly: the kept weights are the served ones, bit for bit
    last = VersionLog(served.versions).events()[-1]
    assert last["event"] == "rollback" and last["version"] == "0" and last["from_version"] == "1"

    # the CLI, as a person would run it: list, then serve version 1 again
    env = {"PYTHONPATH": str(REPO), "OPENCLAW_GATEWAY_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"}
    listed = subprocess.run([sys.executable, "-m", "openclaw_jax.serving", "list", "--gateway", served.url, "--json"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    answer = json.loads(listed.stdout)
    assert answer["served_version"] == "0" and sorted(answer["kept"]) == ["0", "1"]
    cli = subprocess.run([sys.executable, "-m", "openclaw_jax.serving", "rollback", "--version", "1", "--gateway",
                          served.url], capture_output=True, text=True, env=env, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "serving version 1 (was 0)" in cli.stdout
    version, lp, _ = served.logprobs()
    assert version == "1" and lp == lp1

    # the gate checks the next candidate against what is served now (read from the kept weights)
    served_version, served_state = served.lt.run(served.gate._served(served.graphdef))
    assert served_version == "1"
    for (_, a), (_, b) in zip(nnx.to_flat_state(served_state),
                              nnx.to_flat_state(perturbed(served.state0, 1))):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))


@pytest.mark.parametrize("key, body, status, needle", [
    (None, {"version": "0"}, 401, "API key"),
    (API_KEY, {"version": "0"}, 403, "admin key"),        # the person's key is valid, and not the admin key
    (ADMIN_KEY, {"version": "../v0"}, 400, "must be a weight version"),
    (ADMIN_KEY, {"ver": "0"}, 400, '{"version"'),
    (ADMIN_KEY, {"version": "7"}, 404, "kept versions: ["),
])
def test_rollback_refusals(served, key, body, status, needle):
    before = VersionLog(served.versions).events()
    reply = served.admin("POST", "/v1/admin/rollback", key=key, json=body)
    assert reply.status_code == status, reply.text
    assert needle in reply.json()["error"]["message"]
    assert VersionLog(served.versions).events() == before   # nothing logged, nothing served


def test_versions_route_and_admin_off(served, tmp_path):
    reply = served.admin("GET", "/v1/admin/versions")
    assert reply.status_code == 200
    assert set(reply.json()["kept"]) == {"0", "1"} and reply.json()["events"][0]["event"] in ("promoted", "rollback")
    assert served.admin("GET", "/v1/admin/versions", key=API_KEY).status_code == 403
    assert served.admin("GET", "/v1/admin/versions", key=None).status_code == 401

    cfg = GatewayConfig(port=0, policy_urls=(served.gateway.policy.urls[0],), judge="rule", model="tiny",
                        store_dir=str(tmp_path / "samples"))
    gateway, runner, url = served.lt.run(start_gateway(cfg), timeout=120)
    try:
        reply = httpx.post(url + "/v1/admin/rollback", json={"version": "0"}, headers={"Authorization": "Bearer x"})
        assert reply.status_code == 403 and "gateway.admin_key" in reply.json()["error"]["message"]
    finally:
        served.lt.run(stop_gateway(gateway, runner, grace_s=1))
