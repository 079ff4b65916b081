"""A served stack for tests: the embedded inference server over a tiny model, the gateway in front of
it (rule judge, sample store, versions directory beside it) and a `PromotionGate` over the kept
versions, all real, on 127.0.0.1, on one loop thread."""

from __future__ import annotations

import httpx
import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.gateway.judge import RuleJudge
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from openclaw_jax.inference.engine import Engine, EngineConfig
from openclaw_jax.inference.server import InferenceServer
from openclaw_jax.models.tokenizer import load_tokenizer
from openclaw_jax.models.weights import load_hf_checkpoint
from openclaw_jax.pool.weight_sync import InProcessWeightSync
from openclaw_jax.runs.gate import judge_verdict
from openclaw_jax.serving.config import GateConfig
from openclaw_jax.serving.gate import PromotionGate, ScoringSetup
from openclaw_jax.serving.replay import ReplayReader
from openclaw_jax.serving.versions import VersionStore, versions_dir_for
from tests.helpers.scripted_pool import LoopThread, serve_app
from tests.helpers.server_utils import TINY_ENGINE_KW

API_KEY, ADMIN_KEY = "person-key", "admin-key"
MESSAGES = [{"role": "user", "content": "Name three colours."}]


class Served:
    """The embedded server, the gateway and a gate over the kept versions, on one loop thread."""

    def __init__(self, model_dir, tmp_path, gate: GateConfig | None = None):
        self.lt = LoopThread()
        model, self.model_cfg = load_hf_checkpoint(model_dir, dtype="float32", param_dtype="float32")
        self.graphdef, self.state0 = nnx.split(model)
        tok = load_tokenizer(model_dir)
        self.engine = Engine(model, tok, context_length=512, seed=0, config=EngineConfig(**TINY_ENGINE_KW),
                             weight_version="0")
        self.store_dir = store_dir = tmp_path / "run" / "samples"
        self.versions = versions_dir_for(store_dir)
        # a rollback loads kept weights over HTTP: the server's only weight directory is the versions directory
        self.server_runner, server_url = self.lt.run(serve_app(InferenceServer(
            self.engine, tok, model_path=str(model_dir), served_model_name="tiny",
            weight_dirs=[self.versions]).make_app()))
        cfg = GatewayConfig(port=0, policy_urls=(server_url,), judge="rule", store_dir=str(store_dir), model=str(model_dir),
                            api_key=API_KEY, admin_key=ADMIN_KEY, request_timeout_s=60.0)
        self.gateway, self.gw_runner, self.url = self.lt.run(start_gateway(cfg, tokenizer=tok), timeout=120)
        kept = VersionStore(self.versions)
        push = InProcessWeightSync(self.engine)
        # by default a gate that promotes whatever it is given (its check is tested elsewhere): a promoted
        # version is kept and served like the real thing
        gate = gate or GateConfig(enabled=True, min_replay=0, min_score=-1e9, max_kl=1e9)
        self.gate = PromotionGate(
            gate, self.versions, serve=lambda g, s, v, path: push(g, s, v),
            write_kept=lambda g, s, v: kept.write(v, nnx.merge(g, s), self.model_cfg, tokenizer_files_from=model_dir),
            load_kept=lambda v: kept.load_state(v, "float32"),
            replay=ReplayReader(store_dir, holdout_every=gate.holdout_every, size=gate.replay_size),
            setup=ScoringSetup(temperature=1.0, chunk_size=32, w_rl=1.0, w_opd=0.0),
            verdict=judge_verdict(RuleJudge()))
        self.lt.run(self.gate.start(self.graphdef, self.state0, "0"))
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def logprobs(self) -> tuple[str, list[float], list[str]]:
        """A greedy side turn with log-probs: (weight version, the log-prob of each token, the tokens)."""
        reply = self.http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, json={
            "model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 12, "logprobs": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        content = body["choices"][0]["logprobs"]["content"]
        return body["metadata"]["weight_version"], [c["logprob"] for c in content], [c["token"] for c in content]

    def admin(self, method: str, path: str, key: str | None = ADMIN_KEY, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return self.http.request(method, path, headers=headers, **kw)

    def close(self) -> None:
        self.http.close()
        self.lt.run(self.gate.close())
        self.lt.run(stop_gateway(self.gateway, self.gw_runner, grace_s=5))
        self.lt.run(self.server_runner.cleanup())
        self.lt.stop()




def perturbed(state, seed: int, scale: float = 0.05):
    """``state`` with Gaussian noise of ``scale`` on every floating leaf: another weight version."""
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + scale * jax.random.normal(k, x.shape, x.dtype)
                                        if jnp.issubdtype(x.dtype, jnp.floating) else x for x, k in zip(leaves, keys)])
