"""The OpenAI-compatible gateway: live conversations in, training samples out (docs/design.md §9).

Request path (never waits for the judge):
  validate -> render the chat template (exact prompt ids) -> policy pool ``/generate`` with
  log-probs -> answer the client (JSON or SSE) -> record the main turn.
Background path (``pipeline.py``):
  when a main turn has its next state, a judge worker scores it (m eval votes + m hint
  votes, concurrently on the judge pool) -> three-case rule -> hint-augmented prompts ->
  ``SampleStore.append`` (fsync) in a dedicated thread.

What is durable and what is not:
  * an appended sample is never lost (the store fsyncs before ``append`` returns);
  * a sample the store cannot take (full disk, ...) waits in a bounded in-memory queue while the
    write is retried with back-off (gateway/store_writer.py); ``/healthz`` says ``degraded`` and
    ``/readyz`` answers 503 meanwhile; samples beyond the queue bound are dropped and counted;
  * turns waiting for their next state, and scored pairs queued or being judged, live in
    memory only: a SIGKILL loses them (they produce no sample, and nothing is written
    half-way). A graceful stop (SIGTERM/SIGINT) stops taking requests and waits up to
    ``shutdown_grace_s`` for queued judgements to finish and be stored.

Errors: bad input -> 400/401/403/404/405/408/413/415/429 with an OpenAI-shaped JSON body (one error
boundary, openclaw_jax.http.http_guard); pool trouble -> 502 (worker error), 503 (no healthy
worker), 504 (timed out), with no turn recorded; a judge failure is no vote. A 500 would be a
bug (logged with its traceback and a trace id that the response carries). Bodies are size-
checked before reading, conversations before rendering; large ones are decoded, cleaned and rendered
on worker threads, and every step over request text is linear. Connections are capped and must send
their headers within a timeout.

Clients (docs/security.md): each request's person comes from its key (gateway/auth.py); sessions are
kept per person (sessions.py), so only the person who opened one can continue it, give its next state
or end it; each person's connections, generations and queued judgements are capped (client_limits.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from array import array
from typing import Any, NamedTuple

from aiohttp import web

from openclaw_jax.counters import counters
from openclaw_jax.gateway.auth import AUTH_KEY, Caller, GatewayAuth, request_caller
from openclaw_jax.gateway.chat_stream import ChatStream, ClientGone, finish_reason
from openclaw_jax.gateway.client_limits import ClientLimits
from openclaw_jax.gateway.config import KEY_ENVIRONMENT, GatewayConfig
from openclaw_jax.gateway.health_routes import HealthRoutes
from openclaw_jax.gateway.image_spool import ImageSpool, SpooledImage
from openclaw_jax.gateway.image_turns import ImageTurns
from openclaw_jax.gateway.judge import Judge, ModelJudge, NextState, RuleJudge
from openclaw_jax.gateway.openai_judge import OpenAIJudge, openai_judge_from_config
from openclaw_jax.gateway.openclaw_text import OFFLOAD_CHARS
from openclaw_jax.gateway.pipeline import JudgePipeline
from openclaw_jax.gateway.admin_routes import AdminRoutes
from openclaw_jax.gateway.session_routes import GATEWAY_HEADERS, SessionRoutes
from openclaw_jax.gateway.status import SessionActivity
from openclaw_jax.gateway.status_routes import StatusRoutes
from openclaw_jax.gateway.protocol import (ChatCompletionRequest, GatewayHTTPError, bad_request, pool_error_to_http,
                                           parse_agent_chat_request, parse_session_info)
from openclaw_jax.samples import SampleStore
from openclaw_jax.samples.holdout import sample_ids
from openclaw_jax.gateway.store_writer import StoreWriter
from openclaw_jax.gateway.sessions import ScoringJob, SessionLimitError, SessionTracker, TurnRecord, TurnTicket
from openclaw_jax.http import http_guard as G
from openclaw_jax.http.offload import freeze_startup_heap, return_large_blocks_to_the_os, run_heavy
from openclaw_jax.http.text_budget import TextBudget, message_chars
from openclaw_jax.models.tokenizer import tokenizer_by_name
from openclaw_jax.models.image_processing import processor_for_model_dir
from openclaw_jax.pool.client import PoolClient, PoolError
from openclaw_jax.wire import json_safe
from openclaw_jax.wire import openai as O
from openclaw_jax.wire.errors import with_context_advice
from openclaw_jax.wire.images import image_data_url
from openclaw_jax.wire.sglang import SamplingParams
from openclaw_jax.wire.sglang_results import GenerateResult
from openclaw_jax.wire.tool_calls import split_tool_calls

logger = logging.getLogger(__name__)

API_KEY_ENV = KEY_ENVIRONMENT["api_key"]


GatewayStats = counters(
    "GatewayStats",
    "requests main_turns side_turns turn_notices client_errors pool_errors turns_recorded "
    "jobs_queued jobs_dropped_queue_full judgements judge_errors no_sample samples store_errors samples_dropped_store",
    """The gateway's counters (``stats`` in ``/healthz``): requests and their turns, judging, samples.

    ``store_errors`` counts failed store writes (each retry counts; ``judge_errors`` never includes them);
    ``samples_dropped_store`` the samples lost because the store could not take them; ``turn_notices`` the
    turn-starting notices (``POST /v1/sessions/{id}/turn_starting``).
    """)


class ServedAdapter(NamedTuple):
    """A person's LoRA adapter as the pool serves it."""
    person: str
    steps: int       # its optimizer steps
    lora_name: str   # the pool's name for it (a generate request's `lora_path`)


