"""A live run with `trainer.personalize=per_person` (`configs/live_cpu.yaml` with the policy embedded in the
run's process, real processes): two people's turns through the gateway with the real `openai` client train
each person's own adapter, which then serves them (the base, version 0, serves anyone else); Ctrl-C
checkpoints and exports the adapters per person; the same command resumes them and serves them again before
the first turn. (tests/e2e/test_live_per_person_serving.py checks what is served, with `policy.mode=process`.)"""

from __future__ import annotations

import json
import re
import time

import pytest

from openclaw_jax.models.lora_files import ADAPTER_CONFIG, ADAPTER_EXTRA, ADAPTER_WEIGHTS
from openclaw_jax.samples import SampleStore
from openclaw_jax.trainer.checkpoint import Checkpointer
from tests.e2e.test_live import LiveRun
from tests.helpers.server_utils import free_port

PER_PERSON = ("trainer.samples_per_step=4", "gate.enabled=false", "trainer.personalize=per_person",
              "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8", "policy.mode=embedded")


def _served(run: LiveRun, person: str) -> dict:
    """The response metadata of a side turn of `person`: the weight version, and the adapter that served it."""
    r = run.client.chat.completions.create(model="model", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           extra_headers={"X-Turn-Type": "side", "X-Person-Id": person})
    return r.to_dict()["metadata"]


def _wait_for_both_served(run: LiveRun) -> None:
    deadline = time.monotonic() + 600
    while not all(f"person '{p}': serving their adapter at 1 steps" in run.log() for p in ("alice", "bob")):
        assert run.proc.poll() is None, run.log()[-4000:]
        assert time.monotonic() < deadline, run.log()[-4000:]
        time.sleep(1.0)
    for person in ("alice", "bob"):
        assert _served(run, person) == {"weight_version": "0", "adapter": person, "adapter_steps": "1"}
    assert _served(run, "carol") == {"weight_version": "0"}   # no adapter of hers: the base, not an error


def _chat(run: LiveRun, person: str, messages) -> str:
    r = run.client.chat.completions.create(model="model", messages=messages, max_tokens=12, extra_headers={
        "X-Session-Id": "s1", "X-Turn-Type": "main", "X-Person-Id": person})
    return r.choices[0].message.content


@pytest.mark.slow
def test_live_per_person_run_trains_each_persons_adapter_and_resumes(tiny_smollm2_dir, tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    first = LiveRun(tiny_smollm2_dir, run_dir, port, tmp_path / "first.log", *PER_PERSON).start()
    try:
        log = first.log()
        assert "trainer.personalize=per_person" in log
        assert "serving each person their own adapter once it has trained" in log
        reactions = {"alice": ("No, that's wrong. You should answer with just the number.", "Thanks, that's perfect!"),
                     "bob": ("Thanks!", "No, that's wrong. Please answer in one word.")}
        for person, said in reactions.items():   # both use session id s1: each has their own
            talk = [{"role": "user", "content": "What is 2 + 3?"}]
            for reaction in said:
                talk += [{"role": "assistant", "content": _chat(first, person, talk)},
                         {"role": "user", "content": reaction}]
            _chat(first, person, talk)   # scores the last answer
        deadline = time.monotonic() + 600
        while not re.search(r"checkpoint saved: step 1\b", first.log()):
            assert first.proc.poll() is None, first.log()[-4000:]
            assert time.monotonic() < deadline, first.log()[-4000:]
            time.sleep(1.0)
        assert first.probe()[0] == "0"   # the base is what is served
        _wait_for_both_served(first)
    finally:
        rc = first.stop()
    assert rc == 0, first.log()[-4000:]
    assert "person 'alice': a new adapter" in first.log() and "person 'bob': a new adapter" in first.log()

    with SampleStore(run_dir / "samples", readonly=True) as store:
        assert sorted(s.person for s in store.read(0)) == ["alice", "alice", "bob", "bob"]
    ckpt = Checkpointer(run_dir / "ckpt")
    meta = ckpt.metadata()
    ckpt.close()
    assert meta["people"] == ["alice", "bob"] and meta["adapter_steps"] == {"alice": 1, "bob": 1}
    for person in ("alice", "bob"):
        directory = run_dir / "export" / "step_1" / "adapters" / person
        config = json.loads((directory / ADAPTER_CONFIG).read_text())
        ours = json.loads((directory / ADAPTER_EXTRA).read_text())
        assert config["r"] == 4 and ours["person"] == person and (directory / ADAPTER_WEIGHTS).exists()

    second = LiveRun(tiny_smollm2_dir, run_dir, port, tmp_path / "second.log", *PER_PERSON).start()
    try:
        log = second.log()
        assert "restored the adapters of 2 people: alice (1 steps), bob (1 steps)" in log
        assert "resumed at step 1, sample offset 4" in log
        assert second.probe()[0] == "0"
        _wait_for_both_served(second)
    finally:
        rc = second.stop()
    assert rc == 0, second.log()[-4000:]
