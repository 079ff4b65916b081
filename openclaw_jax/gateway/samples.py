"""Training samples and the durable, append-only sample store (DESIGN section 9).

A :class:`Sample` is one scored main turn: the exact prompt and response token ids the
policy saw and sampled, the rollout log-probs the policy server returned, the judge's
reward, and zero or more hint-augmented prompts (teacher candidates).

The :class:`SampleStore` is the one place where the gateway (writer) and the trainer
(reader) meet. Its guarantees:

* **Durable acknowledgement.** ``append`` returns a record index only after the record
  has been written and ``os.fsync``-ed (and, for a new segment file, the directory too).
  A returned index is never lost and never changes meaning.
* **Append-only.** Bytes once written are never rewritten or deleted. A torn record at
  the end of a segment (a crash mid-write) is detected by its header/CRC and *skipped*:
  the writer that opens the store afterwards starts a fresh segment instead of
  truncating, so even a (theoretically) valid-but-unacknowledged record is kept.
* **Offsets.** Records are numbered 0, 1, 2, ... across segments in append order;
  consumers read by offset (``read(start, max_count)``) and save the offset they reached
  in their checkpoint, so a restart neither loses nor repeats samples.

On-disk format: segment files ``samples-000000.log``, ``samples-000001.log``, ...; each
record is a 12-byte header ``MAGIC(4) | payload length (u32 LE) | crc32(payload) (u32 LE)``
followed by the payload (UTF-8 JSON of the sample). A single writer process holds an
exclusive ``flock`` on ``LOCK``; any number of read-only readers may scan concurrently.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import re
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator

logger = logging.getLogger(__name__)

SAMPLE_FORMAT_VERSION = 1
SAMPLE_KINDS = ("opd+rl", "opd", "rl")

RECORD_MAGIC = b"OCJS"
_HEADER = struct.Struct("<4sII")
RECORD_HEADER_BYTES = _HEADER.size
# A record larger than this is treated as corruption rather than allocated blindly.
MAX_RECORD_BYTES = 256 << 20
SEGMENT_PATTERN = re.compile(r"^samples-(\d{6})\.log$")
DEFAULT_SEGMENT_MAX_BYTES = 64 << 20


class SampleError(ValueError):
    """A sample's fields are inconsistent (wrong kind for its reward/hints, length mismatch)."""


class SampleStoreError(RuntimeError):
    """The sample store cannot be opened, written or read as asked."""


class SampleStoreLockedError(SampleStoreError):
    """Another process already holds the store open for writing."""


