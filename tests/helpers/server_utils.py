"""Helpers for tests that run the SGLang-compatible server: in-process (a background thread with
its own event loop) or as a real `python -m openclaw_jax.inference` process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from aiohttp import web

REPO = Path(__file__).resolve().parents[2]

# Small, fixed buckets: every test engine/server compiles the same few variants.
TINY_ENGINE_KW = dict(max_batch_size=8, min_batch_bucket=8, min_prompt_bucket=32, min_cache_bucket=64,
                      batch_wait_s=0.01)
TINY_SERVER_ARGS = ["--max-running-requests", "8", "--min-batch-bucket", "8", "--min-prompt-bucket", "32",
                    "--min-cache-bucket", "64"]


class ServerThread:
    """Serve an aiohttp app on 127.0.0.1:<ephemeral port> from a background thread."""

    def __init__(self, app: web.Application):
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    def start(self) -> "ServerThread":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=60)
        return self

    async def _start(self) -> None:
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(cache_dir: str | os.PathLike | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    if cache_dir is not None:
        # Server processes of one test session share compiled steps through JAX's persistent cache.
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


class ServerProcess:
    """`python -m openclaw_jax.inference` on 127.0.0.1; waits for its READY line."""

    def __init__(self, model_dir, *, port: int | None = None, cache_dir=None, extra_args=(), log_path=None):
        self.model_dir = str(model_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cache_dir = cache_dir
        self.extra_args = list(extra_args)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 240.0) -> "ServerProcess":
        cmd = [sys.executable, "-m", "openclaw_jax.inference", "--model", self.model_dir, "--host",
               "127.0.0.1", "--port", str(self.port), "--log-level", "warning", *TINY_SERVER_ARGS, *self.extra_args]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=server_env(self.cache_dir),
                                     cwd=str(REPO))
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith(b"READY "):
                break
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before READY (log: {self.log_path})")
        else:
            self.kill()
            raise RuntimeError(f"server did not print READY within {timeout}s")
        assert line.decode().strip() == f"READY {self.url}", line
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("server never answered /health")

    def wait_compiled_ahead(self, timeout: float = 120.0) -> dict:
        """Until the engine's compile-ahead thread has twice looked for shapes and found none left (its
        stats from /get_server_info): a program it compiles meanwhile would count in a memory reading."""
        def stats():
            return requests.get(self.url + "/get_server_info", timeout=30).json()["compile_ahead"]

        start = stats()
        deadline = time.monotonic() + timeout
        while (now := stats())["on"] and now["idle_passes"] < start["idle_passes"] + 2:
            assert time.monotonic() < deadline, f"compile-ahead still busy after {timeout} s: {now}"
            time.sleep(0.1)
        return now

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def terminate(self, timeout: float = 60.0) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=timeout)
