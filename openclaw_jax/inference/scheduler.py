"""The engine's scheduling state and decisions, on the host: no JAX work is launched here.

`EngineConfig` (bucket sizes and budgets), `bucket` (power-of-two shapes, finer for long prompts),
`RequestHandle` (a caller's thread-safe view of one sequence), `Seq` and `Batch` (a sequence and the
running batch whose rows it occupies; `check_spec` and `new_seq` make a request one), and the pure
choices the engine thread makes: how large a new batch is (`plan_batch`), how admitted prompts are
grouped into prefill calls (`prefill_groups`, `extend_groups` for prompts that continue a cached
prefix), and the per-row sampling arrays of a step (`sampling_arrays`).
"""

from __future__ import annotations

import asyncio
import queue
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from openclaw_jax.inference.types import GenerationSpec, SequenceOutput
from openclaw_jax.models.config import LORA_TARGETS


# prompt lengths past half of this (whose power-of-two bucket is at least this) are bucketed in
# `EngineConfig.prompt_bucket_steps` sizes per octave
FINE_BUCKETS_FROM = 512
# smallest bucket of an extend prefill's new tokens (see extend_bucket)
MIN_EXTEND_BUCKET = 16
# running batches' cache lengths past half of this are bucketed in `EngineConfig.cache_bucket_steps` sizes per
# octave: every decode step attends over (and reads) the whole cache, so a 4.4 k-token OpenClaw session in a
# power-of-two 8192-slot cache decoded at about half the rate of one in 4096 slots; below it the cache is small
# beside the weights a step reads, and the few power-of-two lengths keep the compilations few
FINE_CACHE_BUCKETS_FROM = 8192


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 16
    # smallest prompt bucket (prefill length) and cache bucket (prompt + new tokens)
    min_prompt_bucket: int = 16
    min_cache_bucket: int = 64
    # prompt lengths over FINE_BUCKETS_FROM / 2 tokens are padded to one of this many sizes per octave
    # (4: at most 25% padding, e.g. OpenClaw's ~2.3 k-token prompt to 2560 rather than 4096; each size
    # compiles the prefill once); 1: powers of two
    prompt_bucket_steps: int = 4
    # cache lengths (prompt + new tokens) past FINE_CACHE_BUCKETS_FROM / 2 in this many sizes per octave
    # (4: 5120, 6144, 7168, 8192 past 4096; each compiles the decode once); 1: powers of two
    cache_bucket_steps: int = 4
    # KV cache memory allowed for one running batch (B * Lc * bytes per token)
    kv_cache_budget_bytes: int = 2 << 30
    # at most this many (padded) prompt tokens per prefill call
    max_prefill_tokens: int = 16384
    # how long the scheduler waits for more requests before forming a new batch
    batch_wait_s: float = 0.003
    # smallest running batch (decode rows). A larger one costs a little per decode step at low load on
    # CPU (memory-bound) and saves compiling the decode step for every smaller row count.
    min_batch_bucket: int = 1
    # smallest prefill call (rows); 0: min_batch_bucket. Prefill is compute-bound: padding rows costs
    # their full price, so this stays small even where the decode batch is fixed.
    min_prefill_rows: int = 0
    # at most this many prompts per prefill call (0: as many as max_prefill_tokens allows). 1 compiles one
    # prefill per prompt bucket and pads no row; batching prompts saves reading the weights per prompt.
    max_prefill_rows: int = 0
    # decode steps one device call may run before the host sees the tokens (rows stop on device
    # on length and stop ids; a batch with stop strings runs one step per call)
    decode_steps: int = 8
    # decode runs the layers unrolled over a per-layer copy of the weights (kernels.split_layers:
    # faster on CPU, one extra copy of the layer weights in memory); False: the model's layer scan
    unrolled_decode: bool = True
    # top-N log-probs are computed for a power-of-two N >= this (fewer compiled variants)
    min_top_logprobs_bucket: int = 8
    # K/V of prompt prefixes kept for reuse across requests (see prefix_cache.py); 0 turns the
    # prefix cache off. 1 GiB holds ~23 k tokens of SmolLM2-135M in float32.
    prefix_cache_bytes: int = 1 << 30
    # prefixes are cached and matched in whole blocks of this many tokens (a power of two)
    prefix_cache_block: int = 64
    # at a weight swap, the most recently used cached prefixes (up to this many, holding at most this
    # many tokens together) are prefilled with the new weights before they serve (weight_swap.py), so
    # the next turn of an active session reuses its prompt; 0 in either: the swap empties the cache
    prefix_refresh_tokens: int = 8192
    prefix_refresh_entries: int = 8
    # before each prefix (and each catch-up pass) it recomputes, the refresh waits up to this long for no request
    # to be queued or running: it takes the gaps between a person's turns
    prefix_refresh_wait_s: float = 10.0
    # a prefix is recomputed this many tokens at a time (whole blocks), waiting for serving to be idle before each
    # chunk, so a person's turn shares the CPU with the rest of one chunk at most (about 1.5 s of 256 tokens over 4 k
    # cached on 2 AVX2 cores), not with a whole cold prefill of the prefix (15 s at 4 k tokens); smaller chunks cost
    # more CPU in all (bench/prefix_refresh.py) and held the p95 of turns through OpenClaw closer to training off's
    # (bench/openclaw_turns.py; both in docs/performance.md)
    prefix_refresh_chunk_tokens: int = 256
    # in idle time, compile the prefill / extend shapes the sessions' next turns and the next recompute will call
    # (compile_ahead.py), so that neither a turn nor the recompute meets a first call
    compile_ahead: bool = True
    # many people's LoRA adapters served at once (adapters.py): this many resident adapter slots (0: off,
    # the engine serves the base model only), each adapter zero-padded to lora_max_rank on lora_targets;
    # adapters are read by name (a request's lora_path) from lora_dir/<name>/ or handed in as arrays.
    # Each row's adapter is added unmerged beside the fused decode matrices (decode_layers.decode_layer).
    lora_slots: int = 0
    lora_max_rank: int = 16
    lora_targets: tuple[str, ...] = LORA_TARGETS
    lora_dir: str | None = None

    def __post_init__(self):
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size} must be >= 1")
        if self.decode_steps < 1:
            raise ValueError(f"decode_steps={self.decode_steps} must be >= 1")
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes={self.prefix_cache_bytes} must be >= 0 (0 turns the cache off)")
        blk = self.prefix_cache_block
        if blk < 1 or blk & (blk - 1):
            raise ValueError(f"prefix_cache_block={blk} must be a power of two >= 1 (e.g. 64)")
        for name in ("prefix_refresh_tokens", "prefix_refresh_entries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0 turns the refresh at weight swaps off)")
        if self.prefix_refresh_chunk_tokens < 1:
            raise ValueError(f"prefix_refresh_chunk_tokens={self.prefix_refresh_chunk_tokens} must be >= 1")
        if self.prefix_refresh_wait_s < 0:
            raise ValueError(f"prefix_refresh_wait_s={self.prefix_refresh_wait_s} must be >= 0 (0: never wait)")
        if self.max_prefill_rows < 0:
            raise ValueError(f"max_prefill_rows={self.max_prefill_rows} must be >= 0 (0: no limit)")
        if self.min_prefill_rows < 0:
            raise ValueError(f"min_prefill_rows={self.min_prefill_rows} must be >= 0 (0: min_batch_bucket)")
        if self.lora_slots < 0 or self.lora_max_rank < 1:
            raise ValueError(f"lora_slots={self.lora_slots} must be >= 0 (0: no adapters) and "
                             f"lora_max_rank={self.lora_max_rank} >= 1")
        if not self.lora_targets or any(t not in LORA_TARGETS for t in self.lora_targets):
            raise ValueError(f"lora_targets={self.lora_targets!r} must be a non-empty subset of {LORA_TARGETS}")
        for name in ("min_prompt_bucket", "min_cache_bucket", "prompt_bucket_steps", "cache_bucket_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")


    @property
    def prefill_row_bucket(self) -> int:
        return self.min_prefill_rows or self.min_batch_bucket


