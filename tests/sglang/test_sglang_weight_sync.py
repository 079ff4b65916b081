"""Weight sync to real SGLang 0.5.23 workers on CPU, and pause/continue generation.

Our HF export (DiskWeightSync) of changed weights is loaded by every worker through
`/update_weights_from_disk`; the workers then report the new weight_version, and SGLang's
log-probs for a fixed prompt equal our decoder's for the same weights (float32).
"""

from __future__ import annotations

import asyncio
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import requests
from flax import nnx

from openclaw_jax.models.weights import load_hf_checkpoint
from openclaw_jax.pool.client import PoolClient
from openclaw_jax.pool.weight_sync import DiskWeightSync, WeightSyncError

pytestmark = pytest.mark.sglang

PROMPT = [12, 99, 150, 7, 201, 33]
TOL = 2e-5


def our_log_softmax(model, ids):
    logits = np.asarray(jax.jit(lambda m, x: m(x))(model, jnp.asarray([ids], dtype=jnp.int32))[0], np.float64)
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_disk_weight_sync_then_sglang_logprobs_equal_ours(sglang_workers, sglang_model_dir_b, sglang_model_dir,
                                                          tmp_path):
    a, b = sglang_workers
    model, cfg = load_hf_checkpoint(sglang_model_dir_b)
    # "trained" weights: every float parameter moved, so nothing on disk already holds them
    graphdef, state = nnx.split(model)
    keys = iter(jax.random.split(jax.random.PRNGKey(7), len(jax.tree.leaves(state))))
    state = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype)
                         if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    trained = nnx.merge(graphdef, state)

    async def main():
        async with PoolClient([a.url, b.url], health_interval_s=0) as pool:
            sync = DiskWeightSync(pool, tmp_path / "weights", model_config=cfg, keep=1,
                                  tokenizer_files_from=sglang_model_dir)
            await sync(graphdef, state, "7")
            infos = [requests.get(w.url + "/get_model_info", timeout=30).json() for w in (a, b)]
            results = await asyncio.gather(*(pool.generate(PROMPT, sampling_params={
                "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}, return_logprob=True,
                top_logprobs_num=2, logprob_start_len=0) for _ in range(2)))
            # a second version replaces the first on disk (keep=1) and on the workers
            await sync(graphdef, state, "8")
            v8 = await pool.generate(PROMPT, sampling_params={"max_new_tokens": 2, "temperature": 0})
            # a directory the workers cannot load (no weights in it): every worker says no, the sync raises,
            # and the workers keep serving version 8
            (tmp_path / "empty").mkdir()
            with pytest.raises(WeightSyncError, match="rejected weights 9"):
                await sync.push_path(tmp_path / "empty", "9")
            after = (await pool.model_info())["weight_version"]
            return infos, results, v8, after, sorted(p.name for p in (tmp_path / "weights").iterdir())

    infos, results, v8, after, kept = asyncio.run(main())
    assert [i["weight_version"] for i in infos] == ["7", "7"]
    assert {r.worker_url for r in results} == {a.url, b.url}
    ref = our_log_softmax(trained, PROMPT + results[0].response_ids)
    n = len(PROMPT)
    for r in results:
        assert r.weight_version == "7" and r.raw["meta_info"]["weight_versions"][0]["version"] == "7"
        assert r.response_ids == results[0].response_ids
        # greedy under our weights, and the same log-probs (output and prompt) as our decoder
        assert r.response_ids == [int(np.argmax(ref[n - 1 + i])) for i in range(8)]
        np.testing.assert_allclose(r.rollout_logprobs, [ref[n - 1 + i, t] for i, t in enumerate(r.response_ids)],
                                   atol=TOL)
        np.testing.assert_allclose(r.input_logprobs[1:], [ref[j - 1, PROMPT[j]] for j in range(1, n)], atol=TOL)
        for i, pos in enumerate(r.output_top_logprobs):
            assert [t for _, t in pos] == np.argsort(-ref[n - 1 + i])[:2].tolist()
    # and not the log-probs of the untrained weights
    untrained = our_log_softmax(load_hf_checkpoint(sglang_model_dir_b)[0], PROMPT + results[0].response_ids)
    assert np.abs(np.array(results[0].rollout_logprobs) -
                  [untrained[n - 1 + i, t] for i, t in enumerate(results[0].response_ids)]).max() > 1e-2
    assert v8.weight_version == "8" and after == "8" and kept == ["step_8"]


def test_pause_and_continue_generation(sglang_workers, sglang_model_dir):
    a = sglang_workers[0]
    requests.post(a.url + "/update_weights_from_disk", json={"model_path": str(sglang_model_dir),
                                                            "weight_version": "base"}, timeout=300).raise_for_status()
    params = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}

    async def main():
        async with PoolClient([a.url], health_interval_s=0, max_retries=3, backoff_s=0.1) as pool:
            want = await pool.generate(PROMPT, sampling_params=params, return_logprob=True)
            paused = await pool.pause_generation()
            t_paused = time.monotonic()
            # sent while paused: it must wait for continue_generation, not fail
            pending = asyncio.create_task(pool.generate(PROMPT, sampling_params=params, return_logprob=True))
            await asyncio.sleep(3.0)
            waited = not pending.done()
            resumed = await pool.continue_generation()
            got = await asyncio.wait_for(pending, timeout=120)
            return want, paused, resumed, waited, got, time.monotonic() - t_paused

    want, paused, resumed, waited, got, elapsed = asyncio.run(main())
    assert paused[a.url]["status"] == 200 and paused[a.url]["body"]["status"] == "ok"
    assert resumed[a.url]["status"] == 200 and resumed[a.url]["body"]["status"] == "ok"
    assert waited and elapsed >= 3.0
    assert got.response_ids == want.response_ids and got.finish_reason.type == "length"
    np.testing.assert_allclose(got.rollout_logprobs, want.rollout_logprobs, atol=TOL)
