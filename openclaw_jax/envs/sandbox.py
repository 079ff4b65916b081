"""Run untrusted code (Python or bash) in a throw-away jail; the CLI prints one JSON result.

    python -m openclaw_jax.envs.sandbox [--lang python|bash] [--timeout S] [--memory-mb M] -- CODE
    -> {"stdout": ..., "stderr": ..., "exit_code": ..., "timed_out": ...}

Every run gets (Linux, via util-linux `unshare`; the jail itself is built by `sandbox_init.py`):

* its own **network namespace** with no interface up: no network at all, not even the host's
  127.0.0.1;
* its own **mount namespace** with a chroot-style root: a tmpfs holding read-only bind mounts of
  `/usr` (and the /bin, /lib symlinks into it) and of the Python prefix, private /proc, /tmp and
  /dev/{null,zero,random,urandom}, and the sandbox directory at /sandbox (the only writable host
  path); the host's other files (home, /etc, /work, other sandboxes) are not in its view;
* its own **PID namespace** (it is PID 1; when it exits or is killed, the kernel kills every
  process it started: nothing outlives the run) and its own process group; the wall timeout
  kills the group;
* **limits**: CPU seconds, address space, file size, number of processes (the limit is per user,
  and each `Sandbox` runs as its own unprivileged uid when started as root), open files;
* output capped at `max_output_bytes` per stream (the rest is read and discarded).

`Sandbox` keeps one directory for several runs (a terminal or SWE episode); `run_code` is a single
run in a fresh directory. Both block; call them from asyncio with `asyncio.to_thread`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

from openclaw_jax.envs.sandbox_init import INIT_ERROR

Lang = Literal["python", "bash"]
LANGS = ("python", "bash")
INIT_SCRIPT = str(Path(__file__).with_name("sandbox_init.py"))
MAX_CODE_BYTES = 100_000  # one argv string (the kernel allows 128 KiB)


class SandboxError(RuntimeError):
    """The jail could not be built or started (not a failure of the code that ran inside it)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0            # wall clock
    memory_mb: int = 512               # address space (RLIMIT_AS)
    cpu_s: int | None = None           # CPU seconds; None = ceil(timeout_s) + 1
    file_size_mb: int = 16             # largest file it may write
    max_processes: int = 32            # processes + threads of its uid
    max_open_files: int = 256
    tmp_mb: int = 32                   # size of its private /tmp
    max_output_bytes: int = 65536      # per stream; the rest is discarded

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"sandbox timeout_s={self.timeout_s} must be > 0")
        if self.memory_mb < 16:
            raise ValueError(f"sandbox memory_mb={self.memory_mb} must be >= 16 (an interpreter needs some)")
        for name in ("file_size_mb", "max_processes", "max_open_files", "tmp_mb", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox {name}={getattr(self, name)} must be > 0")
        if self.cpu_s is not None and self.cpu_s <= 0:
            raise ValueError(f"sandbox cpu_s={self.cpu_s} must be > 0")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int           # the code's exit status; negative = killed by that signal
    timed_out: bool
    wall_s: float = 0.0
    truncated: bool = False  # some output beyond max_output_bytes was discarded

    def to_json(self) -> dict:
        """The pinned CLI object."""
        return {"stdout": self.stdout, "stderr": self.stderr, "exit_code": self.exit_code,
                "timed_out": self.timed_out}


def _python_prefix() -> tuple[str, str]:
    """(interpreter path, prefix to mount) of the base Python (not a virtualenv's symlink)."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


def _ro_paths() -> list[str]:
    _, prefix = _python_prefix()
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/alternatives"]
    if not prefix.startswith("/usr/"):
        paths.append(prefix)
    return paths


def _interpreter(lang: str) -> list[str]:
    if lang == "python":
        return [_python_prefix()[0], "-I", "-B", "-c"]
    if lang == "bash":
        return ["/bin/bash", "--noprofile", "--norc", "-c"]
    raise ValueError(f"unknown sandbox language {lang!r}; use one of {LANGS}")


class _Drain(threading.Thread):
    """Reads a pipe to the end, keeping the first `limit` bytes."""

    def __init__(self, stream, limit: int):
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.data = bytearray()
        self.dropped = 0

    def run(self) -> None:
        while True:
            chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
            if not chunk:
                break
            room = self.limit - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            self.dropped += max(len(chunk) - max(room, 0), 0)
        self.stream.close()


class Sandbox:
    """A sandbox directory that runs code; `with Sandbox() as sb: sb.run("print(1)")`."""

    def __init__(self, limits: SandboxLimits | None = None, *, files: Mapping[str, str | bytes] | None = None,
                 base_dir: str | None = None):
        if sys.platform != "linux" or shutil.which("unshare") is None:
            raise SandboxError("the sandbox needs Linux with util-linux `unshare` (apt-get install util-linux)")
        self.limits = limits or SandboxLimits()
        self._host = Path(tempfile.mkdtemp(prefix="openclaw-sandbox-", dir=base_dir))
        self.directory = self._host / "work"
        self.directory.mkdir()
        (self._host / "root").mkdir()
        self.is_root = os.geteuid() == 0
        # A uid of its own: RLIMIT_NPROC counts per user, and no other process runs as it.
        self.uid = random.randint(200_000, 2_000_000_000) if self.is_root else None
        self._closed = False
        self.write_files(files or {})

    # -- files (host side; used by environments to prepare and inspect the directory)
    def _path(self, name: str) -> Path:
        path = (self.directory / name).resolve()
        if path != self.directory.resolve() and self.directory.resolve() not in path.parents:
            raise ValueError(f"path {name!r} leaves the sandbox directory")
        return path

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        for name, content in files.items():
            path = self._path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        self._chown()

    def read_file(self, name: str, max_bytes: int = 1 << 20) -> bytes:
        """A file of the directory, read by the host without following links out of it."""
        path = self._path(name)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read(max_bytes)

    def _chown(self) -> None:
        if self.uid is None:
            return
        for dirpath, dirnames, filenames in os.walk(self.directory):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.lchown(name, self.uid, self.uid)

    # -- running
    def _spec(self, argv: list[str], status_fd: int) -> dict:
        lim = self.limits
        cpu = lim.cpu_s if lim.cpu_s is not None else math.ceil(lim.timeout_s) + 1
        return {
            "root": str(self._host / "root"), "workdir": str(self.directory), "ro_paths": _ro_paths(),
            "tmp_mb": lim.tmp_mb, "uid": self.uid, "argv": argv, "status_fd": status_fd,
            "env": {"PATH": os.path.dirname(_python_prefix()[0]) + ":/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox",
                    "TMPDIR": "/tmp",
                    "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"},
            "limits": {"cpu_s": cpu, "memory_bytes": lim.memory_mb << 20, "file_size_bytes": lim.file_size_mb << 20,
                       "max_processes": lim.max_processes, "max_open_files": lim.max_open_files},
        }

    def run(self, code: str, lang: Lang = "python") -> SandboxResult:
        """Run `code` with /sandbox (this directory) as its working directory."""
        if self._closed:
            raise SandboxError("this sandbox is closed")
        if len(code.encode()) > MAX_CODE_BYTES:
            return SandboxResult("", f"code of {len(code.encode())} bytes exceeds the {MAX_CODE_BYTES}-byte limit",
                                 exit_code=2, timed_out=False)
        if "\x00" in code:
            return SandboxResult("", "code contains a NUL byte", exit_code=2, timed_out=False)
        argv = _interpreter(lang) + [code]
        cmd = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
        if not self.is_root:
            cmd += ["--user", "--map-root-user"]
        status_r, status_w = os.pipe()
        cmd += ["--", _python_prefix()[0], "-I", "-S", INIT_SCRIPT, json.dumps(self._spec(argv, status_w))]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, close_fds=True, pass_fds=(status_w,))
        finally:
            os.close(status_w)
        drains = [_Drain(proc.stdout, self.limits.max_output_bytes), _Drain(proc.stderr, self.limits.max_output_bytes)]
        for d in drains:
            d.start()
        timed_out = False
        try:
            proc.wait(timeout=self.limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            self._kill(proc)
        for d in drains:
            d.join(timeout=5.0)
        wall = time.monotonic() - start
        with os.fdopen(status_r, "rb") as f:
            status = f.read()
        stdout, stderr = (bytes(d.data).decode("utf-8", "replace") for d in drains)
        if INIT_ERROR in stderr:
            raise SandboxError(f"could not build the sandbox: {stderr.strip()}")
        try:  # the jail's PID 1 reports the code's status; a run killed on timeout has none
            exit_code = int(json.loads(status)["exit_code"])
        except (ValueError, KeyError, TypeError):
            if not timed_out:
                raise SandboxError(f"the sandbox ended without a status (unshare exit {proc.returncode}): "
                                   f"{stderr.strip()[-500:]}") from None
            exit_code = -signal.SIGKILL
        self._chown()  # files the code created stay editable by the next run (same uid anyway)
        return SandboxResult(stdout, stderr, exit_code, timed_out, wall,
                             truncated=any(d.dropped for d in drains))

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """SIGKILL the process group (unshare + the jail's PID 1; PID 1's death ends the namespace)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self._host, ignore_errors=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten sandbox still removes its directory
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def run_code(code: str, lang: Lang = "python", limits: SandboxLimits | None = None,
             files: Mapping[str, str | bytes] | None = None) -> SandboxResult:
    """One run in a fresh directory (optionally prepared with `files`), removed afterwards."""
    with Sandbox(limits, files=files) as sandbox:
        return sandbox.run(code, lang)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m openclaw_jax.envs.sandbox",
        description="Run CODE in a fresh sandbox (no network, no host files, CPU/memory/process limits) and print "
                    "one JSON object {stdout, stderr, exit_code, timed_out}.",
        epilog="Example: python -m openclaw_jax.envs.sandbox --lang python --timeout 5 -- 'print(2**100)'")
    parser.add_argument("--lang", choices=LANGS, default="python", help="interpreter (default python)")
    parser.add_argument("--timeout", type=float, default=SandboxLimits.timeout_s, metavar="S",
                        help=f"wall-clock limit in seconds (default {SandboxLimits.timeout_s})")
    parser.add_argument("--memory-mb", type=int, default=SandboxLimits.memory_mb, metavar="M",
                        help=f"address-space limit in MiB (default {SandboxLimits.memory_mb})")
    parser.add_argument("code", nargs=argparse.REMAINDER, metavar="-- CODE", help="the program text")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code = list(args.code)
    if code and code[0] == "--":
        code = code[1:]
    if not code:
        parser.error("no CODE given; put it after `--`")
    try:
        limits = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb)
    except ValueError as err:
        parser.error(str(err))
    try:
        result = run_code(" ".join(code), args.lang, limits)
    except SandboxError as err:
        print(f"sandbox error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json(), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["LANGS", "Sandbox", "SandboxError", "SandboxLimits", "SandboxResult", "build_parser", "main", "run_code"]
