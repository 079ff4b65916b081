"""Start the embedded inference server (`python -m openclaw_jax.inference`) as a child
process on an ephemeral 127.0.0.1 port, wait for `GET /health`, and stop it again.

With no port given the child binds port 0 itself and announces the port it got on stdout
("READY http://host:port"), so there is no window in which another process can take it."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

SERVER_MODULE = "openclaw_jax.inference"
_READY_RE = re.compile(rb"READY (http://[^\s]+)")


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


class EmbeddedServer:
    """The embedded JAX inference server in a child process.

    `model` is what the server loads: "smollm2" or an HF directory (a training export such as
    `<run>/export/step_<N>/` is an HF directory). `weight_dirs` are the directories it may later
    load other checkpoints from (`--weight-dir`). `extra_args` are passed through verbatim.
    The child's stdout/stderr go to `log_path` (a temporary file when not given), where the
    READY line is read from and from which a failed start shows its last lines.
    """

    def __init__(
        self,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        weight_dirs: Sequence[str | Path] = (),
        log_path: str | Path | None = None,
        startup_timeout_s: float = 900.0,
        env: dict[str, str] | None = None,
    ):
        self.model = model
        self.host = host
        self.port = port
        self._requested_port = port
        self.extra_args = list(extra_args)
        self.weight_dirs = [str(d) for d in dict.fromkeys(str(d) for d in weight_dirs)]
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        port = self._requested_port if self._requested_port is not None else 0
        return [sys.executable, "-m", SERVER_MODULE, "--model", self.model, "--host", self.host,
                "--port", str(port), *(a for d in self.weight_dirs for a in ("--weight-dir", d)), *self.extra_args]

    def _announced_port(self) -> int | None:
        m = _READY_RE.search(self.log_path.read_bytes()) if self.log_path.exists() else None
        return int(m.group(1).decode().rsplit(":", 1)[1].split("/")[0]) if m else None

    def _log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no server log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> "EmbeddedServer":
        if self.proc is not None:
            raise RuntimeError("server already started")
        cmd = self.command()
        log.info("starting inference server: %s", " ".join(cmd))
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="openclaw_inference_", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "wb")  # fresh: an old READY line must not be read
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)
        self.port = self._requested_port
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self._close_log()
                self.proc = None
                raise RuntimeError(
                    f"inference server exited with code {code} before becoming healthy; command: "
                    f"{' '.join(cmd)}\nlast log lines:\n{self._log_tail()}"
                )
            if self.port is None:
                self.port = self._announced_port()
            try:
                if self.port is not None and _get(f"{self.url}/health", timeout=5.0) == 200:
                    log.info("inference server healthy at %s", self.url)
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"inference server ({' '.join(cmd)}) not healthy after {self.startup_timeout_s:.0f}s; "
                    f"raise --server-startup-timeout or check the log:\n{self._log_tail()}"
                )
            time.sleep(0.5)

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("inference server %d ignored SIGTERM for %.0fs; killing it", self.proc.pid, timeout_s)
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.port = self._requested_port
        self._close_log()

    def __enter__(self) -> "EmbeddedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
