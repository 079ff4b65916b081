"""Live mode (`configs/live_cpu.yaml`) with real processes: `python -m openclaw_jax.train` on a tiny random model
with SmolLM2's tokenizer, a person's turns through the gateway with the real `openai` client, a step, Ctrl-C
(SIGINT), the same command again.

What must hold across the restart: the run continues the same model (the served weight version and the
served log-probs equal those before the stop), no sample is trained twice or skipped (the trained windows
are contiguous), and a session left open across the restart continues under its id, its last reply before
the stop unscored (its reaction arrives at a gateway that never saw that reply) and everything after it
scored as usual.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest

from openclaw_jax.config import load_experiment_config
from openclaw_jax.envs.openclaw_agent import node_bin, openclaw_bin, parse_result
from openclaw_jax.samples import SampleStore
from tests.helpers.server_utils import free_port
from tests.helpers.xla_flags import env_without_device_count

ROOT = Path(__file__).resolve().parents[2]
ANNOUNCED = "connect your OpenClaw once"
# The restart test follows the trainer sample by sample, a step every two turns; the gate's hold-out would take
# turns out of its windows (the gated run, and its restart: tests/e2e/test_live_openclaw.py).
UNGATED = ("trainer.samples_per_step=2", "gate.enabled=false")


@pytest.mark.parametrize("name", ["live_cpu", "live_gpu"])
def test_live_configs_have_no_simulated_users_a_fixed_port_and_openclaw_sized_rows(name):
    cfg = load_experiment_config([str(ROOT / "configs" / f"{name}.yaml")])
    assert not cfg.env.enabled and not cfg.agentic.enabled
    # the gate is on: a person's run never serves a version that scores worse on their held-out turns
    assert cfg.gate.enabled and cfg.trainer.staleness_mode == "importance" and cfg.gate.min_score == 0.0
    assert cfg.gate.holdout_every * cfg.gate.min_replay <= 16 and cfg.gate.max_kl <= 0.1
    assert cfg.gateway.port == 8000 and cfg.gateway.host == "127.0.0.1"
    assert cfg.trainer.max_seq_len >= cfg.gateway.max_prompt_tokens >= 8192   # a whole OpenClaw session trains
    assert cfg.model.remat and cfg.trainer.samples_per_step <= 4 and cfg.trainer.optimizer.schedule == "constant"
    if name == "live_cpu":
        # serving in its own process, ahead of the trainer in CPU priority: a step does not stall a turn
        assert cfg.model.path == "smollm2" and cfg.policy.mode == "process" and cfg.policy.trainer_nice > 0
        assert cfg.policy.prefix_cache_mb > 0
        assert cfg.gateway.judge == "rule"


@pytest.mark.slow
def test_live_gpu_config_fits_with_openclaws_default_prompt():
    """The planner (Qwen3-4B's config.json, 4 simulated devices) on OpenClaw's default-profile batch and on the
    longest batch the batcher makes: both fit 80 GiB (docs/live.md gives the numbers)."""
    for extra in (["--prompt-len", "10534", "--shared-len", "10400", "--response-len", "512", "--hint-len", "32"], []):
        out = subprocess.run([sys.executable, "-m", "openclaw_jax.plan", "--config", str(ROOT / "configs/live_gpu.yaml"),
                              "--devices", "4", "--json", *extra], capture_output=True, text=True, timeout=900,
                             cwd=ROOT, env=env_without_device_count())
        assert out.returncode == 0, out.stderr[-3000:]
        plan = json.loads(out.stdout.strip().splitlines()[-1])
        assert plan["fits"] is True and plan["peak_bytes"] < 40 * 2 ** 30, plan["peak_bytes"]


class LiveRun:
    """One `python -m openclaw_jax.train --config configs/live_cpu.yaml` process."""

    def __init__(self, model_dir: Path, run_dir: Path, port: int, log_path: Path, *overrides: str):
        self.cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", str(ROOT / "configs/live_cpu.yaml"),
                    f"model.path={model_dir}", f"run_dir={run_dir}", f"gateway.port={port}",
                    "progress=false", *overrides]
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout_s: float = 600) -> "LiveRun":
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        deadline = time.monotonic() + timeout_s
        while ANNOUNCED not in self.log():
            assert self.proc.poll() is None, f"the live run exited early:\n{self.log()[-4000:]}"
            assert time.monotonic() < deadline, f"no announcement in {timeout_s} s:\n{self.log()[-4000:]}"
            time.sleep(0.5)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=300)
        return self

    def stop(self, timeout_s: float = 300) -> int:
        """Ctrl-C, as a person at the terminal."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.client.close()

    def chat(self, messages, session: str) -> str:
        r = self.client.chat.completions.create(model="model", messages=messages, max_tokens=12,
                                                extra_headers={"X-Session-Id": session, "X-Turn-Type": "main"})
        return r.choices[0].message.content

    def probe(self):
        """A greedy side turn with log-probs: (weight version, tokens, log-probs). Side turns never train."""
        r = self.client.chat.completions.create(
            model="model", messages=[{"role": "user", "content": "Describe the sea in a few words."}],
            max_tokens=8, temperature=0, logprobs=True, extra_headers={"X-Turn-Type": "side"})
        tokens = r.choices[0].logprobs.content
        return r.to_dict()["metadata"]["weight_version"], [t.token for t in tokens], [t.logprob for t in tokens]

    def status(self) -> dict:
        """``GET /v1/status``: what the status page shows (no gateway key in the live config)."""
        with urllib.request.urlopen(self.url + "/v1/status", timeout=60) as r:
            return json.loads(r.read())

    def probe_at(self, version: str, timeout_s: float = 900):
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.probe()
            if got[0] == version:
                return got
            assert self.proc.poll() is None, f"the live run exited:\n{self.log()[-4000:]}"
            assert time.monotonic() < deadline, f"weight version {version} not served in {timeout_s} s " \
                                                f"(serving {got[0]}):\n{self.log()[-3000:]}"
            time.sleep(1.0)


@pytest.mark.slow
def test_live_run_stops_on_ctrl_c_and_continues_the_same_model(tiny_smollm2_dir, tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    first = LiveRun(tiny_smollm2_dir, run_dir, port, tmp_path / "first.log", *UNGATED).start()
    try:
        log = first.log()
        # the run says where OpenClaw connects, with the one command that does it
        assert f"your OpenClaw is the only client of http://127.0.0.1:{port}/v1" in log
        assert (f"bash scripts/openclaw.sh connect --gateway http://127.0.0.1:{port} --model-id model "
                "--context-window 8192 --max-tokens 256 --profile minimal") in log
        assert "serving weight version 0, trained on samples [0, 0)" in log
        assert first.probe()[0] == "0"

        talk = [{"role": "user", "content": "What is 2 + 3?"}]
        for reaction in ("No, that's wrong. You should answer with just the number.", "Thanks, that's perfect!"):
            talk += [{"role": "assistant", "content": first.chat(talk, "s1")}, {"role": "user", "content": reaction}]
        last_before_stop = first.chat(talk, "s1")   # its reaction comes after the restart
        before = first.probe_at("1")                 # two scored turns: one step, its weights served
    finally:
        rc = first.stop()
    assert rc == 0, first.log()[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["end_step"] == 1

    second = LiveRun(tiny_smollm2_dir, run_dir, port, tmp_path / "second.log", *UNGATED).start()
    try:
        log = second.log()
        assert "resumed at step 1, sample offset 2" in log
        assert "serving weight version 1, trained on samples [0, 2)" in log
        after = second.probe()
        assert after[0] == "1" and after[1] == before[1], (before, after)
        np.testing.assert_allclose(after[2], before[2], rtol=0, atol=1e-6)

        # the session open across the restart continues under its id
        talk += [{"role": "assistant", "content": last_before_stop}, {"role": "user", "content": "Now what is 10 + 5?"}]
        for reaction in ("Thanks!", "No, that's wrong. Please answer in one word."):
            talk += [{"role": "assistant", "content": second.chat(talk, "s1")}, {"role": "user", "content": reaction}]
        second.chat(talk, "s1")
        second.probe_at("2")
    finally:
        rc = second.stop()
    assert rc == 0, second.log()[-4000:]

    with SampleStore(run_dir / "samples", readonly=True) as store:
        samples = store.read(0)
    # before the stop: turns 0 and 1 of s1; the reply before the stop is never scored; after it the gateway
    # counts s1's turns afresh, from 0
    assert [(s.session_id, s.turn_index, s.reward) for s in samples] == [
        ("s1", 0, -1), ("s1", 1, 1), ("s1", 0, 1), ("s1", 1, -1)]
    assert [s.next_state["content"] for s in samples] == [
        "No, that's wrong. You should answer with just the number.", "Thanks, that's perfect!", "Thanks!",
        "No, that's wrong. Please answer in one word."]
    assert samples[0].hints == ["You should answer with just the number."]
    assert [s.weight_version for s in samples] == ["0", "0", "1", "1"]
    # every sample trained once, in order, across the restart
    windows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [(w["step"], w["start_offset"], w["end_offset"]) for w in windows] == [(1, 0, 2), (2, 2, 4)]
    assert json.loads((run_dir / "summary.json").read_text())["start_step"] == 1
    assert re.search(r"checkpoint saved: step 2\b", second.log())


