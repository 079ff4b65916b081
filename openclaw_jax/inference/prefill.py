"""One admission round's prefills, with the prefix cache: which prompts reuse cached K/V, the
jitted calls, and the prompt log-probs they return.

Each admitted prompt first looks up its longest cached block prefix (`PrefixCache.match`). Misses
are prefilled from scratch in `prefill_groups` (prompts right-padded to a power-of-two bucket);
hits run an *extend* prefill in `extend_groups`: the cached blocks are gathered into a cache
`[b, nb * block + Ln]` (nb blocks a power of two, Ln new tokens bucketed from 16 on whatever the prompt
bucket's floor: each pair compiles once) and only the new tokens are computed, at positions after the prefix. Afterwards every whole
block of every prompt that is not cached yet is copied from the call's cache into the pool.

When a sequence leaves its row, the whole blocks of its prompt and answer are stored too, from
the running cache (`store_finished`), unless its steps ran on more than one weight version.

Exactness: cached blocks were computed with the same weights (entries are dropped on a weight
change; decode-step K/V differ from a prefill's only by float rounding), and K/V of a prefix do not depend on what follows it (causal attention), so an
extend prefill equals a cold prefill up to float rounding. Prompt log-probs need the hidden state
at every position from `logprob_start_len - 1` on, so such a request reuses at most the blocks
before that position: its input log-probs are computed, never copied.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import jax
import numpy as np

from openclaw_jax.inference.kernels import extend_jit, gather_prefix_jit, prefill_jit
from openclaw_jax.inference.prefix_cache import PrefixCache
from openclaw_jax.inference.scheduler import (EngineConfig, Seq, bucket, extend_bucket, extend_groups,
                                              prefill_groups, prompt_bucket, sampling_arrays)

logger = logging.getLogger(__name__)

# how many of the latest served extends' shapes `ShapeLog.recent_extends` remembers (a compile-ahead guesses the
# next turns' new-token buckets from them)
RECENT_EXTENDS = 4


@dataclass(frozen=True)
class CallShape:
    """What one prefill or extend call compiles for: its rows, its padded tokens (the prompt bucket, or the new
    tokens' bucket of an extend), its cached blocks (extends only) and its static output widths."""

    extend: bool
    rows: int
    tokens: int
    blocks: int = 0
    n_top: int = 0
    k_ids: int = 0
    want_input: bool = False

    def __str__(self) -> str:
        tail = f" over {self.blocks} cached blocks" if self.extend else ""
        return f"{'extend' if self.extend else 'prefill'} {self.rows} x {self.tokens} tokens{tail}"


class ShapeLog:
    """The call shapes this engine has run or compiled ahead (thread-safe; shared by the engine's prefiller,
    the weight swap's refresh and the compile-ahead thread), and the latest served extends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: set[CallShape] = set()   # run or compiled ahead
        self._ran: set[CallShape] = set()
        self._compiled_ahead: set[CallShape] = set()
        self._served_extends: collections.deque[CallShape] = collections.deque(maxlen=RECENT_EXTENDS)
        self.last_served: CallShape | None = None
        self.ahead_hits = 0  # first calls of a shape whose program was compiled ahead

    def ran(self, shape: CallShape, served: bool) -> bool:
        """Record a call; returns whether it is the first call of a shape compiled ahead."""
        with self._lock:
            first = shape not in self._ran
            self._ran.add(shape)
            self._known.add(shape)
            if served:
                self.last_served = shape
                if shape.extend:
                    self._served_extends.append(shape)
            hit = first and shape in self._compiled_ahead
            self.ahead_hits += hit
            return hit

    def compiled_ahead(self, shape: CallShape, done: bool = True) -> None:
        """Record a compilation ahead (done=False: one that could not be made; not tried again either)."""
        with self._lock:
            self._known.add(shape)
            if done:
                self._compiled_ahead.add(shape)

    def known(self, shape: CallShape) -> bool:
        with self._lock:
            return shape in self._known

    def recent_extends(self) -> list[CallShape]:
        """The latest served extends' shapes, newest first, each once."""
        with self._lock:
            return list(dict.fromkeys(reversed(self._served_extends)))


class Prefiller:
    """Runs the prefills of admitted sequences (engine thread only)."""

    def __init__(self, graphdef: Any, config: EngineConfig, vocab_size: int, prefix: PrefixCache,
                 row_state: Callable[[Any, list[Seq], int], Any] | None = None, shapes: ShapeLog | None = None,
                 served: bool = True):
        self.config = config
        self.graphdef = graphdef
        # the shapes run, recorded for compile-ahead (`compile_ahead.py`); served=False: a weight swap's refresh
        self.shapes = shapes if shapes is not None else ShapeLog()
        self.served = served
        # (state, group, rows) -> the params for that group's call: per-row adapters (adapters.py)
        self.row_state = row_state
        self.vocab_size = vocab_size
        self.prefix = prefix
        self._prefill = functools.partial(prefill_jit, graphdef)
        self._extend = functools.partial(extend_jit, graphdef)
        # blocks matched by the running round: not evicted before their group's gather ran (a
        # sequence finishing between two groups stores blocks too)
        self._protect: set = set()

    def reusable_len(self, seq: Seq) -> int:
        """How many prompt tokens may come from the cache: one token is always computed (its
        logits give the first output token), and none at or after a requested prompt log-prob's
        predicting position."""
        limit = seq.prompt_len - 1
        start = seq.spec.logprob_start_len
        if start >= 0:
            limit = min(limit, max(start - 1, 0))
        return limit

    def run(self, seqs: list[Seq], state: Any, version: str, generation: int) -> Iterator[tuple[list[Seq], Any, dict]]:
        """Prefill `seqs` with `state` (weights of `generation`); yields (group, its cache `[b, S]`
        holding prompt token p at slot p, host outputs of row i = group[i])."""
        pc = self.prefix
        paths: dict[int, list] = {}
        if pc.enabled:
            pc.sync(generation)
            for seq in seqs:
                # K/V under an adapter are that adapter's: cached and reused for the base model only
                paths[id(seq)] = [] if seq.spec.lora_path else pc.match(seq.spec.prompt_ids, self.reusable_len(seq))
        self._protect = protect = {node for path in paths.values() for node in path}
        for seq in seqs:
            seq.cached = len(paths.get(id(seq), ())) * pc.block
            seq.out.cached_tokens = seq.cached
            if seq.cached:
                pc.stats.hits += 1
                pc.stats.cached_tokens += seq.cached
        cold = [s for s in seqs if not s.cached]
        warm = [s for s in seqs if s.cached]
        calls = [(g, False) for g in prefill_groups(cold, self.config)]
        calls += [(g, True) for g in extend_groups(warm, self.config)]
        try:
            for group, is_extend in calls:
                started = time.time()
                for seq in group:
                    if seq.out.prefill_started_time is None:
                        seq.out.prefill_started_time = started
                kernel = extend_jit if is_extend else prefill_jit
                compiled = kernel._cache_size()
                if is_extend:
                    cache, host, shape = self._run_extend(group, state, paths)
                else:
                    cache, host, shape = self._run_prefill(group, state)
                ahead = self.shapes.ran(shape, self.served)
                if kernel._cache_size() > compiled:
                    # a shape this process had not run: whoever waits on it waits for the compilation (or the
                    # load from the compilation cache), which this line makes visible in the server's log
                    logger.info("%s: first call of this shape, %.1f s (%s)", shape, time.time() - started,
                                "compiled ahead" if ahead else "compiled, or loaded from the compilation cache")
                if pc.enabled:
                    self._store(group, cache, paths, protect)
                for seq in group:
                    seq.out.weight_version = version  # the oldest version of this response (its prompt's KV)
                    seq.step_version = version
                    seq.gen = generation
                record_input_logprobs(group, host)
                yield group, cache, host
        finally:
            self._protect = set()

    def store_finished(self, seq: Seq, cache: Any) -> None:
        """Keep the K/V of a sequence leaving its row of the running `cache` (prompt and answer so
        far, whole blocks) so the session's next turn, which re-sends both, reuses the answer too.
        Only when its prefill ran on the weights the cache holds entries of: after a swap the cache
        is synced (emptied) at the next prefill, so a sequence that decoded across a swap is either
        stored under the old generation (dropped at that sync, never served) or not at all."""
        pc = self.prefix
        if not pc.enabled or seq.gen != pc.generation or seq.row < 0 or seq.spec.lora_path:
            return
        # slots < position hold K/V (the last sampled token was never fed back)
        ids = (list(seq.spec.prompt_ids) + seq.out.output_ids)[:seq.position]
        n_blocks = len(ids) // pc.block
        path = pc.match(ids, n_blocks * pc.block)
        if len(path) < n_blocks:
            _, writes = pc.insert(ids, path, n_blocks, self._protect | set(path))
            pc.write(cache, [seq.row] * len(writes), [b for b, _ in writes], [slot for _, slot in writes])

    def _arrays(self, group: list[Seq], b: int):
        padded: list[Seq | None] = list(group) + [None] * (b - len(group))
        temps, top_p, top_k, min_p, keys, _, tids, n_top, k_ids = sampling_arrays(padded, b, self.config,
                                                                                  self.vocab_size)
        want_input = any(s.spec.logprob_start_len >= 0 for s in group)
        return (temps, top_p, top_k, min_p, keys, tids), dict(n_top=n_top, k_ids=k_ids, want_input=want_input)

    def _run_prefill(self, group: list[Seq], state: Any):
        b = bucket(len(group), self.config.prefill_row_bucket)
        lp_len = prompt_bucket(max(s.prompt_len for s in group), self.config)
        ids = np.zeros((b, lp_len), np.int32)
        lengths = np.ones((b,), np.int32)
        for i, seq in enumerate(group):
            ids[i, :seq.prompt_len] = seq.spec.prompt_ids
            lengths[i] = seq.prompt_len
        sampling, static = self._arrays(group, b)
        if self.row_state is not None:
            state = self.row_state(state, group, b)
        out = self._prefill(state, ids, lengths, *sampling, **static)
        cache = out.pop("cache")
        return cache, jax.device_get(out), CallShape(False, b, lp_len, 0, **static)

    def _run_extend(self, group: list[Seq], state: Any, paths: dict[int, list]):
        b = bucket(len(group), self.config.prefill_row_bucket)
        # the cached prefix in blocks, a power of two: a session's prefix grows by a block every turn or
        # two, and each new (blocks, new tokens) shape compiles the extend once (seconds on a small CPU)
        nb = bucket(max(len(paths[id(s)]) for s in group))
        ln = extend_bucket(max(s.prompt_len - s.cached for s in group), self.config)
        tables = np.zeros((b, nb), np.int32)  # padding entries: any slot, masked by the row's start
        ids = np.zeros((b, ln), np.int32)
        starts = np.zeros((b,), np.int32)
        lengths = np.ones((b,), np.int32)
        for i, seq in enumerate(group):
            path = paths[id(seq)]
            tables[i, :len(path)] = [node.slot for node in path]
            new = seq.spec.prompt_ids[seq.cached:]
            ids[i, :len(new)] = new
            starts[i] = seq.cached
            lengths[i] = len(new)
        sampling, static = self._arrays(group, b)
        cache = self.prefix.gather(tables, ln)
        if self.row_state is not None:
            state = self.row_state(state, group, b)
        out = self._extend(state, cache, ids, starts, lengths, *sampling, **static)
        cache = out.pop("cache")
        return cache, jax.device_get(out), CallShape(True, b, ln, nb, **static)

    def compile(self, shape: CallShape, state: Any) -> bool:
        """Compile the program a call of `shape` runs, without running it (JAX keeps it in its in-process
        cache, where that call then finds it). False when it cannot be known ahead: per-row adapters, or an
        extend before the prefix cache has a pool."""
        if self.row_state is not None or (shape.extend and self.prefix.pool is None):
            return False
        b = shape.rows
        sampling, _ = self._arrays([], b)
        sampling = (*sampling[:5], np.zeros((b, max(shape.k_ids, 1)), np.int32))
        static = dict(n_top=shape.n_top, k_ids=shape.k_ids, want_input=shape.want_input)
        ids, lengths = np.zeros((b, shape.tokens), np.int32), np.ones((b,), np.int32)
        if not shape.extend:
            prefill_jit.lower(self.graphdef, state, ids, lengths, *sampling, **static).compile()
            return True
        pool, tables = self.prefix.pool, np.zeros((b, shape.blocks), np.int32)
        cache = jax.eval_shape(lambda p, t: gather_prefix_jit(p, t, shape.tokens), pool, tables)
        # the call's cache is the gather's output, committed to a device when the pool is (a placement that
        # differs from the call's would compile a program the call never finds)
        sharding = pool.k.sharding if pool.k.committed else None
        cache = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), cache)
        extend_jit.lower(self.graphdef, state, cache, ids, np.zeros((b,), np.int32), lengths, *sampling,
                         **static).compile()
        return True

    def _store(self, group: list[Seq], cache: Any, paths: dict[int, list], protect: set) -> None:
        """Copy the prompts' whole blocks that are not cached yet into the pool."""
        pc = self.prefix
        rows, src, slots = [], [], []
        for i, seq in enumerate(group):
            if seq.spec.lora_path:
                continue
            path, writes = pc.insert(seq.spec.prompt_ids, paths.get(id(seq), []), seq.prompt_len // pc.block, protect)
            protect.update(path)
            for block_index, slot in writes:
                rows.append(i)
                src.append(block_index)
                slots.append(slot)
        pc.write(cache, rows, src, slots)


def record_input_logprobs(group: list[Seq], host: dict) -> None:
    """Prompt log-probs from a prefill's outputs; row i's column j is position seq.cached + j."""
    for i, seq in enumerate(group):
        start = seq.spec.logprob_start_len
        if start < 0:
            continue
        out = seq.out
        for t in range(start, seq.prompt_len):
            # token t is predicted at position t - 1; the first prompt token has no prediction
            if t == 0:
                out.input_logprobs.append(None)
                if out.input_top_logprobs is not None:
                    out.input_top_logprobs.append(None)
                if out.input_token_ids_logprobs is not None:
                    out.input_token_ids_logprobs.append(None)
                continue
            j = t - 1 - seq.cached
            out.input_logprobs.append(float(host["in_lp"][i, j]))
            if out.input_top_logprobs is not None:
                k = seq.spec.top_logprobs_num
                out.input_top_logprobs.append(
                    [(float(v), int(tid)) for v, tid in zip(host["in_top_vals"][i, j, :k], host["in_top_ids"][i, j, :k])])
            if out.input_token_ids_logprobs is not None:
                ids = seq.spec.token_ids_logprob
                out.input_token_ids_logprobs.append(
                    [(float(host["in_ids_lp"][i, j, n]), int(tid)) for n, tid in enumerate(ids)])