class Gateway(JudgePipeline, SessionRoutes, HealthRoutes, ImageTurns, StatusRoutes, AdminRoutes):
    """The gateway's state and handlers; ``make_app()`` gives the aiohttp application.

    Pass ready-made ``tokenizer``/``policy``/``judge``/``store`` to embed it (tests, the
    train entry point); anything left out is built from ``cfg`` on ``start()``.
    """

    def __init__(self, cfg: GatewayConfig, *, tokenizer: Any = None, policy: PoolClient | None = None,
                 judge: Judge | None = None, judge_pool: PoolClient | None = None,
                 store: SampleStore | None = None, image_processor: Any = None) -> None:
        self.cfg = cfg
        # a vision-language policy (Qwen2.5-VL): its `ImageProcessorConfig`; None: images are refused
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.policy = policy
        self.judge = judge
        self.judge_pool = judge_pool
        self.store = store
        self._owned: list[Any] = []
        self.auth = GatewayAuth.from_config(cfg)
        self.sessions = SessionTracker(idle_timeout_s=cfg.session_idle_timeout_s, max_sessions=cfg.max_sessions,
                                       max_sessions_per_person=cfg.max_sessions_per_person,
                                       max_next_state_chars=cfg.judge_max_next_state_chars,
                                       on_drop=self._release_images)
        self.spool: ImageSpool | None = None
        self.activity = SessionActivity()   # requests per person and session, for the status page
        self.stats = GatewayStats()
        self.started_at = O.now_s()
        self._queue: asyncio.Queue[ScoringJob] | None = None
        self._workers: list[asyncio.Task] = []
        self._housekeeping: asyncio.Task | None = None
        self._active_jobs = 0
        self.guard = cfg.guard
        self.connections = G.ConnectionGuard(self.guard, "gateway",
                                             error_body=lambda status, message: GatewayHTTPError(status, message).body())
        self.limits = ClientLimits(cfg, self.connections)
        self.budget: TextBudget | None = None
        self.writer: StoreWriter | None = None
        self._stop_ids: list[int] = []
        # each person whose LoRA adapter the pool serves (a per-person run's `serve_adapter`): their turns go
        # to it; everyone else's to the base model
        self.served_adapters: dict[str, ServedAdapter] = {}

    def serve_adapter(self, person: str, adapter_steps: int, lora_name: str | None = None) -> None:
        """From now on `person`'s turns are generated with their adapter (`lora_path=<lora_name>`, by default the
        person id): the pool has it loaded, at `adapter_steps` optimizer steps."""
        self.served_adapters[person] = ServedAdapter(person, int(adapter_steps), lora_name or person)

    def _adapter_of(self, person: str, req: ChatCompletionRequest) -> ServedAdapter | None:
        """The adapter a request of `person` is served with, or None: the base model (a person with no adapter
        yet; prompts with images, which adapters do not serve)."""
        return None if req.images else self.served_adapters.get(person)

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        cfg = self.cfg
        if self.tokenizer is None:
            self.tokenizer = await asyncio.get_running_loop().run_in_executor(None, tokenizer_by_name, cfg.model)
        if self.image_processor is None:   # a Qwen2.5-VL model directory: its images are served
            self.image_processor = processor_for_model_dir(cfg.model)
        self._stop_ids = sorted({int(t) for t in (getattr(self.tokenizer, "eos_token_ids", ()) or ())})
        if self.policy is None:
            if not cfg.policy_urls:
                raise ValueError("gateway.policy_urls is empty: give at least one --policy-url (an SGLang worker, "
                                 "a router, or the embedded server)")
            self.policy = PoolClient(list(cfg.policy_urls), max_concurrency=cfg.pool_max_concurrency,
                                     request_timeout_s=cfg.request_timeout_s, max_retries=cfg.pool_max_retries,
                                     api_key=cfg.policy_api_key)
            self._owned.append(self.policy)
            await self.policy.start()
        if self.judge is None:
            if cfg.judge == "rule":
                self.judge = RuleJudge(max_candidates=cfg.max_candidates, min_chars=cfg.hint_min_chars,
                                       hints=cfg.judge_hints)
            elif cfg.judge == "openai":
                self.judge = openai_judge_from_config(cfg)
                self._owned.append(self.judge)
                await self.judge.check()
            else:
                if self.judge_pool is None:
                    # Its own client (own concurrency limit), even on the policy's URLs, so that
                    # votes never take a user request's slot.
                    self.judge_pool = PoolClient(list(cfg.judge_pool_urls),
                                                 max_concurrency=max(1, cfg.judge_concurrency * cfg.judge_votes * 2),
                                                 request_timeout_s=cfg.judge_timeout_s,
                                                 max_retries=cfg.pool_max_retries, api_key=cfg.policy_api_key)
                    self._owned.append(self.judge_pool)
                    await self.judge_pool.start()
                judge_tokenizer = self.tokenizer
                if cfg.judge_model and cfg.judge_model != cfg.model:
                    judge_tokenizer = await asyncio.get_running_loop().run_in_executor(
                        None, tokenizer_by_name, cfg.judge_model)
                self.judge = ModelJudge(self.judge_pool, judge_tokenizer, votes=cfg.judge_votes,
                                        temperature=cfg.judge_temperature, max_new_tokens=cfg.judge_max_new_tokens,
                                        max_candidates=cfg.max_candidates, min_chars=cfg.hint_min_chars,
                                        timeout_s=cfg.judge_timeout_s, name=f"model:{cfg.served_model_name}",
                                        hints=cfg.judge_hints)
        if self.store is None:
            self.store = SampleStore(cfg.store_dir, segment_max_bytes=cfg.segment_max_bytes)
            self._owned.append(self.store)
        self._next_sample_id = sample_ids(cfg.sample_id_seed, len(self.store))
        self.budget = TextBudget(self.tokenizer, max_tokens=cfg.max_prompt_tokens)
        self.spool = ImageSpool(os.path.join(self.store.directory, "image-spool"), max_bytes=cfg.image_spool_bytes,
                                max_bytes_per_person=cfg.image_spool_bytes_per_person)
        self.writer = StoreWriter(self.store, cfg, on_written=self._sample_written, on_error=self._store_error)
        self.writer.start()
        self._queue = asyncio.Queue(maxsize=cfg.max_pending_judgements)
        self._workers = [asyncio.create_task(self._judge_worker(i), name=f"judge-worker-{i}")
                         for i in range(cfg.judge_concurrency)]
        self._housekeeping = asyncio.create_task(self._housekeeping_loop(), name="gateway-housekeeping")
        logger.info("gateway ready: policy %s, judge %s, store %s (%d samples)", self.policy.urls,
                    getattr(self.judge, "name", type(self.judge).__name__), self.store.directory, len(self.store))

    async def close(self, grace_s: float | None = None) -> None:
        """Finish queued judgements (up to ``grace_s``), then stop workers and close what we own."""
        grace_s = self.cfg.shutdown_grace_s if grace_s is None else grace_s
        if self._queue is not None and (self._queue.qsize() or self._active_jobs):
            logger.info("waiting up to %.0fs for %d queued and %d running judgement(s)", grace_s,
                        self._queue.qsize(), self._active_jobs)
            try:
                await asyncio.wait_for(self._queue.join(), timeout=grace_s)
            except asyncio.TimeoutError:
                logger.warning("shutdown: %d judgement(s) not finished; their turns produce no sample",
                               self._queue.qsize() + self._active_jobs)
        tasks = [t for t in [*self._workers, self._housekeeping, self._turn_notice] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._workers = []
        self._housekeeping = None
        if self.writer is not None:
            await self.writer.close(grace_s)
        for owned in reversed(self._owned):
            if isinstance(owned, (PoolClient, OpenAIJudge)):
                await owned.close()
        for owned in self._owned:
            if isinstance(owned, SampleStore):
                owned.close()
        self._owned = []
        self.close_status()

    # ----------------------------------------------------------------- app
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes, middlewares=[
            G.error_boundary(self._render_error, name="gateway"), self.connections.middleware(),
            self._error_middleware])
        app[AUTH_KEY] = self.auth
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_post("/v1/sessions/{session_id}/done", self.handle_session_done)
        app.router.add_post("/v1/sessions/{session_id}/turn_starting", self.handle_turn_starting)
        self.add_status_routes(app)
        self.add_admin_routes(app)
        return app

    def _render_error(self, request: web.BaseRequest, status: int, message: str) -> web.Response:
        """The error boundary's answers (guard rejections, router 404/405, bugs) in our JSON shape."""
        if status < 500:
            self.stats.client_errors += 1
        return web.json_response(GatewayHTTPError(status, message).body(), status=status)

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler):
        try:
            return await handler(request)
        except GatewayHTTPError as err:
            if err.status < 500:
                self.stats.client_errors += 1
            response = web.json_response(err.body(), status=err.status, headers=err.headers)
            if err.close:
                response.force_close()
            return response
        except (ConnectionResetError, ClientGone):
            # Nobody is listening any more; 499 = "client closed request" (never actually sent).
            return web.Response(status=499)

    def _check_auth(self, request: web.Request) -> Caller:
        """The request's caller (401/403 without a valid key); its connection counts as that person's."""
        caller = request_caller(request)
        self.limits.admit_connection(request, caller.person)
        return caller

    # ----------------------------------------------------------------- small handlers
    async def handle_models(self, request: web.Request) -> web.Response:
        self._check_auth(request)
        return web.json_response(O.model_list(O.model_card(self.cfg.served_model_name, self.started_at,
                                                           owned_by="openclaw_jax")))

    # ----------------------------------------------------------------- chat completions
    async def _render_prompt(self, req: ChatCompletionRequest) -> list[int]:
        # Typical prompts render inline (a thread hand-off would cost more than the rendering); a
        # large conversation renders and tokenizes on a worker thread; one that could not fit
        # gateway.max_prompt_tokens in any tokenization is refused before any work.
        chars = message_chars(req.messages, req.tools)
        why = self.budget.conversation_too_long(req.messages, chars)
        if why is not None:
            raise bad_request(with_context_advice(f"the conversation is too long: {why} (gateway.max_prompt_tokens)."),
                              param="messages")
        try:
            ids = await self.budget.render(req.messages, chars=chars, tools=req.tools, **req.chat_template_kwargs)
        except GatewayHTTPError:
            raise
        except Exception as err:  # noqa: BLE001 - a template may raise anything for odd conversations
            raise bad_request(f"the chat template could not render these messages: {type(err).__name__}: {err}",
                              param="messages") from None
        if not ids:
            raise bad_request("the chat template rendered an empty prompt", param="messages")
        if len(ids) > self.cfg.max_prompt_tokens:
            raise bad_request(with_context_advice(f"the prompt has {len(ids)} tokens; at most "
                                                  f"{self.cfg.max_prompt_tokens} are accepted (gateway.max_prompt_tokens)."),
                              param="messages")
        return ids

    def _sampling_params(self, req: ChatCompletionRequest, main: bool) -> SamplingParams:
        cfg = self.cfg
        use_client = cfg.honor_client_sampling or not main
        temperature = req.temperature if (use_client and req.temperature is not None) else cfg.temperature
        top_p = req.top_p if (use_client and req.top_p is not None) else cfg.top_p
        return SamplingParams(max_new_tokens=min(req.max_tokens or cfg.default_max_tokens, cfg.max_tokens_limit),
                              temperature=float(temperature), top_p=float(top_p), top_k=int(cfg.top_k),
                              stop=tuple(req.stop), stop_token_ids=tuple(self._stop_ids), skip_special_tokens=True,
                              sampling_seed=req.seed)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        caller = self._check_auth(request)
        body = await G.read_json(request, self.guard,
                                 empty_message="the request body is empty; send a JSON object with 'messages'")
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
        session = parse_session_info(request.headers, body)
        self.activity.note(caller.person, session.session_id, session.turn_type, session.done)
        messages = body.get("messages")
        if isinstance(messages, list) and len(messages) > self.cfg.max_prompt_tokens:  # before validating each
            raise bad_request(f"the conversation is too long: {self.budget.conversation_too_long(messages, 0)} "
                              "(gateway.max_prompt_tokens)", param="messages")
        req = await G.parse_off_loop(request, parse_agent_chat_request, body, self.cfg.image_limits)
        async with self.limits.generation(caller.person):
            return await self._serve_chat(request, req, session, caller.person)

    async def _next_state(self, messages: list[dict[str, Any]]) -> NextState | None:
        """What a request carries for the previous main turn (`SessionTracker.next_state`): the person's words
        are cleaned of OpenClaw's wrapper in linear time, on a worker thread when the text is long."""
        if message_chars(messages) < OFFLOAD_CHARS:
            return self.sessions.next_state(messages)
        return await run_heavy(self.sessions.next_state, messages)

    async def _open_main_turn(self, session_id: str, messages: list[dict[str, Any]], person: str) -> TurnTicket:
        known = (person, session_id) in self.sessions   # a new session has no previous turn to score
        next_state = await self._next_state(messages) if known else None
        try:
            ticket, job = self.sessions.open_main_turn(session_id, messages, person=person, next_state=next_state)
        except SessionLimitError as err:
            raise GatewayHTTPError(429, f"{err} (gateway.max_sessions_per_person, gateway.max_sessions); end a "
                                        "session or retry when a turn is done", headers={"Retry-After": "1"}) from None
        if job is not None:
            self._submit(job)
        return ticket

    async def _serve_chat(self, request: web.Request, req: ChatCompletionRequest, session: Any,
                          person: str) -> web.StreamResponse:
        grids: list[tuple[int, int, int]] = []
        if req.images:
            prompt_ids, grids = await self._render_image_prompt(req)
        else:
            prompt_ids = await self._render_prompt(req)
        main = session.turn_type == "main"
        params = self._sampling_params(req, main)
        if main and not session.done:  # a closing request's own reply is never trained: any budget is fine
            self._check_room(params)
        request[GATEWAY_HEADERS] = self._override_headers(req, params)

        ticket: TurnTicket | None = None
        if main:
            self.stats.main_turns += 1
            ticket = await self._open_main_turn(session.session_id, req.messages, person)
        else:
            self.stats.side_turns += 1
        if session.done:
            # The previous turn was scored above; this request's own turn never gets a next state.
            self.sessions.end_session(session.session_id, person=person)

        adapter = self._adapter_of(person, req)
        try:
            if req.stream:
                return await self._stream_chat(request, req, prompt_ids, params, ticket, adapter)
            return await self._complete_chat(request, req, prompt_ids, params, ticket, grids, adapter)
        except BaseException:
            if ticket is not None:
                self.sessions.fail_turn(ticket)  # no-op if the turn was recorded
            raise

    async def _generate(self, prompt_ids: list[int], params: SamplingParams, top_logprobs: int,
                        images: tuple = (), lora_path: str | None = None) -> GenerateResult:
        try:
            extra = {"image_data": [image_data_url(im) for im in images]} if images else {}
            return await self.policy.generate(prompt_ids, sampling_params=params, return_logprob=True,
                                              top_logprobs_num=top_logprobs, lora_path=lora_path, **extra)
        except (PoolError, asyncio.TimeoutError) as err:
            self.stats.pool_errors += 1
            logger.warning("policy pool error: %s", err)
            raise pool_error_to_http(err) from None

    def _record_turn(self, ticket: TurnTicket | None, req: ChatCompletionRequest, prompt_ids: list[int],
                     result: GenerateResult, params: SamplingParams, images: tuple[SpooledImage, ...] = (),
                     adapter: ServedAdapter | None = None) -> None:
        if ticket is None:
            return
        if not result.response_ids or len(result.rollout_logprobs) != len(result.response_ids):
            logger.warning("session %s turn %d not recorded: %d output ids with %d log-probs", ticket.session_id,
                           ticket.turn_index, len(result.response_ids), len(result.rollout_logprobs))
            self.sessions.fail_turn(ticket)
            if images:
                self.spool.release(ticket.person, images)
            return
        record = TurnRecord(
            session_id=ticket.session_id, turn_index=ticket.turn_index, prompt_messages=req.messages,
            tools=req.tools, chat_template_kwargs=req.chat_template_kwargs,
            prompt_ids=array("i", prompt_ids),   # 4 bytes a token while it waits (a list takes 36)
            response_ids=list(result.response_ids), rollout_logprobs=list(result.rollout_logprobs),
            response_text=result.text, weight_version=result.weight_version,
            last_weight_version=result.last_weight_version,
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            finish_reason=result.finish_reason.type if result.finish_reason else "", images=images,
            person=ticket.person, adapter=adapter.person if adapter else None,
            adapter_steps=adapter.steps if adapter else None)
        self.stats.turns_recorded += 1
        job = self.sessions.complete_turn(ticket, record)
        if job is not None:
            self._submit(job)

    def _logprobs_block(self, result: GenerateResult, start: int, stop: int, top: int) -> dict[str, Any]:
        return O.logprobs_of_ids(result.response_ids[start:stop], result.rollout_logprobs[start:stop],
                                 result.output_top_logprobs[start:stop] if top else None,
                                 lambda t: self.tokenizer.decode([t]), top_n=top)

    def _metadata(self, result: GenerateResult, ticket: TurnTicket | None,
                  adapter: ServedAdapter | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"weight_version": result.weight_version}
        if adapter is not None:   # OpenAI's metadata values are strings
            meta.update(adapter=adapter.person, adapter_steps=str(adapter.steps))
        if ticket is not None:
            meta.update(session_id=ticket.session_id, turn_index=ticket.turn_index)
        return meta

    async def _complete_chat(self, request: web.Request, req: ChatCompletionRequest, prompt_ids: list[int],
                             params: SamplingParams, ticket: TurnTicket | None,
                             grids: list[tuple[int, int, int]], adapter: ServedAdapter | None) -> web.Response:
        result = await self._generate(prompt_ids, params, req.top_logprobs, req.images,
                                      lora_path=adapter.lora_name if adapter else None)
        transport = request.transport
        if transport is None or transport.is_closing():
            # The agent hung up: it never saw this reply, so the turn must not be trained on.
            if ticket is not None:
                self.sessions.fail_turn(ticket)
            raise ClientGone()
        images: tuple[SpooledImage, ...] | None = ()
        if ticket is not None and req.images:
            images = await self._spool_images(ticket.person, req, grids)
            if images is None:   # over the spool's bounds: answered, not trained
                self.sessions.fail_turn(ticket)
                ticket, images = None, ()
        self._record_turn(ticket, req, prompt_ids, result, params, images, adapter)
        content, calls = split_tool_calls(result.text, req.tools)
        choice = O.chat_choice(
            0, O.chat_message((content or None) if calls else content, calls),
            finish_reason=finish_reason(result, bool(calls)),
            logprobs=self._logprobs_block(result, 0, len(result.response_ids), req.top_logprobs) if req.logprobs
            else None)
        body = O.chat_completion(completion_id=O.new_id("chatcmpl-"), created=O.now_s(),
                                 model=req.model or self.cfg.served_model_name, choices=[choice],
                                 usage=O.usage(len(prompt_ids), len(result.response_ids),
                                               cached_tokens=result.cached_tokens),
                                 metadata=self._metadata(result, ticket, adapter))
        return web.json_response(body, dumps=json_safe.dumps, headers=request.get(GATEWAY_HEADERS))

    async def _stream_chat(self, request: web.Request, req: ChatCompletionRequest, prompt_ids: list[int],
                           params: SamplingParams, ticket: TurnTicket | None,
                           adapter: ServedAdapter | None) -> web.StreamResponse:
        started = time.monotonic()
        stream = self.policy.generate_stream(prompt_ids, sampling_params=params, return_logprob=True,
                                             top_logprobs_num=req.top_logprobs,
                                             lora_path=adapter.lora_name if adapter else None)
        first = await self._first_chunk(stream)  # before answering 200: pool trouble is still an error status
        first_s = time.monotonic() - started
        response = web.StreamResponse(status=200, headers={**O.SSE_HEADERS, "X-Accel-Buffering": "no",
                                                           **request.get(GATEWAY_HEADERS, {})})
        await response.prepare(request)
        out = ChatStream(response, req, model=req.model or self.cfg.served_model_name,
                          logprobs_block=self._logprobs_block)
        try:
            result = await self._relay(stream, first, out)
            # Record before the last chunk: once the client has the finish reason it may send the next turn.
            await out.finish(result, len(prompt_ids),
                             record=lambda: self._record_turn(ticket, req, prompt_ids, result, params,
                                                              adapter=adapter))
            # what the person waited for on this side: the policy's prefill (and how much of it the prefix
            # cache spared) and its answer
            logger.info("streamed %s turn: %d prompt tokens (%d cached), first token after %.2f s, %d tokens in "
                        "%.2f s", "a main" if ticket is not None else "a side", len(prompt_ids), result.cached_tokens,
                        first_s, len(result.response_ids), time.monotonic() - started)
        except ClientGone:
            logger.info("client closed the stream early; turn not recorded")
            if ticket is not None:
                self.sessions.fail_turn(ticket)
        except (PoolError, asyncio.TimeoutError) as err:
            # Too late for an error status: tell the client in-band, record nothing.
            self.stats.pool_errors += 1
            logger.warning("policy stream failed mid-way: %s", err)
            if ticket is not None:
                self.sessions.fail_turn(ticket)
            await out.error(pool_error_to_http(err))
        finally:
            await stream.aclose()
        return response

    async def _first_chunk(self, stream) -> GenerateResult:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            self.stats.pool_errors += 1
            raise GatewayHTTPError(502, "the policy pool ended the stream without output") from None
        except (PoolError, asyncio.TimeoutError) as err:
            self.stats.pool_errors += 1
            logger.warning("policy pool error: %s", err)
            raise pool_error_to_http(err) from None

    @staticmethod
    async def _relay(stream, first: GenerateResult, out: "ChatStream") -> GenerateResult:
        """Send the opening chunk and each update's final-so-far text; returns the final result."""
        result = first
        await out.chunk(delta={"role": "assistant", "content": ""})
        pending: GenerateResult | None = first
        while True:
            if pending is None:
                try:
                    pending = await stream.__anext__()
                except StopAsyncIteration:
                    break
            result, pending = pending, None
            if result.finished:
                break
            await out.progress(result)
        if not result.finished:
            raise PoolError("the policy stream ended without a final chunk")
        return result


async def start_gateway(cfg: GatewayConfig, **components: Any) -> tuple[Gateway, web.AppRunner, str]:
    """Start a gateway on cfg.host:cfg.port; returns (gateway, runner, base URL). Stop with ``stop_gateway``.
    ConfigError when it would be reachable from other machines without a client key."""
    cfg.check_exposure()
    return_large_blocks_to_the_os()
    gateway = Gateway(cfg, **components)
    await gateway.start()
    runner = web.AppRunner(gateway.make_app(), access_log=None, handle_signals=False, **gateway.guard.runner_kwargs())
    await runner.setup()
    try:
        sock = G.bind_socket(cfg.host, cfg.port)
        await G.GuardedSite(runner, sock, gateway.connections).start()
    except OSError:
        await runner.cleanup()
        await gateway.close(grace_s=0)
        raise
    port = sock.getsockname()[1]
    freeze_startup_heap()
    return gateway, runner, f"http://{cfg.host}:{port}"


async def stop_gateway(gateway: Gateway, runner: web.AppRunner, grace_s: float | None = None) -> None:
    await runner.cleanup()
    await gateway.close(grace_s)
