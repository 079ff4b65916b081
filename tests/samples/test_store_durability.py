"""Durability of the sample store under a simulated power cut.

A killed process cannot test fsync (its writes survive in the page cache), so this test runs
the store over a file layer that models what a power cut keeps: a file keeps only the bytes it
had at its last `fsync`, and a newly created file survives only if its directory was fsynced
after it was created. The layer passes every call through to the real file system and records
what was synced; the "cut" then truncates or deletes files accordingly. Every sample that
`append` acknowledged must be readable, intact, after the cut — which holds only if the store
writes, fsyncs the file (and, for a new segment, the directory), and only then acknowledges.
"""

from __future__ import annotations

import os
import stat
import types

import pytest

from openclaw_jax.samples import store as samples_module
from openclaw_jax.samples import Sample, SampleStore
from openclaw_jax.samples.store import segment_name


class PowerCutFS:
    """What survives a power cut: per file, the size at its last fsync; per new file, whether a
    directory fsync came after its creation."""

    def __init__(self, directory: str):
        self.directory = os.path.realpath(directory)
        self.fd_paths: dict[int, str] = {}
        self.synced_size: dict[str, int] = {}
        self.created_unsynced_entry: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def module_os(self) -> types.SimpleNamespace:
        real = os
        fs = self

        def open_(path, flags, mode=0o777, *args, **kwargs):
            path = os.path.realpath(os.fspath(path))
            existed = real.path.exists(path)
            fd = real.open(path, flags, mode, *args, **kwargs)
            fs.fd_paths[fd] = path
            if not existed and flags & real.O_CREAT:
                fs.created_unsynced_entry.add(path)
                fs.synced_size[path] = 0
            return fd

        def write(fd, data):
            fs.calls.append(("write", fs.fd_paths.get(fd, "?")))
            return real.write(fd, data)

        def fsync(fd):
            path = fs.fd_paths.get(fd)
            fs.calls.append(("fsync", path or "?"))
            real.fsync(fd)
            if path is None:
                return
            if stat.S_ISDIR(real.fstat(fd).st_mode):
                # a directory fsync makes the entries of files created in it durable
                fs.created_unsynced_entry = {p for p in fs.created_unsynced_entry if os.path.dirname(p) != path}
            else:
                fs.synced_size[path] = real.fstat(fd).st_size

        def close(fd):
            fs.fd_paths.pop(fd, None)
            return real.close(fd)

        ns = types.SimpleNamespace(**{name: getattr(real, name) for name in dir(real) if not name.startswith("__")})
        ns.open, ns.write, ns.fsync, ns.close = open_, write, fsync, close
        return ns

    def cut(self) -> list[str]:
        """Apply the power cut to the store's segment files; returns what was lost, for messages."""
        lost = []
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if not name.startswith("samples-"):
                continue
            if path in self.created_unsynced_entry:
                os.unlink(path)
                lost.append(f"{name}: created, but its directory entry was never fsynced")
                continue
            size, keep = os.path.getsize(path), self.synced_size.get(path, os.path.getsize(path))
            if size > keep:
                os.truncate(path, keep)
                lost.append(f"{name}: {size - keep} bytes written after its last fsync")
        return lost


def _sample(i: int) -> Sample:
    return Sample(session_id=f"s{i}", turn_index=i, kind="rl", reward=1.0 if i % 2 else -1.0,
                  prompt_ids=list(range(i % 7 + 3)), response_ids=[5, 6, 7], rollout_logprobs=[-0.1, -0.2, -0.3],
                  weight_version=str(i))


@pytest.mark.parametrize("segment_max_bytes", [64 << 20, 1200])  # one segment; a new segment every few samples
def test_acknowledged_samples_survive_a_power_cut(tmp_path, monkeypatch, segment_max_bytes):
    directory = tmp_path / "samples"
    directory.mkdir()
    fs = PowerCutFS(str(directory))
    monkeypatch.setattr(samples_module, "os", fs.module_os())
    store = SampleStore(directory, segment_max_bytes=segment_max_bytes)
    acknowledged = {}
    for i in range(12):
        acknowledged[store.append(_sample(i))] = i
    # the power goes: no close, no flush; only what was synced is left
    lost = fs.cut()
    monkeypatch.undo()
    store._closed = True  # the process is gone: do not let its finaliser touch the files
    if segment_max_bytes < 4096:
        assert len([n for n in os.listdir(directory) if n.startswith("samples-")]) > 2, "no segment rollover exercised"
    reader = SampleStore(directory, readonly=True)
    try:
        assert len(reader) >= len(acknowledged), f"acknowledged samples lost in the power cut: {lost}"
        for offset, i in acknowledged.items():
            got = reader[offset]
            assert (got.session_id, got.turn_index, got.prompt_ids) == (f"s{i}", i, _sample(i).prompt_ids)
    finally:
        reader.close()


def test_the_file_is_synced_after_each_write_and_before_the_next(tmp_path, monkeypatch):
    """The order the guarantee rests on, read from the recorded calls: every write to a segment
    is followed by an fsync of that segment before the next append begins."""
    directory = tmp_path / "samples"
    directory.mkdir()
    fs = PowerCutFS(str(directory))
    monkeypatch.setattr(samples_module, "os", fs.module_os())
    store = SampleStore(directory, segment_max_bytes=1200)
    marks = []
    for i in range(6):
        store.append(_sample(i))
        marks.append(len(fs.calls))
    store.close()
    start = 0
    for end in marks:
        calls = fs.calls[start:end]
        writes = [i for i, (op, p) in enumerate(calls) if op == "write" and os.path.basename(p).startswith("samples-")]
        assert writes, calls
        target = calls[writes[-1]][1]
        assert ("fsync", target) in calls[writes[-1] + 1:], f"append acknowledged without fsync of {target}: {calls}"
        start = end
    assert segment_name(1) in os.listdir(directory)
