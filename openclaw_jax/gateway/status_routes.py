"""The status page routes of the gateway (a mixin of `gateway.server.Gateway`).

* ``GET /v1/status``: what the agent learned, as JSON (`gateway.status.status_body`).
* ``GET /``: the same, as an HTML page rendered on the server (`gateway.status_page`).
* ``POST /login``: the page's sign-in form (``key=<the gateway's API key>``).

Both views are behind the gateway's keys (when it has any: the shared key, a person's key or the
admin key, gateway/auth.py). A program sends one as usual (``Authorization: Bearer <key>``). A browser
cannot send a header when it navigates to a page, so the page signs in once: the form posts the key,
and a correct key sets a cookie whose value is HMAC-SHA256 of a fixed label under a secret derived from
every configured key (``GatewayAuth.browser_secret``: no key is stored in the browser, and changing
any key invalidates every cookie). The cookie is ``HttpOnly`` (no script can
read it), ``SameSite=Strict`` (no other site's page can make the browser send it) and ``Secure``
over HTTPS, and it opens only these two read-only views: chat, session and admin routes still need
the bearer key. The page runs no script at all (its Content-Security-Policy forbids scripts).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web

from openclaw_jax.gateway.auth import GatewayAuth
from openclaw_jax.gateway.protocol import GatewayHTTPError
from openclaw_jax.gateway.status import SessionActivity, StoreSummary, holdout_every, status_body
from openclaw_jax.gateway.status_page import CSP, login_page, status_page
from openclaw_jax.http import http_guard as G
from openclaw_jax.serving.versions import VersionLog, VersionStore, versions_dir_for

logger = logging.getLogger("openclaw_jax.gateway.server")

COOKIE = "openclaw_jax_status"
COOKIE_MAX_AGE_S = 30 * 86400
_COOKIE_LABEL = b"openclaw_jax status page v1"
_PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                 "Cache-Control": "no-store", "X-Frame-Options": "DENY"}


def status_cookie(secret: bytes) -> str:
    """The sign-in cookie's value under ``secret`` (`GatewayAuth.browser_secret`)."""
    return hmac.new(secret, _COOKIE_LABEL, hashlib.sha256).hexdigest()


class StatusRoutes:
    """``GET /``, ``POST /login``, ``GET /v1/status``; state lives on the Gateway."""

    cfg: Any
    guard: Any
    stats: Any
    sessions: Any
    activity: SessionActivity
    auth: GatewayAuth
    _check_auth: Any

    def add_status_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.handle_status_page)
        app.router.add_post("/login", self.handle_login)
        app.router.add_get("/v1/status", self.handle_status)

    def _status_sources(self) -> tuple[StoreSummary, VersionLog, VersionStore, asyncio.Lock]:
        if getattr(self, "_status_summary", None) is None:
            versions = versions_dir_for(self.cfg.store_dir)
            self._status_summary = StoreSummary(self.cfg.store_dir)
            self._status_versions = (VersionLog(versions), VersionStore(versions), asyncio.Lock())
        return (self._status_summary, *self._status_versions)

    def close_status(self) -> None:
        if getattr(self, "_status_summary", None) is not None:
            self._status_summary.close()

    def _signed_in(self, request: web.Request) -> bool:
        """A valid bearer key, or the sign-in cookie (these read-only views only); True when there is no key."""
        secret = self.auth.browser_secret()
        if secret is None or self.auth.valid_key(G.bearer_token(request.headers)):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode("utf-8", "surrogateescape"), status_cookie(secret).encode())

    async def _status(self) -> dict[str, Any]:
        summary, versions, kept, lock = self._status_sources()

        def gather() -> dict[str, Any]:
            summary.refresh(holdout_every(versions.events()))
            return status_body(summary=summary, activity=self.activity, open_sessions=self.sessions,
                               versions=versions, kept=kept, stats=vars(self.stats), model=self.cfg.served_model_name)

        async with lock:   # one reader of the store at a time, off the event loop
            return await asyncio.to_thread(gather)

    async def handle_status(self, request: web.Request) -> web.Response:
        if not self._signed_in(request):
            self._check_auth(request)   # answers 401 with the usual message
        return web.json_response(await self._status(), headers={"Cache-Control": "no-store"})

    async def handle_status_page(self, request: web.Request) -> web.Response:
        if not self._signed_in(request):
            return web.Response(text=login_page(), status=401, content_type="text/html", headers=_PAGE_HEADERS)
        return web.Response(text=status_page(await self._status()), content_type="text/html", headers=_PAGE_HEADERS)

    async def handle_login(self, request: web.Request) -> web.Response:
        raw = bytes(await G.read_body(request, self.guard))
        if len(raw) > 4096:
            raise GatewayHTTPError(413, "the sign-in form is at most 4096 bytes")
        try:
            form = parse_qs(raw.decode("utf-8"), max_num_fields=4, strict_parsing=False)
        except (UnicodeDecodeError, ValueError):
            raise GatewayHTTPError(400, "the sign-in form must be application/x-www-form-urlencoded UTF-8 "
                                        "with a field 'key'") from None
        given = (form.get("key") or [""])[0].encode("utf-8")
        secret = self.auth.browser_secret()
        if secret is not None and not self.auth.valid_key(given):
            logger.warning("status page: a sign-in with a wrong key")
            return web.Response(text=login_page("That is not one of the gateway's keys."), status=401,
                                content_type="text/html", headers=_PAGE_HEADERS)
        response = web.Response(status=303, headers={"Location": "/", **_PAGE_HEADERS})
        if secret is not None:
            response.set_cookie(COOKIE, status_cookie(secret), max_age=COOKIE_MAX_AGE_S, path="/",
                                httponly=True, samesite="Strict", secure=request.secure)
        return response
