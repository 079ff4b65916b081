"""`policy.mode: process`: the JAX policy server in a child process at the normal CPU priority, while the
run's trainer steps back (`policy.trainer_idle`, `policy.trainer_nice`; `cpu_priority`).

In one process the trainer's steps and a person's turns share XLA's CPU thread pool, and nothing orders
them: on a 2-core machine a turn that arrives during a step is prefilled at about half speed. The
operating system can put serving first only when the two are different processes, so here the policy is
`python -m openclaw_jax.inference` (the engine and settings of `embedded` mode, from the `policy:`
section) started by the run, and the run lowers its trainer's threads (all but the gateway's event loop;
`train.py`, `cpu_priority.py`): a training step gets what serving leaves. Weights reach the server as in
`external` mode, as HF safetensors it loads on `/update_weights_from_disk`, its hot prefixes recomputed
with them before they serve.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from openclaw_jax.config import ExperimentConfig, PolicyConfig
from openclaw_jax.inference.scheduler import EngineConfig

log = logging.getLogger(__name__)


class PolicyProcessError(RuntimeError):
    """The policy server process did not start."""


def engine_config(policy: PolicyConfig) -> EngineConfig:
    """The embedded engine's settings from the `policy:` section (`server_command` gives the process the same)."""
    return EngineConfig(max_batch_size=policy.max_batch_size, min_batch_bucket=policy.min_batch_rows,
                        min_prefill_rows=1, max_prefill_rows=policy.max_prefill_rows,
                        min_cache_bucket=policy.min_cache_len, min_prompt_bucket=policy.min_prompt_len,
                        prefix_cache_bytes=policy.prefix_cache_mb << 20,
                        prefix_refresh_tokens=policy.prefix_refresh_tokens,
                        prefix_refresh_entries=policy.prefix_refresh_entries,
                        prefix_refresh_wait_s=policy.prefix_refresh_wait_s,
                        prefix_refresh_chunk_tokens=policy.prefix_refresh_chunk_tokens)


def server_command(cfg: ExperimentConfig, model: str, weight_version: str, weight_dirs: Sequence[Path]) -> list[str]:
    """The `python -m openclaw_jax.inference` command serving `model` with the `policy:` section's settings
    (the same EngineConfig as `engine_config` gives the embedded engine), loading weight updates from
    `weight_dirs` only (the trainer's pushes; the kept versions a rollback serves). Its key comes in its
    environment (`PolicyProcess(env=...)`)."""
    policy = cfg.policy
    # on loopback (its control routes take no key there); policy.port, 0 for a free one
    cmd = [sys.executable, "-m", "openclaw_jax.inference", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(policy.port), "--weight-version", str(weight_version), "--dtype", str(cfg.model.dtype),
           "--max-running-requests", str(policy.max_batch_size), "--min-batch-bucket", str(policy.min_batch_rows),
           "--min-prefill-rows", "1", "--max-prefill-rows", str(policy.max_prefill_rows),
           "--min-prompt-bucket", str(policy.min_prompt_len), "--min-cache-bucket", str(policy.min_cache_len),
           "--prefix-cache-mb", str(policy.prefix_cache_mb),
           "--prefix-refresh-tokens", str(policy.prefix_refresh_tokens),
           "--prefix-refresh-entries", str(policy.prefix_refresh_entries),
           "--prefix-refresh-wait", str(policy.prefix_refresh_wait_s),
           "--prefix-refresh-chunk", str(policy.prefix_refresh_chunk_tokens),
           *(a for d in weight_dirs for a in ("--weight-dir", str(d))),
           "--compile-cache-dir", str(cfg.compile_cache_dir), "--log-level", cfg.log_level.lower()]
    if policy.context_length:
        cmd += ["--context-length", str(policy.context_length)]
    if cfg.seed is not None:
        cmd += ["--seed", str(cfg.seed)]
    return cmd


class PolicyProcess:
    """The child server: `start()` returns its URL once it serves, `stop()` ends it (and its process group)."""

    def __init__(self, command: list[str], log_path: Path, *, env: dict[str, str] | None = None,
                 start_timeout_s: float = 600.0):
        self.command = command
        self.env = dict(os.environ, **(env or {}))
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None

    async def start(self) -> str:
        return await asyncio.to_thread(self._start)

    def _start(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log_file, env=self.env,
                                         stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        first = line[0].strip() if line else ""
        if not first.startswith("READY "):
            self._kill()
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise PolicyProcessError(f"the policy server did not start within {self.start_timeout_s:.0f} s "
                                     f"(first line {first!r}); its log {self.log_path}:\n{tail}")
        url = first.split()[1]
        log.info("policy server process %d serves %s (log %s)", self.proc.pid, url, self.log_path)
        return url

    async def stop(self, grace_s: float = 30.0) -> None:
        await asyncio.to_thread(self._stop, grace_s)

    def _stop(self, grace_s: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace_s)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            log.warning("policy server process %d did not stop within %.0f s of SIGTERM; killing it", self.proc.pid,
                        grace_s)
        self._kill()

    def _kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

