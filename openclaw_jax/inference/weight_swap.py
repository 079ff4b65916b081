"""The engine's weight swap (`WeightSwaps`, a base of `engine.Engine`): the new weights checked against the
served ones and cast to their dtypes and placements (`cast_to_served`), the hot prefixes of the prefix
cache recomputed under the new weights before they serve (`refresh_prefixes`), and both installed
between two engine steps.

Cached K/V belong to the weights that computed them, so a swap cannot keep them. Without more, every
session's next turn after a swap (in live mode: after every training step) would prefill its whole
prompt cold: OpenClaw's ~2.3 k-token system prompt and the conversation so far. Instead, before the
new weights are installed, `refresh_prefixes` prefills the most recently used cached prefixes
(`PrefixCache.hot_paths`: the system prompt and the recent turns of active sessions, within a budget
of tokens and entries) with the *new* weights into a fresh `PrefixCache`, on the thread that swaps the
weights; the engine thread keeps serving with the old weights and their cache meanwhile. The engine
then installs the weights and the fresh cache together between two steps (`Engine.swap_weights`).

The fresh entries are computed by the engine's own prefill and extend steps (`prefill.Prefiller`) from
the prefixes' token ids, one prefix after another (newest first, so later ones extend the shared
system prompt instead of recomputing it) and `EngineConfig.prefix_refresh_chunk_tokens` at a time (the remainder first, so
every later chunk has that length and the calls' shapes recur from swap to swap: `refresh_shapes` lists
them, for the engine to compile ahead), each chunk waiting until no request is queued or running
(`EngineConfig.prefix_refresh_wait_s` at most): the refresh takes the gaps between a person's turns, and
the new weights wait for it rather than serving. A hit after the
swap is exactly what a cold prefill under the new weights followed by a hit would give, within float
rounding. A turn served on the old weights while the refresh ran cached prefixes the refresh had not
chosen; up to `CATCH_UP_PASSES` more passes recompute those too (a turn's worth of tokens each, extending
what is already fresh), so that session's next turn extends only its new message. What the old weights
cache after the last pass is not carried over (its next turn extends the refreshed part).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.inference.prefill import CallShape, Prefiller, ShapeLog
from openclaw_jax.inference.prefix_cache import PrefixCache
from openclaw_jax.inference.scheduler import EngineConfig, RequestHandle, Seq, bucket, extend_bucket, prompt_bucket
from openclaw_jax.inference.types import GenerationSpec, SamplingParams, SequenceOutput

logger = logging.getLogger(__name__)

# the longest a notice that a request is coming holds background work (`WeightSwaps.expect_request`)
MAX_EXPECT_S = 30.0
# after the refresh, passes over the prefixes the old weights cached meanwhile (each pass is a turn or two of tokens)
CATCH_UP_PASSES = 3


def cast_to_served(state: nnx.State, served: nnx.State) -> nnx.State:
    """`state` with the served params' dtypes and placements (the compiled steps stay valid, numerics do
    not drift); ValueError naming the first mismatch when its structure or a shape differs."""
    new_flat = dict(nnx.to_flat_state(state))
    old_flat = dict(nnx.to_flat_state(served))
    if new_flat.keys() != old_flat.keys():
        missing = sorted(map(str, old_flat.keys() - new_flat.keys()))[:5]
        extra = sorted(map(str, new_flat.keys() - old_flat.keys()))[:5]
        raise ValueError(f"new weights do not match the served model: missing {missing}, unexpected {extra}")
    for key, old in old_flat.items():
        new = new_flat[key]
        if tuple(new.value.shape) != tuple(old.value.shape):
            raise ValueError(f"new weight {'.'.join(map(str, key))} has shape {tuple(new.value.shape)}, "
                             f"the served model has {tuple(old.value.shape)}")
    return jax.tree.map(lambda new, old: jax.device_put(jnp.asarray(new, dtype=old.dtype), old.sharding),
                        state, served)


@dataclass
class Refreshed:
    """A prefix cache computed under new weights, ready to replace the engine's at the swap."""

    cache: PrefixCache
    prefixes: int   # how many prefixes were recomputed (wholly or in part)
    tokens: int     # tokens prefilled (a prefix shared with an earlier one counts once)
    seconds: float
    waited_s: float = 0.0  # of `seconds`, waiting for serving to be idle before a chunk

    def plus(self, more: "Refreshed") -> "Refreshed":
        """This refresh and a catch-up pass `more` into the same cache."""
        return Refreshed(cache=more.cache, prefixes=self.prefixes + more.prefixes, tokens=self.tokens + more.tokens,
                         seconds=self.seconds + more.seconds, waited_s=self.waited_s + more.waited_s)


