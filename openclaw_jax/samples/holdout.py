"""Which stored samples are held out of training (the promotion gate's replay set).

The rule reads the record alone, so the trainer (which skips them), the gate (which replays them)
and the status page (which marks them) agree without talking to each other: a sample is held out
when the CRC-32 of its ``sample_id`` (a random UUID the gateway gives every scored turn) is a
multiple of ``every``. About one sample in ``every`` is held out, spread evenly over sessions and
time, and a sample keeps its role across restarts. ``every = 0`` holds out nothing.
"""

from __future__ import annotations

import zlib


def is_held_out(sample_id: str, every: int) -> bool:
    """True when the sample with this id is kept out of training (1 in ``every``; never when ``every`` is 0)."""
    if every <= 0:
        return False
    return zlib.crc32(sample_id.encode("utf-8")) % every == 0