@dataclass(frozen=True)
class Sample:
    """One scored main turn, ready for the trainer.

    ``kind`` follows the three-case rule: ``opd+rl`` (hint accepted and eval +-1; reward =
    eval), ``opd`` (hint only; reward 0), ``rl`` (eval +-1 only; no hint candidates).
    ``hint_prompt_ids[c]`` is the chat-template rendering (with generation prompt) of the
    turn's prompt with ``hints[c]`` appended to its last user message; the response
    tokens are the same ``response_ids`` for every candidate.
    """

    session_id: str
    turn_index: int
    kind: str
    reward: float
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    hints: list[str] = field(default_factory=list)
    hint_prompt_ids: list[list[int]] = field(default_factory=list)
    # The weight version that began the response (the oldest it saw: staleness counts from it) and
    # the one that ended it; they differ when the policy's weights were swapped mid-response.
    weight_version: str | None = None
    last_weight_version: str | None = None
    # Sampling temperature the rollout log-probs were computed with (log_softmax(z / T)); the
    # trainer's tau must equal it. top_p / top_k truncated the sampling (not the log-probs).
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    eval_score: int = 0
    eval_votes: list[int | None] = field(default_factory=list)
    hint_votes: list[int | None] = field(default_factory=list)
    # The judge's raw outputs, for inspection: {"eval": [text, ...], "hint": [text, ...]}.
    judge_raw: dict[str, Any] = field(default_factory=dict)
    judge: str = ""
    next_state: dict[str, Any] = field(default_factory=dict)
    response_text: str = ""
    finish_reason: str = ""
    sample_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    # Multi-turn (agentic) samples: which response tokens are trained (1) and which are context the
    # environment appended (0, e.g. tool observations), and a per-token advantage (e.g. the
    # group-normalised GRPO advantage, per step with PRM votes). None: every response token is
    # trained with advantage `reward` (a conversation turn).
    loss_mask: list[int] | None = None
    token_advantages: list[float] | None = None

    def __post_init__(self) -> None:
        if self.kind not in SAMPLE_KINDS:
            raise SampleError(f"sample kind {self.kind!r} is not one of {SAMPLE_KINDS}")
        if len(self.response_ids) != len(self.rollout_logprobs):
            raise SampleError(
                f"sample has {len(self.response_ids)} response ids but {len(self.rollout_logprobs)} rollout "
                "log-probs; they must be one per response token")
        if not self.response_ids:
            raise SampleError("sample has no response tokens; an empty response cannot be trained on")
        for name in ("loss_mask", "token_advantages"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.response_ids):
                raise SampleError(f"sample has {len(self.response_ids)} response ids but {len(value)} {name} "
                                  "entries; they must be one per response token (or None)")
        if len(self.hints) != len(self.hint_prompt_ids):
            raise SampleError(
                f"sample has {len(self.hints)} hints but {len(self.hint_prompt_ids)} hint prompts; "
                "they must be one per candidate")
        if self.kind == "opd+rl" and not (self.reward in (1, -1) and self.hints):
            raise SampleError(f"an 'opd+rl' sample needs reward +-1 and >= 1 hint (reward={self.reward!r}, "
                              f"{len(self.hints)} hints)")
        if self.kind == "opd" and not (self.reward == 0 and self.hints):
            raise SampleError(f"an 'opd' sample needs reward 0 and >= 1 hint (reward={self.reward!r}, "
                              f"{len(self.hints)} hints)")
        if self.kind == "rl" and not (self.reward in (1, -1) and not self.hints):
            raise SampleError(f"an 'rl' sample needs reward +-1 and no hints (reward={self.reward!r}, "
                              f"{len(self.hints)} hints)")

    @property
    def num_candidates(self) -> int:
        return len(self.hints)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["format_version"] = SAMPLE_FORMAT_VERSION
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        version = data.get("format_version", SAMPLE_FORMAT_VERSION)
        if version != SAMPLE_FORMAT_VERSION:
            raise SampleError(f"sample format_version={version!r} is not supported (this code reads "
                              f"{SAMPLE_FORMAT_VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def encode_sample(sample: Sample) -> bytes:
    """Sample -> JSON bytes. Floats round-trip exactly (repr); -inf log-probs are kept."""
    return json.dumps(sample.to_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_sample(payload: bytes) -> Sample:
    return Sample.from_dict(json.loads(payload.decode("utf-8")))


def encode_record(payload: bytes) -> bytes:
    """Frame a payload as one store record: header (magic, length, crc32) + payload."""
    if len(payload) > MAX_RECORD_BYTES:
        raise SampleStoreError(f"record of {len(payload)} bytes exceeds the {MAX_RECORD_BYTES}-byte limit")
    return _HEADER.pack(RECORD_MAGIC, len(payload), zlib.crc32(payload)) + payload


@dataclass(frozen=True)
class _RecordLocation:
    segment: int
    offset: int  # byte offset of the record header inside the segment file
    length: int  # payload length


@dataclass
class SegmentScan:
    """Result of scanning one segment file."""

    records: list[_RecordLocation]
    # Scanning may resume here later: the end of the last complete, CRC-valid record (or
    # of the file when everything was valid). Bytes beyond it are an incomplete or invalid
    # tail: in-progress while a writer may still append, torn after a crash otherwise.
    valid_bytes: int
    file_bytes: int
    problem: str | None  # why the tail beyond valid_bytes is not a record (None = clean)
    # Invalid byte ranges in the middle of the segment that were skipped because valid
    # records follow them (corruption, never produced by a crash of the single writer).
    skipped: list[tuple[int, int, str]] = field(default_factory=list)


def segment_name(index: int) -> str:
    return f"samples-{index:06d}.log"


def list_segments(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(SEGMENT_PATTERN.match, names) if m)


def _parse_record(data: bytes, pos: int) -> tuple[int | None, str | None]:
    """(payload length, None) for a complete valid record at ``pos``, else (None, why)."""
    if len(data) - pos < RECORD_HEADER_BYTES:
        return None, f"incomplete record header at byte {pos}"
    magic, length, crc = _HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC:
        return None, f"bad record magic {magic!r} at byte {pos}"
    if length > MAX_RECORD_BYTES:
        return None, f"implausible record length {length} at byte {pos}"
    end = pos + RECORD_HEADER_BYTES + length
    if end > len(data):
        return None, f"incomplete record payload at byte {pos} ({len(data) - pos - RECORD_HEADER_BYTES} of {length} bytes)"
    if zlib.crc32(data[pos + RECORD_HEADER_BYTES:end]) != crc:
        return None, f"record CRC mismatch at byte {pos}"
    return length, None


def scan_segment(path: str, segment: int, start: int = 0) -> SegmentScan:
    """Scan a segment from byte ``start``.

    Complete CRC-valid records are indexed. An invalid stretch followed by a valid record
    (found by searching for the next record magic) is skipped; an invalid stretch that
    runs to the end of the file is reported as the tail ``problem``. JSON payloads never
    contain a NUL byte while every header of a record under 16 MiB does, so a payload can
    not be mistaken for a record when re-synchronising.
    """
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    file_bytes = start + len(data)
    records: list[_RecordLocation] = []
    skipped: list[tuple[int, int, str]] = []
    pos = 0
    problem = None
    while pos < len(data):
        length, why = _parse_record(data, pos)
        if length is not None:
            records.append(_RecordLocation(segment, start + pos, length))
            pos += RECORD_HEADER_BYTES + length
            continue
        resume = None
        search = pos + 1
        while (found := data.find(RECORD_MAGIC, search)) >= 0:
            if _parse_record(data, found)[0] is not None:
                resume = found
                break
            search = found + 1
        if resume is None:
            problem = why
            break
        skipped.append((start + pos, start + resume, why))
        pos = resume
    return SegmentScan(records, start + pos, file_bytes, problem, skipped)


def write_fully(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (the one place the store writes record bytes)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SampleStore:
    """Append-only durable sample store (see the module docstring for the guarantees).

    ``SampleStore(dir)`` opens for writing (creates the directory, takes the writer lock,
    recovers from a torn tail by starting a new segment). ``SampleStore(dir,
    readonly=True)`` opens for reading only; call :meth:`refresh` to see records appended
    since. All methods are thread-safe; ``append`` blocks for the fsync, so call it from a
    worker thread when on an event loop.
    """

    def __init__(self, directory: str | os.PathLike, *, readonly: bool = False,
                 segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES, fsync: bool = True) -> None:
        if segment_max_bytes <= RECORD_HEADER_BYTES:
            raise SampleStoreError(f"segment_max_bytes={segment_max_bytes} must exceed the "
                                   f"{RECORD_HEADER_BYTES}-byte record header")
        self.directory = os.fspath(directory)
        self.readonly = readonly
        self.segment_max_bytes = segment_max_bytes
        self.fsync = fsync
        self._lock = threading.RLock()
        self._index: list[_RecordLocation] = []
        self._segments: list[int] = []
        self._scanned_until: dict[int, int] = {}
        self._torn: dict[int, str] = {}  # segment -> why its tail was skipped
        self._read_handles: dict[int, Any] = {}
        self._lock_fd: int | None = None
        self._write_fd: int | None = None
        self._write_segment: int | None = None
        self._write_pos = 0
        self._closed = False

        if readonly:
            if not os.path.isdir(self.directory):
                raise SampleStoreError(f"sample store directory {self.directory!r} does not exist; start the "
                                       "gateway (the writer) first or pass the right --store path")
        else:
            os.makedirs(self.directory, exist_ok=True)
            self._acquire_writer_lock()
        self.refresh()
        if not readonly:
            self._open_for_append()

    # ----------------------------------------------------------------- opening
    def _acquire_writer_lock(self) -> None:
        path = os.path.join(self.directory, "LOCK")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SampleStoreLockedError(
                f"sample store {self.directory!r} is already open for writing by another process "
                "(only one gateway may write a store; give this one its own --store directory)") from None
        self._lock_fd = fd

    def _open_for_append(self) -> None:
        last = self._segments[-1] if self._segments else None
        if last is not None and last not in self._torn:
            self._open_segment(last, create=False)
        else:
            if last is not None:
                logger.warning("sample store %s: segment %s ends in a torn record (%s); it is kept as is and "
                               "appends continue in a new segment", self.directory, segment_name(last),
                               self._torn[last])
            self._open_segment(0 if last is None else last + 1, create=True)

    def _open_segment(self, segment: int, *, create: bool) -> None:
        """Switch appends to ``segment``; on failure (e.g. a full disk) the current state is unchanged."""
        path = os.path.join(self.directory, segment_name(segment))
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError:
            # An earlier attempt created it and then failed (e.g. ENOSPC on fsync): reuse it while empty.
            if not (create and segment not in self._segments and os.path.getsize(path) == 0):
                raise
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            if create and self.fsync:
                os.fsync(fd)
                _fsync_directory(self.directory)
        except BaseException:
            os.close(fd)
            raise
        if create:
            self._segments.append(segment)
            self._scanned_until[segment] = 0
        if self._write_fd is not None:
            os.close(self._write_fd)
        self._write_fd = fd
        self._write_segment = segment
        self._write_pos = os.fstat(fd).st_size

    # ----------------------------------------------------------------- reading
    def refresh(self) -> int:
        """Scan for records appended since the last scan; returns the new record count."""
        with self._lock:
            on_disk = list_segments(self.directory)
            known = set(self._segments)
            for seg in on_disk:
                if seg not in known:
                    self._segments.append(seg)
                    self._scanned_until[seg] = 0
            self._segments.sort()
            for i, seg in enumerate(self._segments):
                if seg in self._torn:
                    continue
                is_last = i == len(self._segments) - 1
                if seg == self._write_segment:
                    continue  # our own writes are indexed as they are acknowledged
                scan = scan_segment(os.path.join(self.directory, segment_name(seg)), seg,
                                    self._scanned_until[seg])
                self._index.extend(scan.records)
                self._scanned_until[seg] = scan.valid_bytes
                for begin, end, why in scan.skipped:
                    logger.error("sample store %s: skipped corrupt bytes [%d, %d) of %s (%s); the records "
                                 "after them are kept", self.directory, begin, end, segment_name(seg), why)
                if scan.problem is not None and (not is_last or not self.readonly):
                    # A later segment exists (or we are the writer, so nobody else is writing):
                    # the bad bytes can never become a complete record. Skip them.
                    self._torn[seg] = scan.problem
                    logger.warning("sample store %s: skipping the tail of %s after %d valid bytes: %s",
                                   self.directory, segment_name(seg), scan.valid_bytes, scan.problem)
            return len(self._index)

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def _read_payload(self, loc: _RecordLocation) -> bytes:
        handle = self._read_handles.get(loc.segment)
        if handle is None:
            handle = open(os.path.join(self.directory, segment_name(loc.segment)), "rb")
            self._read_handles[loc.segment] = handle
        raw = os.pread(handle.fileno(), RECORD_HEADER_BYTES + loc.length, loc.offset)
        magic, length, crc = _HEADER.unpack_from(raw)
        payload = raw[RECORD_HEADER_BYTES:]
        if magic != RECORD_MAGIC or length != loc.length or len(payload) != length or zlib.crc32(payload) != crc:
            raise SampleStoreError(f"record at byte {loc.offset} of {segment_name(loc.segment)} in "
                                   f"{self.directory!r} changed on disk since it was indexed (corruption)")
        return payload

    def read_payloads(self, start: int, max_count: int | None = None) -> list[bytes]:
        with self._lock:
            self._check_open()
            if start < 0:
                raise SampleStoreError(f"read offset {start} must be >= 0")
            stop = len(self._index) if max_count is None else min(len(self._index), start + max_count)
            return [self._read_payload(self._index[i]) for i in range(start, stop)]

    def read(self, start: int = 0, max_count: int | None = None) -> list[Sample]:
        """Samples with offsets ``start, start+1, ...`` (at most ``max_count``) that exist now."""
        return [decode_sample(p) for p in self.read_payloads(start, max_count)]

    def __getitem__(self, offset: int) -> Sample:
        with self._lock:
            if not 0 <= offset < len(self._index):
                raise IndexError(f"sample offset {offset} is out of range [0, {len(self._index)})")
            return decode_sample(self._read_payload(self._index[offset]))

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self)):
            yield self[i]

    @property
    def torn_segments(self) -> dict[str, str]:
        """Segments whose tail was skipped, with the reason (for logs and tests)."""
        return {segment_name(s): why for s, why in self._torn.items()}

    # ----------------------------------------------------------------- writing
    def append(self, sample: Sample) -> int:
        """Append durably; returns the sample's offset once it is on disk (fsynced)."""
        return self.append_payload(encode_sample(sample))

    def append_payload(self, payload: bytes) -> int:
        record = encode_record(payload)
        with self._lock:
            self._check_open()
            if self.readonly:
                raise SampleStoreError(f"sample store {self.directory!r} was opened read-only")
            if self._write_segment in self._torn or (
                    self._write_pos > 0 and self._write_pos + len(record) > self.segment_max_bytes):
                self._open_segment(self._write_segment + 1, create=True)
            start = self._write_pos
            try:
                write_fully(self._write_fd, record)
                if self.fsync:
                    os.fsync(self._write_fd)
            except BaseException:
                # Leave no partial record behind for the next append to follow: cut it off, or, if even
                # that fails, mark this segment torn so that the next append starts a new one.
                try:
                    os.ftruncate(self._write_fd, start)
                except OSError:
                    self._torn[self._write_segment] = f"failed write at byte {start}"
                raise
            self._write_pos = start + len(record)
            self._scanned_until[self._write_segment] = self._write_pos
            self._index.append(_RecordLocation(self._write_segment, start, len(payload)))
            return len(self._index) - 1

    # ----------------------------------------------------------------- closing
    def _check_open(self) -> None:
        if self._closed:
            raise SampleStoreError(f"sample store {self.directory!r} is closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for handle in self._read_handles.values():
                handle.close()
            self._read_handles.clear()
            if self._write_fd is not None:
                os.close(self._write_fd)
                self._write_fd = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    def __enter__(self) -> "SampleStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing useful to report
            pass


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
        store = SampleStore(self.directory, readonly=True)
        try:
            available = len(store)
        finally:
            store.close()
        if start < 0:
            raise SampleStoreError(f"data source start={start} must be >= 0")
        self.start = start
        self.stop = available if stop is None else min(stop, available)
        if self.stop < self.start:
            self.stop = self.start
        self._store: SampleStore | None = None
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

