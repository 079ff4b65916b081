"""Per-person caps of the gateway: open connections, generations in flight, judgements queued.

One client must not be able to take what others need: the connection slots (``max_connections``),
the policy pool's concurrency, the judge queue. Each person (gateway/auth.py) gets at most
``gateway.max_connections_per_person`` open connections (a connection counts for the person whose
request it carried last, until it closes: beyond, the request gets 429 with ``Retry-After`` and the
connection is closed), ``gateway.max_inflight_per_person`` requests being rendered and generated at
once (more wait for one of that person's own slots, in order; their number is bounded by the
person's connections, one request each), and ``gateway.max_pending_judgements_per_person`` scored
turns waiting for the judge (beyond, the person's newest scored turn is dropped, counted). So the
policy pool always has room for others: keep ``max_inflight_per_person`` below
``pool_max_concurrency``. Sessions per person are the session tracker's (sessions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any, AsyncIterator

from aiohttp import web

from openclaw_jax.gateway.protocol import GatewayHTTPError
from openclaw_jax.http.http_guard import ConnectionGuard

logger = logging.getLogger(__name__)


class ClientLimits:
    """The caps of the module docstring; ``status()`` for ``/healthz``."""

    def __init__(self, cfg: Any, connections: ConnectionGuard) -> None:
        self.cfg = cfg
        self.connections = connections
        self.inflight: Counter[str] = Counter()   # requests of each person being generated or waiting to be
        self._slots: dict[str, asyncio.Semaphore] = {}
        self.queued: Counter[str] = Counter()
        self.refused = Counter({"connections": 0, "judgements": 0})
        self.waited = 0   # requests that waited for one of their person's generation slots

    def admit_connection(self, request: web.BaseRequest, person: str) -> None:
        """Count the request's connection as ``person``'s; 429 (and close it) beyond their cap."""
        limit = self.cfg.max_connections_per_person
        if self.connections.claim(request, person) > limit:
            self.refused["connections"] += 1
            raise GatewayHTTPError(429, f"person {person!r} has more than {limit} open connections "
                                        "(gateway.max_connections_per_person); reuse or close some",
                                   headers={"Retry-After": "1"}, close=True)

    @contextlib.asynccontextmanager
    async def generation(self, person: str) -> AsyncIterator[None]:
        """Hold one of ``person``'s slots while a request is rendered and generated (waiting for one, in order,
        when they are all taken by the person's other requests)."""
        slots = self._slots.get(person)
        if slots is None:
            slots = self._slots[person] = asyncio.Semaphore(self.cfg.max_inflight_per_person)
        self.inflight[person] += 1
        if slots.locked():
            self.waited += 1
        try:
            async with slots:
                yield
        finally:
            self.inflight[person] -= 1
            if self.inflight[person] <= 0:   # nobody holds or waits for this person's slots
                del self.inflight[person]
                del self._slots[person]

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
                "waited_for_own_slot": self.waited, "refused": dict(self.refused)}