def _prefill_seq(ids: Sequence[int]) -> Seq:
    """A sequence that only prefills `ids` (its one sampled token is thrown away)."""
    spec = GenerationSpec(prompt_ids=tuple(int(t) for t in ids),
                          sampling=SamplingParams(max_new_tokens=1, temperature=0.0))
    out = SequenceOutput(rid="prefix-refresh", prompt_ids=list(spec.prompt_ids))
    return Seq(spec=spec, handle=RequestHandle("prefix-refresh", False, None), out=out, max_new=1,
               stop_ids=frozenset(), stop_strs=(), stop_tail_tokens=0, seed=0)


def new_prefix_cache(like: PrefixCache, budget_bytes: int, kv_bytes_per_token: int) -> PrefixCache:
    """An empty cache with `like`'s block, slot shape and dtype."""
    return PrefixCache(block=like.block, budget_bytes=budget_bytes, kv_bytes_per_token=kv_bytes_per_token,
                       slot_shape=like._slot_shape, dtype=like._dtype)


def chunk_ends(length: int, done: int, step: int) -> list[int]:
    """Where the recompute of a prefix of `length` tokens, whose first `done` are fresh already, ends its
    chunks: the remainder first, then whole `step`s (every chunk after the first one has the same length)."""
    first = (length - done) % step or step
    return list(range(done + first, length + 1, step)) if length > done else []


