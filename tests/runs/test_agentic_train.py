"""`python -m openclaw_jax.train` in the agentic run mode, end to end.

* A tiny random model learns the `easy` environment with group-normalised GRPO: its greedy
  held-out success must rise from (near) zero to most tasks within a few steps.
* The three CPU configs (tool-call, terminal, SWE) run end to end for a step each (slow): warm-up,
  group rollouts through the sandbox, a trainer step, the held-out evaluation at start and end,
  rollout metrics in TensorBoard and agentic samples in the store. The tool-call config runs on its
  own model, the packaged SmolLM2-135M-Instruct (GGUF load, 30 layers); terminal and SWE run their
  config on a tiny random model with SmolLM2's tokenizer and chat template (the same prompts,
  template, tool prompt and shapes; what they add over tool-call is their environment, not the
  model's size, which would cost ~10x the time on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_jax.samples import SampleStore
from tests.helpers.xla_flags import env_optimized
from tests.helpers.tb_events import read_event_tags

ROOT = Path(__file__).resolve().parents[2]
ROLLOUT_TAGS = {"agentic/train_success", "agentic/group_reward_mean", "agentic/group_reward_std",
                "agentic/turns_per_episode", "agentic/tool_calls_per_episode", "agentic/tool_errors_per_episode",
                "agentic/sandbox_timeouts", "eval/heldout_success"}


def _train(args: list[str], run_dir: Path, timeout: int, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "openclaw_jax.train", *args, f"run_dir={run_dir}", "progress=false",
           "trainer.checkpoint_every=0"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                         env={**(env or os.environ), "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_tiny_model_learns_the_easy_environment_with_group_grpo(tmp_path):
    run_dir = tmp_path / "easy"
    summary = _train(["--config", str(ROOT / "configs/tiny_cpu.yaml"), "agentic.enabled=true", "agentic.env=easy",
                      "env.enabled=false", "loss.name=rl", "trainer.rl_only_teacher=none",
                      "trainer.samples_per_step=8", "agentic.group_size=4", "agentic.max_turns=1",
                      "agentic.max_new_tokens=4", "agentic.heldout_tasks=16", "agentic.eval_every=5",
                      "trainer.max_steps=10"], run_dir, timeout=600)
    scores = [r["heldout_success"] for r in summary["heldout"]]
    assert [r["step"] for r in summary["heldout"]] == [0, 5, 10]
    assert scores[0] <= 0.25 and scores[-1] >= 0.75, scores
    tags = set(read_event_tags(run_dir / "tb"))
    assert ROLLOUT_TAGS <= tags, ROLLOUT_TAGS - tags
    samples = SampleStore(run_dir / "samples", readonly=True).read(0)
    assert samples and all(s.token_advantages is not None and s.response_mask is not None for s in samples)
    # group-normalised: within each written group the advantages sum to zero
    groups: dict[str, list[float]] = {}
    for s in samples:
        groups.setdefault(s.session_id, []).append(s.token_advantages[0])
    assert all(abs(sum(v)) < 1e-4 for v in groups.values() if len(v) == 4)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["toolcall_cpu", "terminal_cpu", "swe_cpu"])
def test_cpu_config_runs_end_to_end(tmp_path, config, tiny_smollm2_dir):
    run_dir = tmp_path / config
    model = [] if config == "toolcall_cpu" else [f"model.path={tiny_smollm2_dir}", "model.tokenizer=auto"]
    # backlog 4: no rollouts beyond the one step's 4 samples (they would only compete with the trainer)
    summary = _train(["--config", str(ROOT / f"configs/{config}.yaml"), *model, "trainer.max_steps=1",
                      "trainer.samples_per_step=4", "agentic.group_size=2", "agentic.all_equal=zero",
                      "agentic.backlog=4", "agentic.heldout_tasks=2", "agentic.warmup_steps=1",
                      "agentic.warmup_examples=4", "agentic.warmup_batch_size=2"], run_dir, timeout=1200,
                     env=env_optimized() if config == "toolcall_cpu" else None)  # SmolLM2's arithmetic: full -O
    assert summary["end_step"] == 1
    assert [r["step"] for r in summary["heldout"]] == [0, 1]
    assert (run_dir / "warmup" / "config.json").exists()
    tags = set(read_event_tags(run_dir / "tb"))
    assert {"agentic/train_success", "agentic/turns_per_episode", "eval/heldout_success", "loss"} <= tags
    samples = SampleStore(run_dir / "samples", readonly=True).read(0)
    assert len(samples) >= 4
    assert all(len(s.response_mask) == len(s.response_ids) and s.weight_version is not None for s in samples)


@pytest.mark.slow
def test_gui_config_runs_end_to_end_with_screenshots(tmp_path, require_gui_tools):
    """configs/gui_cpu.yaml for a step, its SmolLM2-based policy swapped for a tiny random Qwen2.5-VL (the
    graft onto SmolLM2: tests/models/test_vl_on_text_model.py): warmed up on demonstrations with their
    screenshots, group rollouts on real Xvfb desktops served through the image path, a trainer step on
    samples whose screenshots come back from the store's blobs (the push to the image path:
    tests/inference/test_vl_weight_update.py)."""
    from openclaw_jax.models.tokenizer import TINY_VL_IDS
    from openclaw_jax.samples.store import read_image

    run_dir = tmp_path / "gui"
    tiny_vl = ["model.path=random", "model.tokenizer=tiny_vl", "model.vision=null", "model.random.family=qwen2",
               "model.random.hidden_size=64", "model.random.num_heads=4", "model.random.head_dim=16",
               "model.random.vision={depth: 2, hidden_size: 32, num_heads: 2, window_size: 56}"]
    summary = _train(["--config", str(ROOT / "configs/gui_cpu.yaml"), *tiny_vl, "trainer.max_steps=1",
                      "trainer.samples_per_step=4", "agentic.group_size=2", "agentic.all_equal=zero",
                      "agentic.backlog=4", "agentic.heldout_tasks=2", "agentic.warmup_steps=1",
                      "agentic.warmup_examples=4", "agentic.warmup_batch_size=2", "agentic.eval_samples=2"],
                     run_dir, timeout=1200)
    assert summary["end_step"] == 1 and [r["step"] for r in summary["heldout"]] == [0, 1]
    # beside each greedy evaluation, 2 sampled episodes of each of the 2 tasks through the image path
    for record in summary["heldout"]:
        assert record["samples_per_task"] == 2 and record["heldout_success_sampled"] * 4 in (0, 1, 2, 3, 4)
    assert "eval/heldout_success_sampled" in set(read_event_tags(run_dir / "tb"))
    samples = SampleStore(run_dir / "samples", readonly=True).read(0)
    assert len(samples) >= 4
    pad = TINY_VL_IDS["<|image_pad|>"]
    for s in samples:   # every screen (112 x 84 at the config's 1/4 scale) is a blob, and its 4 x 3 tokens are in the ids
        assert s.image_sha256 and all(read_image(run_dir / "samples", h)[:4] == b"\x89PNG" for h in s.image_sha256)
        assert (s.prompt_ids + s.response_ids).count(pad) == 12 * len(s.image_sha256)
