"""Pushing the trainer's weights to the serving pool (docs/design.md §8 and §10).

Two ways, one interface (`await sync(graphdef, state, version)`):

* `InProcessWeightSync`: the embedded JAX engine lives in this process; its params are swapped
  between decode steps (running requests finish on the old version first).
* `DiskWeightSync`: external SGLang workers; the model is written as an HF safetensors
  directory under a shared path, then every worker is told to `/update_weights_from_disk`
  with the new `weight_version` (a router does not forward weight updates, so the workers are
  called one by one). Serving never pauses for training: the update is a swap on the worker.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from flax import nnx

from openclaw_jax.models.hub import save_checkpoint

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A worker did not accept the new weights."""


class InProcessWeightSync:
    """Swap the params of an in-process `Engine`; with `vision` (the image path of a Qwen2.5-VL policy,
    `inference.vision.VisionGenerator`) `state` is the whole QwenVL's and both paths take it under one
    version (`inference.vision.swap_served_weights`)."""

    def __init__(self, engine: Any, vision: Any = None):
        self.engine = engine
        self.vision = vision

    async def __call__(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> None:
        if self.vision is not None:
            from openclaw_jax.inference.vision import swap_served_weights   # the inference stack, only here
            await asyncio.to_thread(swap_served_weights, self.engine, self.vision, state, version)
        else:
            await asyncio.to_thread(self.engine.swap_weights, state, version)
        log.info("weights pushed in process: weight_version=%s", version)


class DiskWeightSync:
    """Write HF safetensors to `directory/step_<version>` and ask every worker to load them.

    `client` may be None on processes other than 0 of a multi-host trainer: they take part in
    the (collective) gather of the weights but do not talk to the pool.
    """

    def __init__(self, client: Any, directory: str | Path, *, model_config: Any, keep: int = 2,
                 extra_config: dict | None = None, tokenizer_files_from: str | Path | None = None):
        self.client = client
        self.directory = Path(directory)
        self.model_config = model_config
        self.keep = keep
        self.extra_config = extra_config
        self.tokenizer_files_from = Path(tokenizer_files_from) if tokenizer_files_from else None
        self._written: list[Path] = []

    def _write(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> Path:
        out = self.directory / f"step_{version}"
        save_checkpoint(nnx.merge(graphdef, state), self.model_config, out, extra_config=self.extra_config)
        if self.tokenizer_files_from is not None:
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                         "generation_config.json", "chat_template.jinja"):
                src = self.tokenizer_files_from / name
                if src.exists():
                    shutil.copy2(src, out / name)
        return out

    async def push_path(self, path: str | Path, version: str) -> None:
        """Tell every worker to load the HF directory `path` as `version`; raise if any worker refuses."""
        results = await self.client.update_weights_from_disk(str(path), weight_version=str(version))
        failed = [r for r in results if not r.success]
        if failed:
            raise WeightSyncError("workers rejected weights %s from %s: %s" % (
                version, path, "; ".join(f"{r.url}: {r.message}" for r in failed)))
        log.info("weights pushed to %d worker(s): weight_version=%s (%s)", len(results), version, path)

    async def __call__(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> None:
        path = await asyncio.to_thread(self._write, graphdef, state, version)
        if self.client is None:  # multi-host: every process writes its part, process 0 tells the pool
            return
        await self.push_path(path, version)
        self._written.append(path)
        while len(self._written) > self.keep:
            old = self._written.pop(0)
            shutil.rmtree(old, ignore_errors=True)


class BackgroundWeightSync:
    """Runs weight pushes off the trainer's path (docs/design.md §12: async weight sync).

    `submit(graphdef, state, version)` returns at once. At most one push is in flight; a version
    submitted meanwhile waits, and a newer one replaces it (its weights supersede the older ones:
    counted in `superseded`, never lost silently). A failed push is retried with back-off
    `retries` times, then logged as an error and counted in `failures`; the next submitted
    version tries again. `state` must already be detached from the trainer's buffers (the trainer
    donates them to its next step). `flush()` waits for everything submitted.
    """

    def __init__(self, push: Callable[[nnx.GraphDef, nnx.State, str], Awaitable[None]], *, retries: int = 3,
                 backoff_s: float = 0.5):
        self._push = push
        self.retries = retries
        self.backoff_s = backoff_s
        self._pending: tuple[nnx.GraphDef, nnx.State, str] | None = None
        self._task: asyncio.Task | None = None
        self.completed = 0
        self.superseded = 0
        self.failures = 0
        self.last_duration_s: float | None = None   # wall time of the last finished push
        self.last_version: str | None = None         # the newest version the pool accepted

    @property
    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    def submit(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> None:
        if self._pending is not None:
            self.superseded += 1
            log.info("weight sync: version %s superseded by %s before it was pushed", self._pending[2], version)
        self._pending = (graphdef, state, version)
        if not self.in_flight:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending is not None:
            graphdef, state, version = self._pending
            self._pending = None
            await self._push_with_retries(graphdef, state, version)

    async def _push_with_retries(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> None:
        start = time.perf_counter()
        for attempt in range(self.retries + 1):
            try:
                await self._push(graphdef, state, version)
            except Exception as err:  # noqa: BLE001 - any worker/IO failure: retry, then report
                if attempt == self.retries:
                    self.failures += 1
                    log.error("weight sync of version %s failed after %d attempts: %s: %s; the pool keeps serving "
                              "version %s until the next sync", version, attempt + 1, type(err).__name__, err,
                              self.last_version)
                    return
                log.warning("weight sync of version %s failed (attempt %d/%d): %s: %s; retrying", version,
                            attempt + 1, self.retries + 1, type(err).__name__, err)
                await asyncio.sleep(self.backoff_s * 2 ** attempt)
            else:
                self.completed += 1
                self.last_version = version
                self.last_duration_s = time.perf_counter() - start
                return

    async def flush(self) -> None:
        """Wait until every submitted version has been pushed (or has failed and been reported)."""
        while self.in_flight:
            await asyncio.shield(self._task)


def worker_urls(policy_urls: Sequence[str], explicit_workers: Sequence[str]) -> list[str]:
    """Workers to update: the explicit list when given (router setups), else the pool URLs."""
    return list(explicit_workers) if explicit_workers else list(policy_urls)
