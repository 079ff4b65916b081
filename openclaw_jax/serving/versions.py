"""What is served, what was decided, and the weights kept to serve again: ``<run_dir>/versions/``.

The trainer side writes it, the gateway reads it (and writes rollbacks); they meet nowhere else but
beside the sample store (docs/design.md §2): the directory is the store directory's sibling
``versions`` (`versions_dir_for`).

* ``events.jsonl``: the **event log**, one JSON object per line, append-only. Each line is written
  with one ``write`` under an exclusive ``flock`` and fsynced before `VersionLog.append` returns; a
  line torn by a crash is closed off by the next append and skipped by readers, so every
  acknowledged event survives a restart and none is ever half-read. Fields: ``time`` (unix
  seconds), ``event`` (below), ``version``, ``served_version`` (what the pool serves after the
  event), and per kind: ``step``, ``check`` (the gate's numbers), ``reason``, ``from_version``.
  Events: ``start`` (the run started serving ``version``), ``promoted`` (a candidate passed the
  check, or the gate is off, and is served), ``refused`` (a candidate failed the check: not served),
  ``rollback`` (a person served a kept ``version`` again), ``reset`` (the trainer restarts from the
  served weights after refusals in a row).
* ``v<version>/``: the **kept weights** of a served version, an HF safetensors directory (with the
  tokenizer files when known), written to a temporary directory and renamed into place, so a
  directory that exists is complete. At most ``gate.keep`` promoted versions are kept, never
  removing the served one.
* ``serve.lock``: held (``flock``) while the served version changes, by the gate and by a
  rollback alike, so the pool and the log never disagree on what is served.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger(__name__)

EVENTS = ("start", "promoted", "refused", "rollback", "reset")
SERVING_EVENTS = ("start", "promoted", "rollback")   # the events that change what is served
_VERSION = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")


class VersionError(ValueError):
    """A version name is malformed, or no kept weights exist for it."""


def versions_dir_for(store_dir: str | os.PathLike) -> Path:
    """The versions directory of a run: the sample store's sibling ``versions``."""
    return Path(os.path.abspath(os.fspath(store_dir))).parent / "versions"


def check_version(version: Any) -> str:
    """``version`` as the string it is kept under; a `VersionError` unless it is a plain name (no path)."""
    if not isinstance(version, (str, int)) or isinstance(version, bool) or not _VERSION.match(str(version)):
        raise VersionError(f"version {version!r:.80} must be a weight version such as '3' (letters, digits, '_', "
                           "'-', '.'; at most 64 characters)")
    return str(version)


class FileLock:
    """An exclusive ``flock`` on a file: between processes, and between threads that each hold their own."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> "FileLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class VersionLog:
    """The event log ``<directory>/events.jsonl`` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.path = self.directory / "events.jsonl"

    def serving_lock(self) -> FileLock:
        """The lock held while the served version changes (acquire it off the event loop: it blocks)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(self.directory / "serve.lock")

    def append(self, event: str, version: str, served_version: str | None, **fields: Any) -> dict[str, Any]:
        """Append one event durably (fsynced before returning); returns the record written."""
        if event not in EVENTS:
            raise ValueError(f"event {event!r} is not one of {EVENTS}")
        record = {"time": time.time(), "event": event, "version": check_version(version),
                  "served_version": None if served_version is None else check_version(served_version), **fields}
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line   # close a line torn by a crash: it stays unreadable, this one does not
            written = 0
            while written < len(line):
                written += os.write(fd, line[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        return record

    def events(self) -> list[dict[str, Any]]:
        """Every complete event, oldest first (torn or foreign lines are skipped)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out = []
        for raw in data.split(b"\n")[:-1]:   # the part after the last newline is incomplete
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") in EVENTS:
                out.append(record)
        return out

    def served_version(self, events: Iterable[dict[str, Any]] | None = None) -> str | None:
        """What the pool serves according to the log (None before the first event)."""
        served = None
        for record in self.events() if events is None else events:
            served = record.get("served_version", served)
        return served


def refusals_in_a_row(events: Iterable[dict[str, Any]]) -> int:
    """Refusals on the evidence (score or drift; not for want of held-out turns) since the served version
    last changed or the trainer was last reset."""
    count = 0
    for record in events:
        if record["event"] != "refused":
            count = 0
        elif record.get("rule") != "min_replay":
            count += 1
    return count


class VersionStore:
    """The kept weights, ``<directory>/v<version>/`` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    def path(self, version: Any) -> Path:
        return self.directory / f"v{check_version(version)}"

    def has(self, version: Any) -> bool:
        return (self.path(version) / "config.json").is_file()

    def kept(self) -> list[str]:
        """Versions with kept weights, oldest written first."""
        if not self.directory.is_dir():
            return []
        dirs = [p for p in self.directory.iterdir() if p.name.startswith("v") and (p / "config.json").is_file()]
        return [p.name[1:] for p in sorted(dirs, key=lambda p: (p.stat().st_mtime, p.name))]

    def require(self, version: Any) -> Path:
        """The kept directory of ``version``; a `VersionError` naming the kept ones when there is none."""
        if not self.has(version):
            raise VersionError(f"no kept weights for version {check_version(version)!r}; kept versions: "
                               f"{self.kept() or 'none'}")
        return self.path(version)

    def write(self, version: Any, model: Any, model_config: Any, *, extra_config: dict | None = None,
              tokenizer_files_from: str | os.PathLike | None = None) -> Path:
        """Write ``model`` (a plain serving model) as ``v<version>/``, complete or not at all."""
        from openclaw_jax.models.hub import save_checkpoint   # the model stack, only where weights are written

        out = self.path(version)
        if self.has(version):
            return out
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            save_checkpoint(model, model_config, tmp, extra_config=extra_config)
            if tokenizer_files_from is not None:
                for name in TOKENIZER_FILES:
                    src = Path(tokenizer_files_from) / name
                    if src.is_file():
                        shutil.copy2(src, tmp / name)
            for f in tmp.iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            os.rename(tmp, out)
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    def load_state(self, version: Any, dtype: str) -> Any:
        """The kept weights of ``version`` as an NNX state (a plain decoder's) in ``dtype``."""
        from flax import nnx

        from openclaw_jax.models.weights import load_hf_checkpoint

        model, _ = load_hf_checkpoint(self.require(version), dtype=dtype, param_dtype=dtype)
        return nnx.split(model)[1]

    def prune(self, keep: int, protect: Iterable[str]) -> list[str]:
        """Remove the oldest kept versions beyond ``keep``, never one in ``protect``; returns the removed."""
        protect = set(protect)
        candidates = [v for v in self.kept() if v not in protect]
        removed = candidates[:max(len(candidates) - keep, 0)]
        for version in removed:
            shutil.rmtree(self.path(version), ignore_errors=True)
            log.info("removed the kept weights of version %s (gate.keep=%d)", version, keep)
        return removed
