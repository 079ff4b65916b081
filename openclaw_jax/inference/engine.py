"""JAX generation engine: batched prefill/decode with a KV cache and a continuous-batching scheduler.

Shape discipline (each bucket compiles once):
  * a *running batch* has B rows (a power of two <= max_batch_size) and a KV cache of Lc
    slots per row (a power of two >= prompt + max_new of every sequence it holds);
  * new sequences are prefilled together into a small cache `[b, Lp]` (b, Lp powers of two,
    prompts right-padded), which is then copied into free rows of the running cache;
  * every decode step runs all B rows at once (empty rows write nowhere: their position is
    Lc, past the cache end, and the decoder drops such writes).
Sequences join free rows while others are still decoding (continuous batching); when a
batch has no active row left it is dropped and the next one is sized for what is waiting.

All jitted work runs in one dedicated engine thread; callers (the aiohttp server, tests,
benchmarks) talk to it through thread-safe handles, so the event loop never blocks on XLA.

Log-probs are log_softmax(logits / T) over the full vocabulary (T = 1 for greedy rows), see
`openclaw_jax.inference.sampling`.  Weights are an `nnx.State` swapped under the engine lock
between steps (`swap_weights`), each result carries the `weight_version` it ran with.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.inference import sampling as sampling_ops
from openclaw_jax.inference.types import GenerationSpec, SequenceOutput
from openclaw_jax.models.decoder import KVCache

logger = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The engine could not run a request (shut down, internal failure)."""


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 16
    # smallest prompt bucket (prefill length) and cache bucket (prompt + new tokens)
    min_prompt_bucket: int = 16
    min_cache_bucket: int = 64
    # KV cache memory allowed for one running batch (B * Lc * bytes per token)
    kv_cache_budget_bytes: int = 2 << 30
    # at most this many (padded) prompt tokens per prefill call
    max_prefill_tokens: int = 16384
    # how long the scheduler waits for more requests before forming a new batch
    batch_wait_s: float = 0.003
    min_batch_bucket: int = 1
    # top-N log-probs are computed for a power-of-two N >= this (fewer compiled variants)
    min_top_logprobs_bucket: int = 8

    def __post_init__(self):
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size} must be >= 1")
        for name in ("min_prompt_bucket", "min_cache_bucket"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


# --------------------------------------------------------------------------------------------
# pure jitted steps (graphdef is bound with functools.partial; params arrive as an nnx.State)
# --------------------------------------------------------------------------------------------
def _sample_outputs(log_src_logits, temps, top_p, top_k, min_p, keys, steps, token_ids, n_top, k_ids):
    skeys = sampling_ops.step_keys(keys, steps)
    tokens, log_probs = sampling_ops.sample_tokens(log_src_logits, temps, top_p, top_k, min_p, skeys)
    out = {"tokens": tokens, "token_lp": sampling_ops.gather_logprobs(log_probs, tokens[:, None])[:, 0]}
    if n_top:
        out["top_vals"], out["top_ids"] = sampling_ops.top_logprobs(log_probs, n_top)
    if k_ids:
        out["ids_lp"] = sampling_ops.gather_logprobs(log_probs, token_ids)
    return out


def _prefill_impl(graphdef, state, input_ids, lengths, temps, top_p, top_k, min_p, keys, token_ids, *,
                  n_top: int, k_ids: int, want_input: bool):
    model = nnx.merge(graphdef, state)
    b, lp_len = input_ids.shape
    # the prompt attends causally to itself: the full-forward attention (blockwise/fused), no [L, L] scores
    hidden, cache = model.prefill_hidden(input_ids, model.init_cache(b, lp_len))
    last = hidden[jnp.arange(b), lengths - 1]
    logits = model.logits(last)
    out = _sample_outputs(logits, temps, top_p, top_k, min_p, keys, jnp.zeros((b,), jnp.int32), token_ids,
                          n_top, k_ids)
    out["cache"] = cache
    if want_input:
        # Prompt log-probs: position t predicts token t + 1.
        all_lp = sampling_ops.scaled_log_probs(model.logits(hidden), temps)
        nxt = jnp.concatenate([input_ids[:, 1:], jnp.zeros((b, 1), input_ids.dtype)], axis=1)
        out["in_lp"] = sampling_ops.gather_logprobs(all_lp, nxt[..., None])[..., 0]
        if n_top:
            out["in_top_vals"], out["in_top_ids"] = sampling_ops.top_logprobs(all_lp, n_top)
        if k_ids:
            out["in_ids_lp"] = sampling_ops.gather_logprobs(
                all_lp, jnp.broadcast_to(token_ids[:, None, :], (b, lp_len, token_ids.shape[-1])))
    return out


def _insert_impl(big, small, rows):
    """Copy prefill caches `[layers, b, Lp, ...]` into rows of the running cache (rows >= B are dropped)."""
    lp_len = small.k.shape[2]
    k = big.k.at[:, rows, :lp_len].set(small.k.astype(big.k.dtype), mode="drop")
    v = big.v.at[:, rows, :lp_len].set(small.v.astype(big.v.dtype), mode="drop")
    return type(big)(k, v)


def _decode_impl(graphdef, state, cache, tokens, positions, temps, top_p, top_k, min_p, keys, steps, token_ids,
                 *, n_top: int, k_ids: int):
    model = nnx.merge(graphdef, state)
    logits, cache = model.decode(tokens[:, None], positions[:, None], cache)
    out = _sample_outputs(logits[:, 0], temps, top_p, top_k, min_p, keys, steps, token_ids, n_top, k_ids)
    out["cache"] = cache
    return out


@functools.partial(jax.jit, static_argnums=(0, 1))
def _zeros_cache_jit(shape, dtype_name):
    # Made by a jitted function so the cache is placed like every other step output (a host-made
    # array would give the steps a different argument signature and cost a recompilation).
    zeros = jnp.zeros(shape, jnp.dtype(dtype_name))
    return KVCache(zeros, zeros)


_prefill_jit = jax.jit(_prefill_impl, static_argnums=(0,), static_argnames=("n_top", "k_ids", "want_input"))
_insert_jit = jax.jit(_insert_impl, donate_argnums=(0,))
_decode_jit = jax.jit(_decode_impl, static_argnums=(0,), static_argnames=("n_top", "k_ids"), donate_argnums=(2,))


# --------------------------------------------------------------------------------------------
# request handles
# --------------------------------------------------------------------------------------------
class RequestHandle:
    """Receives a sequence's updates from the engine thread (thread-safe)."""

    def __init__(self, rid: str, stream: bool, loop: asyncio.AbstractEventLoop | None):
        self.rid = rid
        self.stream = stream
        self._loop = loop
        self._queue: Any = asyncio.Queue() if loop is not None else queue.Queue()
        self.cancelled = False

    def _put(self, item: Any) -> None:
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                self.cancelled = True
        else:
            self._queue.put(item)

    def cancel(self) -> None:
        """Ask the engine to abort this sequence (e.g. the HTTP client went away)."""
        self.cancelled = True

    async def next(self) -> SequenceOutput:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def next_sync(self, timeout: float | None = None) -> SequenceOutput:
        item = self._queue.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item


@dataclass
class _Seq:
    spec: GenerationSpec
    handle: RequestHandle
    out: SequenceOutput
    max_new: int
    stop_ids: frozenset
    stop_strs: tuple[str, ...]
    stop_tail_tokens: int
    seed: int
    _key: np.ndarray | None = None
    row: int = -1
    position: int = 0
    last_token: int = 0

    @property
    def base_key(self) -> np.ndarray:
        """PRNG key of this sequence: (sampling_seed, sample index); built lazily on the engine thread."""
        if self._key is None:
            key = jax.random.fold_in(jax.random.PRNGKey(self.seed % (2 ** 32)), self.spec.sample_index)
            self._key = np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                                   else key, np.uint32)
        return self._key

    @property
    def prompt_len(self) -> int:
        return len(self.spec.prompt_ids)

    @property
    def need_len(self) -> int:
        return self.prompt_len + self.max_new


