"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests, answering with a Python function.

It runs an aiohttp app in its own thread and event loop, so it serves code that calls
`asyncio.run` itself (the eval CLI). `reply(body, headers) -> str` decides each answer (an exception in
it is an HTTP 500). With `api_key`, a request without `Authorization: Bearer <api_key>` gets a 401."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from aiohttp import web


class ScriptedOpenAIServer:
    def __init__(self, reply: Callable[[dict, dict], str], model: str = "scripted", api_key: str | None = None):
        self.reply = reply
        self.model = model
        self.api_key = api_key
        self.requests: list[tuple[dict, dict]] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def _refused(self, request) -> web.Response | None:
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        return web.json_response({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                            "code": "invalid_api_key"}}, status=401)

    async def _models(self, request):
        if (refused := self._refused(request)) is not None:
            return refused
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "test"}]})

    async def _health(self, request):
        return web.json_response({"status": "ok"})

    async def _chat(self, request):
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        headers = request.headers.copy()
        self.requests.append((headers, body))
        text = self.reply(body, headers)
        return web.json_response({
            "id": f"c{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })

    def __enter__(self) -> "ScriptedOpenAIServer":
        started = threading.Event()

        async def start():
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
            app.router.add_post("/v1/chat/completions", self._chat)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

        def serve():
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(start())
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
