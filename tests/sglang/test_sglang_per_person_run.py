"""A per-person run (`trainer.personalize=per_person`) served by a real SGLang worker (`policy.mode=external`,
started with LoRA enabled, tests/sglang/conftest.py `LORA_FLAGS`): after a step on alice's
feedback alone, the run has loaded her adapter on the worker by path and the gateway sends her turns to it
(`lora_path`); her answers change, bob's stay the base model's, and her scored turns record the adapter. Her
second step's version replaces the first on the worker (loaded under a new name, the old one unloaded)."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import requests

from openclaw_jax.samples import SampleStore
from tests.e2e.test_live import LiveRun
from tests.e2e.test_live_per_person_serving import PROBE, _chat, _probe, _wait_for
from tests.helpers.server_utils import free_port
from tests.helpers.sglang_workers import REPO
from tests.sglang.test_sglang_multi_lora import TOL, UNCHANGED_TOL, reference_greedy

pytestmark = pytest.mark.sglang

PER_PERSON = ("env.enabled=false", "trainer.personalize=per_person", "gate.enabled=false", "trainer.samples_per_step=2",
              "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8", "trainer.optimizer.lr=1e-2",
              "trainer.optimizer.warmup_steps=0", "trainer.max_steps=100")


def _assert_same_answer(got, want) -> None:
    """Same tokens, log-probs within float32 rounding (SGLang's prefix cache changes the summation order)."""
    assert got[1] == want[1]
    np.testing.assert_allclose(got[2], want[2], rtol=0, atol=UNCHANGED_TOL)


def _worker_adapters(url: str) -> list[str]:
    """The LoRA adapters the worker lists in its OpenAI model list (SGLang lists each loaded adapter)."""
    models = requests.get(url + "/v1/models", timeout=30).json()["data"]
    return sorted(m["id"] for m in models if m.get("parent") is not None)


def test_a_persons_turns_are_served_by_their_adapter_on_sglang(sglang_lora_worker, sglang_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    run = LiveRun(sglang_model_dir, run_dir, free_port(), tmp_path / "run.log", *PER_PERSON,
                  f"policy.urls=[{sglang_lora_worker.url}]")
    run.cmd[run.cmd.index("--config") + 1] = str(REPO / "configs" / "tiny_sglang_cpu.yaml")
    run.start()
    try:
        bob_before, alice_before = _probe(run, "bob"), _probe(run, "alice")
        _assert_same_answer(alice_before, bob_before)   # both on the base
        assert "adapter" not in alice_before[0]

        talk = [{"role": "user", "content": "What is 2 + 3?"}]
        for reaction in ("No, that's wrong. You should answer with just the number.", "Thanks, that's perfect!",
                         "Thanks!"):
            talk += [{"role": "assistant", "content": _chat(run, "alice", talk)}, {"role": "user", "content": reaction}]
        _wait_for(run, r"person 'alice': serving their adapter at 1 steps")
        talk += [{"role": "assistant", "content": _chat(run, "alice", talk)},
                 {"role": "user", "content": "Thanks, that's perfect!"}]
        loaded = _worker_adapters(sglang_lora_worker.url)
        assert len(loaded) == 1 and loaded[0].startswith("alice#"), loaded   # loaded by path, under a new name

        bob_after, alice_after = _probe(run, "bob"), _probe(run, "alice")
        shutil.copytree((run_dir / "adapters" / "alice").resolve(), tmp_path / "alice_served")   # her step 1
        _assert_same_answer(bob_after, bob_before)   # bob: still the base
        assert "adapter" not in bob_after[0]
        assert (alice_after[0]["adapter"], alice_after[0]["adapter_steps"]) == ("alice", "1")
        n = min(len(alice_after[2]), len(alice_before[2]))   # her adapter moved her answer (it may end sooner)
        assert np.max(np.abs(np.subtract(alice_after[2][:n], alice_before[2][:n]))) > 1e-3
        _chat(run, "alice", talk)   # scores the fourth answer: her second step, a new version replaces the first
        _wait_for(run, r"sample 3: person alice")
        _wait_for(run, r"person 'alice': serving their adapter at 2 steps")
        deadline = time.monotonic() + 120   # the old name is unloaded just after the new one is served
        while len(replaced := _worker_adapters(sglang_lora_worker.url)) > 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(replaced) == 1 and replaced[0].startswith("alice#") and replaced != loaded, replaced
        assert _probe(run, "alice")[0]["adapter_steps"] == "2"
    finally:
        rc = run.stop()
    assert rc == 0, run.log()[-4000:]
    with SampleStore(run_dir / "samples", readonly=True) as store:
        samples = list(store.read(0))
    assert [(s.person, s.adapter, s.adapter_steps) for s in samples][3] == ("alice", "alice", 1)

    # what served her: HF transformers float64 with her adapter merged (the prompt through HF's chat template)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(sglang_model_dir)
    prompt = tok(tok.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    _, ref_logprobs, gap = reference_greedy(sglang_model_dir, tmp_path / "alice_served", prompt, len(alice_after[2]))
    assert gap > 10 * TOL
    np.testing.assert_allclose(alice_after[2], ref_logprobs, rtol=0, atol=TOL)