@dataclass
class _Batch:
    size: int
    cache_len: int
    cache: Any
    rows: list  # _Seq | None per row

    def free_rows(self) -> list[int]:
        return [i for i, s in enumerate(self.rows) if s is None]

    def active(self) -> list[_Seq]:
        return [s for s in self.rows if s is not None]


class Engine:
    """Owns the params and the scheduler thread; see the module docstring."""

    def __init__(self, model: nnx.Module, tokenizer: Any, *, context_length: int | None = None,
                 config: EngineConfig | None = None, weight_version: str = "default", seed: int | None = None,
                 eos_token_ids: Iterable[int] | None = None):
        self.config = config or EngineConfig()
        self.model_config = model.cfg
        self.tokenizer = tokenizer
        self.vocab_size = int(model.cfg.vocab_size)
        self.context_length = int(context_length or model.cfg.max_position_embeddings)
        self._graphdef, self._state = nnx.split(model)
        self._weight_version = str(weight_version)
        if eos_token_ids is None:
            eos: set[int] = set(model.cfg.eos_token_ids)
            eos |= set(getattr(tokenizer, "eos_token_ids", ()) or ())
        else:
            eos = set(int(t) for t in eos_token_ids)
        self.eos_token_ids = frozenset(eos)
        cfg = model.cfg
        cache_dtype = jnp.dtype(cfg.dtype)
        self._kv_bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * cache_dtype.itemsize
        self._rng = np.random.default_rng(seed)

        # Module-level jitted steps with the graphdef as a static argument: engines serving the
        # same architecture (weight reloads, several engines in one process) share compilations.
        self._prefill = functools.partial(_prefill_jit, self._graphdef)
        self._insert = _insert_jit
        self._decode = functools.partial(_decode_jit, self._graphdef)

        self._lock = threading.Lock()  # guards params during a step
        self._cv = threading.Condition()
        self._pending: collections.deque[_Seq] = collections.deque()
        self._batch: _Batch | None = None
        self._paused = False
        self._draining = 0  # > 0 while a weight swap waits for running sequences to finish
        self._stop = False
        self._control: list[Callable[[], None]] = []
        self._steps = 0
        self._thread = threading.Thread(target=self._run, name="jax-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API
    @property
    def weight_version(self) -> str:
        return self._weight_version

    @property
    def params(self) -> nnx.State:
        return self._state

    def compile_counts(self) -> dict[str, int]:
        """Number of compiled variants per jitted function (tests check buckets compile once)."""
        return {name: fn._cache_size() for name, fn in
                (("prefill", _prefill_jit), ("insert", _insert_jit), ("decode", _decode_jit))}

    def num_running(self) -> int:
        with self._cv:
            return len(self._pending) + (len(self._batch.active()) if self._batch else 0)

    def submit(self, spec: GenerationSpec, *, stream: bool = False,
               loop: asyncio.AbstractEventLoop | None = None) -> RequestHandle:
        """Queue one sequence; updates arrive on the returned handle (cumulative when streaming)."""
        if self._stop:
            raise EngineError("the engine is shut down")
        self._check_spec(spec)
        rid = spec.rid or uuid.uuid4().hex
        handle = RequestHandle(rid, stream, loop)
        seq = self._new_seq(spec, handle, rid)
        with self._cv:
            self._pending.append(seq)
            self._cv.notify_all()
        return handle

    async def generate(self, spec: GenerationSpec) -> SequenceOutput:
        handle = self.submit(spec, stream=False, loop=asyncio.get_running_loop())
        try:
            return await handle.next()
        except asyncio.CancelledError:
            handle.cancel()
            raise

    async def stream(self, spec: GenerationSpec) -> AsyncIterator[SequenceOutput]:
        handle = self.submit(spec, stream=True, loop=asyncio.get_running_loop())
        try:
            while True:
                out = await handle.next()
                yield out
                if out.finished:
                    return
        finally:
            handle.cancel()

    def generate_sync(self, specs: Sequence[GenerationSpec], timeout: float | None = None) -> list[SequenceOutput]:
        """Blocking: submit all specs together (so they batch together) and wait for all of them."""
        handles = [self.submit(s) for s in specs]
        return [h.next_sync(timeout=timeout) for h in handles]

    def _call_in_engine(self, fn: Callable[[], Any], timeout: float | None = 30.0) -> Any:
        """Run fn on the engine thread between steps (only that thread mutates batch state)."""
        if threading.current_thread() is self._thread:
            return fn()
        done = threading.Event()
        box: dict[str, Any] = {}

        def task():
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed back to the caller
                box["error"] = exc
            finally:
                done.set()

        with self._cv:
            if self._stop:
                raise EngineError("the engine is shut down")
            self._control.append(task)
            self._cv.notify_all()
        if not done.wait(timeout):
            raise TimeoutError("the engine thread did not answer in time")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def pause(self, abort: bool = True) -> int:
        """Stop scheduling. abort=True finishes queued and running sequences with an abort reason."""
        def do() -> int:
            with self._cv:
                self._paused = True
                return self._abort_all_locked("Abort: generation was paused by /pause_generation.") if abort else 0
        return self._call_in_engine(do)

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def alive(self) -> bool:
        """The engine thread runs and has not been shut down."""
        return self._thread.is_alive() and not self._stop

    def abort_all(self, message: str = "Aborted by the server.") -> int:
        def do() -> int:
            with self._cv:
                return self._abort_all_locked(message)
        return self._call_in_engine(do)

    def swap_weights(self, state: nnx.State, weight_version: str | None = None, *, drain: bool = True,
                     timeout: float | None = None) -> None:
        """Replace the params (same structure, shapes and dtypes) between engine steps.

        drain=True (SGLang's behaviour for /update_weights_from_disk): new sequences wait, running
        ones finish on the old weights, then the swap happens; every sequence runs on one version.
        """
        new_flat = dict(nnx.to_flat_state(state))
        old_flat = dict(nnx.to_flat_state(self._state))
        if new_flat.keys() != old_flat.keys():
            missing = sorted(map(str, old_flat.keys() - new_flat.keys()))[:5]
            extra = sorted(map(str, new_flat.keys() - old_flat.keys()))[:5]
            raise ValueError(f"new weights do not match the served model: missing {missing}, unexpected {extra}")
        for key, old in old_flat.items():
            new = new_flat[key]
            if tuple(new.value.shape) != tuple(old.value.shape):
                raise ValueError(f"new weight {'.'.join(map(str, key))} has shape {tuple(new.value.shape)}, "
                                 f"the served model has {tuple(old.value.shape)}")
        # Keep the served dtypes and placements: the compiled steps stay valid (no recompilation)
        # and numerics do not drift.
        cast = jax.tree.map(lambda new, old: jax.device_put(jnp.asarray(new, dtype=old.dtype), old.sharding),
                            state, self._state)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            if drain:
                self._draining += 1
                try:
                    while self._batch is not None and self._batch.active():
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise TimeoutError("timed out waiting for running requests before the weight swap")
                        self._cv.wait(timeout=remaining if remaining is not None else 0.5)
                    self._install_weights(cast, weight_version)
                finally:
                    self._draining -= 1
                    self._cv.notify_all()
            else:
                self._install_weights(cast, weight_version)

    def _install_weights(self, state: nnx.State, weight_version: str | None) -> None:
        with self._lock:
            self._state = state
            if weight_version is not None:
                self._weight_version = str(weight_version)
        logger.info("weights swapped; weight_version=%s", self._weight_version)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort everything still queued or running and stop the engine thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=timeout)

    # ------------------------------------------------------------------ request setup
    def _check_spec(self, spec: GenerationSpec) -> None:
        n = len(spec.prompt_ids)
        if n == 0:
            raise ValueError("the prompt is empty; at least one token is needed")
        if n >= self.context_length:
            raise ValueError(f"The input ({n} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")
        mx = spec.sampling.max_new_tokens
        if mx is not None and n + mx > self.context_length:
            raise ValueError(f"prompt ({n}) + max_new_tokens ({mx}) exceeds the context length "
                             f"({self.context_length})")
        bad = [t for t in spec.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")

    def _new_seq(self, spec: GenerationSpec, handle: RequestHandle, rid: str) -> _Seq:
        sp = spec.sampling
        max_new = sp.max_new_tokens if sp.max_new_tokens is not None else self.context_length - len(spec.prompt_ids)
        stop_ids: frozenset = frozenset()
        if not sp.ignore_eos:
            stop_ids = frozenset(sp.stop_token_ids) | self.eos_token_ids
        tail = 0
        for s in sp.stop:
            tail = max(tail, len(self.tokenizer.encode(s)))
        seed = sp.sampling_seed if sp.sampling_seed is not None else int(self._rng.integers(0, 2 ** 31 - 1))
        out = SequenceOutput(rid=rid, prompt_ids=list(spec.prompt_ids), created_time=time.time(),
                             weight_version=self._weight_version)
        if spec.logprob_start_len >= 0:
            out.input_logprobs = []
            out.input_top_logprobs = [] if spec.top_logprobs_num > 0 else None
            out.input_token_ids_logprobs = [] if spec.token_ids_logprob is not None else None
        return _Seq(spec=spec, handle=handle, out=out, max_new=max_new, stop_ids=stop_ids, stop_strs=sp.stop,
                    stop_tail_tokens=tail, seed=seed)

    # ------------------------------------------------------------------ scheduler thread
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._control and not self._has_work_locked():
                    self._cv.wait(timeout=0.5)
                control = list(self._control)
                self._control.clear()
                if self._stop:
                    self._abort_all_locked("Aborted: the server is shutting down.")
            for task in control:
                task()
            if self._stop:
                with self._cv:
                    for task in self._control:  # callers waiting on a control task get an answer
                        task()
                    self._control.clear()
                return
            try:
                self._schedule_and_step()
            except Exception as exc:  # never let one bad step kill the engine
                logger.exception("engine step failed")
                self._fail_all(EngineError(f"engine step failed: {type(exc).__name__}: {exc}"))

    def _has_work_locked(self) -> bool:
        if self._paused:
            return False
        running = self._batch is not None and bool(self._batch.active())
        can_admit = bool(self._pending) and not self._draining
        return running or can_admit

    def _schedule_and_step(self) -> None:
        self._drop_cancelled()
        if not self._paused and not self._draining:
            with self._cv:
                # max_new_tokens == 0: only a prefill (prompt log-probs); never occupies a row.
                zero = [s for s in self._pending if s.max_new == 0]
                if zero:
                    self._pending = collections.deque(s for s in self._pending if s.max_new > 0)
            if zero:
                self._prefill_only(zero)
            if self._batch is None or not self._batch.active():
                if self._pending and len(self._pending) < self.config.max_batch_size and self.config.batch_wait_s > 0:
                    # Requests that arrive together should be batched together.
                    time.sleep(self.config.batch_wait_s)
                self._form_batch()
            self._admit()
        if self._batch is not None and self._batch.active() and not self._paused:
            self._decode_step()
        with self._cv:
            if self._batch is not None and not self._batch.active():
                self._batch = None
            self._cv.notify_all()

    def _drop_cancelled(self) -> None:
        with self._cv:
            keep = collections.deque()
            for seq in self._pending:
                if seq.handle.cancelled:
                    self._finish(seq, {"type": "abort", "message": "The request was cancelled by the client."})
                else:
                    keep.append(seq)
            self._pending = keep
            if self._batch is not None:
                for seq in self._batch.active():
                    if seq.handle.cancelled:
                        self._finish(seq, {"type": "abort", "message": "The request was cancelled by the client."})
                        self._release_row(seq)

    def _form_batch(self) -> None:
        """Size a new running batch for the sequences at the head of the queue."""
        with self._cv:
            self._batch = None
            if not self._pending:
                return
            chosen: list[_Seq] = []
            cache_len = 0
            for seq in self._pending:
                if len(chosen) >= self.config.max_batch_size:
                    break
                lc = max(cache_len, bucket(seq.need_len, self.config.min_cache_bucket))
                b = bucket(len(chosen) + 1, self.config.min_batch_bucket)
                if chosen and b * lc * self._kv_bytes_per_token > self.config.kv_cache_budget_bytes:
                    break
                chosen.append(seq)
                cache_len = lc
            size = min(bucket(len(chosen), self.config.min_batch_bucket),
                       bucket(self.config.max_batch_size))
            size = max(size, len(chosen))
        cfg = self.model_config
        shape = (cfg.num_layers, size, cache_len, cfg.num_kv_heads, cfg.head_dim)
        cache = _zeros_cache_jit(shape, jnp.dtype(cfg.dtype).name)
        with self._cv:
            self._batch = _Batch(size=size, cache_len=cache_len, cache=cache, rows=[None] * size)

    def _admit(self) -> None:
        """Prefill waiting sequences that fit into free rows of the running batch (FIFO)."""
        batch = self._batch
        if batch is None:
            return
        with self._cv:
            # rows are a power of two; never run more than max_batch_size sequences at once
            room = self.config.max_batch_size - len(batch.active())
            free = batch.free_rows()[:max(room, 0)]
            admitted: list[_Seq] = []
            while self._pending and len(admitted) < len(free):
                seq = self._pending[0]
                if seq.need_len > batch.cache_len:
                    break  # FIFO: let the batch drain instead of overtaking the head of the queue
                admitted.append(self._pending.popleft())
        if not admitted:
            return
        for seq, row in zip(admitted, free):
            seq.row = row
            batch.rows[row] = seq
        self._prefill_groups(admitted, batch)

    def _groups(self, seqs: list[_Seq]) -> list[list[_Seq]]:
        groups, current = [], []
        for seq in seqs:
            trial = current + [seq]
            lp = bucket(max(s.prompt_len for s in trial), self.config.min_prompt_bucket)
            if current and bucket(len(trial)) * lp > self.config.max_prefill_tokens:
                groups.append(current)
                current = [seq]
            else:
                current = trial
        if current:
            groups.append(current)
        return groups

    def _sampling_arrays(self, seqs: Sequence[_Seq | None], size: int, steps: Sequence[int] | None = None):
        temps = np.ones((size,), np.float32)
        top_p = np.ones((size,), np.float32)
        top_k = np.zeros((size,), np.int32)
        min_p = np.zeros((size,), np.float32)
        keys = np.zeros((size, 2), np.uint32)
        step = np.zeros((size,), np.int32)
        n_top = 0
        k_ids = 0
        for i, seq in enumerate(seqs):
            if seq is None:
                continue
            sp = seq.spec.sampling
            temps[i] = sp.temperature
            top_p[i] = sp.top_p
            top_k[i] = sp.top_k if sp.top_k > 0 else 0
            min_p[i] = sp.min_p
            keys[i] = seq.base_key
            step[i] = len(seq.out.output_ids) if steps is None else steps[i]
            n_top = max(n_top, seq.spec.top_logprobs_num)
            if seq.spec.token_ids_logprob:
                k_ids = max(k_ids, len(seq.spec.token_ids_logprob))
        n_top_b = bucket(n_top, self.config.min_top_logprobs_bucket) if n_top else 0
        n_top_b = min(n_top_b, self.vocab_size)
        k_b = bucket(k_ids, 4) if k_ids else 0
        tids = np.zeros((size, max(k_b, 1)), np.int32)
        for i, seq in enumerate(seqs):
            if seq is not None and seq.spec.token_ids_logprob:
                ids = seq.spec.token_ids_logprob
                tids[i, :len(ids)] = ids
        return temps, top_p, top_k, min_p, keys, step, tids, n_top_b, k_b

    def _run_prefill(self, group: list[_Seq]):
        b = bucket(len(group), self.config.min_batch_bucket)
        lp_len = bucket(max(s.prompt_len for s in group), self.config.min_prompt_bucket)
        ids = np.zeros((b, lp_len), np.int32)
        lengths = np.ones((b,), np.int32)
        for i, seq in enumerate(group):
            ids[i, :seq.prompt_len] = seq.spec.prompt_ids
            lengths[i] = seq.prompt_len
        padded: list[_Seq | None] = list(group) + [None] * (b - len(group))
        temps, top_p, top_k, min_p, keys, _, tids, n_top, k_ids = self._sampling_arrays(padded, b)
        want_input = any(s.spec.logprob_start_len >= 0 for s in group)
        with self._lock:
            out = self._prefill(self._state, ids, lengths, temps, top_p, top_k, min_p, keys, tids,
                                n_top=n_top, k_ids=k_ids, want_input=want_input)
            version = self._weight_version
        cache = out.pop("cache")
        host = jax.device_get(out)
        for seq in group:
            seq.out.weight_version = version
        if want_input:
            self._record_input_logprobs(group, host)
        return cache, host, lp_len

    def _prefill_only(self, seqs: list[_Seq]) -> None:
        for group in self._groups(seqs):
            self._run_prefill(group)
            for seq in group:
                self._finish(seq, {"type": "length", "length": 0})

    def _prefill_groups(self, seqs: list[_Seq], batch: _Batch) -> None:
        for group in self._groups(seqs):
            small_cache, host, _ = self._run_prefill(group)
            rows = np.full((small_cache.k.shape[1],), batch.size, np.int32)  # padding rows: dropped
            for i, seq in enumerate(group):
                rows[i] = seq.row
            batch.cache = self._insert(batch.cache, small_cache, rows)
            for i, seq in enumerate(group):
                seq.position = seq.prompt_len
                self._accept_token(seq, host, i)

    def _record_input_logprobs(self, group: list[_Seq], host: dict) -> None:
        for i, seq in enumerate(group):
            start = seq.spec.logprob_start_len
            if start < 0:
                continue
            n = seq.prompt_len
            out = seq.out
            for t in range(start, n):
                # token t is predicted at position t - 1; the first prompt token has no prediction
                if t == 0:
                    out.input_logprobs.append(None)
                    if out.input_top_logprobs is not None:
                        out.input_top_logprobs.append(None)
                    if out.input_token_ids_logprobs is not None:
                        out.input_token_ids_logprobs.append(None)
                    continue
                out.input_logprobs.append(float(host["in_lp"][i, t - 1]))
                if out.input_top_logprobs is not None:
                    k = seq.spec.top_logprobs_num
                    out.input_top_logprobs.append(
                        [(float(v), int(tid)) for v, tid in zip(host["in_top_vals"][i, t - 1, :k],
                                                                host["in_top_ids"][i, t - 1, :k])])
                if out.input_token_ids_logprobs is not None:
                    ids = seq.spec.token_ids_logprob
                    out.input_token_ids_logprobs.append(
                        [(float(host["in_ids_lp"][i, t - 1, j]), int(tid)) for j, tid in enumerate(ids)])

    def _decode_step(self) -> None:
        batch = self._batch
        size = batch.size
        tokens = np.zeros((size,), np.int32)
        positions = np.full((size,), batch.cache_len, np.int32)  # empty rows write past the end
        for i, seq in enumerate(batch.rows):
            if seq is not None:
                tokens[i] = seq.last_token
                positions[i] = seq.position
        temps, top_p, top_k, min_p, keys, steps, tids, n_top, k_ids = self._sampling_arrays(batch.rows, size)
        with self._lock:
            out = self._decode(self._state, batch.cache, tokens, positions, temps, top_p, top_k, min_p, keys, steps,
                               tids, n_top=n_top, k_ids=k_ids)
        batch.cache = out.pop("cache")
        host = jax.device_get(out)
        self._steps += 1
        for i, seq in enumerate(list(batch.rows)):
            if seq is None:
                continue
            seq.position += 1
            self._accept_token(seq, host, i)

    # ------------------------------------------------------------------ per-token host work
    def _accept_token(self, seq: _Seq, host: dict, i: int) -> None:
        token = int(host["tokens"][i])
        out = seq.out
        out.output_ids.append(token)
        out.output_logprobs.append(float(host["token_lp"][i]))
        k = seq.spec.top_logprobs_num
        if k > 0:
            out.output_top_logprobs.append([(float(v), int(t)) for v, t in zip(host["top_vals"][i, :k],
                                                                               host["top_ids"][i, :k])])
        if seq.spec.token_ids_logprob is not None:
            ids = seq.spec.token_ids_logprob
            out.output_token_ids_logprobs.append(
                [(float(host["ids_lp"][i, j]), int(t)) for j, t in enumerate(ids)] if ids else [])
        seq.last_token = token
        finish = self._check_finished(seq, token)
        if finish is not None:
            self._finish(seq, finish)
            self._release_row(seq)
        elif seq.handle.stream:
            out.text = self._stream_text(seq)
            seq.handle._put(out.snapshot())

    def _check_finished(self, seq: _Seq, token: int) -> dict | None:
        n = len(seq.out.output_ids)
        # Order as SGLang's Req.check_finished: length, then stop tokens, then stop strings.
        if n >= seq.max_new:
            return {"type": "length", "length": seq.max_new}
        limit = min(self.context_length, self._batch.cache_len if self._batch is not None else seq.need_len)
        if seq.position >= limit:  # no slot left for the next token (only reachable with max_new_tokens=None)
            return {"type": "length", "length": n}
        if token in seq.stop_ids:
            return {"type": "stop", "matched": token}
        if seq.stop_strs:
            tail = self.tokenizer.decode(seq.out.output_ids[-(seq.stop_tail_tokens + 1):],
                                         skip_special_tokens=seq.spec.sampling.skip_special_tokens)
            for s in seq.stop_strs:
                if s in tail:
                    return {"type": "stop", "matched": s}
        return None

    def _decode_text(self, seq: _Seq, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=seq.spec.sampling.skip_special_tokens)

    def _final_text(self, seq: _Seq, finish: dict) -> str:
        sp = seq.spec.sampling
        ids = seq.out.output_ids
        matched = finish.get("matched")
        if finish.get("type") == "stop" and isinstance(matched, int) and not sp.no_stop_trim and ids:
            return self._decode_text(seq, ids[:-1])
        text = self._decode_text(seq, ids)
        if finish.get("type") == "stop" and isinstance(matched, str) and not sp.no_stop_trim:
            cut = text.find(matched)
            if cut >= 0:
                text = text[:cut]
        return text

    def _stream_text(self, seq: _Seq) -> str:
        """Text of an unfinished sequence, stable under growth: no half characters, no half stop strings."""
        text = self._decode_text(seq, seq.out.output_ids).rstrip("\ufffd")
        for s in seq.stop_strs:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    text = text[:-k]
                    break
        return text

    def _finish(self, seq: _Seq, finish: dict) -> None:
        out = seq.out
        if out.finish_reason is not None:
            return
        if finish.get("type") != "abort":
            out.text = self._final_text(seq, finish)
        else:
            out.text = self._decode_text(seq, out.output_ids) if out.output_ids else ""
        out.finish_reason = finish
        out.finished_time = time.time()
        seq.handle._put(out.snapshot() if seq.handle.stream else out)

    def _release_row(self, seq: _Seq) -> None:
        batch = self._batch
        if batch is not None and 0 <= seq.row < batch.size and batch.rows[seq.row] is seq:
            batch.rows[seq.row] = None
        seq.row = -1

    def _abort_all_locked(self, message: str) -> int:
        n = 0
        for seq in list(self._pending):
            self._finish(seq, {"type": "abort", "message": message})
            n += 1
        self._pending.clear()
        if self._batch is not None:
            for seq in self._batch.active():
                self._finish(seq, {"type": "abort", "message": message})
                self._release_row(seq)
                n += 1
        return n

    def _fail_all(self, exc: Exception) -> None:
        with self._cv:
            seqs = list(self._pending) + (self._batch.active() if self._batch else [])
            self._pending.clear()
            self._batch = None
            for seq in seqs:
                if seq.out.finish_reason is None:
                    seq.out.finish_reason = {"type": "abort", "message": str(exc)}
                    seq.handle._put(exc)
            self._cv.notify_all()


def spec_for(prompt_ids: Sequence[int], **kwargs: Any) -> GenerationSpec:
    """Convenience for tests and benchmarks: a GenerationSpec from ids and sampling keywords."""
    from openclaw_jax.inference.types import SamplingParams
    spec_fields = {f.name for f in dataclasses.fields(GenerationSpec)}
    spec_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in spec_fields}
    return GenerationSpec(prompt_ids=tuple(int(t) for t in prompt_ids), sampling=SamplingParams(**kwargs),
                          **spec_kwargs)
