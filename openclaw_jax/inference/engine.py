"""JAX generation engine: batched prefill/decode with a KV cache and a continuous-batching scheduler.

Shape discipline (each bucket compiles once):
  * a *running batch* has B rows (a power of two <= max_batch_size) and a KV cache of Lc
    slots per row (a power of two >= prompt + max_new of every sequence it holds);
  * new sequences are prefilled together into a small cache `[b, Lp]` (b a power of two, Lp one
    too, or for long prompts one of `prompt_bucket_steps` sizes per octave; prompts right-padded),
    which is then copied into free rows of the running cache;
  * a prompt that continues a cached prefix (the prefix cache, `prefix_cache.py`: the system
    prompt and earlier turns of a session) prefills only its new tokens over the gathered K/V
    (`prefill.py`); `SequenceOutput.cached_tokens` says how many prompt tokens were reused;
  * every decode step runs all B rows at once (empty rows write nowhere: their position is
    Lc, past the cache end, and the decoder drops such writes);
  * one decode call runs up to `EngineConfig.decode_steps` steps in a jitted while loop (rows stop
    on device on length, stop ids and the cache end; one step per call when a row has stop strings,
    the loop ends early when a waiting request could take a freed row), so the host round trip,
    argument transfer and Python bookkeeping are paid once per call, not once per token; the host
    then accepts the tokens step by step, exactly as if each step had been its own call;
  * decode runs the layers unrolled over per-layer copies of the weights: XLA:CPU copies each
    layer's weights out of the stacked array on every step of a layer scan. The copies are laid
    out for decode (`decode_layers.fuse_layers`: q/k/v and gate/up fused into one matmul each, the
    LM head as `[V, H]`), attention as element-wise products and sums over the cache as stored.
Sequences join free rows while others are still decoding (continuous batching); when a
batch has no active row left it is dropped and the next one is sized for what is waiting.

All jitted work runs in one dedicated engine thread; callers (the aiohttp server, tests,
benchmarks) talk to it through thread-safe handles, so the event loop never blocks on XLA.

Log-probs are log_softmax(logits / T) over the full vocabulary (T = 1 for greedy rows), see
`openclaw_jax.inference.sampling`.  Weights are an `nnx.State` swapped between steps
(`swap_weights`; the most recently used cached prefixes are first recomputed with the new weights, so
a session's next turn does not prefill its prompt cold); each result carries the `weight_version` it
ran with.

Parts: `kernels.py` (the jitted prefill / insert / decode steps), `prefill.py` and `prefix_cache.py`
(admission prefills and the prefix cache), `weight_swap.py` (checks, casts and the prefix refresh of
a swap), `adapter_serving.py` and `adapters.py` (each row with its own person's LoRA adapter,
`EngineConfig.lora_slots`), `scheduler.py` (config, buckets, request setup and handles, batch sizing
and prefill grouping), `stops.py` (finish reasons and reported text), `memory.py` (what the engine holds
in device memory, from its config alone: the planner's serving numbers); this module is the engine
thread that drives them.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.inference import adapters, stops
from openclaw_jax.inference.adapter_serving import AdapterServing
from openclaw_jax.inference.compile_ahead import CompileAhead
from openclaw_jax.inference.decode_layers import FUSED, fuse_layers
from openclaw_jax.inference.kernels import (decode_loop_fused_jit, decode_loop_jit, extend_jit, gather_prefix_jit,
                                            grow_cache_jit, insert_jit, prefill_jit, split_layers, store_blocks_jit,
                                            zeros_cache_jit)
from openclaw_jax.inference.memory import kv_bytes_per_token
from openclaw_jax.inference.prefill import Prefiller, ShapeLog
from openclaw_jax.inference.prefix_cache import PrefixCache
from openclaw_jax.inference.scheduler import (Batch, EngineConfig, RequestHandle, Seq, bucket, check_spec,
                                              grown_batch_shape, new_seq, plan_batch, sampling_arrays)
from openclaw_jax.inference.types import GenerationSpec, SamplingParams, SequenceOutput
from openclaw_jax.inference.weight_swap import WeightSwaps

logger = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The engine could not run a request (shut down, internal failure)."""


