"""SGLang-compatible HTTP server around the JAX engine (docs/design.md §8).

    python -m openclaw_jax.inference --model <HF checkpoint dir | smollm2> --host 127.0.0.1 --port 30000

Endpoints (the subset the project relies on, with SGLang's shapes, status codes and error
bodies): `/generate` (single, batch lists, n > 1, streaming), `/v1/chat/completions`
(logprobs, streaming, `<tool_call>` parsing), `/v1/completions`, `/v1/models`, `/health`,
`/get_model_info`, `/update_weights_from_disk`, `/pause_generation`,
`/continue_generation`, `/flush_cache`.

Every request-shaped problem is a 4xx with an SGLang body (one error boundary: see
`openclaw_jax.http.http_guard`; a 500 is a bug and carries a trace id). Bodies, texts and
prompts are size-checked before any work; large bodies are decoded and large texts tokenized
on worker threads, so one huge request does not stall the others; all JAX work happens on
the engine thread. Connections are capped and must send their headers within a timeout.
SIGTERM/SIGINT stop accepting connections, let in-flight requests finish (up to
`--shutdown-timeout`), then stop the engine.

Control: with an API key every route but `/health*` needs ``Authorization: Bearer <key>``; a
server bound beyond loopback must have one (`check_exposure`), so that nobody else who reaches the
port can pause it, abort requests, flush its cache or swap its weights. `/update_weights_from_disk`
loads only from the configured weight directories (`--weight-dir`); any other path gets the same
answer whether or not it exists. Images are measured from their headers and bounded
(`wire.images.ImageLimits`) before any decoding, which runs on a worker thread; an image that does
not decode is a 400.

Modules: this one (the app, native routes, weights and control), `openai_routes` (the OpenAI
endpoints), `loading` (models and the weight loader), `cli` (the command line); the wire formats
are :mod:`openclaw_jax.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from aiohttp import web

from openclaw_jax.inference import protocol as P
from openclaw_jax.inference.engine import Engine, EngineError
from openclaw_jax.inference.loading import WeightLoader, default_weight_loader, vl_weight_loader
from openclaw_jax.inference.openai_routes import OpenAIRoutes, json_response
from openclaw_jax.inference.types import GenerationSpec, SequenceOutput
from openclaw_jax.inference.vision import (ImageRequestError, VisionGenerator, image_sequence_output,
                                           swap_served_weights)
from openclaw_jax.http import http_guard as G
from openclaw_jax.http.text_budget import TextBudget
from openclaw_jax.wire import openai as O
from openclaw_jax.wire import sglang as S
from openclaw_jax.wire.sglang_results import build_generate_response
from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.images import ImageLimits

logger = logging.getLogger(__name__)

# (method, path, handler name) of every endpoint; the OpenAI handlers come from `OpenAIRoutes`.
_ROUTES = (
    ("POST", "/generate", "generate"), ("PUT", "/generate", "generate"),
    ("POST", "/v1/chat/completions", "chat_completions"), ("POST", "/v1/completions", "completions"),
    ("GET", "/v1/models", "models"), ("GET", "/v1/models/{model:.*}", "retrieve_model"),
    ("GET", "/health", "health"), ("GET", "/health_generate", "health"), ("GET", "/get_model_info", "get_model_info"),
    ("GET", "/get_weight_version", "get_weight_version"), ("GET", "/get_server_info", "get_server_info"),
    ("POST", "/update_weights_from_disk", "update_weights_from_disk"),
    ("POST", "/pause_generation", "pause_generation"), ("POST", "/continue_generation", "continue_generation"),
    ("GET", "/flush_cache", "flush_cache"), ("POST", "/flush_cache", "flush_cache"),
    ("POST", "/abort_request", "abort_request"), ("POST", "/load_lora_adapter", "load_lora_adapter"),
    ("POST", "/expect_request", "expect_request"),
)


API_KEY_ENV = "OPENCLAW_POLICY_API_KEY"   # the key, when --api-key is not given (kept off the process list)


def check_exposure(host: str, api_key: str | None) -> None:
    """A server reachable from other machines must require a key: ValueError (saying what to do) otherwise."""
    if api_key or G.is_loopback_host(host):
        return
    raise ValueError(f"--host {host} is reachable from other machines, and the server has no API key: anyone who "
                     "reaches the port could swap its weights, pause it or abort its requests. Give --api-key (or set "
                     f"{API_KEY_ENV}; clients send it as 'Authorization: Bearer <key>'), or bind 127.0.0.1")


class WeightDirectories:
    """Where `/update_weights_from_disk` may load from: the real paths of the configured directories."""

    def __init__(self, directories: Sequence[str] = ()) -> None:
        self.roots = tuple(os.path.realpath(d) for d in directories)

    def check(self, path: str) -> str:
        """The real path of ``path`` when it lies inside a configured directory; else ValueError, whose
        message is the same whether or not ``path`` exists."""
        if not self.roots:
            raise ValueError("this server loads no weights over HTTP: start it with --weight-dir DIR (the directory "
                             "the trainer writes its weights to)")
        real = os.path.realpath(path) if isinstance(path, str) and path and "\0" not in path else ""
        if real and any(real != root and os.path.commonpath([real, root]) == root for root in self.roots):
            return real
        raise ValueError("model_path is not inside a weight directory of this server (--weight-dir)")


@dataclass
class ServerState:
    model_path: str
    tokenizer_path: str | None
    served_model_name: str
    shutting_down: bool = False


class InferenceServer(OpenAIRoutes):
    """aiohttp application serving one Engine (the OpenAI endpoints come from `OpenAIRoutes`)."""

    def __init__(self, engine: Engine, tokenizer: Any, *, model_path: str, served_model_name: str | None = None,
                 tokenizer_path: str | None = None, api_key: str | None = None,
                 weight_loader: WeightLoader | None = None, guard: G.GuardConfig | None = None,
                 max_text_chars: int | None = None, max_request_tokens: int | None = None,
                 vision: VisionGenerator | None = None, weight_dirs: Sequence[str] = (),
                 image_limits: ImageLimits | None = None):
        self.engine = engine
        # the image path of a Qwen2.5-VL model (inference/vision.py; the engine serves its text decoder)
        self.vision = vision
        self.tokenizer = tokenizer
        self.vocab_size = engine.vocab_size
        self.context_length = engine.context_length
        self.state = ServerState(model_path=str(model_path), tokenizer_path=tokenizer_path or str(model_path),
                                 served_model_name=served_model_name or str(model_path))
        self.api_key = api_key
        self._api_key_bytes = api_key.encode("utf-8") if api_key else None
        self.guard = guard or G.GuardConfig(prefix="--")
        self.connections = G.ConnectionGuard(self.guard, "inference server",
                                             error_body=lambda status, message: S.native_error_body(message))
        # Texts that could not fit the context in any tokenization are refused before tokenizing.
        self.budget = TextBudget(tokenizer, max_tokens=self.context_length, max_text_chars=max_text_chars)
        # Prompt + completion tokens over all sequences of one request (n and batch lists included).
        self.max_request_tokens = max_request_tokens or self.context_length * 1024
        self._weight_loader = weight_loader   # None: the default for what is served (`weight_loader`)
        self.weight_dirs = WeightDirectories(weight_dirs)
        self.image_limits = image_limits or ImageLimits(prefix="--")
        self._update_lock = asyncio.Lock()
        self._token_text_cache: dict[int, str] = {}

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        boundary = G.error_boundary(self._render_error, name="inference server")
        app = web.Application(middlewares=[boundary, self.connections.middleware(), self._auth_middleware,
                                           self._error_middleware], client_max_size=self.guard.max_body_bytes)
        for method, path, handler in _ROUTES:
            app.router.add_route(method, path, getattr(self, handler))
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
            return json_response(O.flat_error_body(message, status), status)
        return json_response(S.native_error_body(message), status)

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
        except WireError as exc:
            return self._error(request, exc.message, exc.status)
        except EngineError as exc:
            logger.error("engine error on %s: %s", request.path, exc)
            return self._error(request, str(exc), 503 if self.state.shutting_down else 500)
        # Anything else (4xx from the guard or aiohttp, bugs) is handled by the error boundary.

    async def _json(self, request: web.Request) -> Any:
        return await G.read_json(request, self.guard, allow_nonfinite=True)

    @property
    def weight_loader(self) -> WeightLoader:
        """`/update_weights_from_disk`'s loader: the one given, else a Qwen2.5-VL directory's (whole model)
        when the server has an image path, else a text decoder's."""
        if self._weight_loader is not None:
            return self._weight_loader
        return vl_weight_loader(self.vision) if self.vision is not None else default_weight_loader(self.engine)

    @weight_loader.setter
    def weight_loader(self, loader: WeightLoader | None) -> None:
        self._weight_loader = loader

    def swap_weights(self, state: Any, weight_version: str | None = None) -> None:
        """New weights into everything that serves: the engine, and with an image path the whole QwenVL
        (`swap_served_weights`: one version, checked before either changes). Blocking."""
        if self.vision is not None:
            swap_served_weights(self.engine, self.vision, state, weight_version)
        else:
            self.engine.swap_weights(state, weight_version)

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
            raise WireError(str(exc)) from None
        return await self.budget.encode_many(texts)

    def _refuse_long_input_ids(self, body: Any) -> None:
        """Prompts that cannot fit (one longer than the context, or more ids in all than the request may
        take) are refused before their ids are validated one by one."""
        ids = body.get("input_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            return
        seqs = [s for s in (ids if ids and isinstance(ids[0], list) else [ids]) if isinstance(s, list)]
        for seq in seqs:
            P.check_prompt_length(len(seq), self.context_length)
        self._check_request_tokens(sum(map(len, seqs)))

    def _check_request_tokens(self, total: int) -> None:
        if total > self.max_request_tokens:
            raise WireError(f"the request asks for more than {self.max_request_tokens} tokens (prompts plus "
                            "completions over all its sequences; --max-request-tokens); split it")

    def _refuse_many_messages(self, body: Any) -> None:
        messages = body.get("messages") if isinstance(body, dict) else None
        if isinstance(messages, list) and len(messages) > self.context_length:
            raise WireError(f"the messages: {self.budget.conversation_too_long(messages, 0)}")

    def _validate(self, ids: Sequence[int], sampling, total: list[int]) -> None:
        """Checks one prompt; ``total[0]`` accumulates the request's tokens against --max-request-tokens."""
        P.validate_prompt(ids, sampling, context_length=self.context_length, vocab_size=self.vocab_size)
        new = sampling.max_new_tokens if sampling.max_new_tokens is not None else self.context_length - len(ids)
        total[0] += (len(ids) + new) * sampling.n
        self._check_request_tokens(total[0])

    def _submit_checked(self, spec: GenerationSpec, stream: bool):
        if self.state.shutting_down:
            raise WireError("the server is shutting down", status=503)
        try:
            return self.engine.submit(spec, stream=stream, loop=asyncio.get_running_loop())
        except ValueError as exc:
            raise WireError(str(exc)) from None

    async def _run_all(self, specs: Sequence[GenerationSpec]) -> list[SequenceOutput]:
        handles = [self._submit_checked(s, stream=False) for s in specs]
        try:
            return list(await asyncio.gather(*(h.next() for h in handles)))
        finally:
            for h in handles:
                h.cancel()  # no-op for finished sequences; aborts the rest if the client went away

    @contextlib.asynccontextmanager
    async def _client_stream(self, specs: Sequence[GenerationSpec]) -> AsyncIterator[AsyncIterator[tuple[int, SequenceOutput]]]:
        """`_stream_all(specs)` for a streamed response: a client that goes away mid-stream ends it
        quietly (its sequences are cancelled at once, not when the generator is collected)."""
        outputs = self._stream_all(specs)
        try:
            yield outputs
        except ConnectionResetError:
            logger.info("the client closed a streamed response early; its %d sequence(s) cancelled", len(specs))
        finally:
            await outputs.aclose()

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
        resp = web.StreamResponse(status=200, headers={**O.SSE_HEADERS, "Connection": "keep-alive"})
        await resp.prepare(request)
        return resp

    # ------------------------------------------------------------------ /generate
    async def _generate_specs(self, request: web.Request, req: S.GenerateRequest) -> list[GenerationSpec]:
        texts = [item.text or "" for item in req.items if item.input_ids is None]
        encoded = await self._encode_all(texts, "text") if texts else []
        return await G.parse_off_loop(request, self._build_generate_specs, req, encoded)

    def _build_generate_specs(self, req: S.GenerateRequest, encoded_texts: list[list[int]]) -> list[GenerationSpec]:
        encoded = iter(encoded_texts)
        specs, total = [], [0]
        for idx, item in enumerate(req.items):
            ids = list(item.input_ids) if item.input_ids is not None else next(encoded)
            self._validate(ids, item.sampling, total)
            base_rid = item.rid or O.new_id("")
            n = item.sampling.n
            for j in range(n):
                specs.append(GenerationSpec.of_item(item, ids, sample_index=j,
                                                    rid=base_rid if n == 1 else f"{base_rid}-{j}"))
        return specs

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._refuse_long_input_ids(body)
        req = await G.parse_off_loop(request, S.parse_generate_request, body, vocab_size=self.vocab_size,
                                     image_limits=self.image_limits)
        if any(item.images for item in req.items):
            if any(item.lora_path is not None for item in req.items):
                raise WireError("lora_path is not served with images: the image path runs the base model",
                                param="lora_path")
            return await self._generate_with_images(request, req)
        specs = await self._generate_specs(request, req)
        single = not req.is_batch and len(specs) == 1
        build = functools.partial(build_generate_response, return_text_in_logprobs=req.return_text_in_logprobs,
                                  token_text=self.token_text)
        if not req.stream:
            outs = await self._run_all(specs)
            results = [build(o, s) for o, s in zip(outs, specs)]
            return json_response(results[0] if single else results)
        resp = await self._start_sse(request)
        async with self._client_stream(specs) as outputs:
            async for i, out in outputs:
                chunk = build(out, specs[i], index=None if single else i)
                await resp.write(O.sse_event(chunk))
            await resp.write(O.SSE_DONE)
            await resp.write_eof()
        return resp

    async def _generate_with_images(self, request: web.Request, req: S.GenerateRequest) -> web.Response:
        """A prompt with `image_data`: served by `self.vision` (inference/vision.py, a QwenVL), one sequence,
        not streamed; a server without it refuses."""
        vision = self.vision
        if vision is None:
            raise WireError("this server's model reads text only: image_data is not served", param="image_data")
        if req.stream:
            raise WireError("a prompt with images is not streamed; send stream=false", param="stream")
        (item,) = req.items
        ids = list(item.input_ids) if item.input_ids is not None else (await self._encode_all([item.text], "text"))[0]
        self._validate(ids, item.sampling, [0])
        spec = GenerationSpec.of_item(item, ids, rid=item.rid or O.new_id(""))
        try:   # decoding and the model both off the loop
            out = await asyncio.get_running_loop().run_in_executor(None, functools.partial(
                image_sequence_output, vision, self.tokenizer, item, ids,
                eos_token_ids=sorted(self.engine.eos_token_ids), weight_version=self.engine.weight_version,
                rid=spec.rid, max_decode_pixels=self.image_limits.max_image_pixels))
        except ImageRequestError as err:
            raise WireError(f"image_data: {err}", param="image_data") from None
        return json_response(build_generate_response(out, spec, return_text_in_logprobs=req.return_text_in_logprobs,
                                                     token_text=self.token_text))

    # ------------------------------------------------------------------ info / health
    async def models(self, request: web.Request) -> web.Response:
        return json_response(O.model_list(self._model_card(self.state.served_model_name)))

    def _model_card(self, name: str) -> dict[str, Any]:
        return O.model_card(name, O.now_s(), owned_by=S.OWNED_BY, root=name, parent=None,
                            max_model_len=self.context_length)

    async def retrieve_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.state.served_model_name:
            return json_response(O.error_body(f"The model '{name}' does not exist", param="model",
                                              code="model_not_found"), 404)
        return json_response(self._model_card(name))

    async def health(self, request: web.Request) -> web.Response:
        if self.state.shutting_down or not self.engine.alive:
            return web.Response(status=503)
        return web.Response(status=200)

    async def get_model_info(self, request: web.Request) -> web.Response:
        return json_response(S.model_info(model_path=self.state.model_path, tokenizer_path=self.state.tokenizer_path,
                                          weight_version=self.engine.weight_version))

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return json_response({"weight_version": self.engine.weight_version})

    async def get_server_info(self, request: web.Request) -> web.Response:
        cfg = self.engine.config
        return json_response({"model_path": self.state.model_path, "served_model_name": self.state.served_model_name,
                              "context_length": self.context_length, "max_running_requests": cfg.max_batch_size,
                              "weight_version": self.engine.weight_version, "version": "openclaw-jax",
                              "paused": self.engine.paused, "max_text_chars": self.budget.max_text_chars,
                              "connections": dataclasses.asdict(self.connections.stats),
                              "compile_ahead": dataclasses.asdict(self.engine.ahead_stats),
                              "expecting_request_s": round(self.engine.expecting_request_s, 3)})

    # ------------------------------------------------------------------ weights / control
    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            upd = S.parse_update_weights_request(await self._json(request))
        except WireError as exc:
            return json_response(S.update_weights_body(False, exc.message), 400)
        except G.RequestRejected as exc:
            return json_response(S.update_weights_body(False, exc.message), exc.status)
        try:
            model_path = self.weight_dirs.check(upd.model_path)
        except ValueError as exc:
            logger.warning("weight update refused: %s", exc)
            return json_response(S.update_weights_body(False, str(exc)), 400)
        async with self._update_lock:
            try:
                started = time.perf_counter()
                state = await asyncio.to_thread(self.weight_loader, model_path, upd.load_format)
                logger.info("weight update: %s loaded in %.1f s", model_path, time.perf_counter() - started)
                if upd.abort_all_requests:
                    await asyncio.to_thread(self.engine.abort_all, "Aborted for a weight update.")
                await asyncio.to_thread(self.swap_weights, state, upd.weight_version)
            except Exception as exc:
                logger.warning("weight update from %s failed: %s", upd.model_path, exc)
                return json_response(S.update_weights_body(
                    False, f"Failed to update weights: {type(exc).__name__}: {exc}. Rolling back to the previous "
                           f"weights (weight_version {self.engine.weight_version})."), 400)
        message = "Succeeded to update model weights."
        if upd.weight_version is not None:
            message += f" Weight version updated to {upd.weight_version}."
        self.state.model_path = upd.model_path
        return json_response(S.update_weights_body(True, message, 0))

    async def pause_generation(self, request: web.Request) -> web.Response:
        raw = await G.read_body(request, self.guard)
        mode = S.parse_pause_mode(await G.decode_json(raw, self.guard, allow_nonfinite=True) if raw.strip() else None)
        await asyncio.to_thread(self.engine.pause, mode == "abort")
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.engine.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def expect_request(self, request: web.Request) -> web.Response:
        """Ours: {"within_s"}: a request is coming (a person's turn has begun); until it arrives, for that long
        at most, the engine's background work (recomputing prefixes for new weights, compiling ahead) waits."""
        held = self.engine.expect_request(S.parse_expect_request(await self._json(request)))
        return json_response({"status": "ok", "held_s": held})

    async def flush_cache(self, request: web.Request) -> web.Response:
        # the engine's prefix cache (cached prompt K/V); running sequences keep their own KV
        flush = getattr(self.engine, "flush_prefix_cache", None)
        if flush is not None:
            blocks = await asyncio.to_thread(flush, None)  # after the running step, however long
            logger.info("/flush_cache: dropped %d cached prefix blocks", blocks)
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n", status=200)

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        """SGLang's `/load_lora_adapter` {"lora_name"}: (re)read the person's adapter from the engine's
        adapter directory (`--lora-dir`/<lora_name>/); a resident one serves its new values from the next
        step. `lora_path`, if given, must name that same directory."""
        body = await self._json(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise WireError("the /load_lora_adapter body must be a JSON object with lora_name (an adapter name)")
        lora_dir = self.engine.config.lora_dir
        path = body.get("lora_path")
        if path is not None and (not lora_dir or not isinstance(path, str)
                                 or os.path.realpath(path) != os.path.realpath(os.path.join(lora_dir, name))):
            raise WireError(f"lora_path must be omitted or be <--lora-dir>/{name[:80]} (adapters are read from the "
                            "server's adapter directory only)")
        try:
            resident = await asyncio.to_thread(self.engine.load_adapter, name)
        except ValueError as exc:
            return json_response({"success": False, "error_message": str(exc)}, 400)
        stats = await asyncio.to_thread(self.engine.adapter_stats)
        return json_response({"success": True, "error_message": "", "was_resident": resident,
                              "loaded_adapters": stats["resident"]})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if isinstance(body, dict) and body.get("abort_all"):
            await asyncio.to_thread(self.engine.abort_all, "Aborted by /abort_request.")
        return web.Response(status=200)
