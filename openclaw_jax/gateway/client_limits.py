"""Per-person caps of the gateway: open connections, generations in flight, judgements queued.

One client must not be able to take what others need: the connection slots (``max_connections``),
the policy pool's concurrency, the judge queue. Each person (gateway/auth.py) gets at most
``gateway.max_connections_per_person`` open connections (a connection counts for the person whose
request it carried last, until it closes), ``gateway.max_inflight_per_person`` requests being
generated at once and ``gateway.max_pending_judgements_per_person`` scored turns waiting for the
judge. Beyond the first two the request gets 429 with ``Retry-After`` (the connection is closed
when it is one too many); beyond the third the person's newest scored turn is dropped (counted).
Sessions per person are the session tracker's (sessions.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from typing import Any, Iterator

from aiohttp import web

from openclaw_jax.gateway.protocol import GatewayHTTPError
from openclaw_jax.http.http_guard import ConnectionGuard

logger = logging.getLogger(__name__)


class ClientLimits:
    """The caps of the module docstring; ``status()`` for ``/healthz``."""

    def __init__(self, cfg: Any, connections: ConnectionGuard) -> None:
        self.cfg = cfg
        self.connections = connections
        self.inflight: Counter[str] = Counter()
        self.queued: Counter[str] = Counter()
        self.refused = Counter({"connections": 0, "generations": 0, "judgements": 0})

    def admit_connection(self, request: web.BaseRequest, person: str) -> None:
        """Count the request's connection as ``person``'s; 429 (and close it) beyond their cap."""
        limit = self.cfg.max_connections_per_person
        if self.connections.claim(request, person) > limit:
            self.refused["connections"] += 1
            raise GatewayHTTPError(429, f"person {person!r} has more than {limit} open connections "
                                        "(gateway.max_connections_per_person); reuse or close some",
                                   headers={"Retry-After": "1"}, close=True)

    @contextlib.contextmanager
    def generation(self, person: str) -> Iterator[None]:
        """Hold one of ``person``'s in-flight slots while a request is rendered and generated; 429 beyond."""
        limit = self.cfg.max_inflight_per_person
        if self.inflight[person] >= limit:
            self.refused["generations"] += 1
            raise GatewayHTTPError(429, f"person {person!r} already has {limit} requests being generated "
                                        "(gateway.max_inflight_per_person); retry when one is done",
                                   headers={"Retry-After": "1"})
        self.inflight[person] += 1
        try:
            yield
        finally:
            self.inflight[person] -= 1
            if self.inflight[person] <= 0:
                del self.inflight[person]

    def queue_judgement(self, person: str) -> bool:
        """Reserve one of ``person``'s judge-queue places (False: they hold their cap already)."""
        if self.queued[person] >= self.cfg.max_pending_judgements_per_person:
            self.refused["judgements"] += 1
            return False
        self.queued[person] += 1
        return True

    def judgement_done(self, person: str) -> None:
        self.queued[person] -= 1
        if self.queued[person] <= 0:
            del self.queued[person]

    def status(self) -> dict[str, Any]:
        return {"people_connected": len(self.connections.by_owner), "people_generating": len(self.inflight),
                "refused": dict(self.refused)}
