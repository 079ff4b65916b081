"""Read a run's TensorBoard event files without TensorBoard (tensorboardX's protobufs only).

The trainer writes `<run_dir>/tb/events.out.tfevents.*` with tensorboardX (see `trainer/metrics.py`);
notebooks and scripts read them back here:

    read_scalars(logdir)     -> {tag: [(step, value), ...]}
    read_texts(logdir)       -> {tag: [(step, text), ...]}         (tag as given to add_text)
    read_histograms(logdir)  -> {tag: [(step, Histogram), ...]}

Event files are TFRecord streams: `length (u64 LE) | masked crc32c(length) (u32) | payload |
masked crc32c(payload) (u32)`, each payload one `Event` protobuf. A live run may be writing the
last record while we read, so a record cut short at the end of a file is ignored, not an error;
a record whose payload checksum is wrong is skipped with a warning; a wrong length checksum
ends that file (nothing after it can be located). Files are read in the order they were
created (the timestamp in their name), and every series is sorted by step, stable, so a
resumed run that logs a step again keeps both values in write order.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

log = logging.getLogger(__name__)

EVENT_FILE_GLOB = "events.out.tfevents.*"
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_CRC_MASK_DELTA = 0xA282EAD8
# tensorboardX stores add_text(tag, ...) under "<tag>/text_summary".
_TEXT_SUFFIX = "/text_summary"


@dataclass(frozen=True)
class Histogram:
    """One histogram summary: bucket `i` counts values in (bucket_limits[i-1], bucket_limits[i]]."""

    min: float
    max: float
    num: float
    sum: float
    sum_squares: float
    bucket_limits: np.ndarray
    bucket_counts: np.ndarray

    @property
    def mean(self) -> float:
        return self.sum / self.num if self.num else float("nan")


def _masked_crc32c(data: bytes) -> int:
    from tensorboardX.crc32c import crc32c

    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def event_files(logdir: str | Path) -> list[Path]:
    """The event files directly under `logdir`, oldest first (by the creation time in their name)."""
    logdir = Path(logdir)
    if not logdir.is_dir():
        raise FileNotFoundError(
            f"TensorBoard log directory {str(logdir)!r} does not exist; a run writes it under <run_dir>/tb")

    def created(path: Path) -> tuple[float, str]:
        match = re.match(r"events\.out\.tfevents\.(\d+(?:\.\d+)?)", path.name)
        return (float(match.group(1)) if match else float("inf"), path.name)

    return sorted((p for p in logdir.glob(EVENT_FILE_GLOB) if p.is_file()), key=created)


def read_records(path: str | Path, *, verify: bool = True) -> Iterator[bytes]:
    """Payloads of the TFRecord file `path`; a torn last record is dropped silently."""
    data = Path(path).read_bytes()
    pos, size = 0, len(data)
    header = _LENGTH.size + _CRC.size
    while pos + header <= size:
        length_bytes = data[pos:pos + _LENGTH.size]
        (length,) = _LENGTH.unpack(length_bytes)
        (length_crc,) = _CRC.unpack_from(data, pos + _LENGTH.size)
        if verify and _masked_crc32c(length_bytes) != length_crc:
            log.warning("%s: corrupt record header at byte %d; ignoring the rest of the file", path, pos)
            return
        start, end = pos + header, pos + header + length
        if end + _CRC.size > size:
            return  # the writer has not finished this record yet
        payload = data[start:end]
        (payload_crc,) = _CRC.unpack_from(data, end)
        pos = end + _CRC.size
        if verify and _masked_crc32c(payload) != payload_crc:
            log.warning("%s: record at byte %d fails its checksum; skipped", path, start - header)
            continue
        yield payload


def iter_events(logdir: str | Path, *, verify: bool = True):
    """Every `Event` protobuf of the run, file by file in creation order."""
    from tensorboardX.proto import event_pb2

    for path in event_files(logdir):
        for payload in read_records(path, verify=verify):
            try:
                yield event_pb2.Event.FromString(payload)
            except Exception as err:  # protobuf raises DecodeError; any failure means a bad record
                log.warning("%s: undecodable event skipped (%s)", path, err)


def _plugin(value) -> str:
    return value.metadata.plugin_data.plugin_name if value.HasField("metadata") else ""


def _tensor_scalar(tensor) -> float | None:
    """A scalar stored as a TensorProto (newer writers), or None if it is not one number."""
    for field in ("float_val", "double_val", "int_val", "int64_val"):
        values = getattr(tensor, field)
        if len(values) == 1:
            return float(values[0])
    if tensor.tensor_content:
        dtype = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64}.get(tensor.dtype)
        if dtype is not None:
            arr = np.frombuffer(tensor.tensor_content, dtype=dtype)
            if arr.size == 1:
                return float(arr[0])
    return None


def _sorted(series: dict[str, list]) -> dict[str, list]:
    return {tag: sorted(points, key=lambda p: p[0]) for tag, points in series.items()}


def read_scalars(logdir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """`{tag: [(step, value), ...]}` sorted by step, from `add_scalar` summaries."""
    out: dict[str, list[tuple[int, float]]] = {}
    for event in iter_events(logdir):
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                number = float(value.simple_value)
            elif kind == "tensor" and _plugin(value) in ("scalars", ""):
                number = _tensor_scalar(value.tensor)
                if number is None:
                    continue
            else:
                continue
            out.setdefault(value.tag, []).append((int(event.step), number))
    return _sorted(out)


def read_texts(logdir: str | Path) -> dict[str, list[tuple[int, str]]]:
    """`{tag: [(step, text), ...]}` sorted by step, from `add_text` summaries (tag as written)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for event in iter_events(logdir):
        for value in event.summary.value:
            if value.WhichOneof("value") != "tensor" or _plugin(value) != "text":
                continue
            strings = [s.decode("utf-8", errors="replace") for s in value.tensor.string_val]
            tag = value.tag[:-len(_TEXT_SUFFIX)] if value.tag.endswith(_TEXT_SUFFIX) else value.tag
            out.setdefault(tag, []).append((int(event.step), "\n".join(strings)))
    return _sorted(out)


def read_histograms(logdir: str | Path) -> dict[str, list[tuple[int, Histogram]]]:
    """`{tag: [(step, Histogram), ...]}` sorted by step, from `add_histogram` summaries."""
    out: dict[str, list[tuple[int, Histogram]]] = {}
    for event in iter_events(logdir):
        for value in event.summary.value:
            if value.WhichOneof("value") != "histo":
                continue
            h = value.histo
            hist = Histogram(min=h.min, max=h.max, num=h.num, sum=h.sum, sum_squares=h.sum_squares,
                             bucket_limits=np.asarray(h.bucket_limit, np.float64),
                             bucket_counts=np.asarray(h.bucket, np.float64))
            out.setdefault(value.tag, []).append((int(event.step), hist))
    return _sorted(out)
