"""SGLang-compatible HTTP server around the JAX engine (DESIGN section 8).

    python -m openclaw_jax.inference.server --model <HF checkpoint dir | smollm2> --host 127.0.0.1 --port 30000

Endpoints (the subset the project relies on, with SGLang's shapes, status codes and error
bodies): `/generate` (single, batch lists, n > 1, streaming), `/v1/chat/completions`
(logprobs, streaming, `<tool_call>` parsing), `/v1/completions`, `/v1/models`, `/health`,
`/get_model_info`, `/update_weights_from_disk`, `/pause_generation`,
`/continue_generation`, `/flush_cache`.

Every request-shaped problem is a 4xx with an SGLang body (one error boundary: see
`openclaw_jax.serving.http_guard`; a 500 is a bug and carries a trace id). Bodies, texts and
prompts are size-checked before any work; large bodies are decoded and large texts tokenized
on worker threads, so one huge request does not stall the others; all JAX work happens on
the engine thread. Connections are capped and must send their headers within a timeout.
SIGTERM/SIGINT stop accepting connections, let in-flight requests finish (up to
`--shutdown-timeout`), then stop the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web

from openclaw_jax.inference import protocol as P
from openclaw_jax.inference import tool_calls as TC
from openclaw_jax.inference.engine import Engine, EngineConfig, EngineError
from openclaw_jax.inference.types import GenerationSpec, SequenceOutput
from openclaw_jax.serving import http_guard as G
from openclaw_jax.serving.offload import freeze_startup_heap, return_large_blocks_to_the_os
from openclaw_jax.serving.text_budget import TextBudget, message_chars

logger = logging.getLogger(__name__)

_OPENAI_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                       500: "InternalServerError", 503: "ServiceUnavailableError"}
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", "Connection": "keep-alive"}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str)


def _finite(obj: Any) -> Any:
    """JSON has no NaN/Infinity; like orjson in SGLang, send null for them."""
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            return None
        return obj
    if isinstance(obj, list):
        return [_finite(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    return obj


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=_dumps(_finite(obj)), status=status, content_type="application/json")


def sse(obj: Any) -> bytes:
    return b"data: " + _dumps(_finite(obj)).encode("utf-8") + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


@dataclass
class ServerState:
    model_path: str
    tokenizer_path: str | None
    served_model_name: str
    shutting_down: bool = False


WeightLoader = Callable[[str, "str | None"], Any]  # (path, load_format) -> nnx.State


class InferenceServer:
    """aiohttp application serving one Engine."""

    def __init__(self, engine: Engine, tokenizer: Any, *, model_path: str, served_model_name: str | None = None,
                 tokenizer_path: str | None = None, api_key: str | None = None,
                 weight_loader: WeightLoader | None = None, guard: G.GuardConfig | None = None,
                 max_text_chars: int | None = None, max_request_tokens: int | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.vocab_size = engine.vocab_size
        self.context_length = engine.context_length
        self.state = ServerState(model_path=str(model_path), tokenizer_path=tokenizer_path or str(model_path),
                                 served_model_name=served_model_name or str(model_path))
        self.api_key = api_key
        self._api_key_bytes = api_key.encode("utf-8") if api_key else None
        self.guard = guard or G.GuardConfig(prefix="--")
        self.connections = G.ConnectionGuard(self.guard, "inference server",
                                             error_body=lambda status, message: P.native_error_body(message))
        # Texts that could not fit the context in any tokenization are refused before tokenizing.
        self.budget = TextBudget(tokenizer, max_tokens=self.context_length, max_text_chars=max_text_chars)
        # Prompt + completion tokens over all sequences of one request (n and batch lists included).
        self.max_request_tokens = max_request_tokens or self.context_length * 1024
        self.weight_loader = weight_loader or default_weight_loader(engine)
        self._update_lock = asyncio.Lock()
        self._token_text_cache: dict[int, str] = {}

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        boundary = G.error_boundary(self._render_error, name="inference server")
        app = web.Application(middlewares=[boundary, self.connections.middleware(), self._auth_middleware,
                                           self._error_middleware], client_max_size=self.guard.max_body_bytes)
        r = app.router
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.*}", self.retrieve_model)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/get_model_info", self.get_model_info)
        r.add_get("/get_weight_version", self.get_weight_version)
        r.add_get("/get_server_info", self.get_server_info)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_shutdown(self, app: web.Application) -> None:
        self.state.shutting_down = True
        logger.info("shutting down: no new connections; waiting for in-flight requests")

    async def _on_cleanup(self, app: web.Application) -> None:
        await asyncio.to_thread(self.engine.shutdown)
        logger.info("engine stopped")

    @staticmethod
    def _is_openai(request: web.Request) -> bool:
        return request.path.startswith("/v1/")

    def _error(self, request: web.Request, message: str, status: int = 400) -> web.Response:
        if self._is_openai(request):
            err_type = _OPENAI_ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
            return json_response(P.openai_error_body(message, err_type=err_type, code=status), status)
        return json_response(P.native_error_body(message), status)

    def _render_error(self, request: web.BaseRequest, status: int, message: str) -> web.Response:
        if status in (404, 405):  # FastAPI's (hence SGLang's) body for unknown routes and methods
            return json_response({"detail": message}, status)
        return self._error(request, message, status)  # type: ignore[arg-type]

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler):
        if self._api_key_bytes and not request.path.startswith("/health"):
            if not G.bearer_matches(request.headers, self._api_key_bytes):
                return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler):
        try:
            return await handler(request)
        except P.ProtocolError as exc:
            return self._error(request, exc.message, exc.status)
        except EngineError as exc:
            logger.error("engine error on %s: %s", request.path, exc)
            return self._error(request, str(exc), 503 if self.state.shutting_down else 500)
        # Anything else (4xx from the guard or aiohttp, bugs) is handled by the error boundary.

    async def _json(self, request: web.Request) -> Any:
        return await G.read_json(request, self.guard, allow_nonfinite=True)

    # ------------------------------------------------------------------ helpers
    def token_text(self, token_id: int) -> str:
        text = self._token_text_cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text_cache[token_id] = text
        return text

    async def _encode_all(self, texts: Sequence[str], what: str) -> list[list[int]]:
        """Token ids of each text; texts that cannot fit the context are refused before tokenizing."""
        try:
            self.budget.check(texts, what)
        except ValueError as exc:
            raise P.ProtocolError(str(exc)) from None
        return await self.budget.encode_many(texts)

    def _refuse_long_input_ids(self, body: Any) -> None:
        """Prompts that cannot fit (one longer than the context, or more ids in all than the request may
        take) are refused before their ids are validated one by one."""
        ids = body.get("input_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            return
        seqs = [s for s in (ids if ids and isinstance(ids[0], list) else [ids]) if isinstance(s, list)]
        for seq in seqs:
            if len(seq) >= self.context_length:
                raise P.ProtocolError(f"The input ({len(seq)} tokens) is longer than the model's context length "
                                      f"({self.context_length} tokens).")
        if sum(map(len, seqs)) > self.max_request_tokens:
            raise P.ProtocolError(f"the request asks for more than {self.max_request_tokens} tokens (prompts plus "
                                  "completions over all its sequences; --max-request-tokens); split it")

    def _refuse_many_messages(self, body: Any) -> None:
        messages = body.get("messages") if isinstance(body, dict) else None
        if isinstance(messages, list) and len(messages) > self.context_length:
            raise P.ProtocolError(f"the messages: {self.budget.conversation_too_long(messages, 0)}")

    def _validate(self, ids: Sequence[int], sampling, total: list[int]) -> None:
        """Checks one prompt; ``total[0]`` accumulates the request's tokens against --max-request-tokens."""
        P.validate_prompt(ids, sampling, context_length=self.context_length, vocab_size=self.vocab_size)
        new = sampling.max_new_tokens if sampling.max_new_tokens is not None else self.context_length - len(ids)
        total[0] += (len(ids) + new) * sampling.n
        if total[0] > self.max_request_tokens:
            raise P.ProtocolError(f"the request asks for more than {self.max_request_tokens} tokens (prompts plus "
                                  "completions over all its sequences; --max-request-tokens); split it")

    def _submit_checked(self, spec: GenerationSpec, stream: bool):
        if self.state.shutting_down:
            raise P.ProtocolError("the server is shutting down", status=503)
        try:
            return self.engine.submit(spec, stream=stream, loop=asyncio.get_running_loop())
        except ValueError as exc:
            raise P.ProtocolError(str(exc)) from None

    async def _run_all(self, specs: Sequence[GenerationSpec]) -> list[SequenceOutput]:
        handles = [self._submit_checked(s, stream=False) for s in specs]
        try:
            return list(await asyncio.gather(*(h.next() for h in handles)))
        finally:
            for h in handles:
                h.cancel()  # no-op for finished sequences; aborts the rest if the client went away

    async def _stream_all(self, specs: Sequence[GenerationSpec]) -> AsyncIterator[tuple[int, SequenceOutput]]:
        """Cumulative outputs of several streamed sequences as they come: (index, output)."""
        handles = [self._submit_checked(s, stream=True) for s in specs]
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i, h):
            try:
                while True:
                    out = await h.next()
                    await merged.put((i, out, None))
                    if out.finished:
                        return
            except Exception as exc:
                await merged.put((i, None, exc))

        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
        remaining = len(handles)
        try:
            while remaining:
                i, out, exc = await merged.get()
                if exc is not None:
                    raise exc
                yield i, out
                if out.finished:
                    remaining -= 1
        finally:
            for h in handles:
                h.cancel()
            for t in tasks:
                t.cancel()

    async def _start_sse(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        await resp.prepare(request)
        return resp

    # ------------------------------------------------------------------ /generate
    async def _generate_specs(self, request: web.Request, req: P.GenerateRequest) -> list[GenerationSpec]:
        texts = [item.text or "" for item in req.items if item.input_ids is None]
        encoded = await self._encode_all(texts, "text") if texts else []
        return await G.parse_off_loop(request, self._build_generate_specs, req, encoded)

    def _build_generate_specs(self, req: P.GenerateRequest, encoded_texts: list[list[int]]) -> list[GenerationSpec]:
        encoded = iter(encoded_texts)
        specs, total = [], [0]
        for idx, item in enumerate(req.items):
            ids = list(item.input_ids) if item.input_ids is not None else next(encoded)
            self._validate(ids, item.sampling, total)
            base_rid = item.rid or P.new_request_id("")
            n = item.sampling.n
            for j in range(n):
                specs.append(item.spec(ids, sample_index=j, rid=base_rid if n == 1 else f"{base_rid}-{j}"))
        return specs

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._refuse_long_input_ids(body)
        req = await G.parse_off_loop(request, P.parse_generate_request, body, vocab_size=self.vocab_size)
        specs = await self._generate_specs(request, req)
        single = not req.is_batch and len(specs) == 1
        build = functools.partial(P.build_generate_response, return_text_in_logprobs=req.return_text_in_logprobs,
                                  token_text=self.token_text)
        if not req.stream:
            outs = await self._run_all(specs)
            results = [build(o, s) for o, s in zip(outs, specs)]
            return json_response(results[0] if single else results)
        resp = await self._start_sse(request)
        async for i, out in self._stream_all(specs):
            chunk = build(out, specs[i], index=None if single else i)
            await resp.write(sse(chunk))
        await resp.write(SSE_DONE)
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ /v1/chat/completions
    async def _chat_prompt(self, req: P.ChatRequest) -> list[int]:
        if req.input_ids is not None:
            return list(req.input_ids)
        messages = req.messages
        prefix = None
        if messages and messages[-1]["role"] == "assistant" and isinstance(messages[-1].get("content"), str):
            if req.continue_final_message:
                prefix, messages = messages[-1]["content"], messages[:-1]
            else:
                messages = messages[:-1] + [{"role": "user", "content": messages[-1]["content"]}]
        tools = req.tools if req.tool_choice != "none" else None
        chars = message_chars(messages, tools) + len(prefix or "")
        why = self.budget.conversation_too_long(messages, chars)
        if why is not None:
            raise P.ProtocolError(f"the messages: {why}")
        try:
            ids = await self.budget.render(messages, chars=chars, tools=tools, **req.chat_template_kwargs)
        except Exception as exc:  # template errors are the request's fault (roles, missing fields)
            raise P.ProtocolError(f"failed to apply the chat template: {type(exc).__name__}: {exc}") from None
        if prefix:
            ids += (await self._encode_all([prefix], "the final assistant message"))[0]
        return ids

    def _chat_specs(self, req: P.ChatRequest, ids: list[int]) -> list[GenerationSpec]:
        self._validate(ids, req.sampling, [0])
        base = req.rid or P.new_request_id("")
        return [GenerationSpec(prompt_ids=tuple(ids), sampling=req.sampling, return_logprob=req.logprobs,
                               top_logprobs_num=req.top_logprobs, rid=base if req.sampling.n == 1 else f"{base}-{j}",
                               sample_index=j)
                for j in range(req.sampling.n)]

    def _parse_tools(self, req: P.ChatRequest, text: str) -> tuple[str, list[dict] | None]:
        if not req.tools or req.tool_choice == "none":
            return text, None
        content, calls = TC.parse_tool_calls(text, req.tools)
        if not calls:
            return text, None
        return content, TC.openai_tool_calls(calls)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._refuse_many_messages(body)
        req = await G.parse_off_loop(request, P.parse_chat_request, body, vocab_size=self.vocab_size)
        ids = await self._chat_prompt(req)
        specs = self._chat_specs(req, ids)
        request_id = "chatcmpl-" + (req.rid or P.new_request_id(""))
        created = int(time.time())
        if not req.stream:
            outs = await self._run_all(specs)
            choices = []
            for i, out in enumerate(outs):
                content, calls = self._parse_tools(req, out.text)
                finish, matched = P.openai_finish(out.finish_reason)
                if calls and finish == "stop":
                    finish, matched = "tool_calls", None
                logprobs = (P.chat_logprobs(out.output_ids, out.output_logprobs, out.output_top_logprobs,
                                            self.token_text) if req.logprobs else None)
                choices.append(P.chat_choice(i, P.chat_message(content, calls), finish_reason=finish,
                                             matched_stop=matched, logprobs=logprobs))
            usage = P.usage_info(len(ids), sum(len(o.output_ids) for o in outs))
            return json_response(P.build_chat_response(request_id=request_id, model=req.model, created=created,
                                                       choices=choices, usage=usage,
                                                       weight_version=outs[0].weight_version))
        return await self._chat_stream(request, req, specs, ids, request_id, created)

    async def _chat_stream(self, request, req: P.ChatRequest, specs, ids, request_id, created):
        resp = await self._start_sse(request)
        use_tools = bool(req.tools) and req.tool_choice != "none"
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        completion: dict[int, int] = {}
        chunk = functools.partial(P.chat_chunk, request_id=request_id, model=req.model, created=created)
        for i in range(len(specs)):
            await resp.write(sse(chunk(index=i, delta={"role": "assistant", "content": ""})))
            sent_text[i] = sent_tokens[i] = completion[i] = 0
        async for i, out in self._stream_all(specs):
            completion[i] = len(out.output_ids)
            logprobs = None
            if req.logprobs and len(out.output_ids) > sent_tokens[i]:
                a = sent_tokens[i]
                logprobs = P.chat_logprobs(out.output_ids[a:], out.output_logprobs[a:],
                                           out.output_top_logprobs[a:] if out.output_top_logprobs else None,
                                           self.token_text)
                sent_tokens[i] = len(out.output_ids)
            usage = (P.usage_info(len(ids), completion[i]) if req.continuous_usage_stats else None)
            if not out.finished:
                safe = TC.safe_stream_prefix(out.text) if use_tools else len(out.text)
                delta_text = out.text[sent_text[i]:safe] if safe > sent_text[i] else ""
                if delta_text or logprobs:
                    await resp.write(sse(chunk(index=i, delta={"content": delta_text}, logprobs=logprobs,
                                               usage=usage)))
                    sent_text[i] = max(sent_text[i], safe)
                continue
            content, calls = self._parse_tools(req, out.text)
            finish, matched = P.openai_finish(out.finish_reason)
            delta: dict[str, Any] = {}
            if calls:
                if finish == "stop":
                    finish, matched = "tool_calls", None
                remaining = content[sent_text[i]:] if len(content) > sent_text[i] else ""
                if remaining:
                    delta["content"] = remaining
                delta["tool_calls"] = calls
            else:
                delta["content"] = out.text[sent_text[i]:]
            await resp.write(sse(chunk(index=i, delta=delta, finish_reason=finish, matched_stop=matched,
                                       logprobs=logprobs, usage=usage)))
        if req.include_usage:
            usage = P.usage_info(len(ids), sum(completion.values()))
            await resp.write(sse(chunk(index=0, usage=usage, empty_choices=True)))
        await resp.write(SSE_DONE)
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ /v1/completions
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        req = await G.parse_off_loop(request, P.parse_completion_request, body, vocab_size=self.vocab_size)
        texts = [p for p in req.prompts if not isinstance(p, tuple)]
        encoded = iter(await self._encode_all(texts, "prompt") if texts else [])
        prompts_ids = [list(p) if isinstance(p, tuple) else next(encoded) for p in req.prompts]
        prompt_texts = [p if isinstance(p, str) else self.tokenizer.decode(list(p)) for p in req.prompts]
        want_lp = req.logprobs is not None
        specs = []
        base = req.rid or P.new_request_id("")
        total = [0]
        for p, ids in enumerate(prompts_ids):
            self._validate(ids, req.sampling, total)
            for j in range(req.sampling.n):
                specs.append(GenerationSpec(prompt_ids=tuple(ids), sampling=req.sampling, return_logprob=want_lp,
                                            top_logprobs_num=req.logprobs or 0,
                                            logprob_start_len=0 if (req.echo and want_lp) else -1,
                                            rid=f"{base}-{p}-{j}", sample_index=j))
        n = req.sampling.n
        request_id = "cmpl-" + base
        created = int(time.time())

        def logprobs_of(out: SequenceOutput, first: bool) -> dict | None:
            if not want_lp:
                return None
            ids = list(out.output_ids)
            lps: list[float | None] = list(out.output_logprobs)
            tops = list(out.output_top_logprobs) if req.logprobs else None
            if req.echo and first:
                ids = out.prompt_ids + ids
                lps = list(out.input_logprobs or []) + lps
                if tops is not None:
                    tops = list(out.input_top_logprobs or []) + tops
            return P.completion_logprobs(ids, lps, tops, self.token_text)

        if not req.stream:
            outs = await self._run_all(specs)
            choices = []
            for k, out in enumerate(outs):
                text = (prompt_texts[k // n] + out.text) if req.echo else out.text
                finish, matched = P.openai_finish(out.finish_reason)
                choices.append(P.completion_choice(k, text, finish_reason=finish, matched_stop=matched,
                                                   logprobs=logprobs_of(out, True)))
            usage = P.usage_info(sum(len(i) for i in prompts_ids), sum(len(o.output_ids) for o in outs))
            return json_response(P.build_completion_response(request_id=request_id, model=req.model,
                                                             created=created, choices=choices, usage=usage,
                                                             weight_version=outs[0].weight_version))
        resp = await self._start_sse(request)
        sent_text = {k: 0 for k in range(len(specs))}
        sent_tokens = {k: 0 for k in range(len(specs))}
        completion = {k: 0 for k in range(len(specs))}
        first = {k: True for k in range(len(specs))}
        async for k, out in self._stream_all(specs):
            completion[k] = len(out.output_ids)
            text = out.text[sent_text[k]:]
            if req.echo and first[k]:
                text = prompt_texts[k // n] + text
            sent_text[k] = len(out.text)
            lp = None
            if want_lp:
                a = sent_tokens[k]
                partial = SequenceOutput(rid=out.rid, prompt_ids=out.prompt_ids, output_ids=out.output_ids[a:],
                                         output_logprobs=out.output_logprobs[a:],
                                         output_top_logprobs=out.output_top_logprobs[a:],
                                         input_logprobs=out.input_logprobs,
                                         input_top_logprobs=out.input_top_logprobs)
                lp = logprobs_of(partial, first[k])
                sent_tokens[k] = len(out.output_ids)
            finish, matched = P.openai_finish(out.finish_reason)
            if text or lp or finish:
                usage = (P.usage_info(len(prompts_ids[k // n]), completion[k]) if req.continuous_usage_stats
                         else None)
                await resp.write(sse(P.completion_chunk(
                    request_id=request_id, model=req.model, created=created, usage=usage,
                    choices=[P.completion_choice(k, text, finish_reason=finish, matched_stop=matched, logprobs=lp)])))
            first[k] = False
        if req.include_usage:
            usage = P.usage_info(sum(len(i) for i in prompts_ids), sum(completion.values()))
            await resp.write(sse(P.completion_chunk(request_id=request_id, model=req.model, created=created,
                                                    choices=[], usage=usage)))
        await resp.write(SSE_DONE)
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ info / health
    async def models(self, request: web.Request) -> web.Response:
        return json_response(P.model_list(self.state.served_model_name, self.context_length))

    async def retrieve_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.state.served_model_name:
            return json_response({"error": {"message": f"The model '{name}' does not exist",
                                            "type": "invalid_request_error", "param": "model",
                                            "code": "model_not_found"}}, 404)
        return json_response(P.model_list(name, self.context_length)["data"][0])

    async def health(self, request: web.Request) -> web.Response:
        if self.state.shutting_down or not self.engine.alive:
            return web.Response(status=503)
        return web.Response(status=200)

    async def get_model_info(self, request: web.Request) -> web.Response:
        return json_response(P.model_info(model_path=self.state.model_path, tokenizer_path=self.state.tokenizer_path,
                                          weight_version=self.engine.weight_version))

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return json_response({"weight_version": self.engine.weight_version})

    async def get_server_info(self, request: web.Request) -> web.Response:
        cfg = self.engine.config
        return json_response({"model_path": self.state.model_path, "served_model_name": self.state.served_model_name,
                              "context_length": self.context_length, "max_running_requests": cfg.max_batch_size,
                              "weight_version": self.engine.weight_version, "version": "openclaw-jax",
                              "paused": self.engine.paused, "max_text_chars": self.budget.max_text_chars,
                              "connections": dataclasses.asdict(self.connections.stats)})

    # ------------------------------------------------------------------ weights / control
    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            upd = P.parse_update_weights_request(await self._json(request))
        except P.ProtocolError as exc:
            return json_response(P.update_weights_body(False, exc.message), 400)
        except G.RequestRejected as exc:
            return json_response(P.update_weights_body(False, exc.message), exc.status)
        async with self._update_lock:
            try:
                state = await asyncio.to_thread(self.weight_loader, upd.model_path, upd.load_format)
                if upd.abort_all_requests:
                    await asyncio.to_thread(self.engine.abort_all, "Aborted for a weight update.")
                await asyncio.to_thread(self.engine.swap_weights, state, upd.weight_version)
            except Exception as exc:
                logger.warning("weight update from %s failed: %s", upd.model_path, exc)
                return json_response(P.update_weights_body(
                    False, f"Failed to update weights: {type(exc).__name__}: {exc}. Rolling back to the previous "
                           f"weights (weight_version {self.engine.weight_version})."), 400)
        message = "Succeeded to update model weights."
        if upd.weight_version is not None:
            message += f" Weight version updated to {upd.weight_version}."
        self.state.model_path = upd.model_path
        return json_response(P.update_weights_body(True, message, 0))

    async def pause_generation(self, request: web.Request) -> web.Response:
        raw = await G.read_body(request, self.guard)
        mode = "abort"
        if raw.strip():
            body = await G.decode_json(raw, self.guard, allow_nonfinite=True)
            if isinstance(body, dict) and body.get("mode") is not None:
                mode = body["mode"]
        if mode not in ("abort", "in_place", "retract"):
            raise P.ProtocolError(f"mode must be 'abort', 'in_place' or 'retract', got {mode!r}")
        await asyncio.to_thread(self.engine.pause, mode == "abort")
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.engine.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        # There is no prefix cache to flush: every sequence is prefilled from scratch.
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n", status=200)

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if isinstance(body, dict) and body.get("abort_all"):
            await asyncio.to_thread(self.engine.abort_all, "Aborted by /abort_request.")
        return web.Response(status=200)


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------
def default_weight_loader(engine: Engine) -> WeightLoader:
    """HF safetensors directory -> params with the served model's structure and dtypes."""

    def load(path: str, load_format: str | None):
        from flax import nnx

        from openclaw_jax.models.config import ModelConfig
        from openclaw_jax.models.weights import load_hf_checkpoint
        if load_format not in (None, "auto", "safetensors", "hf"):
            raise ValueError(f"load_format={load_format!r} is not supported; use 'auto' (HF safetensors)")
        p = Path(path)
        if not p.is_dir():
            raise FileNotFoundError(f"model_path {path} is not a directory")
        served: ModelConfig = engine.model_config
        model, cfg = load_hf_checkpoint(p, dtype=served.param_dtype)
        for name in ("family", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "tie_word_embeddings", "attention_bias", "qk_norm"):
            if getattr(cfg, name) != getattr(served, name):
                raise ValueError(f"checkpoint {path} has {name}={getattr(cfg, name)!r}, the served model has "
                                 f"{getattr(served, name)!r}")
        return nnx.split(model)[1]

    return load


def load_for_serving(model: str, *, dtype: str | None = None):
    """(Decoder, Tokenizer, hf_config, model_path) for `--model` (an HF directory or 'smollm2')."""
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained(model, dtype=dtype)
    return pre.model, pre.tokenizer, pre.hf_config, str(pre.source)


def context_length_from(hf_config: dict | None, model_cfg, override: int | None) -> int:
    if override is not None:
        if override < 2:
            raise ValueError(f"--context-length={override} must be >= 2")
        return int(override)
    for key in ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"):
        if hf_config and isinstance(hf_config.get(key), int):
            return int(hf_config[key])
    return int(model_cfg.max_position_embeddings)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m openclaw_jax.inference.server",
                                 description="SGLang-compatible server around the JAX engine")
    ap.add_argument("--model", "--model-path", dest="model", required=True,
                    help="an HF checkpoint directory (config.json, safetensors, tokenizer.json) or 'smollm2'")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed on stdout)")
    ap.add_argument("--context-length", type=int, default=None, help="default: from the model config")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>'")
    ap.add_argument("--weight-version", default="default")
    ap.add_argument("--dtype", default=None, choices=[None, "float32", "bfloat16"])
    ap.add_argument("--max-running-requests", type=int, default=16, help="largest decode batch")
    ap.add_argument("--min-prompt-bucket", type=int, default=16)
    ap.add_argument("--min-cache-bucket", type=int, default=64)
    ap.add_argument("--min-batch-bucket", type=int, default=1)
    ap.add_argument("--kv-cache-budget-gb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--shutdown-timeout", type=float, default=30.0)
    ap.add_argument("--log-level", default="info")
    limits = G.add_cli_arguments(ap)
    limits.add_argument("--max-text-chars", type=int, default=None,
                        help="longest text/prompt/messages in characters (400 before tokenizing; default: the most "
                             "characters that could fit the context length in any tokenization)")
    limits.add_argument("--max-request-tokens", type=int, default=None,
                        help="most prompt + completion tokens over all sequences of one request (400; default: "
                             "1024 x the context length)")
    return ap


def _bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(server: InferenceServer, sock: socket.socket, shutdown_timeout: float) -> None:
    return_large_blocks_to_the_os()
    app = server.make_app()
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout,
                           **server.guard.runner_kwargs())
    await runner.setup()
    site = G.GuardedSite(runner, sock, server.connections)
    await site.start()
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    host, port = sock.getsockname()[:2]
    # One machine-readable line for launchers and tests.
    print(f"READY http://{host}:{port}", flush=True)
    logger.info("serving %s on http://%s:%d", server.state.served_model_name, host, port)
    await stop.wait()
    logger.info("signal received: shutting down gracefully")
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_arg_parser()
    args = ap.parse_args(argv)
    try:
        guard = G.config_from_cli(args)
        for flag in ("max_text_chars", "max_request_tokens"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be >= 1")
    except ValueError as exc:
        ap.error(str(exc))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    model, tokenizer, hf_config, source = load_for_serving(args.model, dtype=args.dtype)
    context_length = context_length_from(hf_config, model.cfg, args.context_length)
    engine = Engine(model, tokenizer, context_length=context_length, weight_version=args.weight_version,
                    seed=args.seed,
                    config=EngineConfig(max_batch_size=args.max_running_requests,
                                        min_prompt_bucket=args.min_prompt_bucket,
                                        min_cache_bucket=args.min_cache_bucket,
                                        min_batch_bucket=args.min_batch_bucket,
                                        kv_cache_budget_bytes=int(args.kv_cache_budget_gb * (1 << 30))))
    name = args.served_model_name or (args.model if args.model == "smollm2" else str(Path(args.model).name))
    server = InferenceServer(engine, tokenizer, model_path=source, served_model_name=name, api_key=args.api_key,
                             guard=guard, max_text_chars=args.max_text_chars,
                             max_request_tokens=args.max_request_tokens)
    sock = _bind_socket(args.host, args.port)
    try:
        asyncio.run(serve(server, sock, args.shutdown_timeout))
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
