"""Real SGLang 0.5.23 on CPU serves several LoRA adapters at once, each request naming its own.

One SGLang worker started with LoRA enabled (tests/sglang/conftest.py `LORA_FLAGS`) on the tiny random Qwen3; two adapters written
by our own writer (models/lora_files.py, PEFT's layout, non-zero B) are loaded by path through SGLang's
`/load_lora_adapter`; one batch of concurrent `/generate` requests names different adapters (`lora_path`
per request, one with none). Each row's greedy tokens and log-probs equal an independent reference: HF
`transformers` in float64 on the base weights with that row's adapter merged in NumPy float64. Then one
adapter is replaced by a new version under the same name (unload + load by path): that row follows the new
reference, the others are bit-exact what they were.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pytest
import requests
from flax import nnx

from openclaw_jax.models.lora import LoRAConfig, add_lora, lora_state
from openclaw_jax.models.lora_files import save_adapter
from openclaw_jax.models.weights import load_hf_checkpoint
from tests.helpers.lora_reference import merged_hf_model

pytestmark = pytest.mark.sglang
logger = logging.getLogger(__name__)

LORA = LoRAConfig(rank=4, alpha=8.0)
PROMPT = [12, 99, 150, 7, 201, 33, 64, 5]
STEPS = 6
# SGLang computes in float32 (sglang_cpu.sh --dtype float32), the reference in float64: over two layers
# and a 320-token vocabulary the log-probs differ by float32 rounding (measured <= 1.5e-6 on every row);
# 5e-5 leaves room for other summation orders, and every greedy decision checked is > 10 * TOL from a tie.
TOL = 5e-5
# The same row served twice, in batches of other adapters: float32 rounding alone (measured <= 2.4e-7).
UNCHANGED_TOL = 2e-6


def _write_adapter(model, directory: Path, seed: int, base_model: Path) -> Path:
    """Our adapter on `model` with A and B drawn from N(0, 0.3^2) (so B != 0 and the output changes)."""
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda x: np.asarray(rng.normal(0.0, 0.3, x.shape), np.float32),
                         lora_state(add_lora(model, LORA, rngs=nnx.Rngs(seed))))
    return save_adapter(directory, state, LORA, base_model=str(base_model))


def reference_greedy(model_dir: Path, adapter_dir: Path | None, prompt: list[int] = PROMPT, steps: int = STEPS):
    """Greedy tokens, their log-probs, and the smallest top-1/top-2 log-prob gap, of `prompt` in HF transformers
    float64 with the adapter (read with the `safetensors` package) merged into W in NumPy float64."""
    import torch

    model = merged_hf_model(model_dir, adapter_dir)
    ids, tokens, logprobs, gap = list(prompt), [], [], np.inf
    with torch.no_grad():
        for _ in range(steps):
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1).numpy()
            top2 = np.sort(logp)[-2:]
            nxt = int(np.argmax(logp))
            tokens.append(nxt)
            logprobs.append(float(logp[nxt]))
            gap = min(gap, float(top2[1] - top2[0]))
            ids.append(nxt)
    return tokens, logprobs, gap


def _generate(url: str, adapter: str | None):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": STEPS, "temperature": 0.0},
            "return_logprob": True}
    if adapter is not None:
        body["lora_path"] = adapter
    r = requests.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["output_ids"], [lp[0] for lp in out["meta_info"]["output_token_logprobs"]]


def _batch(url: str, adapters):
    """One request per entry of `adapters`, all sent at once (SGLang batches what is waiting)."""
    with ThreadPoolExecutor(len(adapters)) as pool:
        return list(pool.map(lambda a: _generate(url, a), adapters))


def _adapter_route(url: str, route: str, **body):
    r = requests.post(url + route, json=body, timeout=120)
    assert r.status_code == 200 and r.json()["success"], r.text
    return r.json()


def test_each_request_is_served_by_the_adapter_it_names(sglang_lora_worker, sglang_model_dir, tmp_path):
    url = sglang_lora_worker.url
    model, _ = load_hf_checkpoint(sglang_model_dir)
    alice = _write_adapter(model, tmp_path / "alice", 1, sglang_model_dir)
    bob = _write_adapter(model, tmp_path / "bob", 2, sglang_model_dir)
    _adapter_route(url, "/load_lora_adapter", lora_name="alice", lora_path=str(alice))
    loaded = _adapter_route(url, "/load_lora_adapter", lora_name="bob", lora_path=str(bob))["loaded_adapters"]
    assert loaded == {"alice": str(alice), "bob": str(bob)}

    rows = ("alice", None, "bob", "alice")
    served = _batch(url, rows)
    refs = {name: reference_greedy(sglang_model_dir, path)
            for name, path in (("alice", alice), (None, None), ("bob", bob))}
    for row, (tokens, logprobs) in zip(rows, served):
        ref_tokens, ref_logprobs, gap = refs[row]
        logger.info("row %s: max |SGLang - reference| log-prob %.2e, smallest greedy gap %.3f", row,
                    np.max(np.abs(np.subtract(logprobs, ref_logprobs))), gap)
        assert gap > 10 * TOL, f"{row}: a greedy near-tie ({gap:.2e}) would make the token check meaningless"
        assert tokens == ref_tokens, row
        np.testing.assert_allclose(logprobs, ref_logprobs, rtol=0, atol=TOL, err_msg=str(row))
    assert served[0][0] == served[3][0]   # alice twice in one batch (one prefill, one from the prefix cache)
    np.testing.assert_allclose(served[0][1], served[3][1], rtol=0, atol=UNCHANGED_TOL)
    assert len({tuple(refs[r][0]) for r in refs}) == 3   # each adapter changes the greedy answer

    # alice's next version, same name, read again by path: unload, then load what the path now holds
    _write_adapter(model, alice, 3, sglang_model_dir)
    _adapter_route(url, "/unload_lora_adapter", lora_name="alice")
    _adapter_route(url, "/load_lora_adapter", lora_name="alice", lora_path=str(alice))
    after = _batch(url, rows)
    for before, now in zip(served[1:3], after[1:3]):   # the base and bob: unchanged
        assert now[0] == before[0]
        # not bit-exact: a row may read the prompt from SGLang's prefix cache, a different float32 summation
        # than a full prefill
        np.testing.assert_allclose(now[1], before[1], rtol=0, atol=UNCHANGED_TOL)
    new_tokens, new_logprobs, gap = reference_greedy(sglang_model_dir, alice)
    assert gap > 10 * TOL and new_tokens != refs["alice"][0]
    for tokens, logprobs in (after[0], after[3]):
        assert tokens == new_tokens
        logger.info("alice v2: max |SGLang - reference| log-prob %.2e",
                    np.max(np.abs(np.subtract(logprobs, new_logprobs))))
        np.testing.assert_allclose(logprobs, new_logprobs, rtol=0, atol=TOL)