class Engine(WeightSwaps, AdapterServing, CompileAhead):
    """Owns the params and the scheduler thread; see the module docstring (weight swaps: `WeightSwaps`,
    per-row LoRA adapters: `AdapterServing`, shapes compiled in idle time: `CompileAhead`)."""

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
        self._kv_bytes_per_token = kv_bytes_per_token(cfg)
        self._rng = np.random.default_rng(seed)
        # bumped by every weight install: prefix-cache entries belong to one generation
        self._weights_gen = 0
        self._prefix = PrefixCache(block=self.config.prefix_cache_block, budget_bytes=self.config.prefix_cache_bytes,
                                   kv_bytes_per_token=self._kv_bytes_per_token,
                                   slot_shape=(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim), dtype=cache_dtype)
        # the steps' graphdef: the model's, or with adapters on, its LoRA form fed per-row adapters
        steps_graphdef = self._init_adapters(cfg, self._graphdef)
        self._shapes = ShapeLog()  # the prefill / extend shapes run or compiled ahead
        self._prefiller = Prefiller(steps_graphdef, self.config, self.vocab_size, self._prefix,
                                    row_state=None if self._adapters is None else self._group_params,
                                    shapes=self._shapes)

        # Module-level jitted steps with the graphdef as a static argument: engines serving the
        # same architecture (weight reloads, several engines in one process) share compilations.
        self._insert = insert_jit
        self._layer_graphdef, self._layer_states = self._decode_layers(self._state)
        loop = decode_loop_fused_jit if self._layer_graphdef == FUSED else decode_loop_jit
        # the fused decode merges the plain model for its embedding and norm (adapters ride in the layers)
        self._decode = functools.partial(loop, self._graphdef if loop is decode_loop_fused_jit else steps_graphdef,
                                         self._layer_graphdef)

        self._lock = threading.Lock()  # guards params during a step
        self._swap_lock = threading.Lock()  # one weight swap (refresh + install) at a time
        self._cv = threading.Condition()
        self._pending: collections.deque[Seq] = collections.deque()
        self._batch: Batch | None = None
        self._paused = False
        self._draining = 0  # > 0 while a weight swap waits for running sequences to finish
        self._expected_until = 0.0  # monotonic time until which a request said to be coming holds background work
        self._stop = False
        self._control: list[Callable[[], None]] = []
        self._steps = 0
        self._thread = threading.Thread(target=self._run, name="jax-engine", daemon=True)
        self._thread.start()
        self._start_compile_ahead()

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
                (("prefill", prefill_jit), ("extend", extend_jit), ("insert", insert_jit), ("decode", decode_loop_jit),
                 ("decode_fused", decode_loop_fused_jit),
                 ("prefix_gather", gather_prefix_jit), ("prefix_store", store_blocks_jit), ("grow", grow_cache_jit),
                 *adapters.JITTED.items())}

    def prefix_cache_stats(self) -> dict[str, int]:
        """Hits, cached tokens served, stored / evicted blocks, invalidations, blocks in use and allocated."""
        def do() -> dict[str, int]:
            stats = dataclasses.asdict(self._prefix.stats)
            stats.update(block=self._prefix.block, used_blocks=self._prefix.used_blocks,
                         capacity_blocks=self._prefix.capacity, max_blocks=self._prefix.max_slots)
            return stats
        return self._call_in_engine(do)

    def flush_prefix_cache(self, timeout: float | None = 30.0) -> int:
        """Drop every cached prefix (the pool stays allocated); returns how many blocks were cached.
        Runs between engine steps: `timeout` bounds the wait for a long step to end."""
        def do() -> int:
            n = self._prefix.used_blocks
            self._prefix.clear()
            return n
        return self._call_in_engine(do, timeout=timeout)

    def num_running(self) -> int:
        with self._cv:
            return len(self._pending) + (len(self._batch.active()) if self._batch else 0)

    def submit(self, spec: GenerationSpec, *, stream: bool = False,
               loop: asyncio.AbstractEventLoop | None = None) -> RequestHandle:
        """Queue one sequence; updates arrive on the returned handle (cumulative when streaming)."""
        if self._stop:
            raise EngineError("the engine is shut down")
        check_spec(spec, self.context_length, self.vocab_size)
        self._check_adapter(spec)
        rid = spec.rid or uuid.uuid4().hex
        handle = RequestHandle(rid, stream, loop)
        seed = spec.sampling.sampling_seed
        seq = new_seq(spec, handle, rid, context_length=self.context_length, eos_token_ids=self.eos_token_ids,
                      tokenizer=self.tokenizer, weight_version=self._weight_version,
                      seed=int(self._rng.integers(0, 2 ** 31 - 1)) if seed is None else seed)
        with self._cv:
            self._pending.append(seq)
            self._expected_until = 0.0  # the request a notice announced (or another) is here: the queue speaks now
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

    def _decode_layers(self, state: nnx.State):
        """(layer graphdef, per-layer weights) for the unrolled decode, or (None, None) for the scan:
        the fused decode weights (`decode_layers.fuse_layers`, marker FUSED) when the model has no
        LoRA adapters, else the block graphdef and per-layer block params (`kernels.split_layers`)."""
        if not self.config.unrolled_decode:
            return None, None
        fused = fuse_layers(self._graphdef, state)
        if fused is not None:
            return FUSED, fused
        if self.config.lora_slots:
            return None, None  # per-row adapters: the fused layers' or the model's layer scan
        return split_layers(self._graphdef, state)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort everything still queued or running and stop the engine thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=timeout)
        self._stop_compile_ahead()

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
            # outside the lock (submit takes it on the event loop): taking an adapter may read it from disk;
            # only this thread removes queued sequences
            zero = [s for s in zero if self._adapter_ready(s)]
            if zero:
                taken = {id(s) for s in zero}
                with self._cv:
                    self._pending = collections.deque(s for s in self._pending if id(s) not in taken)
            if zero:
                self._prefill_only(zero)
            if self._batch is None or not self._batch.active():
                if self._pending and len(self._pending) < self.config.max_batch_size and self.config.batch_wait_s > 0:
                    # Requests that arrive together should be batched together.
                    time.sleep(self.config.batch_wait_s)
                self._form_batch()
            else:
                self._grow_batch()
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
            size, cache_len = plan_batch(self._pending, self.config, self._kv_bytes_per_token)
        logger.debug("new running batch: %d rows x %d cache slots", size, cache_len)
        cfg = self.model_config
        shape = (cfg.num_layers, size, cache_len, cfg.num_kv_heads, cfg.head_dim)
        # the fused decode keeps one cache array per layer (see kernels.zeros_cache_jit)
        cache = zeros_cache_jit(shape, jnp.dtype(cfg.dtype).name, self._layer_graphdef == FUSED)
        with self._cv:
            self._batch = Batch(size=size, cache_len=cache_len, cache=cache, rows=[None] * size)

    def _grow_batch(self) -> None:
        """Widen the running batch (more rows, a longer cache) for sequences that wait for it.

        Requests reach the engine one by one (HTTP), so a batch formed for the first few would
        otherwise keep the rest waiting until it drains, decoding a few rows at a time. The
        running rows keep their rows and K/V; the new rows and slots start empty."""
        batch = self._batch
        with self._cv:
            room = self.config.max_batch_size - len(batch.active())
            waiting = list(itertools.islice(self._pending, max(room, 0)))
        if not waiting:
            return
        size, cache_len = grown_batch_shape(batch.size, batch.cache_len, len(batch.active()), waiting, self.config,
                                            self._kv_bytes_per_token)
        if (size, cache_len) == (batch.size, batch.cache_len):
            return
        batch.cache = grow_cache_jit(batch.cache, size, cache_len)
        batch.rows.extend([None] * (size - batch.size))
        batch.size, batch.cache_len = size, cache_len

    def _admit(self) -> None:
        """Prefill waiting sequences that fit into free rows of the running batch (FIFO)."""
        batch = self._batch
        if batch is None:
            return
        with self._cv:
            # rows are a power of two; never run more than max_batch_size sequences at once
            room = self.config.max_batch_size - len(batch.active())
            free = batch.free_rows()[:max(room, 0)]
            heads = list(itertools.islice(self._pending, len(free)))
        n = 0
        for seq in heads:  # outside the lock, as in _schedule_and_step; only this thread pops the queue
            if seq.need_len > batch.cache_len or not self._adapter_ready(seq):
                break  # FIFO: let the batch drain (or an adapter slot free) instead of overtaking the head
            n += 1
        with self._cv:
            admitted: list[Seq] = [self._pending.popleft() for _ in range(n)]
        if not admitted:
            return
        for seq, row in zip(admitted, free):
            seq.row = row
            batch.rows[row] = seq
        self._prefill_groups(admitted, batch)

    def _prefill_round(self, seqs: list[Seq]):
        """Prefill groups of `seqs` (see prefill.py), all with the weights current at the start."""
        with self._lock:
            state, version, generation = self._state, self._weight_version, self._weights_gen
        return self._prefiller.run(seqs, state, version, generation)

    def _prefill_only(self, seqs: list[Seq]) -> None:
        for group, _, _ in self._prefill_round(seqs):
            for seq in group:
                self._finish(seq, {"type": "length", "length": 0})
                self._drop_adapter(seq)

    def _prefill_groups(self, seqs: list[Seq], batch: Batch) -> None:
        for group, small_cache, host in self._prefill_round(seqs):
            rows = np.full((small_cache.k.shape[1],), batch.size, np.int32)  # padding rows: dropped
            for i, seq in enumerate(group):
                rows[i] = seq.row
            batch.cache = self._insert(batch.cache, small_cache, rows)
            for i, seq in enumerate(group):
                seq.position = seq.prompt_len
                self._accept_token(seq, host, i)

    def _decode_steps_for(self, batch: Batch) -> int:
        """How many decode steps the next call may run before the host looks at the tokens.

        Stop strings need the tokenizer after every token, so a batch holding such a row takes one
        step per call; otherwise up to `decode_steps` (the device stops rows itself on length and
        stop ids, see kernels.decode_loop_jit)."""
        if any(seq is not None and seq.stop_strs for seq in batch.rows):
            return 1
        return max(1, self.config.decode_steps)

    def _decode_step(self) -> None:
        """One decode call: up to `_decode_steps_for` steps of every row, then the host accepts
        the tokens step by step (exactly as if each step had been its own call)."""
        batch = self._batch
        size = batch.size
        tokens = np.zeros((size,), np.int32)
        positions = np.full((size,), batch.cache_len, np.int32)  # empty rows write past the end
        remaining = np.zeros((size,), np.int32)  # <= 0: the row is empty / stopped on device
        n_stop = max((len(seq.stop_ids) for seq in batch.rows if seq is not None), default=0)
        stop_ids = np.full((size, bucket(n_stop, 4)), -1, np.int32)
        for i, seq in enumerate(batch.rows):
            if seq is not None:
                tokens[i] = seq.last_token
                positions[i] = seq.position
                remaining[i] = seq.max_new - len(seq.out.output_ids)
                stop_ids[i, :len(seq.stop_ids)] = sorted(seq.stop_ids)
        limit = min(self.context_length, batch.cache_len)
        limits = np.full((size,), limit, np.int32)
        temps, top_p, top_k, min_p, keys, steps, tids, n_top, k_ids = sampling_arrays(batch.rows, size, self.config, self.vocab_size)
        n_steps = self._decode_steps_for(batch)
        with self._cv:
            # a waiting request gets the first row that frees up
            stop_on_finish = bool(self._pending)
        with self._lock:
            out = self._decode(*self._decode_inputs(batch), batch.cache, tokens, positions, temps, top_p, top_k, min_p, keys, steps,
                               tids, stop_ids, remaining, limits, np.int32(n_steps), np.bool_(stop_on_finish),
                               n_top=n_top, k_ids=k_ids, max_steps=max(1, self.config.decode_steps))
            version = self._weight_version
        batch.cache = out.pop("cache")
        host = jax.device_get(out)
        n_run = int(host.pop("n_run"))
        self._steps += n_run
        for j in range(n_run):
            step = {name: value[j] for name, value in host.items()}
            for i, seq in enumerate(list(batch.rows)):
                if seq is None:
                    continue
                seq.position += 1
                seq.step_version = version
                self._accept_token(seq, step, i)

    # ------------------------------------------------------------------ per-token host work
    def _accept_token(self, seq: Seq, host: dict, i: int) -> None:
        token = int(host["tokens"][i])
        out = seq.out
        if out.first_token_time is None:
            out.first_token_time = time.time()
        out.output_ids.append(token)
        out.record_version(seq.step_version)
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
        limit = min(self.context_length, self._batch.cache_len if self._batch is not None else seq.need_len)
        finish = stops.check_finished(seq, token, limit, self.tokenizer)
        if finish is not None:
            self._finish(seq, finish)
            self._release_row(seq)
        elif seq.handle.stream:
            out.text = stops.stream_text(seq, self.tokenizer)
            seq.handle._put(out.snapshot())

    def _finish(self, seq: Seq, finish: dict) -> None:
        out = seq.out
        if out.finish_reason is not None:
            return
        if finish.get("type") != "abort":
            out.text = stops.final_text(seq, finish, self.tokenizer)
        else:
            out.text = stops.decode_text(seq, out.output_ids, self.tokenizer) if out.output_ids else ""
        out.finish_reason = finish
        out.finished_time = time.time()
        seq.handle._put(out.snapshot() if seq.handle.stream else out)
        log_request_times(out)

    def _release_row(self, seq: Seq) -> None:
        batch = self._batch
        if batch is not None and 0 <= seq.row < batch.size and batch.rows[seq.row] is seq:
            if not self._stop:
                self._prefiller.store_finished(seq, batch.cache)
            batch.rows[seq.row] = None
        seq.row = -1
        self._drop_adapter(seq)

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
                self._drop_adapter(seq)
                if seq.out.finish_reason is None:
                    seq.out.finish_reason = {"type": "abort", "message": str(exc)}
                    seq.handle._put(exc)
            self._cv.notify_all()


def log_request_times(out: SequenceOutput) -> None:
    """One INFO line per finished sequence: where its time went (queue, prefill to the first token, decode)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    prefill = out.prefill_started_time or out.finished_time
    first = out.first_token_time or out.finished_time
    logger.info("request %s: %d prompt tokens (%d cached), queued %.2f s, prefill to first token %.2f s, %d tokens "
                "out in %.2f s, %s, weights %s", out.rid, len(out.prompt_ids), out.cached_tokens,
                prefill - out.created_time, first - prefill, len(out.output_ids), out.finished_time - first,
                (out.finish_reason or {}).get("type"), out.weight_version)


def spec_for(prompt_ids: Sequence[int], **kwargs: Any) -> GenerationSpec:
    """Convenience for tests and benchmarks: a GenerationSpec from ids and sampling keywords."""
    spec_fields = {f.name for f in dataclasses.fields(GenerationSpec)}
    spec_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in spec_fields}
    return GenerationSpec(prompt_ids=tuple(int(t) for t in prompt_ids), sampling=SamplingParams(**kwargs),
                          **spec_kwargs)
