"""Real SGLang processes on CPU for the `sglang`-marked tests (started through scripts/sglang_cpu.sh).

The SGLang venv is made once by `bash scripts/sglang_cpu.sh setup` in <repo>/.venv-sglang. When it
is missing the tests FAIL under CI (the `CI` environment variable is set) and are skipped with the
command to create it otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.helpers.server_utils import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sglang_cpu.sh"
VENV = Path(os.environ.get("SGLANG_CPU_VENV", REPO / ".venv-sglang"))
SETUP_HINT = "bash scripts/sglang_cpu.sh setup"
START_TIMEOUT_S = float(os.environ.get("SGLANG_CPU_START_TIMEOUT_S", "420"))


def require_sglang_venv() -> None:
    """Fail (CI) or skip (local) with the command to run when the SGLang venv is not ready."""
    proc = subprocess.run(["bash", str(SCRIPT), "check"], capture_output=True, text=True)
    if proc.returncode == 0:
        return
    message = (f"the SGLang CPU venv is not ready ({proc.stderr.strip() or proc.stdout.strip()}); "
               f"create it once with `{SETUP_HINT}` (about 6 minutes, 11 GB)")
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


class SGLangProcess:
    """`scripts/sglang_cpu.sh serve|router ...` in its own process group on 127.0.0.1:<ephemeral port>."""

    def __init__(self, args: list[str], *, log_path: Path, name: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = list(args)
        self.log_path = Path(log_path)
        self.name = name
        self.proc: subprocess.Popen | None = None

    @classmethod
    def worker(cls, model_dir, *, log_dir: Path, name: str, port: int | None = None,
               extra: tuple[str, ...] = ()) -> "SGLangProcess":
        p = cls([], log_path=Path(log_dir) / f"{name}.log", name=name, port=port)
        p.args = ["serve", "--model", str(model_dir), "--port", str(p.port), *extra]
        return p

    @classmethod
    def router(cls, worker_urls: list[str], *, log_dir: Path, name: str = "router") -> "SGLangProcess":
        p = cls([], log_path=Path(log_dir) / f"{name}.log", name=name)
        p.args = ["router", "--port", str(p.port), "--worker-urls", *worker_urls]
        return p

    def launch(self) -> "SGLangProcess":
        """Start the process; returns at once (use `wait_healthy`)."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["bash", str(SCRIPT), *self.args], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=str(REPO), start_new_session=True)
        log.close()
        return self

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> "SGLangProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"SGLang {self.name} exited with {self.proc.returncode} before it was healthy; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"SGLang {self.name} not healthy after {timeout:.0f}s; log {self.log_path}:\n"
                           f"{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (the server, its scheduler and detokenizer processes)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


class WorkerPair:
    """The session's two SGLang workers, started on first use and stopped after the last sglang test.

    Two workers hold ~7 GB of memory, and without --sleep-on-idle (which sglang_cpu.sh passes) SGLang's
    scheduler busy-polls while idle (measured: a third of a core per idle worker; ~1% with it), so the
    workers must not outlive the `sglang` tests: the `pytest_runtest_teardown` hook in tests/sglang/conftest.py
    calls `stop()` when the next test is not one of them, and `ensure()` starts them again if a later
    test needs them.
    """

    def __init__(self, model_dir, log_dir: Path):
        self.model_dir = model_dir
        self.log_dir = Path(log_dir)
        self.workers: list[SGLangProcess] = []
        self.starts = 0

    def ensure(self) -> list[SGLangProcess]:
        if self.workers and all(w.alive() for w in self.workers):
            return self.workers
        self.stop()
        self.starts += 1
        fresh = [SGLangProcess.worker(self.model_dir, log_dir=self.log_dir, name=f"worker{i}-start{self.starts}")
                 for i in range(2)]
        try:
            for w in fresh:
                w.launch()
            for w in fresh:
                w.wait_healthy()
        except BaseException:
            for w in fresh:
                w.kill()
            raise
        self.workers[:] = fresh
        return self.workers

    def stop(self) -> None:
        for w in self.workers:
            w.kill()
        self.workers.clear()
