"""Where the images of turns that wait for their next state are kept: on disk, bounded, per person.

A main turn with images is scored only when the session's next request arrives, which may be hours
later or never. Its encoded images wait here, not in memory: one file per image (named by its
sha256, shared by every turn that shows it), counted against ``max_bytes`` in all and
``max_bytes_per_person`` for each person (a person is charged for every turn's reference). A turn
whose images do not fit is not kept for training (`put` returns None); the person still gets their
reply. When the turn is scored its images move into the sample store (durable blobs that live as
long as the samples naming them); when it is dropped unscored they are released. A file nobody
references any more is deleted at once. The spool is emptied when the gateway starts: pending turns
do not survive a restart anyway.

Blocking file I/O: the gateway calls `put`, `read` and `release` from a worker thread. Thread-safe.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from openclaw_jax.counters import counters

logger = logging.getLogger(__name__)

SpoolStats = counters("SpoolStats", "images_spooled turns_refused bytes_refused",
                      "The image spool's counters: images written, turns whose images did not fit (and their bytes).")


@dataclass(frozen=True)
class SpooledImage:
    """One image of a pending turn: where its bytes wait, and what rendering its prompt needs (no pixels)."""

    sha256: str
    mime: str
    size: int
    grid: tuple[int, int, int]   # the vision grid (t, h, w) from the image's header size


class ImageSpool:
    """See the module docstring."""

    def __init__(self, directory: str, *, max_bytes: int, max_bytes_per_person: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_bytes_per_person = max_bytes_per_person
        self._lock = threading.Lock()
        self._refs: Counter[str] = Counter()          # sha256 -> references (turns holding it)
        self._sizes: dict[str, int] = {}
        self._charged: Counter[str] = Counter()       # person -> bytes of their references
        self.bytes = 0                                # bytes on disk
        self.stats = SpoolStats()
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)

    def _path(self, sha256: str) -> str:
        return os.path.join(self.directory, sha256)

    def put(self, person: str, images: Sequence[tuple[bytes, SpooledImage]]) -> tuple[SpooledImage, ...] | None:
        """Keep a turn's images (encoded bytes and their reference); None (nothing kept) when they do not fit."""
        with self._lock:
            new = {ref.sha256: data for data, ref in images if ref.sha256 not in self._refs}
            added = sum(len(d) for d in new.values())
            charge = sum(ref.size for _, ref in images)
            if self.bytes + added > self.max_bytes or self._charged[person] + charge > self.max_bytes_per_person:
                self.stats.turns_refused += 1
                self.stats.bytes_refused += charge
                logger.warning("image spool: person %s's turn with %d image(s) (%d bytes) is not kept for training: "
                               "the spool holds %d of %d bytes (gateway.image_spool_bytes), this person %d of %d "
                               "(gateway.image_spool_bytes_per_person)", person, len(images), charge, self.bytes,
                               self.max_bytes, self._charged[person], self.max_bytes_per_person)
                return None
            for sha, data in new.items():   # counted before writing: a concurrent put sees the space as taken
                self._sizes[sha] = len(data)
            self.bytes += added
            for _, ref in images:
                self._refs[ref.sha256] += 1
            self._charged[person] += charge
        try:
            for sha, data in new.items():
                tmp = self._path(sha) + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, self._path(sha))
        except OSError:
            self.release(person, [ref for _, ref in images])
            raise
        self.stats.images_spooled += len(new)
        return tuple(ref for _, ref in images)

    def read(self, ref: SpooledImage) -> bytes:
        with open(self._path(ref.sha256), "rb") as f:
            return f.read()

    def release(self, person: str, refs: Iterable[SpooledImage]) -> None:
        """The turn is done with these images (scored and stored, or dropped): files nobody needs are deleted."""
        gone = []
        with self._lock:
            for ref in refs:
                self._charged[person] -= ref.size
                if self._charged[person] <= 0:
                    del self._charged[person]
                self._refs[ref.sha256] -= 1
                if self._refs[ref.sha256] <= 0:
                    del self._refs[ref.sha256]
                    self.bytes -= self._sizes.pop(ref.sha256, 0)
                    gone.append(ref.sha256)
        for sha in gone:
            try:
                os.unlink(self._path(sha))
            except FileNotFoundError:
                pass

    def status(self) -> dict[str, int]:
        with self._lock:
            return {"bytes": self.bytes, "images": len(self._refs), "max_bytes": self.max_bytes,
                    "turns_refused": self.stats.turns_refused}
