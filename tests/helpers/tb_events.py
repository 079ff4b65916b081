"""Read TensorBoard event files with tensorboardX's protobufs (independent of our writer)."""

from __future__ import annotations

import glob


def read_event_tags(logdir):
    """Parse tensorboardX event files with its own protobufs (independent of our writer code)."""
    from tensorboardX.proto import event_pb2
    import struct

    tags = {}
    for path in glob.glob(f"{logdir}/events.out.tfevents.*"):
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append((event.step, value))
    return tags
