"""Probes: the model server's control routes, called by whatever reaches its port.

Anyone who reaches an open port (an agent's own shell tool on the same host included) could pause
generation, abort every request, flush the cache or load weights from any path, and an error could
tell whether a path exists. A server bound beyond loopback refuses to start without a key; with one,
every control route answers 401 without it (and changes nothing); weights load only from --weight-dir,
and any other path gets one answer whether it exists or not; the gateway and the trainer send the key.
Real processes on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import requests

from tests.helpers.abuse import GatewayProcess
from tests.helpers.server_utils import REPO, ServerProcess, server_env

KEY = "k-" + "7" * 40
CONTROL_ROUTES = [("POST", "/pause_generation", {}), ("POST", "/continue_generation", {}),
                  ("POST", "/abort_request", {"abort_all": True}), ("POST", "/flush_cache", None),
                  ("GET", "/flush_cache", None), ("POST", "/update_weights_from_disk", {"model_path": "/etc"}),
                  ("POST", "/expect_request", {"within_s": 600})]


def test_a_server_reachable_from_elsewhere_needs_a_key(tiny_qwen3_dir):
    env = {k: v for k, v in server_env(None).items() if k != "OPENCLAW_POLICY_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "openclaw_jax.inference", "--model", str(tiny_qwen3_dir), "--host",
                           "0.0.0.0", "--port", "0"], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--host 0.0.0.0 is reachable from other machines" in proc.stderr and "--api-key" in proc.stderr


@pytest.fixture(scope="module")
def keyed_server(tiny_qwen3_dir, tiny_qwen3_dir_b, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("abuse_controls")
    server = ServerProcess(tiny_qwen3_dir, log_path=tmp / "server.log",
                           extra_args=["--api-key", KEY, "--weight-dir", str(tiny_qwen3_dir_b.parent)])
    yield server.start(), tmp
    server.kill()


def generate(url: str, headers: dict | None = None) -> requests.Response:
    return requests.post(url + "/generate", timeout=120, headers=headers,
                         json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}})


def test_control_routes_need_the_key_and_change_nothing_without_it(keyed_server):
    server, _ = keyed_server
    auth = {"Authorization": f"Bearer {KEY}"}
    for method, path, body in CONTROL_ROUTES:
        r = requests.request(method, server.url + path, json=body, timeout=60)
        assert r.status_code == 401, (path, r.status_code, r.text)
    info = requests.get(server.url + "/get_server_info", headers=auth, timeout=60).json()
    assert info["expecting_request_s"] == 0, info  # no background work held (a request would end a hold)
    # nothing was paused, aborted or swapped: a generation runs, on the weights it started with
    r = generate(server.url, auth)
    assert r.status_code == 200 and r.json()["meta_info"]["weight_version"] == "default", r.text
    assert generate(server.url).status_code == 401
    assert requests.get(server.url + "/health", timeout=10).status_code == 200   # health needs no key
    r = requests.post(server.url + "/pause_generation", json={}, headers=auth, timeout=60)
    assert r.status_code == 200
    assert requests.post(server.url + "/continue_generation", json={}, headers=auth, timeout=60).status_code == 200


def test_weights_load_only_from_weight_dirs_and_errors_tell_nothing_about_other_paths(keyed_server,
                                                                                      tiny_qwen3_dir_b, tmp_path):
    server, _ = keyed_server
    auth = {"Authorization": f"Bearer {KEY}"}

    def update(path: str) -> requests.Response:
        return requests.post(server.url + "/update_weights_from_disk", headers=auth, timeout=300,
                             json={"model_path": path, "weight_version": "probe"})

    existing_dir, existing_file = str(tmp_path), str(REPO / "pyproject.toml")
    missing = str(tmp_path / "no-such-directory")
    escape = str(tiny_qwen3_dir_b.parent / ".." / os.path.basename(tmp_path))   # out of the weight dir by ..
    answers = {p: update(p) for p in (existing_dir, existing_file, missing, escape, "/etc", "/")}
    assert {r.status_code for r in answers.values()} == {400}
    messages = {r.json()["message"] for r in answers.values()}
    assert messages == {"model_path is not inside a weight directory of this server (--weight-dir)"}, messages
    assert not any(re.search(r"exist|found|permission|directory:", r.text, re.I) for r in answers.values())
    r = update(str(tiny_qwen3_dir_b))
    assert r.status_code == 200 and r.json()["success"], r.text
    assert generate(server.url, auth).json()["meta_info"]["weight_version"] == "probe"


def test_the_gateway_sends_the_pool_key(keyed_server, tmp_path):
    server, _ = keyed_server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for env, status in (({"OPENCLAW_POLICY_API_KEY": KEY}, 200), ({}, 502)):
        gw = GatewayProcess(["--policy-url", server.url, "--judge", "rule", "--model", "tiny", "--store",
                             str(tmp_path / f"store{status}")], tmp_path / f"gateway{status}.log", env=env)
        try:
            r = requests.post(gw.url + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == status, r.text
            if status == 502:
                assert "HTTP 401" in r.json()["error"]["message"]
        finally:
            gw.stop()


def test_the_trainers_embedded_server_has_a_key(tmp_path):
    """A real `python -m openclaw_jax.train` run: its policy server (which the log names) refuses every control
    route and generation without the run's key, while the run's own gateway serves through it."""
    proc = subprocess.Popen([sys.executable, "-m", "openclaw_jax.train", "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
                             f"run_dir={tmp_path / 'run'}", "trainer.max_steps=100000", "progress=false",
                             "env.concurrency=1"], cwd=REPO, env=server_env(None), stderr=subprocess.PIPE, text=True)
    try:
        policy = gateway = None
        deadline = time.monotonic() + 400
        while (policy is None or gateway is None) and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the run ended before its servers started"
            if m := re.search(r"policy pool: \['(http://[^']+)'\]", line):
                policy = m.group(1)
            if m := re.search(r"gateway: (http://\S+)/v1", line):
                gateway = m.group(1)
        assert policy and gateway, "the run never logged its policy pool and gateway"
        for method, path, body in CONTROL_ROUTES:
            assert requests.request(method, policy + path, json=body, timeout=60).status_code == 401, path
        assert generate(policy).status_code == 401
        r = requests.post(gateway + "/v1/chat/completions", timeout=300,
                          json={"messages": [{"role": "user", "content": "1 + 1?"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
