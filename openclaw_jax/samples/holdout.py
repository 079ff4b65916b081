"""Which stored samples are held out of training (the promotion gate's replay set).

The rule reads the record alone, so the trainer (which skips them), the gate (which replays them)
and the status page (which marks them) agree without talking to each other: a sample is held out
when the CRC-32 of its ``sample_id`` (a UUID the gateway gives every scored turn, `sample_ids`) is a
multiple of ``every``. About one sample in ``every`` is held out, spread evenly over sessions and
time, and a sample keeps its role across restarts. ``every = 0`` holds out nothing.

The ids are random, or with a seed a reproducible sequence: a run with the same seed and the same
scored turns, in the same order, holds out the same turns (a measured gated run can be repeated).
"""

from __future__ import annotations

import random
import uuid
import zlib
from typing import Callable


def is_held_out(sample_id: str, every: int) -> bool:
    """True when the sample with this id is kept out of training (1 in ``every``; never when ``every`` is 0)."""
    if every <= 0:
        return False
    return zlib.crc32(sample_id.encode("utf-8")) % every == 0


def sample_ids(seed: int | None, start: int) -> Callable[[], str]:
    """The ids of the samples a gateway stores from store offset ``start`` on: random UUIDs (``seed`` None),
    or UUIDs drawn from a generator seeded by ``seed`` and ``start``. ``start`` keeps the ids of a restarted
    gateway apart from those it stored before (a run that stored nothing leaves no id to collide with)."""
    if seed is None:
        return lambda: uuid.uuid4().hex
    rng = random.Random(f"openclaw_jax sample ids:{seed}:{start}")   # a str seed: the same in every process
    return lambda: uuid.UUID(int=rng.getrandbits(128), version=4).hex
