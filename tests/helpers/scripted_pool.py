"""A scripted SGLang-shaped worker (real aiohttp server on 127.0.0.1) for gateway tests.

It answers ``/generate`` (plain and SSE streaming, cumulative chunks) and ``/health`` with
outputs the test controls: by default a deterministic token sequence derived from the
prompt; or the encoding of a queued text (to make the "model" call a tool); or a failure
(HTTP status, delay, abort). Every request and every answer is recorded so tests can
check that the gateway stored exactly what the worker returned.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Reply:
    text: str | None = None          # None: derived from the prompt
    status: int = 200
    delay_s: float = 0.0
    abort: bool = False
    error: str = "scripted failure"
    break_after: int | None = None   # streaming: drop the connection after this many chunks


@dataclass
class ScriptedPool:
    tokenizer: Any
    weight_version: str = "7"
    requests: list[dict] = field(default_factory=list)
    answers: list[dict] = field(default_factory=list)   # the final body of each answered /generate
    exchanges: list[tuple[dict, dict]] = field(default_factory=list)  # (request payload, final body) pairs
    queue: list[Reply] = field(default_factory=list)     # consumed first-in-first-out
    default: Reply = field(default_factory=Reply)
    healthy: bool = True
    stream_chunk_delay_s: float = 0.0
    # Optional: responder(prompt_text) -> Reply | None, consulted before the queue (judge pools).
    responder: Any = None

    def _next_reply(self, payload: dict) -> Reply:
        if self.responder is not None:
            reply = self.responder(self.tokenizer.decode(payload.get("input_ids") or []))
            if reply is not None:
                return reply
        return self.queue.pop(0) if self.queue else self.default

    def _output(self, payload: dict, reply: Reply) -> tuple[list[int], list[float], str, dict]:
        params = payload.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 16))
        eos = self.tokenizer.eos_token_ids[0]
        if reply.text is not None:
            ids = self.tokenizer.encode(reply.text)[:max_new]
        else:
            rng = random.Random(sum(payload.get("input_ids") or [0]) * 31 + int(params.get("sampling_seed") or 0))
            ids = [rng.randrange(97, 123) for _ in range(min(max_new, 6))]  # lowercase letters in the tiny vocab
        finish: dict[str, Any]
        if len(ids) < max_new:
            ids = ids + [eos]
            finish = {"type": "stop", "matched": eos}
        else:
            finish = {"type": "length", "length": max_new}
        rng = random.Random(len(self.answers))
        logprobs = [-rng.uniform(0.01, 5.0) for _ in ids]
        text = self.tokenizer.decode([t for t in ids if t != eos], skip_special_tokens=True)
        return ids, logprobs, text, finish

    def _body(self, payload: dict, ids, logprobs, text, finish) -> dict:
        meta = {"id": "x", "finish_reason": finish, "prompt_tokens": len(payload.get("input_ids") or []),
                "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": self.weight_version,
                "e2e_latency": 0.0}
        if payload.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids)]
            k = int(payload.get("top_logprobs_num") or 0)
            if k:
                meta["output_top_logprobs"] = [[[lp, t, None]] + [[lp - 1.0 - j, (t + j + 1) % 300, None]
                                                                  for j in range(k - 1)]
                                               for lp, t in zip(logprobs, ids)]
        return {"text": text, "output_ids": list(ids), "meta_info": meta}

    async def generate(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.requests.append(payload)
        reply = self._next_reply(payload)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            return web.json_response({"error": {"message": reply.error}}, status=reply.status)
        ids, logprobs, text, finish = self._output(payload, reply)
        if reply.abort:
            finish = {"type": "abort", "message": "scripted abort"}
        if not payload.get("stream"):
            body = self._body(payload, ids, logprobs, text, finish)
            self.answers.append(body)
            self.exchanges.append((payload, body))
            return web.json_response(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        eos = self.tokenizer.eos_token_ids[0]
        for n in range(1, len(ids) + 1):
            last = n == len(ids)
            part_text = text if last else self.tokenizer.decode([t for t in ids[:n] if t != eos],
                                                                 skip_special_tokens=True)
            body = self._body(payload, ids[:n], logprobs[:n], part_text, finish if last else None)
            if last:
                self.answers.append(body)
                self.exchanges.append((payload, body))
            await resp.write(f"data: {json.dumps(body)}\n\n".encode())
            if reply.break_after is not None and n >= reply.break_after:
                request.transport.close()  # the worker dies mid-stream
                return resp
            if self.stream_chunk_delay_s:
                await asyncio.sleep(self.stream_chunk_delay_s)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({}, status=200 if self.healthy else 503)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)   # requests with images
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        return app


class LoopThread:
    """An asyncio loop in a daemon thread, for running servers beside synchronous test code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def serve_app(app: web.Application, host: str = "127.0.0.1") -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, f"http://{host}:{runner.addresses[0][1]}"


class RecordingProxy:
    """Pass-through to a real worker that records every (request payload, final response body).

    Lets a test compare what the gateway stored with what the real policy server answered,
    byte for byte, without asking the server twice.
    """

    def __init__(self, target_url: str) -> None:
        self.target = target_url.rstrip("/")
        self.exchanges: list[tuple[dict, dict]] = []
        self._session = None

    async def _client(self):
        import aiohttp
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def generate(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        session = await self._client()
        async with session.post(self.target + "/generate", json=payload) as upstream:
            if "text/event-stream" not in upstream.headers.get("Content-Type", ""):
                raw = await upstream.read()
                if upstream.status == 200:
                    self.exchanges.append((payload, json.loads(raw)))
                return web.Response(body=raw, status=upstream.status, content_type="application/json")
            resp = web.StreamResponse(status=upstream.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            last = None
            buffer = b""
            async for piece in upstream.content.iter_any():
                await resp.write(piece)
                buffer += piece
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    if event.startswith(b"data: {"):
                        last = json.loads(event[6:])
            if last is not None:
                self.exchanges.append((payload, last))
            await resp.write_eof()
            return resp

    async def health(self, request: web.Request) -> web.Response:
        session = await self._client()
        async with session.get(self.target + "/health") as upstream:
            return web.Response(body=await upstream.read(), status=upstream.status)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)   # requests with images
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        return app
