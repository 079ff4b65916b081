"""The agentic run mode of `python -m openclaw_jax.train` (`agentic.enabled: true`).

`train.py` builds the model, trainer and policy pool as for conversations; instead of the gateway
and simulated users it runs an `AgenticDriver`: group rollouts of the configured environment against
the pool, written to the same durable sample store the trainer consumes (same staleness bound,
same hybrid loss), a greedy held-out evaluation at the start, every `agentic.eval_every` steps and at
the end, and rollout metrics to TensorBoard. `warm_up` is the optional SFT warm-up on generated
demonstrations, run before the trainer is built (the frozen teacher starts from the warmed model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from openclaw_jax.config import ExperimentConfig
from openclaw_jax.envs.agentic.episode import PoolPolicy, episode_runner, make_env
from openclaw_jax.envs.agentic.rollout import GroupRollouts, StepVote, demonstrations, evaluate
from openclaw_jax.gateway.judge import ModelJudge, NextState, RuleJudge
from openclaw_jax.models.hub import load_pretrained, save_checkpoint
from openclaw_jax.models.image_processing import ImageProcessorConfig
from openclaw_jax.models.qwen_vl import QwenVLConfig, is_vl_config
from openclaw_jax.pool.client import PoolClient
from openclaw_jax.samples import SampleStore
from openclaw_jax.trainer.input_pipeline import demonstration_batches
from openclaw_jax.trainer.sft import SFTTrainer

log = logging.getLogger(__name__)


def policy_images(base) -> ImageProcessorConfig | None:
    """The image processor of a vision-language policy (a Qwen2.5-VL `base.hf_config`: its episodes
    show it the environment's screenshots), or None for a text model."""
    hf = dict(getattr(base, "hf_config", None) or {})
    return ImageProcessorConfig.for_vision(QwenVLConfig.from_hf_dict(hf).vision) if is_vl_config(hf) else None


def warm_up(cfg: ExperimentConfig, base, run_dir: Path):
    """SFT on generated demonstrations (cached in <run_dir>/warmup); returns `base` with the warmed model
    as the student and, when `base` has a frozen teacher, as that teacher too: RL after a warm-up starts
    from the warmed-up policy, so the KL anchor (`loss.kl_coef`) and the OPD teacher hold it there, not at
    the model before the warm-up."""
    a = cfg.agentic
    out = run_dir / "warmup"
    if (out / "config.json").exists():
        log.info("loading the warmed-up model from %s", out)
        return _warmed_up(cfg, base, out)
    env = make_env(a)
    images = policy_images(base)
    runner = episode_runner(a, env, base.tokenizer, images=images)
    # demonstrations come from training tasks the RL stream reaches last (a different seed)
    tasks = env.tasks("train", a.warmup_examples, seed=a.seed + 7919)
    t0 = time.monotonic()
    pairs = asyncio.run(demonstrations(runner, tasks))
    if not pairs:
        raise RuntimeError(f"no demonstration of agentic.env={a.env} solved its task; cannot warm up")
    log.info("warm-up: %d assistant turns from %d demonstrations in %.1f s", len(pairs), len(tasks),
             time.monotonic() - t0)
    pad = base.tokenizer.pad_token_id
    sft = SFTTrainer(base.model, lr=a.warmup_lr, pad_id=int(pad) if pad is not None else 0,
                     chunk_size=cfg.trainer.chunk_size, images=images)
    losses = []
    batches = demonstration_batches(pairs, steps=a.warmup_steps, batch_size=a.warmup_batch_size, seed=a.seed)
    for step, batch in enumerate(batches):   # batches sorted by length: few padded shapes (and compiles)
        losses.append(sft.step(batch))
        if step % 10 == 0 or step == a.warmup_steps - 1:
            log.info("warm-up step %d/%d: loss %.4f", step + 1, a.warmup_steps, losses[-1])
    save_checkpoint(sft.model(), None, out, extra_config=base.hf_config)
    if hasattr(base.tokenizer, "save_pretrained"):  # the cache must load on resume like any HF dir
        base.tokenizer.save_pretrained(out)
    del sft
    return _warmed_up(cfg, base, out)


def _warmed_up(cfg: ExperimentConfig, base, out: Path):
    """`base` with the student (and the frozen teacher, if it has one) read from the warm-up's checkpoint,
    in the dtypes and on the mesh `train.load_base_model` gives the base model."""
    loaded = load_pretrained(str(out), mesh=base.mesh, dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype,
                             teacher_dtype=cfg.model.dtype if base.teacher is not None else None,
                             remat=cfg.model.remat, attention=cfg.model.attention, tokenizer=False)
    return dataclasses.replace(base, model=loaded.model, teacher=loaded.teacher)


def judge_step_vote(judge) -> StepVote:
    """The PRM step vote of `envs.agentic.rollout` from a gateway judge: its evaluation of the step
    given the tool observation that followed it."""

    async def vote(text: str, observation: str, seed: int) -> int:
        judgement = await judge.judge(text, NextState("tool", observation), seed=seed)
        return int(judgement.eval_score)

    return vote


def _judge(cfg: ExperimentConfig, client, tokenizer):
    g = cfg.gateway
    if g.judge == "rule":
        return RuleJudge()
    return ModelJudge(client, tokenizer, votes=g.judge_votes, temperature=g.judge_temperature,
                      max_new_tokens=g.judge_max_new_tokens, timeout_s=g.judge_timeout_s)


class AgenticDriver:
    """Group rollouts into the store while the trainer trains; held-out evaluation; metrics."""

    def __init__(self, cfg: ExperimentConfig, policy_urls: list[str], tokenizer, *, store_dir: str,
                 offset_fn: Callable[[], int], images: ImageProcessorConfig | None = None,
                 pool_api_key: str | None = None):
        """`images`: the policy's image processor (a vision-language policy sees the screenshots);
        `pool_api_key`: the policy servers' bearer key."""
        self.cfg = cfg
        self.policy_urls = policy_urls
        self.pool_api_key = pool_api_key
        self.tokenizer = tokenizer
        self.store_dir = store_dir
        self.offset_fn = offset_fn
        a = cfg.agentic
        self.env = make_env(a)
        self.runner = episode_runner(a, self.env, tokenizer, images=images)
        self.heldout = self.env.tasks("heldout", a.heldout_tasks, seed=a.seed)
        self.train_tasks = self.env.tasks("train", a.train_tasks, seed=a.seed)
        self.backlog = a.backlog or 2 * cfg.trainer.samples_per_step
        self.client = None
        self.store = None
        self.rollouts: GroupRollouts | None = None
        self._reader = None

    async def start(self) -> "AgenticDriver":
        a = self.cfg.agentic
        self.client = await PoolClient(self.policy_urls, request_timeout_s=self.cfg.policy.request_timeout_s,
                                       api_key=self.pool_api_key).start()
        self.store = SampleStore(self.store_dir)
        self._reader = SampleStore(self.store_dir, readonly=True)
        vote = judge_step_vote(_judge(self.cfg, self.client, self.tokenizer)) if a.prm else None
        # a resumed run continues the task stream where its samples reached (one group = group_size samples)
        start = (len(self.store) // a.group_size) % len(self.train_tasks)
        tasks = self.train_tasks[start:] + self.train_tasks[:start]
        self.rollouts = GroupRollouts(self.runner, PoolPolicy(self.client), self.store, tasks, group_size=a.group_size,
                                      temperature=self.cfg.gateway.temperature, normalize_std=a.normalize_std,
                                      all_equal=a.all_equal, all_equal_scale=a.all_equal_scale,
                                      baseline=a.baseline, step_vote=vote,
                                      prm_weight=a.prm_weight)
        return self

    def waiting(self) -> int:
        return self._reader.refresh() - self.offset_fn()

    async def drive(self, stop: asyncio.Event) -> None:
        await self.rollouts.drive(stop, groups_in_flight=self.cfg.agentic.groups_in_flight, waiting=self.waiting,
                                  backlog=self.backlog)

    async def evaluate(self, step: int, writer: Any = None) -> dict[str, Any]:
        t0 = time.monotonic()
        result = await evaluate(self.runner, PoolPolicy(self.client), self.heldout,
                                concurrency=self.cfg.agentic.eval_concurrency)
        metrics = result.metrics()
        record = {"step": step, "heldout_success": result.success, "n": result.n, "per_family": result.per_family,
                  "turns": result.turns, "tool_calls": result.tool_calls, "tool_errors": result.tool_errors,
                  "end_reasons": dict(Counter(e.end_reason for e in result.episodes)),
                  # what the failed episodes ended with (to tell a wrong answer from a cut-off turn)
                  # and what they did (the assistant turns: a wrong click tells a misread from a broken call)
                  "failures": [{"task": e.task.task_id, "end": e.end_reason, "text": e.final_text[-120:],
                                "turns": [str(m.get("content") or m.get("tool_calls"))[-160:]
                                          for m in e.messages if m.get("role") == "assistant"]}
                               for e in result.episodes if not e.success],
                  "eval_s": time.monotonic() - t0}
        if self.cfg.agentic.eval_samples:
            sampled = await evaluate(self.runner, PoolPolicy(self.client), self.heldout,
                                     concurrency=self.cfg.agentic.eval_concurrency,
                                     temperature=self.cfg.gateway.temperature, samples=self.cfg.agentic.eval_samples)
            record.update(heldout_success_sampled=sampled.success, samples_per_task=self.cfg.agentic.eval_samples,
                          per_family_sampled=sampled.per_family, eval_s=time.monotonic() - t0)
            metrics["eval/heldout_success_sampled"] = sampled.success
        if writer is not None:
            writer.scalars(step, metrics)
            writer.flush()
        return record

    def log_rollouts(self, step: int, writer: Any) -> dict[str, float]:
        metrics = self.rollouts.stats.take() if self.rollouts is not None else {}
        if writer is not None and metrics:
            writer.scalars(step, metrics)
        return metrics

    async def close(self) -> None:
        for closer in (self.client.close if self.client else None,):
            if closer is not None:
                await closer()
        for store in (self.store, self._reader):
            if store is not None:
                store.close()
