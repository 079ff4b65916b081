"""``GET /healthz`` and ``GET /readyz`` of the gateway (a mixin of :class:`~openclaw_jax.gateway.server.Gateway`).

``/readyz`` answers 200 when the gateway serves and records samples, 503 otherwise; ``/healthz``
says ``ok`` or ``degraded``. Both answer without a key, but only with what a stranger may know:
whether it works. Where the gateway and its store live, the pool's URLs, the problems (which name
paths) and the counters are shown to a request with a valid key (any client key or the admin key),
or to anyone on a gateway that has no key at all.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from openclaw_jax.gateway.auth import request_caller
from openclaw_jax.gateway.protocol import GatewayHTTPError


class HealthRoutes:
    """The health handlers; state lives on the Gateway."""

    auth: Any
    policy: Any
    store: Any
    writer: Any
    judge: Any
    connections: Any
    limits: Any
    spool: Any
    sessions: Any
    stats: Any
    _queue: Any
    _active_jobs: int

    def _problems(self) -> list[str]:
        """Why the gateway is not fully working right now (empty = ok)."""
        problems = []
        if self.policy is None or not self.policy.healthy_urls():
            problems.append("no healthy policy worker")
        if self.store is None or self.writer is None:
            problems.append("the sample store is not open")
        elif self.writer.degraded:
            problems.append(f"the sample store {self.store.directory} cannot be written ({self.writer.last_error}) "
                            f"for {self.writer.failing_for_s:.1f} s: {self.writer.pending} sample(s) wait in memory, "
                            f"{self.writer.stats.dropped} dropped")
        return problems

    def _may_see_details(self, request: web.Request) -> bool:
        """A valid key was sent (or the gateway has none); a missing or wrong key is not an error here."""
        if self.auth.open:
            return True
        try:
            return request_caller(request).authenticated
        except GatewayHTTPError:
            return False

    async def handle_readyz(self, request: web.Request) -> web.Response:
        """200 when the gateway serves and records samples; 503 (with the reasons, given a key) otherwise."""
        problems = self._problems()
        body: dict[str, Any] = {"ready": not problems}
        if self._may_see_details(request):
            body["problems"] = problems
        return web.json_response(body, status=503 if problems else 200)

    async def handle_healthz(self, request: web.Request) -> web.Response:
        problems = self._problems()
        status = "degraded" if problems else "ok"
        if not self._may_see_details(request):
            return web.json_response({"status": status})
        store: dict[str, Any] = {"directory": self.store.directory if self.store is not None else None,
                                 "samples": len(self.store) if self.store is not None else 0}
        if self.writer is not None:
            store.update(self.writer.status())
        body = {
            "status": status,
            "problems": problems,
            "policy": {"urls": self.policy.urls if self.policy else [],
                       "healthy": self.policy.healthy_urls() if self.policy is not None else []},
            "judge": getattr(self.judge, "name", None),
            "store": store,
            "image_spool": self.spool.status() if self.spool is not None else None,
            "connections": asdict(self.connections.stats),
            "clients": self.limits.status(),
            "sessions": len(self.sessions),
            "pending_turns": self.sessions.pending_turns(),
            "queued_judgements": self._queue.qsize() if self._queue else 0,
            "running_judgements": self._active_jobs,
            "stats": asdict(self.stats),
        }
        return web.json_response(body)