def refresh_step(chunk_tokens: int, block: int) -> int:
    return max(chunk_tokens // block, 1) * block


def refresh_shapes(prefixes: Sequence[Sequence[int]], config: EngineConfig, block: int,
                   chunk_tokens: int) -> list[CallShape]:
    """The calls `refresh_prefixes` makes to recompute `prefixes` into an empty cache, in order: the same chunks
    over a model of the fresh cache's contents (which blocks it holds), without the model."""
    step = refresh_step(chunk_tokens, block)
    fresh: set[tuple[int, int]] = set()   # (blocks, hash of the ids up to there) of every block recomputed
    shapes: list[CallShape] = []
    for ids in prefixes:
        keys, chain = [], 0
        for i in range(len(ids) // block):
            chain = hash((chain, tuple(ids[i * block:(i + 1) * block])))
            keys.append((i + 1, chain))
        done = next((i for i, key in enumerate(keys) if key not in fresh), len(keys)) * block
        for end in chunk_ends(len(ids), done, step):
            if done == 0:
                shapes.append(CallShape(False, bucket(1, config.prefill_row_bucket), prompt_bucket(end, config)))
            else:
                shapes.append(CallShape(True, bucket(1, config.prefill_row_bucket), extend_bucket(end - done, config),
                                        bucket(done // block)))
            fresh.update(keys[:end // block])
            done = end
    return shapes


def refresh_prefixes(prefixes: Sequence[Sequence[int]], *, graphdef: Any, state: Any, config: EngineConfig,
                     vocab_size: int, fresh: PrefixCache, generation: int, chunk_tokens: int,
                     before_chunk: Callable[[], None] = lambda: None, shapes: ShapeLog | None = None) -> Refreshed:
    """Prefill `prefixes` (token ids, whole blocks) with `state` into the empty cache `fresh`, whose
    entries then belong to weights generation `generation`. Runs on the caller's thread: the jitted
    steps are the engine's, the cache is not shared with the engine thread until it is installed.

    Each prefix is prefilled in chunks (`chunk_ends`: the first one cold, the next ones extending what is
    already in `fresh`), and `before_chunk()` runs before each chunk: the engine waits there for serving to
    be idle, so that a person's turn competes with at most one chunk. `shapes`: the engine's record of the
    call shapes run."""
    start = time.perf_counter()
    fresh.sync(generation)
    prefiller = Prefiller(graphdef, config, vocab_size, fresh, shapes=shapes, served=False)
    tokens, waited, recomputed = 0, 0.0, 0
    step = refresh_step(chunk_tokens, fresh.block)
    for ids in prefixes:
        done = fresh.contains(ids)  # shared with a prefix recomputed before (or in an earlier pass)
        recomputed += done < len(ids)
        for end in chunk_ends(len(ids), done, step):
            wait_start = time.perf_counter()
            before_chunk()
            waited += time.perf_counter() - wait_start
            seq = _prefill_seq(ids[:end])
            for _ in prefiller.run([seq], state, "prefix-refresh", generation):
                pass
            tokens += seq.prompt_len - seq.cached
    return Refreshed(cache=fresh, prefixes=recomputed, tokens=tokens, seconds=time.perf_counter() - start,
                     waited_s=waited)


class WeightSwaps:
    """The weight-swap part of `engine.Engine` (which it is a base of): `swap_weights`, the refresh of the
    hot prefixes and the install between two engine steps. Uses the engine's params, locks, prefix cache
    and control queue."""

    def swap_weights(self, state: nnx.State, weight_version: str | None = None, *, drain: bool = False,
                     timeout: float | None = None) -> None:
        """Replace the params (same structure, shapes and dtypes) between two engine steps.

        By default serving never pauses: running sequences go on with the new weights from the next
        decode step (their KV cache so far was computed by the old ones, as SGLang's in-flight weight
        updates do), and each output records which version produced which tokens
        (`SequenceOutput.weight_versions`). drain=True instead holds new sequences and lets running
        ones finish on the old weights first, so every sequence runs on one version.

        Before the new weights serve, the most recently used cached prefixes are prefilled with them on
        the calling thread (`EngineConfig.prefix_refresh_tokens` / `prefix_refresh_entries`; the engine
        keeps serving with the old weights meanwhile) and installed with them, so the next turn of an
        active session reuses its prompt instead of prefilling it cold (`weight_swap.refresh_prefixes`).
        """
        cast = cast_to_served(state, self._state)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._swap_lock:  # one swap at a time: a refresh belongs to the weights it computed
            fresh = self._refresh_hot_prefixes(cast)
            if not drain:
                self._install_weights(cast, weight_version, fresh)
                return
            with self._cv:
                self._draining += 1
            try:
                with self._cv:
                    while self._batch is not None and self._batch.active():
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise TimeoutError("timed out waiting for running requests before the weight swap")
                        self._cv.wait(timeout=remaining if remaining is not None else 0.5)
                self._install_weights(cast, weight_version, fresh)
            finally:
                with self._cv:
                    self._draining -= 1
                    self._cv.notify_all()

    def _refresh_hot_prefixes(self, state: nnx.State) -> Refreshed | None:
        """The hot prefixes prefilled with `state` into a fresh prefix cache (None: nothing to refresh,
        the refresh is off, or it failed: the swap then empties the cache as before)."""
        cfg = self.config
        if not (self._prefix.enabled and cfg.prefix_refresh_tokens > 0 and cfg.prefix_refresh_entries > 0
                and self.alive):
            return None
        try:
            def hot() -> list[list[int]]:
                return self._prefix.hot_paths(cfg.prefix_refresh_tokens, cfg.prefix_refresh_entries)

            paths = self._call_in_engine(hot, timeout=None)
            if not paths:
                return None
            logger.info("new weights: recomputing %d hot prefixes (the longest %d tokens) before they serve",
                        len(paths), max(map(len, paths)))
            fresh = new_prefix_cache(self._prefix, cfg.prefix_cache_bytes, self._kv_bytes_per_token)

            def refresh(prefixes: list[list[int]]) -> Refreshed:
                return refresh_prefixes(prefixes, graphdef=self._graphdef, state=state, config=cfg,
                                        vocab_size=self.vocab_size, fresh=fresh, generation=-1,
                                        chunk_tokens=cfg.prefix_refresh_chunk_tokens, shapes=self._shapes,
                                        before_chunk=lambda: self._wait_until_idle(cfg.prefix_refresh_wait_s))

            done = refresh(paths)
            # the turns served (on the old weights) while a pass ran cached prefixes the pass did not see: the
            # next turn of such a session would extend over a whole turn more, so catch up on them, a few times
            for _ in range(CATCH_UP_PASSES):
                missing = [p for p in self._call_in_engine(hot, timeout=None) if fresh.contains(p) < len(p)]
                if not missing:
                    break
                done = done.plus(refresh(missing))
            return done
        except Exception:  # the swap itself must not fail for it
            logger.exception("recomputing the hot prefixes under the new weights failed; the swap empties the "
                             "prefix cache instead")
            return None

    def _next_refresh_shapes(self) -> list[CallShape]:
        """(engine thread) The calls the next swap's recompute would make for the prefixes hot now, and for each
        of them one chunk longer (its session's next turn)."""
        cfg = self.config
        if not (self._prefix.enabled and cfg.prefix_refresh_tokens > 0 and cfg.prefix_refresh_entries > 0):
            return []
        paths = self._prefix.hot_paths(cfg.prefix_refresh_tokens, cfg.prefix_refresh_entries)
        step = refresh_step(cfg.prefix_refresh_chunk_tokens, self._prefix.block)
        longer = [list(p) + [-1] * step for p in paths]  # -1: no token id, so nothing else shares these blocks
        return list(dict.fromkeys(refresh_shapes(paths + longer, cfg, self._prefix.block,
                                                  cfg.prefix_refresh_chunk_tokens)))

    def expect_request(self, within_s: float) -> float:
        """A client says a request is coming (a person's turn has begun; our OpenClaw plugin's notice, through
        the gateway): until it arrives, for `within_s` seconds at most (capped at `MAX_EXPECT_S`), background
        work waits as it does for a request being served: the recompute's next chunk and compiling ahead. The
        person's client builds its prompt on the CPU meanwhile. Returns the seconds held."""
        if not within_s >= 0:  # also NaN
            raise ValueError(f"within_s={within_s!r} must be a number of seconds >= 0")
        held = min(float(within_s), MAX_EXPECT_S)
        with self._cv:
            self._expected_until = max(self._expected_until, time.monotonic() + held)
            self._cv.notify_all()
        return held

    @property
    def expecting_request_s(self) -> float:
        """Seconds left of the hold of an `expect_request` (0: none, or the request came)."""
        with self._cv:
            return max(0.0, self._expected_until - time.monotonic())

    def _serving_locked(self) -> bool:
        """(holding `_cv`) Whether a request is queued or running, or said to be coming (`expect_request`)."""
        return (bool(self._pending) or (self._batch is not None and bool(self._batch.active()))
                or time.monotonic() < self._expected_until)

    def _wait_until_idle(self, limit_s: float) -> None:
        """Until no request is queued, running or said to be coming, for at most `limit_s`: a refresh chunk
        goes after the turn being served (the weights it prepares wait; serving does not)."""
        deadline = time.monotonic() + limit_s
        with self._cv:
            while not self._stop and self._serving_locked():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cv.wait(min(remaining, 0.5))

    def _install_weights(self, state: nnx.State, weight_version: str | None, fresh: Refreshed | None = None) -> None:
        """New params (and, with `fresh`, the prefix cache computed with them) for the next engine step.
        With a fresh cache the install runs on the engine thread between two steps: a prefill round
        reads the weights and the cache it fills together."""
        _, layer_states = self._decode_layers(state)

        def install() -> None:
            with self._lock:
                self._state = state
                self._layer_states = layer_states
                # without a fresh cache the engine thread drops the prefix cache before its next prefill
                self._weights_gen += 1
                if weight_version is not None:
                    self._weight_version = str(weight_version)
                if fresh is not None:
                    old, cache = self._prefix, fresh.cache
                    cache.generation = self._weights_gen
                    cache.stats = old.stats
                    cache.stats.invalidations += 1
                    cache.stats.refreshes += 1
                    cache.stats.refreshed_tokens += fresh.tokens
                    self._prefix = self._prefiller.prefix = cache

        if fresh is not None and self.alive:
            self._call_in_engine(install, timeout=None)
            logger.info("weights swapped; weight_version=%s; %d hot prefixes (%d tokens) recomputed in %.1f s (%.1f s "
                        "of it waiting for serving to be idle)", self._weight_version, fresh.prefixes, fresh.tokens,
                        fresh.seconds, fresh.waited_s)
        else:
            install()
            logger.info("weights swapped; weight_version=%s", self._weight_version)

