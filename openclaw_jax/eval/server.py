"""Start the embedded inference server (`python -m openclaw_jax.inference.server`) as a child
process on an ephemeral 127.0.0.1 port, wait for `GET /health`, and stop it again."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

SERVER_MODULE = "openclaw_jax.inference.server"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just gave out; the child binds it right after (a tiny race we accept)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


class EmbeddedServer:
    """The embedded JAX inference server in a child process.

    `model` is what the server loads: "smollm2" or an HF directory (a training export such as
    `<run>/export/step_<N>/` is an HF directory). `extra_args` are passed through verbatim.
    The child's stdout/stderr go to `log_path` (or are discarded), so a failed start can show
    its last lines.
    """

    def __init__(
        self,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: str | Path | None = None,
        startup_timeout_s: float = 900.0,
        env: dict[str, str] | None = None,
    ):
        self.model = model
        self.host = host
        self.port = port
        self.extra_args = list(extra_args)
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
        return [sys.executable, "-m", SERVER_MODULE, "--model", self.model, "--host", self.host,
                "--port", str(self.port), *self.extra_args]

    def _log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no server log; pass log_path to keep one)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> "EmbeddedServer":
        if self.proc is not None:
            raise RuntimeError("server already started")
        if self.port is None:
            self.port = free_port(self.host)
        cmd = self.command()
        log.info("starting inference server: %s", " ".join(cmd))
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")
        out = self._log_file or subprocess.DEVNULL
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
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
            try:
                if _get(f"{self.url}/health", timeout=5.0) == 200:
                    log.info("inference server healthy at %s", self.url)
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"inference server at {self.url} not healthy after {self.startup_timeout_s:.0f}s; "
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
        self._close_log()

    def __enter__(self) -> "EmbeddedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
