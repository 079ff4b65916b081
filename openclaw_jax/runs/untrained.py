"""A run that does not train (`trainer.enabled: false`): the base model is served as it is and the samples
are consumed in the trainer's windows, so a baseline that learns outside the weights (OpenClaw's memory,
`env.memory: user_md`) gets the same sample budget (`trainer.max_steps` x `trainer.samples_per_step`) and
the same evaluation steps (`env.eval_every`) as a training run of the same config.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Awaitable, Callable

import numpy as np

from openclaw_jax.config import ExperimentConfig
from openclaw_jax.samples import SampleTail
from openclaw_jax.trainer.metrics import person_stats

log = logging.getLogger(__name__)


class UntrainedLearner:
    """Stands in for `trainer.loop.Trainer` in `python -m openclaw_jax.train`: the same `run(...)`, `step`,
    `sample_offset`, `weight_version` and `serving_model()`, with no optimizer, teacher or checkpoint.

    A "step" takes the next `samples_per_step` samples of the store and changes nothing; its metrics are
    the window's rewards, kinds and people (`rollout/reward`, `samples/*`, `people/*`), as a training step
    logs them."""

    def __init__(self, cfg: ExperimentConfig, model: Any):
        self.cfg = cfg
        self.model = model
        self.step = 0
        self.sample_offset = 0

    @property
    def weight_version(self) -> str:
        return "0"   # the base model is served throughout

    def serving_model(self, dtype: str | None = "compute") -> Any:
        del dtype  # served and never changed: the model as loaded (model.dtype)
        return self.model

    def restore(self, checkpointer: Any) -> bool:
        del checkpointer
        return False

    def save_checkpoint(self, checkpointer: Any) -> None:
        del checkpointer  # nothing learnt in the weights

    async def run(self, store_dir: str, *, checkpointer: Any, writer: Any, weight_sync: Any, stop: asyncio.Event,
                  on_step: Callable[[int, dict[str, float]], Awaitable[None] | None] | None = None,
                  progress: Callable[[str], None] | None = None) -> None:
        """Consume `trainer.max_steps` windows of `trainer.samples_per_step` samples (or until `stop`, or
        `trainer.wait_timeout_s` without a new sample), calling `on_step` after each, as the trainer does."""
        del checkpointer, weight_sync
        tcfg = self.cfg.trainer
        while not os.path.isdir(store_dir):   # the gateway creates the store with its first sample
            if stop.is_set():
                return
            await asyncio.sleep(0.2)
        store = SampleTail(store_dir, start=self.sample_offset)
        last_arrival = time.monotonic()
        try:
            while self.step < tcfg.max_steps and not stop.is_set():
                available = store.refresh()
                if progress is not None:
                    progress(f"step {self.step}/{tcfg.max_steps}  samples waiting {available - self.sample_offset}")
                if available - self.sample_offset < tcfg.samples_per_step:
                    if tcfg.wait_timeout_s and time.monotonic() - last_arrival > tcfg.wait_timeout_s:
                        log.warning("no new samples for %.0f s; stopping", tcfg.wait_timeout_s)
                        return
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=0.25)
                    except asyncio.TimeoutError:
                        pass
                    continue
                last_arrival = time.monotonic()
                end = self.sample_offset + tcfg.samples_per_step
                samples = await asyncio.to_thread(store.read, self.sample_offset, end)
                self.step, self.sample_offset = self.step + 1, end
                metrics = {"rollout/reward": float(np.mean([s.reward for s in samples])),
                           "samples/per_step": float(len(samples)),
                           "samples/waiting": float(max(available - end, 0)), "weight_version": 0.0}
                for kind in ("opd+rl", "opd", "rl"):
                    metrics[f"samples/{kind.replace('+', '_')}"] = float(sum(s.kind == kind for s in samples))
                metrics.update(person_stats(samples))
                if writer is not None:
                    writer.scalars(self.step, metrics)
                    writer.flush()
                if on_step is not None:
                    result = on_step(self.step, metrics)
                    if asyncio.iscoroutine(result):
                        await result
        finally:
            store.close()
