"""The durable, append-only sample store (docs/design.md §9).

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

* **Images.** A sample of a turn with images names them by content hash (``Sample.image_sha256``,
  sha256 hex, prompt order). The bytes live next to the segments, one blob file per image,
  ``images/<sha256>``, written to a temporary file, fsynced, renamed into place and the directory
  fsynced: ``append(sample, images=...)`` writes the blobs first and acknowledges the record only
  once every image it names is on disk. A blob is written once and never changes (its name is its
  hash); `read_image` checks the hash when it reads one back.

On-disk format: segment files ``samples-000000.log``, ``samples-000001.log``, ...; each
record is a 12-byte header ``MAGIC(4) | payload length (u32 LE) | crc32(payload) (u32 LE)``
followed by the payload (UTF-8 JSON of the sample). A single writer process holds an
exclusive ``flock`` on ``LOCK``; any number of read-only readers may scan concurrently.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from openclaw_jax.samples.sample import Sample, decode_sample, encode_sample

logger = logging.getLogger(__name__)

RECORD_MAGIC = b"OCJS"
_HEADER = struct.Struct("<4sII")
RECORD_HEADER_BYTES = _HEADER.size
# A record larger than this is treated as corruption rather than allocated blindly.
MAX_RECORD_BYTES = 256 << 20
SEGMENT_PATTERN = re.compile(r"^samples-(\d{6})\.log$")
DEFAULT_SEGMENT_MAX_BYTES = 64 << 20


class SampleStoreError(RuntimeError):
    """The sample store cannot be opened, written or read as asked."""


class SampleStoreLockedError(SampleStoreError):
    """Another process already holds the store open for writing."""


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


IMAGES_DIR = "images"
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def image_path(directory: str | os.PathLike, sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA256_HEX.match(sha256):
        raise SampleStoreError(f"image hash {sha256!r} is not a sha256 hex digest")
    return os.path.join(os.fspath(directory), IMAGES_DIR, sha256)


def read_image(directory: str | os.PathLike, sha256: str) -> bytes:
    """The bytes of the image blob ``sha256`` of the store at ``directory``, checked against the hash."""
    path = image_path(directory, sha256)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SampleStoreError(f"image {sha256} of sample store {os.fspath(directory)!r} is missing "
                               f"({path})") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SampleStoreError(f"image blob {path} does not match its hash (corrupt)")
    return data


def write_image(directory: str | os.PathLike, data: bytes, *, fsync: bool = True) -> str:
    """Write one image blob durably (temporary file, fsync, rename, directory fsync); returns its
    sha256. A blob already there is kept (same name, same bytes)."""
    data = bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    final = image_path(directory, sha)
    folder = os.path.dirname(final)
    if os.path.exists(final):
        return sha
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        if fsync:
            _fsync_directory(os.fspath(directory))
    tmp = os.path.join(folder, f".{sha}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_fully(fd, data)
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, final)
    if fsync:
        _fsync_directory(folder)
    return sha


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
        self._base = 0  # offset of self._index[0]: a reader may release what it has consumed
        self._sealed: set[int] = set()  # segments with a later one: complete, never scanned again
        self.bytes_read = 0  # segment bytes read (scans and record reads), for metrics and tests
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
                if seg in self._torn or seg in self._sealed:
                    continue
                is_last = i == len(self._segments) - 1
                if seg == self._write_segment:
                    continue  # our own writes are indexed as they are acknowledged
                scan = scan_segment(os.path.join(self.directory, segment_name(seg)), seg,
                                    self._scanned_until[seg])
                self.bytes_read += scan.file_bytes - self._scanned_until[seg]
                self._index.extend(scan.records)
                if not is_last:
                    # The single writer moved on to a later segment: nothing more is appended here.
                    self._sealed.add(seg)
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
            return self._base + len(self._index)

    def __len__(self) -> int:
        with self._lock:
            return self._base + len(self._index)

    def release_before(self, offset: int) -> None:
        """Forget where the records before ``offset`` are (a forward reader's memory stays bounded);
        reading them afterwards is an error. Read-only stores only: the writer keeps its index."""
        with self._lock:
            if not self.readonly:
                raise SampleStoreError("release_before is for read-only stores; the writer keeps its index")
            drop = min(max(offset - self._base, 0), len(self._index))
            if drop == 0:
                return
            del self._index[:drop]
            self._base += drop
            keep = self._index[0].segment if self._index else (self._segments[-1] if self._segments else 0)
            for seg in [s for s in self._read_handles if s < keep]:
                self._read_handles.pop(seg).close()

    def _location(self, offset: int) -> _RecordLocation:
        if offset < self._base:
            raise SampleStoreError(f"sample offset {offset} of {self.directory!r} was released by this reader "
                                   f"(it keeps offsets >= {self._base}); open a new reader to read it again")
        return self._index[offset - self._base]

    def _read_payload(self, loc: _RecordLocation) -> bytes:
        handle = self._read_handles.get(loc.segment)
        if handle is None:
            handle = open(os.path.join(self.directory, segment_name(loc.segment)), "rb")
            self._read_handles[loc.segment] = handle
        raw = os.pread(handle.fileno(), RECORD_HEADER_BYTES + loc.length, loc.offset)
        self.bytes_read += len(raw)
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
            end = self._base + len(self._index)
            stop = end if max_count is None else min(end, start + max_count)
            return [self._read_payload(self._location(i)) for i in range(start, stop)]

    def read(self, start: int = 0, max_count: int | None = None) -> list[Sample]:
        """Samples with offsets ``start, start+1, ...`` (at most ``max_count``) that exist now."""
        return [decode_sample(p) for p in self.read_payloads(start, max_count)]

    def __getitem__(self, offset: int) -> Sample:
        with self._lock:
            if not 0 <= offset < self._base + len(self._index):
                raise IndexError(f"sample offset {offset} is out of range [0, {self._base + len(self._index)})")
            return decode_sample(self._read_payload(self._location(offset)))

    def __iter__(self) -> Iterator[Sample]:
        for i in range(self._base, len(self)):
            yield self[i]

    @property
    def torn_segments(self) -> dict[str, str]:
        """Segments whose tail was skipped, with the reason (for logs and tests)."""
        return {segment_name(s): why for s, why in self._torn.items()}

    # ----------------------------------------------------------------- writing
    def append(self, sample: Sample, images: Iterable[bytes] = ()) -> int:
        """Append durably; returns the sample's offset once it is on disk (fsynced). ``images``: the
        encoded images the sample names (``sample.image_sha256``), written as blobs first; every image
        the sample names must be on disk (given now or stored before), else SampleStoreError."""
        if self.readonly:
            raise SampleStoreError(f"sample store {self.directory!r} was opened read-only")
        written = {self.put_image(data) for data in images}
        names = list(getattr(sample, "image_sha256", None) or ())
        missing = [h for h in names if h not in written and not os.path.exists(image_path(self.directory, h))]
        if missing:
            raise SampleStoreError(f"sample {sample.sample_id} names {len(missing)} image(s) the store does not "
                                   f"hold (first {missing[0]}); pass their bytes in append(..., images=...)")
        return self.append_payload(encode_sample(sample))

    def put_image(self, data: bytes) -> str:
        """Write one image blob durably (see the module docstring); returns its sha256."""
        self._check_open()
        if self.readonly:
            raise SampleStoreError(f"sample store {self.directory!r} was opened read-only")
        return write_image(self.directory, data, fsync=self.fsync)

    def image(self, sha256: str) -> bytes:
        """An image blob's bytes, checked against its hash."""
        return read_image(self.directory, sha256)

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
            return self._base + len(self._index) - 1

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
