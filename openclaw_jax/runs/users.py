"""Simulated users for the conversation run mode: an `EnvRunner` from the experiment config."""

from __future__ import annotations

import os
from typing import Any, Callable

from openclaw_jax.config import ExperimentConfig
from openclaw_jax.envs.runner import EnvRunner


def env_runner(cfg: ExperimentConfig, gateway_url: str, *, store_dir: str, offset_fn: Callable[[], int],
               writer: Any = None, step_fn: Callable[[], int] | None = None) -> EnvRunner:
    """The simulated users of `cfg.env` on the gateway at `gateway_url`, as `python -m openclaw_jax.train` runs
    them: their sessions (`sessions.jsonl`) and held-out answers (`heldout/`) recorded in `cfg.run_dir`."""
    return EnvRunner(cfg.env, gateway_url, store_dir=store_dir, api_key=cfg.gateway.api_key, offset_fn=offset_fn,
                     backlog=max(1, round(cfg.env.backlog_steps * cfg.trainer.samples_per_step)), temperature=cfg.gateway.temperature,
                     served_model_name=cfg.gateway.served_model_name,
                     min_main_turn_tokens=cfg.gateway.min_main_turn_tokens,
                     openclaw_dir=os.path.join(cfg.run_dir, "openclaw"), policy_batch_size=cfg.policy.max_batch_size,
                     record_dir=cfg.run_dir, writer=writer, step_fn=step_fn)
