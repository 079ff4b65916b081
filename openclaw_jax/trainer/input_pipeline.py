"""The trainer's input pipeline as grain transformations, with the next window prefetched on a host thread.

A step trains on a window `[start, end)` of new store records. Getting it ready is host work:
read the records' bytes (the run's one `SampleTail`, `read_payloads`), parse them into `Sample`s, drop those that
cannot train, and pack them into the shape ladder's shapes. Here that is one grain graph per window

    MapDataset.source(payloads).map(decode_sample)          # parse, on grain's read threads
      .to_iter_dataset(ReadOptions(num_threads=...))        # (in order)
      .filter(keep)                                         # stale / too long / temperature / hint-only
      .batch(batch_size, batch_fn=list)                     # batch_size samples per step
      .map(pack)                                            # the ladder's shapes (trainer/batcher.py)

and `prefetch` runs the whole graph for the *next* window on a host thread while the device runs
the current step, so the loop finds its batch ready.

    pipeline = WindowPipeline(store_dir_or_tail, spec)       # spec: trainer/batcher.py BatchSpec
    packed = pipeline.batch(start, end, version)             # PackedBatch, or None: all dropped
    pipeline.prefetch(end, end + n, version + 1)             # the next window, on a host thread
    ... train on `packed` ...
    packed = pipeline.batch(end, end + n, version + 1)       # the prefetched result (or built now)
    pipeline.dropped                                         # {"stale": .., ...} as SampleBatcher's
    pipeline.close()

`batches(start, end, current_version=...)` gives exactly what `SampleBatcher.batches` gives for the
same window (every array; tests/trainer/test_input_pipeline.py), since the filter and the packer are the
batcher's own (`SampleBatcher._keep`, `pack`, with the same seen-shapes set). Windows must be
asked for in order (the tail reads forward and the packer reuses the shapes it has seen): a
prefetch must be of the window that is asked for next; asking for another one discards it
(its seen shapes are rolled back) and builds the asked one, if the tail has not yet released its
records. A prefetched window's drops count in `dropped` when its batches are taken, as they would
have without the prefetch. `bench/input_pipeline.py` measures the host time per step against the
hand-written path.

The agentic warm-up's SFT batches read through the same grain API (`demonstration_batches(pairs,
...)`, used by `runs/agentic.warm_up`), as do the group rollouts' task sets (`envs/agentic/rollout.py`,
which may not import the trainer, builds its own one-line stream); `sample_dataset(records)` parses
stored sample records.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import logging
import os
from typing import Callable, Sequence

import grain
import numpy as np

from openclaw_jax.samples import Sample, SampleTail
from openclaw_jax.samples.sample import decode_sample
from openclaw_jax.samples.store import read_image
from openclaw_jax.trainer.batch import BatchSpec, PackedBatch
from openclaw_jax.trainer.batcher import SampleBatcher, pack
from openclaw_jax.trainer.vision_batch import attach_images

log = logging.getLogger(__name__)

Window = tuple[int, int, "int | None"]


def sample_dataset(payloads: Sequence[bytes]) -> grain.MapDataset:
    """Stored records -> `Sample`s, as a random-access grain dataset (also for task sets and
    demonstrations kept as sample records: `sample_dataset(records).map(...)`)."""
    return grain.MapDataset.source(list(payloads)).map(decode_sample)


def window_dataset(payloads: Sequence[bytes], spec: BatchSpec, keep, *, current_version: int | None,
                   seen: dict[str, set] | None, parse_threads: int = 0,
                   image_bytes: Callable[[str], bytes] | None = None) -> grain.IterDataset:
    """The grain graph of one window: parse -> filter (`keep(sample, current_version)`) -> batches of
    `spec.samples_per_step` -> `pack` (in order: the packer's seen shapes and the filter's counters are
    stateful, so only the parse runs on several threads)."""
    read = grain.ReadOptions(num_threads=parse_threads, prefetch_buffer_size=max(len(payloads), 1))
    return (sample_dataset(payloads)
            .to_iter_dataset(read)
            .filter(lambda s: keep(s, current_version))
            .batch(spec.samples_per_step, batch_fn=list)
            .map(functools.partial(_pack, spec=spec, current_version=current_version, seen=seen,
                                   image_bytes=image_bytes)))


def _pack(samples: list[Sample], *, spec: BatchSpec, current_version: int | None,
          seen: dict[str, set] | None, image_bytes: Callable[[str], bytes] | None = None) -> PackedBatch:
    packed = pack(samples, spec, current_version=current_version, seen=seen)
    if spec.image_processor is not None:   # a QwenVL student: the samples' images (store blobs) as patches
        if image_bytes is None:
            raise ValueError("a batch spec with images needs image_bytes (the store's blob reader)")
        packed = attach_images(packed, image_bytes, spec.image_processor, spec.image_token_id)
    return packed


class WindowPipeline:
    """Windows of the store -> `PackedBatch`es through grain, the next one prefetched on a host thread.

    `store`: the run's `SampleTail` (the caller owns it) or a store directory (a tail is opened on
    first use and closed by `close`). `parse_threads`: grain read threads for the parse (0: in the
    pipeline's own thread; JSON parsing holds the GIL, so more rarely helps)."""

    def __init__(self, store: str | os.PathLike | SampleTail, spec: BatchSpec, *, parse_threads: int = 0):
        self._batcher = SampleBatcher(store, spec)   # the filter, its counters, the tail and the seen shapes
        self.spec = spec
        self.parse_threads = parse_threads
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="input-pipeline")
        self._pending: tuple[Window, concurrent.futures.Future, tuple] | None = None

    @property
    def dropped(self) -> dict[str, int]:
        return self._batcher.dropped

    @property
    def seen_shapes(self) -> dict[str, set[tuple[int, int]]]:
        return self._batcher.seen_shapes

    @property
    def tail(self) -> SampleTail:
        return self._batcher.tail

    def _build(self, window: Window, dropped: dict[str, int] | None = None) -> list[PackedBatch]:
        """The window's batches; the filter counts its drops into `dropped` (default: `self.dropped`)."""
        start, end, version = window
        keep = self._batcher._keep
        if dropped is not None:   # a prefetch: its drops count when its window is taken
            counter = copy.copy(self._batcher)
            counter.dropped = dropped
            keep = counter._keep
        payloads = self.tail.read_payloads(start, end)
        return list(window_dataset(payloads, self.spec, keep, current_version=version, seen=self.seen_shapes,
                                   parse_threads=self.parse_threads,
                                   image_bytes=functools.partial(read_image, self.tail.directory)))

    def prefetch(self, start: int, end: int, current_version: int | None = None) -> None:
        """Start building the window `[start, end)` on the pipeline's host thread (the records must
        exist); the next `batch` / `batches` of the same window takes the result."""
        self._settle(None)
        window = (start, end, current_version)
        dropped = dict.fromkeys(self.dropped, 0)
        seen = copy.deepcopy(self.seen_shapes)
        self._pending = (window, self._executor.submit(self._build, window, dropped), (dropped, seen))

    def _settle(self, window: Window | None) -> list[PackedBatch] | None:
        """The prefetched batches if they are of `window` (their drops counted now); any other prefetch
        is waited out and undone (its seen shapes rolled back)."""
        if self._pending is None:
            return None
        pending, future, (dropped, seen) = self._pending
        self._pending = None
        try:
            result = future.result()
        except Exception:
            if pending == window:
                raise
            result = None
        if pending == window:
            for k, v in dropped.items():
                self._batcher.dropped[k] = self._batcher.dropped.get(k, 0) + v
            return result
        log.warning("input pipeline: prefetched window %s but %s was asked for; building it now", pending, window)
        for part, shapes in seen.items():
            self._batcher.seen_shapes[part].clear()
            self._batcher.seen_shapes[part].update(shapes)
        return None

    def batches(self, start: int, end: int, *, current_version: int | None = None) -> list[PackedBatch]:
        """Every batch of the window (the last may be partial), as `SampleBatcher.batches` gives them."""
        window = (start, end, current_version)
        result = self._settle(window)
        return result if result is not None else self._build(window)

    def batch(self, start: int, end: int, current_version: int | None = None) -> PackedBatch | None:
        """The window's first batch (a window is one step's samples), or None when every sample was dropped."""
        return next(iter(self.batches(start, end, current_version=current_version)), None)

    def close(self) -> None:
        if self._pending is not None:
            self._pending[1].cancel()
            try:
                self._pending[1].result()
            except Exception:  # noqa: BLE001 - cancelled, or a discarded prefetch's failure: no longer matters
                pass
            self._pending = None
        self._executor.shutdown(wait=True)
        self._batcher.close()

    def __enter__(self) -> "WindowPipeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------ the other readers, through the same API

def demonstration_batches(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, steps: int, batch_size: int,
                          seed: int, prefetch_threads: int = 0) -> grain.IterDataset:
    """The warm-up's batches of (prompt ids, response ids) demonstrations: per step `batch_size` distinct
    pairs drawn with `np.random.default_rng(seed)` (the draws of the hand-written warm-up loop), sorted
    by length (similar lengths per batch keep the padded shapes few). `prefetch_threads` > 0 builds
    the next batches on host threads while a step runs."""
    rng = np.random.default_rng(seed)
    size = min(batch_size, len(pairs))
    draws = [rng.choice(len(pairs), size=size, replace=False) for _ in range(steps)]
    return (grain.MapDataset.source(draws)
            .map(lambda idx: sorted((pairs[i] for i in idx), key=lambda p: len(p[0]) + len(p[1])))
            .to_iter_dataset(grain.ReadOptions(num_threads=prefetch_threads, prefetch_buffer_size=2)))


__all__ = ["WindowPipeline", "demonstration_batches", "sample_dataset", "window_dataset"]