def bucket(n: int, minimum: int = 1, steps: int = 1, fine_from: int = FINE_BUCKETS_FROM) -> int:
    """Smallest power of two >= max(n, minimum); with steps > 1, from `fine_from` on, the smallest of
    `steps` evenly spaced sizes per octave (steps=4: 1.25, 1.5, 1.75 and 2 times a power of two), so a
    2.3 k-token prompt is padded to 2560, not 4096."""
    n = max(int(n), int(minimum), 1)
    p = 1 << (n - 1).bit_length()
    if steps <= 1 or p < max(int(fine_from), 2 * steps):
        return p
    half = p // 2
    step = half // steps
    return half + step * -(-(n - half) // step)


def prompt_bucket(n: int, config: "EngineConfig") -> int:
    """The padded length of a prefill of n prompt tokens."""
    return bucket(n, config.min_prompt_bucket, config.prompt_bucket_steps)


def cache_bucket(n: int, config: "EngineConfig") -> int:
    """The cache length of a running batch whose longest sequence (prompt + new tokens) is n tokens."""
    return bucket(n, config.min_cache_bucket, config.cache_bucket_steps, FINE_CACHE_BUCKETS_FROM)


def extend_bucket(n: int, config: "EngineConfig") -> int:
    """The padded length of an extend prefill of n new tokens after a cached prefix: from MIN_EXTEND_BUCKET,
    not `min_prompt_bucket` (a floor that keeps cold prompts to few compiled lengths would make a turn
    of tens of new tokens compute hundreds of positions)."""
    return bucket(n, min(MIN_EXTEND_BUCKET, config.min_prompt_bucket), config.prompt_bucket_steps)


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




@jax.jit
def _base_key(seed, index):
    # one compiled call: the same ops run eagerly took tens of milliseconds per request
    key = jax.random.fold_in(jax.random.PRNGKey(seed), index)
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


@dataclass
class Seq:
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
    step_version: str = ""  # the weight version of the step that produced the token being accepted
    cached: int = 0  # prompt tokens whose K/V came from the prefix cache (this prefill starts there)
    gen: int = -1  # weights generation of its prefill (-1: none yet)
    adapter_slot: int = 0  # its adapter's slot in the engine's AdapterBank while it holds one (0: none)

    @property
    def base_key(self) -> np.ndarray:
        """PRNG key of this sequence: (sampling_seed, sample index); built lazily on the engine thread."""
        if self._key is None:
            self._key = np.asarray(_base_key(np.uint32(self.seed % (2 ** 32)), np.int32(self.spec.sample_index)),
                                   np.uint32)
        return self._key

    @property
    def prompt_len(self) -> int:
        return len(self.spec.prompt_ids)

    @property
    def need_len(self) -> int:
        return self.prompt_len + self.max_new


def check_spec(spec: GenerationSpec, context_length: int, vocab_size: int) -> None:
    """ValueError (the client's mistake, in words) unless `spec` can run within the context."""
    n = len(spec.prompt_ids)
    if n == 0:
        raise ValueError("the prompt is empty; at least one token is needed")
    if n >= context_length:
        raise ValueError(f"The input ({n} tokens) is longer than the model's context length "
                         f"({context_length} tokens).")
    mx = spec.sampling.max_new_tokens
    if mx is not None and n + mx > context_length:
        raise ValueError(f"prompt ({n}) + max_new_tokens ({mx}) exceeds the context length ({context_length})")
    bad = [t for t in spec.prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")


def new_seq(spec: GenerationSpec, handle: RequestHandle, rid: str, *, context_length: int,
            eos_token_ids: frozenset, tokenizer: Any, weight_version: str, seed: int) -> Seq:
    """The engine's state of a new request: its limits, stop ids, stop-string tail and output record."""
    sp = spec.sampling
    max_new = sp.max_new_tokens if sp.max_new_tokens is not None else context_length - len(spec.prompt_ids)
    stop_ids: frozenset = frozenset()
    if not sp.ignore_eos:
        stop_ids = frozenset(sp.stop_token_ids) | eos_token_ids
    tail = 0
    for s in sp.stop:
        tail = max(tail, len(tokenizer.encode(s)))
    out = SequenceOutput(rid=rid, prompt_ids=list(spec.prompt_ids), created_time=time.time(),
                         weight_version=weight_version)
    if spec.logprob_start_len >= 0:
        out.input_logprobs = []
        out.input_top_logprobs = [] if spec.top_logprobs_num > 0 else None
        out.input_token_ids_logprobs = [] if spec.token_ids_logprob is not None else None
    return Seq(spec=spec, handle=handle, out=out, max_new=max_new, stop_ids=stop_ids, stop_strs=sp.stop,
               stop_tail_tokens=tail, seed=seed)


@dataclass
class Batch:
    size: int
    cache_len: int
    cache: Any
    rows: list  # Seq | None per row

    def free_rows(self) -> list[int]:
        return [i for i, s in enumerate(self.rows) if s is None]

    def active(self) -> list[Seq]:
        return [s for s in self.rows if s is not None]



def plan_batch(pending: Iterable[Seq], config: EngineConfig, kv_bytes_per_token: int) -> tuple[int, int]:
    """(rows, cache length) of a new running batch for the sequences at the head of the queue.

    Takes sequences in order while the KV cache of the bucketed batch stays within the budget
    (the first always fits); rows are a power of two, at least the number taken.
    """
    chosen = 0
    cache_len = 0
    for seq in pending:
        if chosen >= config.max_batch_size:
            break
        lc = max(cache_len, cache_bucket(seq.need_len, config))
        b = bucket(chosen + 1, config.min_batch_bucket)
        if chosen and b * lc * kv_bytes_per_token > config.kv_cache_budget_bytes:
            break
        chosen += 1
        cache_len = lc
    size = min(bucket(chosen, config.min_batch_bucket), bucket(config.max_batch_size))
    return max(size, chosen), cache_len


def grown_batch_shape(size: int, cache_len: int, active: int, waiting: Sequence[Seq], config: EngineConfig,
                      kv_bytes_per_token: int) -> tuple[int, int]:
    """(rows, cache length) a running batch of `size` x `cache_len` with `active` rows grows to, so that
    the head of the queue (`waiting`, in order, at most the rows `max_batch_size` leaves) can join it:
    as many of them as the KV budget allows, each a bucket (`cache_bucket`, rows a power of two) never smaller
    than now.
    Unchanged when they already fit (free rows, long enough cache) or none fits the budget."""
    best = (size, cache_len)
    need = cache_len
    for taken, seq in enumerate(waiting, start=1):
        need = max(need, cache_bucket(seq.need_len, config))
        rows = max(size, min(bucket(active + taken, config.min_batch_bucket), bucket(config.max_batch_size)))
        if rows * need * kv_bytes_per_token > config.kv_cache_budget_bytes:
            break
        best = (rows, need)
    return best


def _groups_within(seqs: list[Seq], config: EngineConfig, tokens: Callable[[Seq], int],
                   padded: Callable[[int, EngineConfig], int]) -> list[list[Seq]]:
    """Consecutive groups whose padded work (rows x `padded` `tokens`) stays within max_prefill_tokens,
    of at most max_prefill_rows prompts each."""
    groups, current = [], []
    for seq in seqs:
        trial = current + [seq]
        length = padded(max(tokens(s) for s in trial), config)
        too_many = bool(config.max_prefill_rows) and len(trial) > config.max_prefill_rows
        if current and (too_many or bucket(len(trial)) * length > config.max_prefill_tokens):
            groups.append(current)
            current = [seq]
        else:
            current = trial
    if current:
        groups.append(current)
    return groups


def prefill_groups(seqs: list[Seq], config: EngineConfig) -> list[list[Seq]]:
    """Consecutive groups whose padded prefill (rows x prompt bucket) stays within max_prefill_tokens."""
    return _groups_within(seqs, config, lambda s: s.prompt_len, prompt_bucket)


def extend_groups(seqs: list[Seq], config: EngineConfig) -> list[list[Seq]]:
    """Consecutive groups of prefix-cache hits whose padded new tokens (rows x new-token bucket)
    stay within max_prefill_tokens; the cached prefixes cost a gather, not a prefill."""
    return _groups_within(seqs, config, lambda s: s.prompt_len - s.cached, extend_bucket)


def sampling_arrays(seqs: Sequence[Seq | None], size: int, config: EngineConfig, vocab_size: int,
                    steps: Sequence[int] | None = None):
    """Per-row sampling inputs of one step (empty rows: greedy defaults) and the bucketed top-N / id-list widths."""
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
    n_top_b = bucket(n_top, config.min_top_logprobs_bucket) if n_top else 0
    n_top_b = min(n_top_b, vocab_size)
    k_b = bucket(k_ids, 4) if k_ids else 0
    tids = np.zeros((size, max(k_b, 1)), np.int32)
    for i, seq in enumerate(seqs):
        if seq is not None and seq.spec.token_ids_logprob:
            ids = seq.spec.token_ids_logprob
            tids[i, :len(ids)] = ids
    return temps, top_p, top_k, min_p, keys, step, tids, n_top_b, k_b
