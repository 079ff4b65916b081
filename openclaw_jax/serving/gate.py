"""The promotion gate: a trained weight version is a candidate, served only if it passes the check.

`PromotionGate` is a weight push (``await gate(graphdef, state, version)``, what
`pool.weight_sync.BackgroundWeightSync` runs in the background), wrapped around the pool's own push
(``serve``): the trainer hands it every new version as before and knows nothing of the gate.

For each candidate (docs/gate_and_status.md states the rule):

1. the replay set is read (`replay.ReplayReader`: the last ``gate.replay_size`` held-out turns) and
   each turn's reaction is judged by the configured judge (``verdict``; once per turn);
2. `scoring.replay_terms` compares the candidate with the served version on those turns, on this
   side, without serving the candidate; `scoring.decide` applies the rule;
3. under the serving lock, if nobody rolled back meanwhile (else the check runs again against the
   newly served version): a passing candidate's weights are kept (``v<version>/``), served, logged
   ``promoted`` and the oldest kept versions beyond ``gate.keep`` removed; a failing one is logged
   ``refused`` with its reason and numbers, and is never served.

**After a refusal** training goes on from the candidate (its update may be right and merely not yet
shown on the replay set; the next candidate is again checked against the served version). After
``gate.reset_after`` refusals in a row the gate logs ``reset`` and asks the trainer to restart from
the served weights (`take_reset`): that many failed checks mean the updates since the served version
move away from what the person accepts, and each further step on them only adds drift, until no
candidate could pass the drift bound. Candidates trained before the reset are then ignored.

With ``gate.enabled`` false every version is served and logged ``promoted`` without a check (and no
weights are kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import jax
from flax import nnx

from openclaw_jax.samples import Sample
from openclaw_jax.serving.config import GateConfig
from openclaw_jax.serving.replay import ReplayReader
from openclaw_jax.serving.scoring import (TurnTerms, aggregate, decide, not_replayed, replay_arrays, replay_terms,
                                          signal_count)
from openclaw_jax.serving.versions import VersionLog, VersionStore, refusals_in_a_row

log = logging.getLogger(__name__)

Serve = Callable[[nnx.GraphDef, nnx.State, str, "Path | None"], Awaitable[None]]
Verdict = Callable[[Sample], Awaitable[int]]


@dataclass(frozen=True)
class ScoringSetup:
    """What the check computes with, from the trainer's side: the sampling temperature (tau), the LM
    head chunk, the loss weights, the hint candidates per turn, the pad id, and the frozen teacher
    (None: the check has no teacher term, e.g. for the `rl` loss)."""

    temperature: float
    chunk_size: int
    w_rl: float
    w_opd: float
    max_candidates: int = 1
    pad_id: int = 0
    teacher_graphdef: Any = None
    teacher_state: Any = None
    mesh: Any = None


def version_number(version: str) -> int | None:
    try:
        return int(str(version).rsplit("-", 1)[-1])
    except ValueError:
        return None


class PromotionGate:
    """See the module docstring. ``write_kept(graphdef, state, version) -> Path`` and
    ``load_kept(version) -> state`` keep and read weights under ``versions_dir`` (the serving dtype)."""

    def __init__(self, cfg: GateConfig, versions_dir: str | Path, *, serve: Serve,
                 write_kept: Callable[[nnx.GraphDef, nnx.State, str], Path] | None = None,
                 load_kept: Callable[[str], nnx.State] | None = None, replay: ReplayReader | None = None,
                 setup: ScoringSetup | None = None, verdict: Verdict | None = None):
        if cfg.enabled and None in (write_kept, load_kept, replay, setup, verdict):
            raise ValueError("an enabled gate needs write_kept, load_kept, replay, setup and verdict")
        self.cfg = cfg
        self.log = VersionLog(versions_dir)
        self.kept = VersionStore(versions_dir)
        self.serve, self.write_kept, self.load_kept = serve, write_kept, load_kept
        self.replay, self.setup, self.verdict = replay, setup, verdict
        self.served_version: str | None = None
        self._served_state: nnx.State | None = None
        self._verdicts: dict[str, int] = {}
        self._reset_state: nnx.State | None = None
        self._ignore_through = -1           # candidates of steps <= this were trained before a reset

    # ------------------------------------------------------------------ start

    async def start(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> str:
        """The pool serves ``state`` as ``version`` now; on a restart with the gate on it is brought to the
        version the log says was served (kept weights). Logs ``start``; returns the served version."""
        served = self.log.served_version()
        reason = "the trainer's weights"
        if self.cfg.enabled and served is not None and self.kept.has(served):
            if served != version:
                state = await asyncio.to_thread(self.load_kept, served)
                await self.serve(graphdef, state, served, self.kept.path(served))
            version, reason = served, "the version served before the restart (kept weights)"
        elif self.cfg.enabled:
            await asyncio.to_thread(self.write_kept, graphdef, state, version)
        self.served_version = version
        self._served_state = state if self.cfg.enabled else None
        self.log.append("start", version, version, reason=reason, gate=self.cfg.enabled, holdout_every=self.cfg.holdout)
        log.info("serving weight version %s (%s); promotion gate %s", version, reason,
                 "on" if self.cfg.enabled else "off")
        return version

    # ------------------------------------------------------------------ the push

    async def __call__(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> None:
        step = version_number(version)
        if step is not None and step <= self._ignore_through:
            log.info("candidate %s was trained before the reset at step %d: not checked", version,
                     self._ignore_through)
            return
        if not self.cfg.enabled:
            await self.serve(graphdef, state, version, None)
            self.served_version = version
            self.log.append("promoted", version, version, step=step, check=None, reason="gate off")
            return
        for _ in range(3):
            served_version, served_state = await self._served(graphdef)
            check = await self._check(graphdef, served_state, state)
            lock = await asyncio.to_thread(self.log.serving_lock().acquire)
            try:
                if self.log.served_version() != served_version:
                    log.info("served version changed to %s while candidate %s was checked against %s; checking "
                             "again", self.log.served_version(), version, served_version)
                    continue
                failed, reason = decide(check, min_replay=self.cfg.min_replay, min_score=self.cfg.min_score,
                                        max_kl=self.cfg.max_kl)
                if failed is None:
                    await self._promote(graphdef, state, version, step, check, reason)
                else:
                    self._refuse(version, step, served_version, served_state, check, failed, reason)
                return
            finally:
                lock.release()
        raise RuntimeError(f"the served version kept changing while candidate {version} was checked")

    async def _served(self, graphdef: nnx.GraphDef) -> tuple[str, nnx.State]:
        """The served version per the log, its weights read from the kept directory if it changed (rollback)."""
        served = self.log.served_version()
        if served is not None and served != self.served_version:
            self._served_state = await asyncio.to_thread(self.load_kept, served)
            self.served_version = served
            log.info("checking candidates against version %s from now on (served since a rollback)", served)
        return self.served_version, self._served_state

    async def _promote(self, graphdef, state, version, step, check, reason) -> None:
        path = await asyncio.to_thread(self.write_kept, graphdef, state, version)
        await self.serve(graphdef, state, version, path)
        self.log.append("promoted", version, version, step=step, check=check.as_dict(), reason=reason)
        self.served_version, self._served_state = version, state
        await asyncio.to_thread(self.kept.prune, self.cfg.keep, {version})
        log.info("promoted weight version %s: %s", version, reason)

    def _refuse(self, version, step, served_version, served_state, check, rule, reason) -> None:
        self.log.append("refused", version, served_version, step=step, check=check.as_dict(), rule=rule,
                        reason=reason)
        log.warning("refused weight version %s (version %s stays served): %s", version, served_version, reason)
        in_a_row = refusals_in_a_row(self.log.events())
        if self.cfg.reset_after and in_a_row >= self.cfg.reset_after:
            why = (f"{in_a_row} refusals in a row (gate.reset_after={self.cfg.reset_after}): training restarts from "
                   f"the served weights of version {served_version}")
            self.log.append("reset", served_version, served_version, step=step, reason=why)
            self._reset_state = served_state
            log.warning("%s", why)

    # ------------------------------------------------------------------ the check

    async def _verdict(self, sample: Sample) -> int:
        if sample.sample_id not in self._verdicts:
            self._verdicts[sample.sample_id] = int(await self.verdict(sample))
        return self._verdicts[sample.sample_id]

    async def _check(self, graphdef: nnx.GraphDef, served: nnx.State, candidate: nnx.State):
        samples = await asyncio.to_thread(self.replay.refresh)
        verdicts = list(await asyncio.gather(*(self._verdict(s) for s in samples)))   # the judge pool bounds its calls
        live = {s.sample_id for s in samples}
        self._verdicts = {k: v for k, v in self._verdicts.items() if k in live}
        setup = self.setup
        signal = signal_count(verdicts, [bool(s.hint_prompt_ids) for s in samples], w_rl=setup.w_rl,
                              w_opd=setup.w_opd, teacher=setup.teacher_graphdef is not None)
        if signal < self.cfg.min_replay:
            # too little evidence to promote whatever the replay shows: refuse without the replay's forward passes
            # (minutes at OpenClaw's prompt sizes on a CPU, taken from the person's turns)
            return not_replayed(signal)
        turns = await asyncio.to_thread(self._score, graphdef, served, candidate, samples, verdicts)
        return aggregate(turns, w_rl=self.setup.w_rl, w_opd=self.setup.w_opd)

    def _score(self, graphdef, served, candidate, samples: list[Sample], verdicts: list[int]) -> list[TurnTerms]:
        setup = self.setup
        teacher = setup.teacher_graphdef is not None and setup.w_opd > 0
        # the served weights where the candidate's are (a kept version is read onto the default device)
        served = jax.tree.map(lambda s, c: jax.device_put(s, c.sharding), served, candidate)
        turns = []
        mesh = jax.set_mesh(setup.mesh) if setup.mesh is not None else contextlib.nullcontext()
        with mesh:
            for sample, verdict in zip(samples, verdicts):
                arrays = replay_arrays(sample.prompt_ids, sample.response_ids, sample.response_mask,
                                       sample.hint_prompt_ids if teacher else (), max_candidates=setup.max_candidates,
                                       pad_id=setup.pad_id)
                batch = {k: v for k, v in vars(arrays).items() if v is not None}
                out = replay_terms(graphdef, served, candidate, batch, temperature=setup.temperature,
                                   chunk_size=setup.chunk_size,
                                   teacher_graphdef=setup.teacher_graphdef if "hint_ids" in batch else None,
                                   teacher=setup.teacher_state if "hint_ids" in batch else None)
                out = jax.device_get(out)
                turns.append(TurnTerms(sample.sample_id, verdict, float(out["dlogp"][0]), float(out["drift"][0]),
                                       float(out["teacher"][0]) if "teacher" in out else None))
        return turns

    # ------------------------------------------------------------------ reset

    def take_reset(self) -> nnx.State | None:
        """The served weights the trainer should restart from, once per `reset` event (None: none pending)."""
        state, self._reset_state = self._reset_state, None
        return state

    def reset_done(self, step: int) -> None:
        """The trainer restarted from the served weights after step ``step``: older candidates are ignored."""
        self._ignore_through = step

    async def close(self) -> None:
        if self.replay is not None:
            self.replay.close()
