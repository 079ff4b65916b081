"""Programs compiled ahead, in the engine's idle time (`CompileAhead`, a base of `engine.Engine`).

Every new (rows, tokens, cached blocks) shape of a prefill or an extend compiles once, on a small CPU in
seconds (2-4 s for SmolLM2-135M on 2 AVX2 cores, 5-15 s while a trainer shares them). Without more, whoever
first calls a shape pays for it: the turn whose session just grew past a power of two of cached blocks,
and the weight swap's recompute of the hot prefixes (`weight_swap.py`), whose chunk shapes are new at the
first swap and whose compilations then share the CPU with the next person's turn.

The shapes that come next are predictable from what the engine holds: the recompute's calls for the
prefixes hot now (`weight_swap.refresh_shapes`, the same chunks as the recompute itself, with one more
chunk for a session one turn longer), and each hot session's next turn, an extend over its cached blocks
with the new-token buckets of the latest turns served and their neighbours (`next_turn_shapes`; before
any, a guess of `FIRST_EXTEND_GUESS` tokens). A thread compiles the ones not run or compiled yet, one at
a time, each after serving has been idle for `IDLE_S` and never during a weight swap, with
`jax.jit(...).lower(...).compile()` on abstract arguments placed as the call's will be: nothing runs, and
the call then finds the program in JAX's in-process cache (and the persistent compilation cache keeps it
for the next start).

Off with `EngineConfig.compile_ahead=False`; not with per-row adapters (a call's params depend on its rows).

The thread is a daemon, but the process never ends under a compilation: a daemon thread still inside XLA when
the interpreter finalizes aborts the process ("FATAL: exception not rethrown"), so `Engine.shutdown` and an
exit hook stop it and wait for the compilation in flight.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
import weakref
from typing import Sequence

from openclaw_jax.inference.prefill import CallShape
from openclaw_jax.inference.scheduler import EngineConfig, bucket, extend_bucket

logger = logging.getLogger(__name__)

# engines whose compile-ahead thread runs: stopped at interpreter exit (module docstring)
_RUNNING: weakref.WeakSet = weakref.WeakSet()
# how long an exit or a shutdown waits for the compilation in flight
STOP_WAIT_S = 120.0

# serving idle this long before a compilation starts (a person's next turn rarely follows within it)
IDLE_S = 1.0
# between two looks for shapes to compile when there was nothing to do
POLL_S = 1.0
# sessions whose next turn is compiled for (the most recently used cached prefixes)
NEXT_TURN_SESSIONS = 4
# before any extend was served, the next turn's new tokens are guessed at this many (a person's message and an
# agent's tool results: OpenClaw's turns after the first added 60-250 tokens in bench/openclaw_turns.py)
FIRST_EXTEND_GUESS = 128
# new-token buckets up to this many are also compiled at half and twice a served turn's (beyond, a turn's
# prefill takes seconds itself)
NEIGHBOUR_MAX = 512


def next_turn_shapes(paths: Sequence[Sequence[int]], recent: Sequence[CallShape], block: int,
                     config: EngineConfig) -> list[CallShape]:
    """Extends a next turn of each session `paths` (its cached prefix, newest first) would call: each recent
    served extend's rows and outputs, with its new-token bucket and then the buckets of half and twice as many
    tokens (up to `NEIGHBOUR_MAX`: a turn's new message varies), over the session's cached blocks now and over
    them plus that many new tokens and a block of answer (the turn after)."""
    shapes: list[CallShape] = []
    for path in paths:
        blocks = len(path) // block
        for seen in recent:
            near = [extend_bucket(n, config) for n in (seen.tokens // 2, seen.tokens * 2) if 0 < n <= NEIGHBOUR_MAX]
            for tokens in [seen.tokens, *near]:
                for grown in (blocks, blocks + tokens // block + 1):
                    shapes.append(dataclasses.replace(seen, tokens=tokens, blocks=bucket(grown)))
    return list(dict.fromkeys(shapes))


@dataclasses.dataclass
class AheadStats:
    """What the compile-ahead thread did: programs compiled (and their seconds), failures, and the looks that
    found nothing left to compile (`idle_passes`: two more than at a reading mean it was idle meanwhile)."""
    on: bool = False
    compiled: int = 0
    seconds: float = 0.0
    failed: int = 0
    idle_passes: int = 0


class CompileAhead:
    """The compile-ahead part of `engine.Engine` (which it is a base of): the thread, what it predicts and
    `wait_compiled_ahead`. Uses the engine's prefiller, shape log, prefix cache, locks and config."""

    def _start_compile_ahead(self) -> None:
        self._ahead_cv = threading.Condition()
        self._ahead_on = bool(self.config.compile_ahead and self._prefix.enabled and self._adapters is None)
        self.ahead_stats = AheadStats(on=self._ahead_on)
        self._ahead_stop = threading.Event()
        self._ahead_thread = None
        if self._ahead_on:
            self._ahead_thread = threading.Thread(target=self._compile_ahead_loop, name="jax-compile-ahead",
                                                  daemon=True)
            self._ahead_thread.start()
            if not _RUNNING:
                # registered after JAX's own exit hooks (the engine's arrays exist), so it runs before them
                atexit.unregister(_stop_all_at_exit)
                atexit.register(_stop_all_at_exit)
            _RUNNING.add(self)

    def _stop_compile_ahead(self, timeout: float = STOP_WAIT_S) -> None:
        """Stop the thread and wait for the compilation in flight (at most `timeout` seconds)."""
        self._ahead_stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._ahead_thread is not None and self._ahead_thread is not threading.current_thread():
            self._ahead_thread.join(timeout)
        _RUNNING.discard(self)

    def wait_compiled_ahead(self, timeout: float) -> bool:
        """Until a look for shapes to compile, begun after this call, finds none left (True), or `timeout`
        seconds (False; also when compile-ahead is off)."""
        if not self._ahead_on:
            return False
        with self._ahead_cv:
            start = self.ahead_stats.idle_passes
            # the first pass to end may have looked before the call
            return self._ahead_cv.wait_for(lambda: self.ahead_stats.idle_passes >= start + 2, timeout)

    def _predicted_shapes(self) -> list[CallShape]:
        """(engine thread) The calls likely next: the sessions' next turns first, then the next recompute's."""
        block = self._prefix.block
        sessions = self._prefix.hot_paths(1 << 40, NEXT_TURN_SESSIONS)
        recent, last = self._shapes.recent_extends(), self._shapes.last_served
        if not recent and last is not None:  # only cold prompts so far: the statics of the latest one
            recent = [dataclasses.replace(last, extend=True, tokens=extend_bucket(FIRST_EXTEND_GUESS, self.config))]
        shapes = next_turn_shapes(sessions, recent, block, self.config)
        return list(dict.fromkeys(shapes + self._next_refresh_shapes()))

    def _compile_ahead_loop(self) -> None:
        while self._idle_for(IDLE_S):
            if self._swap_lock.locked():  # the recompute runs its shapes itself; a second compilation races it
                self._ahead_stop.wait(POLL_S)
                continue
            try:
                todo = [s for s in self._call_in_engine(self._predicted_shapes, timeout=None)
                        if not self._shapes.known(s)]
            except Exception:
                if self.alive:  # not the engine shutting down meanwhile: say why compile-ahead stops
                    logger.exception("predicting the shapes to compile ahead failed; compile-ahead stops")
                return
            if not todo:
                with self._ahead_cv:
                    self.ahead_stats.idle_passes += 1
                    self._ahead_cv.notify_all()
                self._ahead_stop.wait(POLL_S)
                continue
            self._compile_one(todo[0])

    def _compile_one(self, shape: CallShape) -> None:
        with self._lock:
            state = self._state
        started = time.perf_counter()
        try:
            done = self._prefiller.compile(shape, state)
        except Exception:  # a wrong guess must not stop serving; the call compiles it when it comes
            logger.exception("compiling %s ahead failed", shape)
            done = False
        seconds = time.perf_counter() - started
        self._shapes.compiled_ahead(shape, done)  # known either way: not tried again
        if done:
            self.ahead_stats.compiled += 1
            self.ahead_stats.seconds += seconds
            logger.info("%s: compiled ahead in %.1f s", shape, seconds)
        else:
            self.ahead_stats.failed += 1

    def _idle_for(self, seconds: float) -> bool:
        """Until no request has been queued, running or said to be coming for `seconds` (True), or the engine or
        compile-ahead stops (False)."""
        quiet_since = None
        with self._cv:
            while not self._stop and not self._ahead_stop.is_set():
                busy = self._serving_locked()
                now = time.monotonic()
                if busy:
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= seconds:
                    return True
                self._cv.wait(0.25)
        return False


def _stop_all_at_exit() -> None:
    for engine in list(_RUNNING):
        engine._stop_compile_ahead()
