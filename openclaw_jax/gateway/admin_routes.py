"""The gateway's admin routes: which weight versions are kept, and serving one of them again.

A mixin of `gateway.server.Gateway`; every route needs the admin key (``gateway.admin_key``, sent as
``Authorization: Bearer <admin key>``); without one configured they answer 403.

* ``GET /v1/admin/versions``: ``{"served_version", "kept": [...], "events": [...newest first]}``.
* ``POST /v1/admin/rollback`` ``{"version": "3"}``: every policy worker (``gateway.worker_urls``, else
  the policy URLs) loads the kept weights of that version (``/update_weights_from_disk`` with
  ``<run_dir>/versions/v3``: the embedded server swaps them in between decode steps, SGLang workers
  load them from disk), then a ``rollback`` event is logged: the gate checks later candidates against
  this version. Answers ``{"served_version", "from_version", "workers": [{"url", "success",
  "message"}]}``; 400 for a malformed version, 404 for one without kept weights (the message lists the
  kept ones), 502 when a worker refuses (nothing is logged; the answer says which workers took it).
  The change happens under the versions directory's serving lock, so a gate promotion and a rollback
  never interleave.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from openclaw_jax.gateway.auth import require_admin
from openclaw_jax.gateway.protocol import GatewayHTTPError, bad_request
from openclaw_jax.http import http_guard as G
from openclaw_jax.pool.client import PoolClient
from openclaw_jax.serving.versions import VersionError, VersionLog, VersionStore, check_version, versions_dir_for

logger = logging.getLogger("openclaw_jax.gateway.server")


class AdminRoutes:
    """Kept versions and rollback; state lives on the Gateway."""

    cfg: Any
    guard: Any
    policy: Any

    def add_admin_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/admin/versions", self.handle_versions)
        app.router.add_post("/v1/admin/rollback", self.handle_rollback)

    def _check_admin(self, request: web.Request) -> None:
        require_admin(request)   # 401 without a valid key, 403 for a client key or a gateway without an admin key

    def _versions(self) -> tuple[VersionLog, VersionStore]:
        directory = versions_dir_for(self.cfg.store_dir)
        return VersionLog(directory), VersionStore(directory)

    async def handle_versions(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        versions, kept = self._versions()

        def read() -> dict[str, Any]:
            events = versions.events()
            return {"served_version": versions.served_version(events), "kept": kept.kept(),
                    "events": list(reversed(events[-200:]))}

        return web.json_response(await asyncio.to_thread(read))

    async def _rollback_body(self, request: web.Request) -> tuple[str, str]:
        body = await G.read_json(request, self.guard, empty_message='the body is empty; send {"version": "<version>"}')
        if not isinstance(body, dict) or "version" not in body:
            raise bad_request('the body must be a JSON object {"version": "<a kept version>"}', param="version")
        reason = body.get("reason", "")
        if not isinstance(reason, str) or len(reason) > 200:
            raise bad_request("reason must be a string of at most 200 characters", param="reason")
        try:
            return check_version(body["version"]), reason
        except VersionError as err:
            raise bad_request(str(err), param="version") from None

    async def handle_rollback(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        version, reason = await self._rollback_body(request)
        versions, kept = self._versions()
        try:
            path = kept.require(version)
        except VersionError as err:
            raise GatewayHTTPError(404, str(err), param="version") from None
        lock = await asyncio.to_thread(versions.serving_lock().acquire)
        try:
            previous = versions.served_version()
            results = await self._update_workers(str(path), version)
            workers = [{"url": r.url, "success": r.success, "message": r.message} for r in results]
            failed = [w for w in workers if not w["success"]]
            if failed:
                raise GatewayHTTPError(502, f"rollback to version {version} failed on {len(failed)} of {len(workers)} "
                                            "worker(s): " + "; ".join(f"{w['url']}: {w['message']}" for w in failed))
            await asyncio.to_thread(versions.append, "rollback", version, version, from_version=previous,
                                    reason=reason or "rollback requested")
        finally:
            lock.release()
        logger.info("rolled back to weight version %s (was %s)", version, previous)
        return web.json_response({"served_version": version, "from_version": previous, "workers": workers})

    async def _update_workers(self, path: str, version: str) -> list[Any]:
        if not self.cfg.worker_urls:
            return await self.policy.update_weights_from_disk(path, weight_version=version)
        client = PoolClient(list(self.cfg.worker_urls), request_timeout_s=self.cfg.request_timeout_s,
                            api_key=self.cfg.policy_api_key)
        await client.start()
        try:
            return await client.update_weights_from_disk(path, weight_version=version)
        finally:
            await client.close()
