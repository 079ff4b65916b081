"""Rollback on real SGLang 0.5.23 workers (CPU): the gateway's `POST /v1/admin/rollback` has every worker
load the kept directory with `/update_weights_from_disk`, and the same greedy request then gets, from
either worker, exactly the log-probs that version gave before."""

from __future__ import annotations

import httpx
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from openclaw_jax.models.weights import load_hf_checkpoint
from openclaw_jax.serving.versions import VersionLog, VersionStore, versions_dir_for
from tests.helpers.scripted_pool import LoopThread

pytestmark = pytest.mark.sglang

ADMIN = "admin-key"
CLIENT = "client-key"   # a gateway with an admin key is not open: the chat requests carry a client key


def _logprobs(http: httpx.Client) -> tuple[str, list[float]]:
    reply = http.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "Hi!"}],
                                                    "temperature": 0, "max_tokens": 8, "logprobs": True},
                      headers={"Authorization": f"Bearer {CLIENT}"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    return body["metadata"]["weight_version"], [c["logprob"] for c in body["choices"][0]["logprobs"]["content"]]


def _rollback(http: httpx.Client, version: str) -> None:
    reply = http.post("/v1/admin/rollback", json={"version": version}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status_code == 200, reply.text
    assert all(w["success"] for w in reply.json()["workers"]) and len(reply.json()["workers"]) == 2


def test_rollback_on_sglang_workers_is_exact(sglang_workers, sglang_model_dir, tmp_path):
    model, cfg = load_hf_checkpoint(sglang_model_dir)
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    moved = jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                         if jnp.issubdtype(x.dtype, jnp.floating) else x for x, k in zip(leaves, keys)])
    store_dir = tmp_path / "run" / "samples"
    kept = VersionStore(versions_dir_for(store_dir))
    kept.write("0", model, cfg, tokenizer_files_from=sglang_model_dir)
    kept.write("1", nnx.merge(graphdef, moved), cfg, tokenizer_files_from=sglang_model_dir)
    VersionLog(versions_dir_for(store_dir)).append("start", "0", "0")

    lt = LoopThread()
    gw_cfg = GatewayConfig(port=0, policy_urls=tuple(w.url for w in sglang_workers), judge="rule",
                           store_dir=str(store_dir), model=str(sglang_model_dir), api_key=CLIENT, admin_key=ADMIN,
                           request_timeout_s=120.0)
    gateway, runner, url = lt.run(start_gateway(gw_cfg), timeout=120)
    try:
        with httpx.Client(base_url=url, timeout=300) as http:
            _rollback(http, "0")                 # the workers may hold another test's weights: serve version 0
            first = [_logprobs(http) for _ in range(2)]    # both workers (round robin)
            assert first[0] == first[1] and first[0][0] == "0"
            _rollback(http, "1")
            other = _logprobs(http)
            assert other[0] == "1" and other[1] != first[0][1]
            _rollback(http, "0")
            again = [_logprobs(http) for _ in range(2)]
            assert again == first                # the same weights, bit for bit: the same log-probs
        events = VersionLog(versions_dir_for(store_dir)).events()
        assert [(e["event"], e["version"]) for e in events] == [("start", "0"), ("rollback", "0"), ("rollback", "1"),
                                                                ("rollback", "0")]
    finally:
        lt.run(stop_gateway(gateway, runner, grace_s=2))
        lt.stop()
