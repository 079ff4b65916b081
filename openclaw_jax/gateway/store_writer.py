"""The gateway's one writer into the sample store: in order, retried, bounded, honest about failure.

Samples are appended by one background task, in the order they were scored, on the writer's own
thread (``append`` blocks for the fsync). A failed append (an ``OSError``: a full disk, EIO, a
vanished mount) is retried with exponential back-off, capped at ``gateway.store_retry_max_backoff_s``,
for as long as it keeps failing; the samples behind it wait in memory, up to
``gateway.store_queue_max`` (the one being retried included). A sample that arrives while the
queue is full is dropped and counted. When the store can be written again, the queue is written
out in order. Any other exception from ``append`` would fail the same way again (e.g. a record
over the size limit): that sample is dropped, counted and logged with its traceback, and the rest go on.

``status()`` reports ``degraded`` once the current failure has lasted ``gateway.store_degraded_after_s``:
the gateway's ``/healthz`` then says so and ``/readyz`` answers 503 until a write succeeds again.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from dataclasses import asdict
from typing import Any, Callable

from openclaw_jax.counters import counters
from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.samples import Sample, SampleStore

logger = logging.getLogger(__name__)

BASE_BACKOFF_S = 0.05


StoreWriterStats = counters(
    "StoreWriterStats", "written errors dropped dropped_queue_full",
    """The store writer's counters (in its ``status()``): samples durably appended (``written``), failed
    append attempts (``errors``, each retry counts), samples lost (``dropped``: the queue was full while
    failing, or the sample could not be written at all) and, of those, the ones lost to a full queue.""")


class StoreWriter:
    """Writes into ``store`` as ``cfg.store_queue_max``, ``cfg.store_retry_max_backoff_s`` and
    ``cfg.store_degraded_after_s`` say, on its own thread (shut down by ``close``)."""

    def __init__(self, store: SampleStore, cfg: GatewayConfig, *,
                 on_written: Callable[[int, Sample], None] | None = None,
                 on_error: Callable[[], None] | None = None) -> None:
        self.store = store
        self.cfg = cfg
        self.on_written = on_written
        self.on_error = on_error
        self.stats = StoreWriterStats()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sample-store")
        self.last_error: str | None = None
        self._failing_since: float | None = None
        self._consecutive_failures = 0
        self._pending: collections.deque[Sample] = collections.deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self._last_drop_log = -1e18

    # ----------------------------------------------------------------- producer side
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sample-store-writer")

    def submit(self, sample: Sample) -> bool:
        """Queue ``sample`` for writing; False (and counted) when the queue is full."""
        if len(self._pending) >= self.cfg.store_queue_max:
            self.stats.dropped += 1
            self.stats.dropped_queue_full += 1
            now = time.monotonic()
            if now - self._last_drop_log >= 5.0:
                self._last_drop_log = now
                logger.error("sample store %s cannot be written and %d sample(s) already wait in memory "
                             "(gateway.store_queue_max): dropping session %s turn %d (%d dropped so far)",
                             self.store.directory, len(self._pending), sample.session_id, sample.turn_index,
                             self.stats.dropped)
            return False
        self._pending.append(sample)
        self._idle.clear()
        self._wake.set()
        return True

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def failing_for_s(self) -> float | None:
        return None if self._failing_since is None else time.monotonic() - self._failing_since

    @property
    def degraded(self) -> bool:
        failing = self.failing_for_s
        return failing is not None and failing >= self.cfg.store_degraded_after_s

    def status(self) -> dict[str, Any]:
        failing = self.failing_for_s
        return {"state": "ok" if failing is None else ("failing" if self.degraded else "retrying"),
                "pending": len(self._pending), **asdict(self.stats),
                "failing_for_s": None if failing is None else round(failing, 3), "last_error": self.last_error}

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every queued sample is written; False if that did not happen within ``timeout_s``."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=max(timeout_s, 0.0))
            return True
        except asyncio.TimeoutError:
            return False

    async def close(self, grace_s: float) -> None:
        """Write what is queued (up to ``grace_s``), then stop; anything still unwritten is lost (logged)."""
        if self._pending and not await self.flush(grace_s):
            logger.error("shutdown: %d sample(s) could not be written to %s (%s); they are lost",
                         len(self._pending), self.store.directory, self.last_error)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._executor.shutdown(wait=True)

    # ----------------------------------------------------------------- the writer task
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            sample = self._pending[0]
            try:
                offset = await loop.run_in_executor(self._executor, self.store.append, sample)
            except OSError as err:
                self._failed(err)
                backoff_s = BASE_BACKOFF_S * 2 ** min(self._consecutive_failures, 20)
                await asyncio.sleep(min(self.cfg.store_retry_max_backoff_s, backoff_s))
                continue
            except Exception:  # noqa: BLE001 - cannot succeed on retry: drop this one, keep the rest
                self._pending.popleft()
                self._count_error()
                self.stats.dropped += 1
                logger.exception("sample of session %s turn %d cannot be written to %s; dropped", sample.session_id,
                                 sample.turn_index, self.store.directory)
                continue
            self._pending.popleft()
            if self._failing_since is not None:
                logger.warning("sample store %s is writable again after %.1f s and %d failed attempt(s); writing "
                               "the %d queued sample(s)", self.store.directory, time.monotonic() - self._failing_since,
                               self._consecutive_failures, len(self._pending) + 1)
            self._failing_since = None
            self._consecutive_failures = 0
            self.stats.written += 1
            if self.on_written is not None:
                try:
                    self.on_written(offset, sample)
                except Exception:  # noqa: BLE001
                    logger.exception("the written-sample callback failed")

    def _count_error(self) -> None:
        self.stats.errors += 1
        if self.on_error is not None:
            self.on_error()

    def _failed(self, err: OSError) -> None:
        self._count_error()
        self._consecutive_failures += 1
        self.last_error = f"{type(err).__name__}: {err}"
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            logger.error("sample store %s: write failed (%s); retrying with back-off, %d sample(s) held in memory",
                         self.store.directory, self.last_error, len(self._pending))
        elif self._consecutive_failures % 20 == 0:
            logger.error("sample store %s still cannot be written after %d attempts over %.0f s (%s); %d sample(s) "
                         "held in memory, %d dropped", self.store.directory, self._consecutive_failures,
                         time.monotonic() - self._failing_since, self.last_error, len(self._pending),
                         self.stats.dropped)
