"""The loss family and the chunked kernels on 8 fake CPU devices equal the 1-device run.

Runs in a subprocess because the device count must be set before jax is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.xla_flags import env_without_device_count

SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    sys.path.insert(0, sys.argv[1])
    from openclaw_jax import ops
    from openclaw_jax.losses import HybridBatch, LossConfig, get_loss
    from tests.helpers.loss_reference import batch_arrays, make_case

    assert jax.device_count() == 8, jax.devices()
    case = make_case(7, T=12, V=64)
    arrays = batch_arrays(case)
    B, T = case["response_ids"].shape
    V, H = 64, 16
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(B, T, H)).astype(np.float32)
    w = (0.7 * rng.normal(size=(H, V))).astype(np.float32)
    logits = np.asarray(case["logits"], np.float32)

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "tp"))
    def put(x, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))
    def shard_batch(arrs):
        out = {}
        for k, v in arrs.items():
            out[k] = None if v is None else put(v, P("data", *([None] * (v.ndim - 1))))
        return HybridBatch(**out)
    batch_1 = HybridBatch(**{k: None if v is None else jnp.asarray(v) for k, v in arrays.items()})
    batch_8 = shard_batch(arrays)
    logits_8 = put(logits, P("data", None, "tp"))
    hidden_8 = put(hidden, P("data", None, "fsdp"))
    w_8 = put(w, P("fsdp", "tp"))

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))

    report = {"checks": {}, "sharded_inputs": len(logits_8.sharding.device_set)}
    configs = {
        "combine_overlap": ("combine", LossConfig(hint_selection="token_optimal", subset_mode="overlap",
                                                  entropy_coef=0.02, kl_coef=0.1)),
        "tail_kl": ("tail_kl", LossConfig(name="tail_kl")),
    }
    for name, (loss_name, cfg) in configs.items():
        fn = get_loss(loss_name)
        dense = jax.jit(jax.value_and_grad(lambda z, b: fn.dense(z, b, cfg), has_aux=True))
        chunked = jax.jit(jax.value_and_grad(
            lambda h, w, b: fn.chunked(h, w, b, cfg, temperature=0.9, chunk_size=5), argnums=(0, 1), has_aux=True))
        (l1, m1), g1 = dense(jnp.asarray(logits), batch_1)
        (l8, m8), g8 = dense(logits_8, batch_8)
        (c1, cm1), (gh1, gw1) = chunked(jnp.asarray(hidden), jnp.asarray(w), batch_1)
        (c8, cm8), (gh8, gw8) = chunked(hidden_8, w_8, batch_8)
        report["checks"][name] = {
            "dense_loss": rel(l8, l1), "dense_grad": rel(g8, g1),
            "dense_metrics": max(rel(m8[k], m1[k]) if abs(float(m1[k])) > 1e-6 else abs(float(m8[k])) for k in m1),
            "chunked_loss": rel(c8, c1), "chunked_grad_hidden": rel(gh8, gh1), "chunked_grad_lm_head": rel(gw8, gw1),
            "chunked_metrics": max(rel(cm8[k], cm1[k]) if abs(float(cm1[k])) > 1e-6 else abs(float(cm8[k])) for k in cm1),
            "grad_devices": len(g8.sharding.device_set),
        }

    ids = jnp.asarray(case["student_topk_ids"], jnp.int32)
    stats = jax.jit(lambda h, w, i: ops.vocab_stats(h, w, ids=i, top_k=4, with_entropy=True, chunk_size=5))
    s1 = stats(jnp.asarray(hidden), jnp.asarray(w), ids)
    s8 = stats(hidden_8, w_8, put(np.asarray(ids), P("data", None, None)))
    report["vocab_stats"] = {
        "topk_ids_equal": bool(np.array_equal(s1.topk_ids, s8.topk_ids)),
        "topk_logprobs": rel(s8.topk_logprobs, s1.topk_logprobs),
        "logprobs_at_ids": rel(s8.logprobs_at_ids, s1.logprobs_at_ids),
        "entropy": rel(s8.entropy, s1.entropy),
        "logsumexp": rel(s8.logsumexp, s1.logsumexp),
    }
    print("REPORT" + json.dumps(report))
    """
)


def test_sharded_equals_unsharded(tmp_path):
    script = tmp_path / "sharded_losses.py"
    script.write_text(SCRIPT)
    env = env_without_device_count()
    env["JAX_PLATFORMS"] = "cpu"
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(script), str(repo)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("REPORT")][-1]
    report = json.loads(line[len("REPORT"):])
    assert report["sharded_inputs"] == 8
    for name, checks in report["checks"].items():
        assert checks.pop("grad_devices") == 8, name
        for key, err in checks.items():
            assert err <= 1e-5, (name, key, err)
    vocab = report["vocab_stats"]
    assert vocab.pop("topk_ids_equal")
    for key, err in vocab.items():
        assert err <= 1e-5, (key, err)
