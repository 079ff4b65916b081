"""A per-person live run serves each person their own adapter (`configs/live_cpu.yaml` with
`trainer.personalize=per_person`: the policy as its own process with adapter slots, real processes, the real
`openai` client). After steps on alice's feedback alone, bob's greedy answers and log-probs are bit-exact what
they were before; alice's changed, and equal, within float tolerance, an independent reference: HF
`transformers` in float64 on the base weights with her adapter (read with the `safetensors` package) merged
in NumPy float64. Her scored turns record the adapter that served them."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from openclaw_jax.samples import SampleStore
from tests.e2e.test_live import LiveRun
from tests.helpers.lora_reference import merged_hf_model
from tests.helpers.server_utils import free_port

PER_PERSON = ("trainer.samples_per_step=2", "gate.enabled=false", "trainer.personalize=per_person",
              "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8", "trainer.optimizer.lr=1e-3",
              "trainer.optimizer.warmup_steps=0")
PROBE = [{"role": "user", "content": "Describe the sea in a few words."}]


def _probe(run: LiveRun, person: str):
    """A greedy side turn of `person` with log-probs: (metadata, tokens, log-probs). Side turns never train."""
    r = run.client.chat.completions.create(model="model", messages=PROBE, max_tokens=8, temperature=0, logprobs=True,
                                           extra_headers={"X-Turn-Type": "side", "X-Person-Id": person})
    tokens = r.choices[0].logprobs.content
    return r.to_dict()["metadata"], [t.token for t in tokens], [t.logprob for t in tokens]


def _chat(run: LiveRun, person: str, messages) -> str:
    r = run.client.chat.completions.create(model="model", messages=messages, max_tokens=12, extra_headers={
        "X-Session-Id": f"s-{person}", "X-Turn-Type": "main", "X-Person-Id": person})
    return r.choices[0].message.content


def _wait_for(run: LiveRun, pattern: str, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, run.log()):
        assert run.proc.poll() is None, run.log()[-4000:]
        assert time.monotonic() < deadline, f"no {pattern!r} in {timeout_s} s:\n{run.log()[-4000:]}"
        time.sleep(1.0)


def _reference_greedy(model_dir: Path, adapter_dir: Path | None, steps: int):
    """Greedy tokens and log-probs of PROBE in HF transformers, float64, with the adapter merged into W."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = merged_hf_model(model_dir, adapter_dir)
    text = tok.apply_chat_template(PROBE, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tokens, logprobs = [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1]
            logp = torch.log_softmax(logits, -1)
            nxt = int(torch.argmax(logp))
            tokens.append(tok.decode([nxt]))
            logprobs.append(float(logp[nxt]))
            ids.append(nxt)
    return tokens, logprobs


@pytest.mark.slow
def test_per_person_run_serves_each_person_their_own_adapter(tiny_smollm2_dir, tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    run = LiveRun(tiny_smollm2_dir, run_dir, port, tmp_path / "run.log", *PER_PERSON).start()
    try:
        assert "serving each person their own adapter once it has trained" in run.log()
        _probe(run, "bob")   # warms the prefix cache: the probes compared below all read the same cached prefix
        bob_before, alice_before = _probe(run, "bob"), _probe(run, "alice")
        assert bob_before[0] == {"weight_version": "0"} and alice_before[1:] == bob_before[1:]   # both on the base

        talk = [{"role": "user", "content": "What is 2 + 3?"}]
        for reaction in ("No, that's wrong. You should answer with just the number.", "Thanks, that's perfect!",
                         "Thanks!"):
            talk += [{"role": "assistant", "content": _chat(run, "alice", talk)}, {"role": "user", "content": reaction}]
            if reaction == "Thanks!":   # two of alice's turns are scored now: one step of hers alone
                _wait_for(run, r"person 'alice': serving their adapter at 1 steps")
        # the third answer came from the base; the fourth, answered now, from her adapter; both are scored below
        talk += [{"role": "assistant", "content": _chat(run, "alice", talk)},
                 {"role": "user", "content": "Thanks, that's perfect!"}]
        served = run_dir / "adapters" / "alice"
        shutil.copytree(served, tmp_path / "alice_served")   # what serves her now (her next step waits for the below)

        bob_after, alice_after = _probe(run, "bob"), _probe(run, "alice")
        assert bob_after == bob_before   # bit-exact: tokens and log-probs, still the base
        assert alice_after[0] == {"weight_version": "0", "adapter": "alice", "adapter_steps": "1"}
        assert alice_after[2] != alice_before[2]

        _chat(run, "alice", talk)   # scores the fourth answer
        _wait_for(run, r"sample 3: person alice")
    finally:
        rc = run.stop()
    assert rc == 0, run.log()[-4000:]
    assert "person 'bob'" not in run.log()   # bob never trained: no adapter of his was made or served

    with SampleStore(run_dir / "samples", readonly=True) as store:
        samples = list(store.read(0))
    assert [(s.person, s.adapter, s.adapter_steps) for s in samples] == [("alice", None, None)] * 3 + [
        ("alice", "alice", 1)]

    steps = len(alice_after[1])
    ref_tokens, ref_logprobs = _reference_greedy(tiny_smollm2_dir, None, steps)
    assert bob_before[1] == ref_tokens
    np.testing.assert_allclose(bob_before[2], ref_logprobs, atol=2e-4)
    ref_tokens, ref_logprobs = _reference_greedy(tiny_smollm2_dir, tmp_path / "alice_served", steps)
    assert alice_after[1] == ref_tokens
    np.testing.assert_allclose(alice_after[2], ref_logprobs, atol=2e-4)
    assert np.max(np.abs(np.subtract(alice_after[2], alice_before[2]))) > 1e-3   # her adapter moved her answers
