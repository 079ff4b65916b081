"""Errors and per-worker results of the SGLang pool client (docs/design.md §8).

What a worker's `/generate` returned is :class:`openclaw_jax.wire.sglang_results.GenerateResult` (parsed
by :func:`openclaw_jax.wire.sglang_results.parse_generate_response`, the one place that reads that body).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PoolError(RuntimeError):
    """Base class of every error the pool client raises."""


class NoHealthyWorkerError(PoolError):
    """Every worker of the pool is marked unhealthy (or the pool is empty)."""


class RequestRejectedError(PoolError):
    """A worker answered 4xx (other than 408/429): the request itself is wrong; not retried."""

    def __init__(self, status: int, message: str, *, url: str | None = None, body: Any = None):
        self.status = int(status)
        self.message = str(message)
        self.url = url
        self.body = body
        where = f" from {url}" if url else ""
        super().__init__(f"request rejected with HTTP {self.status}{where}: {self.message}")


class WorkerUnavailableError(PoolError):
    """Retries were exhausted on connection errors, timeouts, 408/429/5xx or aborted generations."""

    def __init__(self, message: str, *, attempts: list[str] | None = None):
        self.attempts = list(attempts or [])
        detail = "" if not self.attempts else " (attempts: " + "; ".join(self.attempts) + ")"
        super().__init__(message + detail)


class MalformedResponseError(PoolError):
    """A worker answered 200 but the body is not a valid SGLang response."""


@dataclass(frozen=True)
class WeightUpdateResult:
    """Per-worker answer of `/update_weights_from_disk`."""

    url: str
    success: bool
    message: str
    num_paused_requests: int
