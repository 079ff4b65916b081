"""The promotion gate of a `python -m openclaw_jax.train` run, from the experiment config.

`start_gate` builds a `serving.gate.PromotionGate` around the pool's weight push (the embedded
engine's in-process swap, or the external workers' `/update_weights_from_disk` of the kept
directory), logs what the pool serves at start (restoring, on a restart, the version served before)
and returns it: train.py hands it to the background weight sync in place of the plain push. The
gate's judge is the gateway's own (the same verdicts the samples got), its replay set the run's
sample store, its versions directory ``<run_dir>/versions``.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Callable

import jax
from flax import nnx

from openclaw_jax.config import ExperimentConfig
from openclaw_jax.gateway.judge import Judge, NextState
from openclaw_jax.parallel import multihost
from openclaw_jax.samples import Sample
from openclaw_jax.serving.gate import PromotionGate, ScoringSetup
from openclaw_jax.serving.replay import ReplayReader
from openclaw_jax.serving.versions import VersionStore, versions_dir_for


def judge_verdict(judge: Judge) -> Callable[[Sample], Any]:
    """The judge's eval score of a stored turn, from the person's reaction the sample kept (its
    ``next_state``); a sample without one keeps the verdict it was stored with."""

    async def verdict(sample: Sample) -> int:
        ns = sample.next_state or {}
        if ns.get("role") not in ("user", "tool") or not isinstance(ns.get("content"), str):
            return int(sample.eval_score)
        state = NextState(role=ns["role"], content=ns["content"], name=ns.get("name"), raw=ns.get("raw"))
        judgement = await judge.judge(sample.response_text, state, seed=zlib.crc32(sample.sample_id.encode()) * 1000)
        return int(judgement.eval_score)

    return verdict


class LateJudge:
    """The judge ``judge_of()`` returns at each call: the gate starts before the gateway whose judge it asks."""

    def __init__(self, judge_of: Callable[[], Judge]):
        self.judge_of = judge_of

    async def judge(self, response_text: str, next_state: NextState, *, seed: int = 0) -> Any:
        return await self.judge_of().judge(response_text, next_state, seed=seed)


async def start_gate(cfg: ExperimentConfig, trainer: Any, base: Any, push: Any, judge: Judge | None,
                     *, store_dir: str | Path) -> PromotionGate:
    """The run's gate around ``push`` (an `InProcessWeightSync`-like ``push(graphdef, state, version)``, or a
    `DiskWeightSync`: then kept directories are pushed by path), started on the trainer's current weights."""
    if cfg.gate.enabled and multihost.is_multiprocess():
        raise RuntimeError("the promotion gate runs with one trainer process; set gate.enabled=false for a "
                           "multi-process trainer")
    versions_dir = versions_dir_for(store_dir)
    kept = VersionStore(versions_dir)
    dtype = cfg.model.dtype
    model_config = base.config.replace(param_dtype=dtype) if base.config is not None else None
    tokenizer_dir = None if base.model_dir == "smollm2" else base.model_dir

    def write_kept(graphdef, state, version):
        return kept.write(version, nnx.merge(graphdef, state), model_config, extra_config=base.hf_config,
                          tokenizer_files_from=tokenizer_dir)

    async def serve(graphdef, state, version, path):
        push_path = getattr(push, "push_path", None)
        if path is not None and push_path is not None:
            await push_path(path, version)
        else:
            await push(graphdef, state, version)

    enabled = cfg.gate.enabled
    loss = cfg.loss
    # the scoring reads the trainer's step (pad id, mesh) and state (the frozen teacher): a gated run trains
    setup = ScoringSetup(temperature=cfg.gateway.temperature, chunk_size=cfg.trainer.chunk_size, w_rl=loss.w_rl,
                         w_opd=loss.w_opd if loss.uses_hints else 0.0, max_candidates=cfg.gateway.max_candidates,
                         pad_id=trainer.train_step.spec.pad_id,
                         teacher_graphdef=trainer.state.teacher_graphdef if loss.uses_hints else None,
                         teacher_state=trainer.state.teacher if loss.uses_hints else None,
                         mesh=trainer.train_step.mesh) if enabled else None
    replay = ReplayReader(store_dir, holdout_every=cfg.gate.holdout_every, size=cfg.gate.replay_size,
                          max_tokens=cfg.trainer.max_seq_len) if enabled else None
    if enabled and judge is None:
        raise RuntimeError("gate.enabled=true needs the gateway's judge (a run with the gateway)")
    gate = PromotionGate(cfg.gate, versions_dir, serve=serve, write_kept=write_kept,
                         load_kept=lambda version: kept.load_state(version, dtype), replay=replay,
                         setup=setup, verdict=judge_verdict(judge) if judge else None)
    graphdef = state = None
    if enabled:
        # its own arrays: in the master dtype the serving model shares the trainer's, which the next step donates
        graphdef, state = nnx.split(trainer.serving_model())
        state = jax.tree.map(lambda x: x.copy(), state)
    await gate.start(graphdef, state, trainer.weight_version)
    return gate
