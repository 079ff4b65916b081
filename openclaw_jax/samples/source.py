"""A grain ``RandomAccessDataSource`` over a fixed range of the sample store (for notebooks, tools and
offline pipelines; the trainer follows the store with one :class:`~openclaw_jax.samples.tail.SampleTail`)."""

from __future__ import annotations

import os
import threading
from typing import Any

from openclaw_jax.samples.sample import Sample
from openclaw_jax.samples.store import SampleStore, SampleStoreError


class SampleStoreDataSource:
    """grain ``RandomAccessDataSource`` over the samples ``[start, stop)`` of a store.

    The length is fixed when the source is made (grain needs a stable length); make a new
    source (e.g. ``SampleStoreDataSource(dir, start=consumed_offset)``) to see newer
    samples. Index ``i`` is store offset ``start + i``. Picklable (file handles reopen
    lazily in each worker), read-only, thread-safe.
    """

    def __init__(self, directory: str | os.PathLike, start: int = 0, stop: int | None = None,
                 *, as_dict: bool = False) -> None:
        self.directory = os.fspath(directory)
        self.as_dict = as_dict
        if start < 0:
            raise SampleStoreError(f"data source start={start} must be >= 0")
        store = SampleStore(self.directory, readonly=True)  # kept for reading: the store is scanned once
        available = len(store)
        self.start = start
        self.stop = available if stop is None else min(stop, available)
        if self.stop < self.start:
            self.stop = self.start
        self._store: SampleStore | None = store
        self._store_lock = threading.Lock()

    def _get_store(self) -> SampleStore:
        with self._store_lock:
            if self._store is None:
                self._store = SampleStore(self.directory, readonly=True)
            return self._store

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: int) -> Sample | dict[str, Any]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range [0, {len(self)}) for {self!r}")
        store = self._get_store()
        offset = self.start + index
        if offset >= len(store):
            store.refresh()
        sample = store[offset]
        return sample.to_dict() if self.as_dict else sample

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None
        del state["_store_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._store_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SampleStoreDataSource(directory={self.directory!r}, start={self.start}, stop={self.stop})"
