"""The trainer's one reader of the sample store: it follows the store forward from an offset.

A :class:`SampleTail` is opened once per run. It indexes the store once when it opens (the
records before the starting offset are only counted, then forgotten) and afterwards each
:meth:`refresh` reads only the bytes appended since the previous one; :meth:`read` reads just the
records of the window asked for (one ``pread`` each) and releases the index entries before that
window, so its memory holds only what is waiting. The store's guarantees hold as they do for any
reader: only complete, CRC-valid records are seen, a torn tail is skipped once a later segment
exists, and offsets mean what the writer acknowledged.
"""

from __future__ import annotations

import os

from openclaw_jax.samples.sample import Sample, decode_sample
from openclaw_jax.samples.store import SampleStore, SampleStoreError


class SampleTail:
    """Read-only, forward-only reader of a store, starting at record ``start`` (e.g. a checkpoint's offset)."""

    def __init__(self, directory: str | os.PathLike, *, start: int = 0) -> None:
        if start < 0:
            raise SampleStoreError(f"tail start offset {start} must be >= 0")
        self._store = SampleStore(directory, readonly=True)
        self.directory = self._store.directory
        self.position = start  # the next offset to read
        self.records_decoded = 0
        self._store.release_before(start)

    @property
    def bytes_read(self) -> int:
        """Segment bytes read so far (the opening scan included)."""
        return self._store.bytes_read

    def refresh(self) -> int:
        """Index the records appended since the last refresh; returns how many records the store has."""
        return self._store.refresh()

    def __len__(self) -> int:
        return len(self._store)

    def read(self, start: int, stop: int) -> list[Sample]:
        """The samples at offsets ``[start, stop)``, all of which must exist (refresh first).

        Reading moves the tail forward: the records before ``start`` are released (reading one of
        them later is an error); the window itself may be read again."""
        return [decode_sample(p) for p in self.read_payloads(start, stop)]

    def read_payloads(self, start: int, stop: int) -> list[bytes]:
        """The undecoded records ``[start, stop)``, read as :meth:`read` reads them (the trainer's
        input pipeline parses them as a stage of its own)."""
        if stop > len(self._store):
            self._store.refresh()
        if stop > len(self._store):
            raise SampleStoreError(f"samples [{start}, {stop}) asked for, but {self.directory!r} holds only "
                                   f"{len(self._store)} records")
        self._store.release_before(start)
        payloads = self._store.read_payloads(start, stop - start)
        self.records_decoded += len(payloads)
        self.position = stop
        return payloads

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> "SampleTail":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
