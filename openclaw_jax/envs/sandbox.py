"""Run untrusted code (Python or bash) in a throw-away jail; the CLI prints one JSON result.

    python -m openclaw_jax.envs.sandbox [--lang python|bash] [--timeout S] [--memory-mb M] ... -- CODE
    -> {"stdout": ..., "stderr": ..., "exit_code": ..., "timed_out": ...}

The jail holds whether this process runs as root or as an ordinary user (docs/sandbox.md has the
whole story and its stated gaps). Every run gets (Linux, util-linux `unshare`/`nsenter`; the jail
itself is built by `sandbox_init.py`):

* its own **network namespace** with no interface up: no network at all, not even the host's
  127.0.0.1;
* its own **mount namespace** and a new root entered with `pivot_root`, the old root detached: a
  read-only tmpfs holding read-only bind mounts of `/usr` (and the /bin, /lib symlinks into it) and
  of the Python prefix, a private /proc, /dev/{null,zero,random,urandom}, a private /tmp and the
  writable area at /sandbox; the host's other files (home, /etc, /work, other sandboxes) are not in
  its view, and no path leads back to them;
* a **bounded writable area**: /sandbox and /tmp are tmpfs mounts limited in bytes and in files,
  in memory, never a folder on the host's disk;
* its own **PID namespace** (its init is PID 1; when that exits or is killed, the kernel kills every
  process it started: nothing outlives the run) and its own IPC namespace; the wall timeout kills it;
* **no privilege**: as root, an unprivileged uid of its own per `Sandbox`; as an ordinary user, the
  user's own uid inside a user namespace; either way every capability set empty (bounding set
  included), `no_new_privs`, and a seccomp filter (`sandbox_seccomp.py`) refusing mount, namespace,
  ptrace, keyring, eBPF and similar calls;
* **limits**: a cgroup (memory and process count for the whole sandbox) where the host can make one
  (`sandbox_cgroup.py`), and always the rlimits: CPU seconds, address space per process, file size,
  processes, open files;
* output capped at `max_output_bytes` per stream (the rest is read and discarded).

`Sandbox` keeps its area for several runs (a terminal or SWE episode): a small holder process owns
the area's mount namespace, and runs enter it. `run_code` is a single run in a fresh area. Both
block; call them from asyncio with `asyncio.to_thread`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import posixpath
import random
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

from openclaw_jax.envs.sandbox_cgroup import SandboxCgroup, plan as cgroup_plan
from openclaw_jax.envs.sandbox_init import INIT_ERROR
from openclaw_jax.envs.sandbox_seccomp import SeccompUnavailable, filter_bpf

Lang = Literal["python", "bash"]
LANGS = ("python", "bash")
INIT_SCRIPT = str(Path(__file__).with_name("sandbox_init.py"))
MAX_CODE_BYTES = 100_000  # one argv string (the kernel allows 128 KiB)


class SandboxError(RuntimeError):
    """The jail could not be built or started (not a failure of the code that ran inside it)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0            # wall clock
    memory_mb: int = 512               # address space per process (RLIMIT_AS); the whole sandbox's with a cgroup
    cpu_s: int | None = None           # CPU seconds; None = ceil(timeout_s) + 1
    file_size_mb: int = 16             # largest file it may write
    max_processes: int = 32            # processes + threads of the sandbox (its init and holder included)
    max_open_files: int = 256
    tmp_mb: int = 32                   # size of its private /tmp
    work_mb: int = 64                  # size of its writable area /sandbox
    max_files: int = 4096              # files + folders + links in /sandbox, and again in /tmp
    max_output_bytes: int = 65536      # per stream; the rest is discarded

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"sandbox timeout_s={self.timeout_s} must be > 0")
        if self.memory_mb < 16:
            raise ValueError(f"sandbox memory_mb={self.memory_mb} must be >= 16 (an interpreter needs some)")
        for name in ("file_size_mb", "max_processes", "max_open_files", "tmp_mb", "work_mb", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox {name}={getattr(self, name)} must be > 0")
        if self.max_files < 16:
            raise ValueError(f"sandbox max_files={self.max_files} must be >= 16")
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


_HOST_CMDS = ("unshare", "nsenter")
_HOLDER_START_S = 30.0   # a holder reports ready in milliseconds; this only catches a wedged one


class Sandbox:
    """A sandbox whose writable area outlives each run; `with Sandbox() as sb: sb.run("print(1)")`.

    `files` are placed in the area before the first run. With `persistent=False` there is no holder
    process: each run starts from a fresh area filled from `directory` (the host's staging folder),
    and what it writes is dropped with it (`run_code`, and the GUI's application jail)."""

    def __init__(self, limits: SandboxLimits | None = None, *, files: Mapping[str, str | bytes] | None = None,
                 base_dir: str | None = None, persistent: bool = True):
        missing = [c for c in _HOST_CMDS if shutil.which(c) is None]
        if sys.platform != "linux" or missing:
            raise SandboxError("the sandbox needs Linux with util-linux `unshare` and `nsenter` "
                               "(apt-get install util-linux)")
        try:
            self._seccomp = filter_bpf().hex()
        except SeccompUnavailable as err:
            raise SandboxError(str(err)) from err
        self.limits = limits or SandboxLimits()
        self.persistent = persistent
        self.is_root = os.geteuid() == 0
        # A uid of its own: RLIMIT_NPROC counts per user, and no other process runs as it.
        self.uid = random.randint(200_000, 2_000_000_000) if self.is_root else None
        self._host = Path(tempfile.mkdtemp(prefix="openclaw-sandbox-", dir=base_dir))
        self.directory = self._host / "work"   # the staging folder (host side)
        self.directory.mkdir()
        (self._host / "root").mkdir()
        self._closed = False
        self._holder: subprocess.Popen | None = None
        self._files_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.cgroup: SandboxCgroup | None = None
        try:
            plan = cgroup_plan()
            if plan is not None:
                self.cgroup = SandboxCgroup(plan, self.limits.memory_mb << 20, self.limits.max_processes)
            self.write_files(files or {})
            if persistent:
                self._start_holder()
        except BaseException:
            self.close()
            raise

    # -- the holder: owns the area's mount namespace between runs
    def _area_spec(self) -> dict:
        lim = self.limits
        area = {"staging": str(self.directory), "bytes": lim.work_mb << 20, "files": lim.max_files}
        if self._holder is not None:
            area["holder_path"] = str(self._host / "area")
        return area

    def _start_holder(self) -> None:
        (self._host / "area").mkdir()
        spec = {"mode": "hold", "area": {**self._area_spec(), "holder_path": str(self._host / "area")},
                "uid": self.uid, "seccomp_bpf": self._seccomp}
        cmd = ["unshare", "--mount", "--net"] + ([] if self.is_root else ["--user", "--map-root-user"])
        cmd += ["--", _python_prefix()[0], "-I", "-S", INIT_SCRIPT, json.dumps(spec)]
        with open(self._host / "holder.stderr", "wb") as err:
            self._holder = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                            start_new_session=True, close_fds=True)
        fd = self._holder.stdout.fileno()
        ready = select.select([fd], [], [], _HOLDER_START_S)[0] and os.read(fd, 64) == b"ready\n"
        if not ready:
            detail = (self._host / "holder.stderr").read_bytes()[-500:].decode(errors="replace").strip()
            raise SandboxError(f"could not build the sandbox's area: {detail or 'the holder did not start'}")
        area = f"/proc/{self._holder.pid}/root{self._host / 'area'}"
        new_fd = os.open(area, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.close(self._files_fd)
        self._files_fd = new_fd
        shutil.rmtree(self.directory)   # copied in; the host's disk keeps nothing
        self.directory.mkdir()

    # -- files (host side; used by environments to prepare and inspect the area between runs)
    @staticmethod
    def _parts(name: str) -> list[str]:
        norm = posixpath.normpath(name) if name else ""
        if not norm or norm == "." or name.startswith("/") or norm == ".." or norm.startswith("../") \
                or "\x00" in name:
            raise ValueError(f"path {name!r} leaves the sandbox directory")
        return norm.split("/")

    def _parent_fd(self, parts: list[str], create: bool) -> int:
        """A descriptor of the folder holding parts[-1], reached without following any link."""
        fd = os.dup(self._files_fd)
        try:
            for part in parts[:-1]:
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    sub = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if self.uid is not None:
                        os.chown(part, self.uid, self.uid, dir_fd=fd, follow_symlinks=False)
                    sub = os.open(part, flags, dir_fd=fd)
                os.close(fd)
                fd = sub
            return fd
        except BaseException:
            os.close(fd)
            raise

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self._check_open()
        for name, content in files.items():
            parts = self._parts(name)
            data = content if isinstance(content, bytes) else content.encode()
            parent = self._parent_fd(parts, create=True)
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644, dir_fd=parent)
            finally:
                os.close(parent)
            with os.fdopen(fd, "wb") as f:
                if self.uid is not None:
                    os.fchown(fd, self.uid, self.uid)
                f.write(data)

    def read_file(self, name: str, max_bytes: int = 1 << 20) -> bytes:
        """A file of the area, read by the host without following any link."""
        self._check_open()
        parts = self._parts(name)
        parent = self._parent_fd(parts, create=False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        finally:
            os.close(parent)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{name!r} is not a regular file")
            return f.read(max_bytes)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("this sandbox is closed")
        if self._holder is not None and self._holder.poll() is not None:
            raise SandboxError(f"the sandbox's holder process ended (exit {self._holder.returncode}); its area is gone")

    # -- running
    def _spec(self, argv: list[str], status_fd: int) -> dict:
        lim = self.limits
        cpu = lim.cpu_s if lim.cpu_s is not None else math.ceil(lim.timeout_s) + 1
        return {
            "mode": "run", "root": str(self._host / "root"), "ro_paths": _ro_paths(), "area": self._area_spec(),
            "tmp": {"bytes": lim.tmp_mb << 20, "files": lim.max_files}, "uid": self.uid, "argv": argv,
            "status_fd": status_fd, "seccomp_bpf": self._seccomp,
            "cgroup_procs": self.cgroup.procs_files if self.cgroup else [],
            "env": {"PATH": os.path.dirname(_python_prefix()[0]) + ":/usr/local/bin:/usr/bin:/bin", "HOME": "/sandbox",
                    "TMPDIR": "/tmp",
                    "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"},
            "limits": {"cpu_s": cpu, "memory_bytes": lim.memory_mb << 20, "file_size_bytes": lim.file_size_mb << 20,
                       "max_processes": lim.max_processes, "max_open_files": lim.max_open_files},
        }

    def command(self, argv: list[str], status_fd: int) -> list[str]:
        """The host command that runs `argv` in this sandbox's jail; `status_fd` (inherited) gets its status."""
        self._check_open()
        inner = ["unshare", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
        if self._holder is not None:   # into the holder's mount (its area) and network namespaces
            outer = ["nsenter", f"--target={self._holder.pid}", "--mount", "--net"]
            outer += [] if self.is_root else ["--user", "--preserve-credentials"]
            cmd = outer + ["--"] + inner
        else:
            cmd = inner + ["--net"] + ([] if self.is_root else ["--user", "--map-root-user"])
        return cmd + ["--", _python_prefix()[0], "-I", "-S", INIT_SCRIPT, json.dumps(self._spec(argv, status_fd))]

    def run(self, code: str, lang: Lang = "python") -> SandboxResult:
        """Run `code` with /sandbox (the area) as its working directory."""
        self._check_open()
        if len(code.encode()) > MAX_CODE_BYTES:
            return SandboxResult("", f"code of {len(code.encode())} bytes exceeds the {MAX_CODE_BYTES}-byte limit",
                                 exit_code=2, timed_out=False)
        if "\x00" in code:
            return SandboxResult("", "code contains a NUL byte", exit_code=2, timed_out=False)
        status_r, status_w = os.pipe()
        start = time.monotonic()
        try:
            proc = subprocess.Popen(self.command(_interpreter(lang) + [code], status_w), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    close_fds=True, pass_fds=(status_w,))
        except BaseException:
            os.close(status_r)
            raise
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
                raise SandboxError(f"the sandbox ended without a status (exit {proc.returncode}): "
                                   f"{stderr.strip()[-500:]}") from None
            exit_code = -signal.SIGKILL
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
        if self._closed:
            return
        self._closed = True
        if getattr(self, "_holder", None) is not None:
            self._kill(self._holder)   # its mount namespace, and the area with it, go away
            for stream in (self._holder.stdin, self._holder.stdout):
                stream.close()
        if getattr(self, "_files_fd", None) is not None:
            os.close(self._files_fd)
            self._files_fd = None
        if getattr(self, "cgroup", None) is not None:
            self.cgroup.close()
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
    """One run in a fresh area (optionally prepared with `files`), removed afterwards."""
    with Sandbox(limits, files=files, persistent=False) as sandbox:
        return sandbox.run(code, lang)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m openclaw_jax.envs.sandbox",
        description="Run CODE in a fresh sandbox (no network, no host files, no privilege; CPU, memory, process "
                    "and disk limits) and print one JSON object {stdout, stderr, exit_code, timed_out}.",
        epilog="Example: python -m openclaw_jax.envs.sandbox --lang python --timeout 5 -- 'print(2**100)'")
    d = SandboxLimits()
    parser.add_argument("--lang", choices=LANGS, default="python", help="interpreter (default python)")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, metavar="S",
                        help=f"wall-clock limit in seconds (default {d.timeout_s})")
    parser.add_argument("--memory-mb", type=int, default=d.memory_mb, metavar="M",
                        help=f"address-space limit per process in MiB, and the whole sandbox's where a cgroup "
                             f"is available (default {d.memory_mb})")
    parser.add_argument("--max-processes", type=int, default=d.max_processes, metavar="N",
                        help=f"processes and threads (default {d.max_processes})")
    parser.add_argument("--work-mb", type=int, default=d.work_mb, metavar="M",
                        help=f"size of the writable area /sandbox in MiB (default {d.work_mb})")
    parser.add_argument("--tmp-mb", type=int, default=d.tmp_mb, metavar="M",
                        help=f"size of the private /tmp in MiB (default {d.tmp_mb})")
    parser.add_argument("--max-files", type=int, default=d.max_files, metavar="N",
                        help=f"files, folders and links in /sandbox, and again in /tmp (default {d.max_files})")
    parser.add_argument("--file-size-mb", type=int, default=d.file_size_mb, metavar="M",
                        help=f"largest file it may write in MiB (default {d.file_size_mb})")
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
        limits = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb, max_processes=args.max_processes,
                               work_mb=args.work_mb, tmp_mb=args.tmp_mb, max_files=args.max_files,
                               file_size_mb=args.file_size_mb)
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
