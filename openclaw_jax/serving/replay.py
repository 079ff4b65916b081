"""The gate's replay set: the most recent held-out turns of the sample store.

`ReplayReader` follows the store forward (one `SampleTail`, each record decoded once) and keeps the
last ``size`` samples that `samples.holdout.is_held_out` marks, so its memory is bounded by the
replay set whatever the store's size. On a restart it reads the store once from the start (the
held-out turns are recognised from their records alone).
"""

from __future__ import annotations

import collections
import os

from openclaw_jax.samples import Sample, SampleTail
from openclaw_jax.samples.holdout import is_held_out


class ReplayReader:
    """The last ``size`` held-out samples (1 in ``holdout_every``) of the store at ``store_dir``."""

    def __init__(self, store_dir: str | os.PathLike, *, holdout_every: int, size: int, max_tokens: int = 0,
                 read_batch: int = 256):
        self.store_dir = os.fspath(store_dir)
        self.holdout_every = holdout_every
        self.max_tokens = max_tokens        # longer turns (a prompt or hint prompt + response) are not replayed (0: no limit)
        self.read_batch = read_batch
        self._recent: collections.deque[Sample] = collections.deque(maxlen=size)
        self._tail: SampleTail | None = None
        self.position = 0                   # the next store offset to read
        self.skipped_long = 0

    def refresh(self) -> list[Sample]:
        """Read what was appended since the last call; the current replay set, oldest first (blocking I/O)."""
        if self._tail is None:
            if not os.path.isdir(self.store_dir):
                return []
            self._tail = SampleTail(self.store_dir)
        end = self._tail.refresh()
        while self.position < end:
            stop = min(end, self.position + self.read_batch)
            for sample in self._tail.read(self.position, stop):
                if not is_held_out(sample.sample_id, self.holdout_every):
                    continue
                longest = max([len(sample.prompt_ids), *map(len, sample.hint_prompt_ids)])
                if self.max_tokens and longest + len(sample.response_ids) > self.max_tokens:
                    self.skipped_long += 1
                    continue
                self._recent.append(sample)
            self.position = stop
        return list(self._recent)

    def close(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None
