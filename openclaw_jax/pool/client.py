"""Asyncio client for a pool of SGLang-compatible workers (docs/design.md §8).

The same client drives real SGLang servers, an `sglang_router` in front of them, or our
embedded JAX server (`openclaw_jax.inference.server`), because all of them speak the
same wire protocol.

What it does:
  * one `aiohttp` session (connection pooling) shared by every call;
  * bounded concurrency (a semaphore of `max_concurrency` in-flight requests);
  * a per-request timeout;
  * retries with exponential backoff on connection errors, timeouts, 408/429/5xx and
    aborted generations, moving to another worker when one is available;
  * active health checks (`GET /health` every `health_interval_s`) plus passive ones
    (a refused connection takes a worker out at once); a worker that answers again is
    put back;
  * least-outstanding-requests choice among healthy workers (round-robin on ties);
  * typed results (`GenerateResult`), and weight-update fan-out to *every* worker with
    per-worker results (a router does not forward weight updates).

Bodies are built and parsed by :mod:`openclaw_jax.wire.sglang` (``sampling_params`` may be a typed
`SamplingParams` or a raw mapping). Errors are exceptions, never empty results: `RequestRejectedError` (4xx, not retried),
`WorkerUnavailableError` (retries exhausted), `NoHealthyWorkerError`,
`MalformedResponseError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Sequence

import aiohttp

from openclaw_jax.pool.types import (
    MalformedResponseError,
    NoHealthyWorkerError,
    PoolError,
    RequestRejectedError,
    WeightUpdateResult,
    WorkerUnavailableError,
)
from openclaw_jax.wire import sglang as S
from openclaw_jax.wire.openai import SSEDecoder
from openclaw_jax.wire import sglang_results as R
from openclaw_jax.wire.sglang import SamplingParams
from openclaw_jax.wire.sglang_results import GenerateResult

SamplingArg = SamplingParams | Mapping[str, Any] | None

__all__ = [
    "WeightUpdateResult",
    "PoolError",
    "NoHealthyWorkerError",
    "RequestRejectedError",
    "WorkerUnavailableError",
    "MalformedResponseError",
    "PoolClient",
]

logger = logging.getLogger(__name__)

# Statuses that say "try again (maybe elsewhere)" rather than "your request is wrong".
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_MAX_BACKOFF_S = 5.0


class _RetryableFailure(Exception):
    """Internal: one attempt failed in a way that another attempt may fix."""

    def __init__(self, description: str, *, worker_down: bool = False):
        super().__init__(description)
        self.description = description
        self.worker_down = worker_down


@dataclass
class _Worker:
    url: str
    healthy: bool = True
    outstanding: int = 0
    last_error: str | None = None
    last_checked: float = 0.0


_CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError)


@dataclass
class _Try:
    """One attempt on one worker: counted as outstanding there; a retryable failure is recorded and swallowed.

    A refused/reset connection also takes the worker out at once (the health loop puts it back). Once a
    stream has ``delivered`` output, a failure is final (a restart would repeat tokens).
    """

    pool: "PoolClient"
    worker: _Worker
    path: str
    attempts: list[str]
    delivered: bool = False

    async def __aenter__(self) -> "_Try":
        self.worker.outstanding += 1
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        self.worker.outstanding -= 1
        where = f"{self.worker.url}{self.path}"
        if isinstance(exc, _RetryableFailure):
            desc, down = exc.description, exc.worker_down
        elif isinstance(exc, asyncio.TimeoutError):
            desc, down = f"{where}: timed out after {self.pool.request_timeout_s:g}s", False
        elif isinstance(exc, _CONNECTION_ERRORS):
            desc, down = f"{where}: {type(exc).__name__}: {exc}", True
        else:
            return False
        if down:
            self.pool._set_health(self.worker, False, desc)
        if self.delivered:
            raise WorkerUnavailableError(f"stream from {self.worker.url} broke after partial output: {desc}") from None
        self.attempts.append(desc)
        return True


class PoolClient:
    """Client for a pool of SGLang-compatible workers; use as `async with PoolClient(urls) as pool:`."""

    def __init__(self, urls: Sequence[str], *, max_concurrency: int = 64, request_timeout_s: float = 120.0,
                 max_retries: int = 3, backoff_s: float = 0.2, health_interval_s: float = 2.0,
                 api_key: str | None = None, health_timeout_s: float = 5.0,
                 weight_update_timeout_s: float = 900.0, vocab_size: int | None = None):
        if isinstance(urls, str):
            urls = [urls]
        cleaned = [str(u).rstrip("/") for u in urls]
        if not cleaned:
            raise ValueError("PoolClient needs at least one worker URL, e.g. ['http://127.0.0.1:30000']")
        for u in cleaned:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"worker URL {u!r} must start with http:// or https://")
        if len(set(cleaned)) != len(cleaned):
            raise ValueError(f"worker URLs must be distinct, got {cleaned}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency={max_concurrency} must be >= 1")
        if max_retries < 0:
            raise ValueError(f"max_retries={max_retries} must be >= 0")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s={request_timeout_s} must be > 0")
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} must be >= 1 (or None to send ids unchecked)")
        # SGLang (0.5.23) does not range-check input_ids: an id >= vocab_size crashes the worker's scheduler,
        # and retrying elsewhere would crash the next worker too. With vocab_size the client refuses them.
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        self._workers = [_Worker(u) for u in cleaned]
        self.max_concurrency = int(max_concurrency)
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.health_interval_s = float(health_interval_s)
        self.health_timeout_s = float(health_timeout_s)
        self.weight_update_timeout_s = float(weight_update_timeout_s)
        self._api_key = api_key
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._health_task: asyncio.Task | None = None
        self._rr = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> "PoolClient":
        if self._session is not None:
            return self
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        connector = aiohttp.TCPConnector(limit=self.max_concurrency + 4 * len(self._workers), limit_per_host=0)
        self._session = aiohttp.ClientSession(connector=connector, headers=headers)
        self._semaphore = asyncio.Semaphore(self.max_concurrency)
        await self.check_health()
        if self.health_interval_s > 0:
            self._health_task = asyncio.create_task(self._health_loop(), name="pool-health-check")
        return self

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            try:
                await self._health_task
            except (asyncio.CancelledError, Exception):
                pass
            self._health_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "PoolClient":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self._workers]

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise PoolError("PoolClient is not started; use `async with PoolClient(...)` or `await client.start()`")
        return self._session

    # ------------------------------------------------------------------ health
    def healthy_urls(self) -> list[str]:
        return [w.url for w in self._workers if w.healthy]

    def outstanding(self) -> dict[str, int]:
        return {w.url: w.outstanding for w in self._workers}

    async def _check_one(self, worker: _Worker) -> bool:
        session = self._require_session()
        try:
            async with session.get(worker.url + "/health",
                                   timeout=aiohttp.ClientTimeout(total=self.health_timeout_s)) as resp:
                await resp.read()
                ok = resp.status == 200
                err = None if ok else f"/health answered HTTP {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            ok, err = False, f"/health failed: {type(exc).__name__}: {exc}"
        self._set_health(worker, ok, err)
        worker.last_checked = time.monotonic()
        return ok

    def _set_health(self, worker: _Worker, ok: bool, error: str | None) -> None:
        if ok and not worker.healthy:
            logger.info("worker %s is healthy again; putting it back in the pool", worker.url)
        elif not ok and worker.healthy:
            logger.warning("taking worker %s out of the pool: %s", worker.url, error)
        worker.healthy = ok
        if error:
            worker.last_error = error

    async def check_health(self) -> dict[str, bool]:
        """Probe every worker now; returns {url: healthy}."""
        results = await asyncio.gather(*(self._check_one(w) for w in self._workers))
        return {w.url: ok for w, ok in zip(self._workers, results)}

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_health()
            except asyncio.CancelledError:
                raise
            except Exception:  # a health probe must never kill the loop
                logger.exception("health check round failed")

    # ------------------------------------------------------------------ worker choice
    def _pick(self, exclude: set[str]) -> _Worker | None:
        healthy = [w for w in self._workers if w.healthy]
        if not healthy:
            return None
        candidates = [w for w in healthy if w.url not in exclude] or healthy
        least = min(w.outstanding for w in candidates)
        tied = [w for w in candidates if w.outstanding == least]
        self._rr += 1
        return tied[self._rr % len(tied)]

    async def _pick_or_wait(self, exclude: set[str]) -> _Worker:
        worker = self._pick(exclude)
        if worker is None:
            # Every worker is marked down: probe once right now (one may be back) before giving up.
            await self.check_health()
            worker = self._pick(exclude)
        if worker is None:
            details = "; ".join(f"{w.url}: {w.last_error}" for w in self._workers)
            raise NoHealthyWorkerError(f"no healthy worker among {len(self._workers)} ({details})")
        return worker

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_s * (2 ** attempt), _MAX_BACKOFF_S)

    # ------------------------------------------------------------------ low-level request with retries
    async def _classify_response(self, worker: _Worker, resp: aiohttp.ClientResponse, path: str) -> Any:
        raw = await resp.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if resp.status == 200:
            if body is None:
                raise MalformedResponseError(f"{worker.url}{path} answered 200 with a non-JSON body: {raw[:200]!r}")
            return body
        message = S.error_message(body, raw[:500].decode("utf-8", "replace"))
        if resp.status in RETRYABLE_STATUSES:
            raise _RetryableFailure(f"{worker.url}{path}: HTTP {resp.status}: {message}")
        raise RequestRejectedError(resp.status, message, url=worker.url, body=body)

    async def _tries(self, what: str, path: str) -> AsyncIterator[_Try]:
        """Up to 1 + max_retries attempts with backoff, each on the least-busy healthy worker not tried yet;
        `WorkerUnavailableError` when none succeeded (the caller returns from inside the loop on success)."""
        assert self._semaphore is not None
        attempts: list[str] = []
        tried: set[str] = set()
        async with self._semaphore:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    await asyncio.sleep(self._backoff(attempt - 1))
                worker = await self._pick_or_wait(tried)
                tried.add(worker.url)
                yield _Try(self, worker, path, attempts)
        raise WorkerUnavailableError(f"{what} failed after {self.max_retries + 1} attempt(s) on the pool {self.urls}",
                                     attempts=attempts)

    async def _request_json(self, method: str, path: str, payload: Any | None, *, parse=None) -> Any:
        """Send one request to the pool with retries; `parse(body, worker)` turns the body into the result."""
        session = self._require_session()
        async with contextlib.aclosing(self._tries(f"{method} {path}", path)) as tries:
            async for attempt in tries:
                async with attempt:
                    worker = attempt.worker
                    async with session.request(method, worker.url + path, json=payload,
                                               timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as resp:
                        body = await self._classify_response(worker, resp, path)
                    return parse(body, worker) if parse is not None else body
        raise AssertionError("unreachable: _tries raises when attempts run out")

    # ------------------------------------------------------------------ generate
    def _check_ids(self, ids: list[int]) -> list[int]:
        if self.vocab_size is not None:
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"input_ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size}); SGLang "
                                 "would crash on them, so the request was not sent")
        return ids

    def _generate_payload(self, input_ids, text, sampling_params: SamplingArg, return_logprob: bool,
                          top_logprobs_num: int, logprob_start_len: int, rid: str | None, stream: bool,
                          image_data: Sequence[str] | None = None, lora_path: str | None = None) -> dict[str, Any]:
        return S.generate_request_body(
            input_ids=None if input_ids is None else self._check_ids([int(t) for t in input_ids]), text=text,
            sampling_params=sampling_params, return_logprob=return_logprob, top_logprobs_num=top_logprobs_num,
            logprob_start_len=logprob_start_len, rid=rid, stream=stream, image_data=image_data, lora_path=lora_path)

    @staticmethod
    def _check_single(sampling_params: SamplingArg) -> None:
        n = S.sampling_params_json(sampling_params).get("n", 1)
        if n not in (None, 1):
            raise ValueError(f"generate() returns one sequence; sampling_params.n={n} needs generate_many()")

    def _parse_generate(self, expect_logprobs: bool, top_logprobs_num: int):
        def parse(body: Any, worker: _Worker) -> GenerateResult:
            try:
                result = R.parse_generate_response(body, worker_url=worker.url, expect_logprobs=expect_logprobs,
                                                   top_logprobs_num=top_logprobs_num)
            except R.ErrorAnswer as err:
                raise RequestRejectedError(400, err.message, url=worker.url, body=err.body) from None
            except R.MalformedResponse as err:
                raise MalformedResponseError(str(err)) from None
            if result.aborted:
                # Aborted by the worker (pause, shutdown, weight reload): retry, possibly elsewhere.
                raise _RetryableFailure(f"{worker.url}/generate: generation aborted: {result.finish_reason.message}")
            return result
        return parse

    async def generate(self, input_ids: list[int] | None = None, *, text: str | None = None,
                       sampling_params: SamplingArg = None, return_logprob: bool = False,
                       top_logprobs_num: int = 0, logprob_start_len: int = -1,
                       rid: str | None = None, image_data: Sequence[str] | None = None,
                       lora_path: str | None = None) -> GenerateResult:
        """One `/generate` call; retried on transient failures; returns the finished sequence.
        `image_data`: the prompt's images as data URLs, in order (its ids hold their placeholders);
        `lora_path`: the LoRA adapter (a person id) the worker generates with (None: the base model)."""
        self._check_single(sampling_params)
        payload = self._generate_payload(input_ids, text, sampling_params, return_logprob, top_logprobs_num,
                                         logprob_start_len, rid, stream=False, image_data=image_data,
                                         lora_path=lora_path)
        expect = bool(payload.get("return_logprob"))
        return await self._request_json("POST", "/generate", payload,
                                         parse=self._parse_generate(expect, int(top_logprobs_num)))

    async def generate_many(self, prompts: Sequence[list[int]] | Sequence[str], *,
                            sampling_params: SamplingArg = None, return_logprob: bool = False,
                            top_logprobs_num: int = 0, logprob_start_len: int = -1) -> list[GenerateResult]:
        """A batch `/generate` (list of prompts, optional n > 1): results prompt-major, n per prompt."""
        if not prompts:
            return []
        is_text = isinstance(prompts[0], str)
        payload = S.generate_request_body(
            input_ids=None if is_text else [self._check_ids([int(t) for t in p]) for p in prompts],
            text=[str(p) for p in prompts] if is_text else None, sampling_params=sampling_params,
            return_logprob=return_logprob, top_logprobs_num=top_logprobs_num, logprob_start_len=logprob_start_len)
        n = int(payload["sampling_params"].get("n", 1) or 1)
        expect = bool(payload.get("return_logprob"))
        single = self._parse_generate(expect, int(top_logprobs_num))

        def parse(body: Any, worker: _Worker) -> list[GenerateResult]:
            if isinstance(body, Mapping):
                body = [body]
            if not isinstance(body, list) or len(body) != len(prompts) * n:
                raise MalformedResponseError(
                    f"batch /generate of {len(prompts)} prompt(s) x n={n} answered "
                    f"{len(body) if isinstance(body, list) else type(body).__name__} result(s) from {worker.url}")
            return [single(item, worker) for item in body]

        return await self._request_json("POST", "/generate", payload, parse=parse)

    async def generate_stream(self, input_ids: list[int] | None = None, *, text: str | None = None,
                              sampling_params: SamplingArg = None, return_logprob: bool = False,
                              top_logprobs_num: int = 0, logprob_start_len: int = -1,
                              rid: str | None = None, lora_path: str | None = None) -> AsyncIterator[GenerateResult]:
        """Streaming `/generate`: yields cumulative partial results; the last one has a finish_reason.

        Failures before the first chunk are retried like `generate`; a failure after chunks were
        delivered raises `WorkerUnavailableError` (a restart would repeat tokens).
        """
        self._check_single(sampling_params)
        payload = self._generate_payload(input_ids, text, sampling_params, return_logprob, top_logprobs_num,
                                         logprob_start_len, rid, stream=True, lora_path=lora_path)
        parse = self._parse_generate(bool(payload.get("return_logprob")), int(top_logprobs_num))
        session = self._require_session()
        async with contextlib.aclosing(self._tries("streaming /generate", "/generate")) as tries:
            async for attempt in tries:
                async with attempt:
                    worker = attempt.worker
                    async with session.post(worker.url + "/generate", json=payload,
                                            timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as resp:
                        if resp.status != 200:
                            await self._classify_response(worker, resp, "/generate")
                            raise MalformedResponseError(f"{worker.url}/generate stream answered HTTP {resp.status}")
                        finished = False
                        async for result in _stream_results(resp, worker, parse):
                            attempt.delivered = True
                            yield result
                            finished = finished or result.finished
                        if finished:
                            return
                        raise _RetryableFailure(f"{worker.url}/generate: stream ended without a final chunk")

    # ------------------------------------------------------------------ info
    async def model_info(self) -> dict:
        """`GET /get_model_info` from one healthy worker."""
        return await self._request_json("GET", "/get_model_info", None)

    # ------------------------------------------------------------------ fan-out (every worker, not only healthy)
    async def _fan_out_one(self, worker: _Worker, method: str, path: str, payload: Any,
                           timeout_s: float) -> tuple[int | None, Any, str | None]:
        session = self._require_session()
        try:
            async with session.request(method, worker.url + path, json=payload,
                                       timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await resp.read()
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                return resp.status, body, None
        except asyncio.TimeoutError:
            return None, None, f"timed out after {timeout_s:g}s"
        except (aiohttp.ClientError, OSError) as exc:
            return None, None, f"{type(exc).__name__}: {exc}"

    async def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                       load_format: str | None = None,
                                       flush_cache: bool = True) -> list[WeightUpdateResult]:
        """POST `/update_weights_from_disk` to every worker; one result per worker, in URL order."""
        payload = S.UpdateWeightsRequest(model_path=str(model_path), load_format=load_format,
                                         weight_version=None if weight_version is None else str(weight_version),
                                         flush_cache=bool(flush_cache)).to_json()
        replies = await asyncio.gather(*(self._fan_out_one(w, "POST", "/update_weights_from_disk", payload,
                                                           self.weight_update_timeout_s) for w in self._workers))
        results = []
        for worker, (status, body, err) in zip(self._workers, replies):
            if err is not None:
                results.append(WeightUpdateResult(worker.url, False, f"request failed: {err}", 0))
            else:
                results.append(WeightUpdateResult(worker.url, *S.parse_update_weights_answer(status, body)))
        for r in results:
            if not r.success:
                logger.warning("weight update on %s failed: %s", r.url, r.message)
        return results

    async def _fan_out_simple(self, method: str, path: str, payload: Any = None,
                              timeout_s: float | None = None) -> dict[str, Any]:
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        replies = await asyncio.gather(*(self._fan_out_one(w, method, path, payload, timeout_s)
                                         for w in self._workers))
        out: dict[str, Any] = {}
        for worker, (status, body, err) in zip(self._workers, replies):
            out[worker.url] = {"status": status, "body": body, "error": err}
        return out

    async def pause_generation(self, mode: str | None = None) -> dict[str, Any]:
        """POST `/pause_generation` to every worker; {url: {"status", "body", "error"}}.

        `mode` (SGLang): "abort" (its default: running requests end with finish_reason abort, which
        this client retries), "retract" (back to the waiting queue) or "in_place" (kept, frozen).
        Requests that arrive while paused wait until `continue_generation`.
        """
        return await self._fan_out_simple("POST", "/pause_generation", S.pause_request_body(mode))

    async def continue_generation(self) -> dict[str, Any]:
        return await self._fan_out_simple("POST", "/continue_generation", {})

    async def expect_request(self, within_s: float, timeout_s: float = 5.0) -> dict[str, Any]:
        """POST `/expect_request` (ours) to every worker: a request is coming (a person's turn has begun), so
        background work waits up to `within_s` seconds for it. {url: {"status", "body", "error"}}; SGLang has
        no such route (404) and serves the same without the hold."""
        return await self._fan_out_simple("POST", "/expect_request", S.expect_request_body(within_s), timeout_s)

    async def flush_cache(self) -> dict[str, Any]:
        return await self._fan_out_simple("POST", "/flush_cache")

    async def load_lora_adapter(self, name: str, path: str | None = None) -> dict[str, Any]:
        """POST `/load_lora_adapter` to every worker: with no `path` (our engine) each (re)reads the adapter `name`
        from its adapter directory; with `path` (SGLang) each loads the PEFT directory `path` under the new name
        `name`; {url: {"status", "body", "error"}}."""
        body = {"lora_name": name} if path is None else {"lora_name": name, "lora_path": path}
        return await self._fan_out_simple("POST", "/load_lora_adapter", body)

    async def unload_lora_adapter(self, name: str) -> dict[str, Any]:
        """POST `/unload_lora_adapter {"lora_name": name}` to every worker (SGLang); {url: {"status", "body",
        "error"}}."""
        return await self._fan_out_simple("POST", "/unload_lora_adapter", {"lora_name": name})


async def _sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    decoder = SSEDecoder()
    async for piece in resp.content.iter_any():
        for event in decoder.feed(piece):
            yield event
    for event in decoder.close():
        yield event


async def _stream_results(resp: aiohttp.ClientResponse, worker: _Worker, parse) -> AsyncIterator[GenerateResult]:
    """The parsed `/generate` chunks of an SSE response. The finished chunk comes once the stream has ended
    (``[DONE]``), so a caller that stops there leaves no answer half-read on the connection."""
    held: GenerateResult | None = None
    async with contextlib.aclosing(_sse_events(resp)) as events:
        async for event in events:
            if event == "[DONE]":
                break
            if held is not None:
                yield held
            held = parse(_chunk_json(event, worker), worker)
            if not held.finished:
                yield held
                held = None
    if held is not None:
        yield held


def _chunk_json(event: str, worker: _Worker) -> Any:
    try:
        return json.loads(event)
    except ValueError as exc:
        raise MalformedResponseError(f"bad SSE chunk from {worker.url}/generate: {event[:200]!r}") from exc
