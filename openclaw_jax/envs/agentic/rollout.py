"""Group rollouts: n episodes per task, group-normalised GRPO advantages, optional PRM step votes,
samples into the durable store (docs/design.md §13).

Advantage of episode i in a group with outcome rewards r: A_i = r_i - mean(r), divided by
(std(r) + eps) when `normalize_std` (population std, as GRPO). A group whose rewards are all
equal carries no ranking signal: it is dropped (`all_equal=drop`), kept with A = 0 (`zero`: it
still counts in the batch mean), or kept with A = scale * (2r - 1) (`scale`: a small push towards
solved tasks and away from failed ones). With `baseline="none"` there is no group baseline:
A_i = r_i, so with 0/1 rewards the solved episodes are imitated, each with weight 1, and a group
with no reward at all is dropped (filtered imitation, "expert iteration": no push away from
failures, and the tasks a policy nearly always solves count as much as those it half-solves). On
GUI RL with uncited clicks it fell on held-out tasks as GRPO then did (docs/results/gui.md,
without the citation). With PRM step votes s_k in {-1, 0, 1} (the judge's
majority vote on assistant step k given the observation that followed it; the final step has no
next state and gets 0), every token of step k gets A_i + prm_weight * s_k. Observation tokens keep
loss mask 0, so whatever advantage they carry never trains.

Each episode becomes one `rl` Sample: prompt = the opening messages; response = every token after
it (assistant turns and observations) with `loss_mask` and per-token `token_advantages`;
`reward` = +1 solved / -1 not; `weight_version` = the oldest version any of its turns used, so the
trainer's staleness bound applies as for conversation samples.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import grain
import numpy as np

from openclaw_jax.envs.agentic.episode import (Episode, EpisodeRunner, NoDemonstration, Policy, ScriptedPolicy, Task,
                                               oldest_version)
from openclaw_jax.samples import Sample, SampleStore

log = logging.getLogger(__name__)


def group_advantages(rewards: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6,
                     all_equal: str = "drop", all_equal_scale: float = 0.1,
                     baseline: str = "group") -> list[float] | None:
    """Per-episode advantages of one group; None when the group is dropped."""
    r = np.asarray(rewards, np.float64)
    if r.size == 0:
        return None
    if baseline == "none":
        return None if not np.any(r) else [float(x) for x in r]
    if baseline != "group":
        raise ValueError(f"baseline={baseline!r} must be group or none")
    if np.ptp(r) <= 1e-12:
        if all_equal == "drop":
            return None
        if all_equal == "zero":
            return [0.0] * r.size
        if all_equal == "scale":
            return [float(all_equal_scale * (2.0 * x - 1.0)) for x in r]
        raise ValueError(f"all_equal={all_equal!r} must be drop, zero or scale")
    adv = r - r.mean()
    if normalize_std:
        adv = adv / (r.std() + eps)
    return [float(a) for a in adv]


def token_advantages(episode: Episode, advantage: float, step_scores: Sequence[int] | None = None,
                     prm_weight: float = 0.0) -> list[float]:
    """The episode's advantage on every response token, plus prm_weight * vote on each assistant step."""
    out = [float(advantage)] * len(episode.response_ids)
    if step_scores:
        for (start, end), score in zip(episode.turns, step_scores):
            for t in range(start, end):
                out[t] = float(advantage + prm_weight * score)
    return out


def episode_sample(episode: Episode, advantages: list[float], *, group_id: str, index: int,
                   temperature: float, step_scores: Sequence[int] | None = None) -> Sample:
    return Sample(
        session_id=group_id, turn_index=index, kind="rl", reward=1.0 if episode.success else -1.0,
        prompt_ids=list(episode.prompt_ids), response_ids=list(episode.response_ids),
        rollout_logprobs=list(episode.rollout_logprobs), weight_version=oldest_version(episode.weight_versions),
        temperature=temperature, eval_score=1 if episode.success else -1,
        eval_votes=list(step_scores or []), judge="agentic-prm" if step_scores else "agentic-outcome",
        next_state={"env_reward": episode.reward, "end_reason": episode.end_reason, "task_id": episode.task.task_id},
        response_text=episode.final_text, finish_reason=episode.end_reason,
        response_mask=list(episode.loss_mask), token_advantages=advantages,
        image_sha256=[hashlib.sha256(png).hexdigest() for png in episode.images])


# A process reward model's vote on one assistant step: (the step's text, the tool observation that
# followed it, a seed) -> -1, 0 or +1. The run wiring builds it from the gateway's judge.
StepVote = Callable[[str, str, int], Awaitable[int]]


async def step_votes(vote: StepVote, episode: Episode, *, seed: int = 0) -> list[int]:
    """`vote` on every assistant step that a tool observation followed (the last: 0)."""

    async def one(k: int) -> int:
        obs = episode.observations[k] if k < len(episode.observations) else ""
        if not obs:
            return 0
        return int(await vote(_turn_text(episode, k), obs, seed + k))

    return list(await asyncio.gather(*(one(k) for k in range(len(episode.turns)))))


def _turn_text(episode: Episode, k: int) -> str:
    assistant = [m for m in episode.messages if m.get("role") == "assistant"]
    return assistant[k]["content"] if k < len(assistant) else ""


@dataclass
class RolloutStats:
    """Accumulated since the last `take()`: what TensorBoard shows under rollout/ and agentic/."""

    episodes: list[Episode] = field(default_factory=list)
    group_reward_std: list[float] = field(default_factory=list)
    group_reward_mean: list[float] = field(default_factory=list)
    groups: int = 0
    groups_dropped: int = 0
    samples: int = 0

    def take(self) -> dict[str, float]:
        eps = self.episodes
        out: dict[str, float] = {"agentic/groups": float(self.groups), "agentic/groups_dropped": float(self.groups_dropped),
                                 "agentic/samples_written": float(self.samples)}
        if eps:
            out.update({
                "agentic/train_success": float(np.mean([e.success for e in eps])),
                "agentic/turns_per_episode": float(np.mean([e.num_turns for e in eps])),
                "agentic/tool_calls_per_episode": float(np.mean([e.tool_calls for e in eps])),
                "agentic/tool_errors_per_episode": float(np.mean([e.tool_errors for e in eps])),
                "agentic/sandbox_timeouts": float(sum(e.sandbox_timeouts for e in eps)),
                "agentic/episode_tokens": float(np.mean([len(e.response_ids) for e in eps])),
            })
        if self.group_reward_mean:
            out["agentic/group_reward_mean"] = float(np.mean(self.group_reward_mean))
            out["agentic/group_reward_std"] = float(np.mean(self.group_reward_std))
        self.__init__()
        return out


class GroupRollouts:
    """Runs groups of episodes against the policy and appends their samples to the store."""

    def __init__(self, runner: EpisodeRunner, policy: Policy, store: SampleStore, tasks: Sequence[Task], *,
                 group_size: int, temperature: float, normalize_std: bool = True, all_equal: str = "drop",
                 all_equal_scale: float = 0.1, baseline: str = "group", step_vote: StepVote | None = None,
                 prm_weight: float = 0.0):
        if not tasks:
            raise ValueError("group rollouts need at least one training task")
        self.runner, self.policy, self.store = runner, policy, store
        # the training tasks in order, forever, read through grain as the trainer's inputs are
        # (no read threads: the tasks are in memory)
        self.tasks = iter(grain.MapDataset.source(list(tasks)).repeat()
                          .to_iter_dataset(grain.ReadOptions(num_threads=0)))
        self.group_size = group_size
        self.temperature = temperature
        self.normalize_std, self.all_equal, self.all_equal_scale = normalize_std, all_equal, all_equal_scale
        self.baseline = baseline
        self.step_vote, self.prm_weight = step_vote, prm_weight
        self.stats = RolloutStats()
        self._groups = itertools.count()

    async def run_group(self, task: Task) -> tuple[list[Episode], list[float] | None]:
        """n episodes of `task` at once; writes their samples (unless the group is dropped)."""
        episodes = list(await asyncio.gather(*(self.runner.run(task, self.policy, temperature=self.temperature)
                                               for _ in range(self.group_size))))
        rewards = [e.reward for e in episodes]
        advs = group_advantages(rewards, normalize_std=self.normalize_std, all_equal=self.all_equal,
                                all_equal_scale=self.all_equal_scale, baseline=self.baseline)
        gid = f"{task.task_id}#{next(self._groups)}"
        self.stats.episodes.extend(episodes)
        self.stats.groups += 1
        self.stats.group_reward_mean.append(float(np.mean(rewards)))
        self.stats.group_reward_std.append(float(np.std(rewards)))
        if advs is None:
            self.stats.groups_dropped += 1
            return episodes, None
        votes: list[list[int] | None] = [None] * len(episodes)
        if self.step_vote is not None:
            votes = list(await asyncio.gather(*(step_votes(self.step_vote, e) for e in episodes)))
        kept = [(i, e, a, v) for i, (e, a, v) in enumerate(zip(episodes, advs, votes))
                if e.response_ids and e.end_reason != "image_token"]   # a sampled image marker: no sample
        for i, e, a, v in kept:
            sample = episode_sample(e, token_advantages(e, a, v, self.prm_weight), group_id=gid, index=i,
                                    temperature=self.temperature, step_scores=v)
            await asyncio.to_thread(self.store.append, sample, e.images)   # the screenshots' blobs first
        self.stats.samples += len(kept)
        return episodes, advs

    async def drive(self, stop: asyncio.Event, *, groups_in_flight: int, waiting: Callable[[], int],
                    backlog: int) -> None:
        """Keep `groups_in_flight` groups running until `stop`; pause while `waiting()` >= backlog."""

        async def worker() -> None:
            while not stop.is_set():
                if waiting() >= backlog:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=0.25)
                    except asyncio.TimeoutError:
                        pass
                    continue
                task = next(self.tasks)
                try:
                    await self.run_group(task)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - one failed group is logged; the run goes on
                    log.exception("group rollout of %s failed", task.task_id)
                    await asyncio.sleep(1.0)

        await asyncio.gather(*(worker() for _ in range(groups_in_flight)))


@dataclass(frozen=True)
class EvalResult:
    success: float
    n: int
    turns: float
    tool_calls: float
    tool_errors: float
    per_family: dict[str, float]
    episodes: list[Episode] = field(repr=False, default_factory=list)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}heldout_success": self.success, f"{prefix}turns_per_episode": self.turns,
               f"{prefix}tool_calls_per_episode": self.tool_calls, f"{prefix}tool_errors_per_episode": self.tool_errors}
        out.update({f"{prefix}heldout_success/{k}": v for k, v in self.per_family.items()})
        return out


async def evaluate(runner: EpisodeRunner, policy: Policy, tasks: Sequence[Task], *, concurrency: int = 16,
                   temperature: float = 0.0, samples: int = 1) -> EvalResult:
    """Episodes on `tasks`, greedy by default: the fraction solved (and episode statistics). With a
    temperature, `samples` episodes per task, each drawn as training draws them: the policy's expected
    success (the RL objective), which greedy decoding of near-tied choices need not follow."""
    if samples < 1 or (temperature == 0.0 and samples != 1):
        raise ValueError(f"samples={samples} at temperature={temperature}: greedy takes 1, sampling >= 1")
    sem = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> Episode:
        async with sem:
            return await runner.run(task, policy, temperature=temperature)

    eps = list(await asyncio.gather(*(one(t) for t in tasks for _ in range(samples))))
    fams: dict[str, list[bool]] = {}
    for e in eps:
        fams.setdefault(e.task.family or "all", []).append(e.success)
    mean = (lambda xs: float(np.mean(xs)) if len(xs) else 0.0)
    return EvalResult(mean([e.success for e in eps]), len(eps), mean([e.num_turns for e in eps]),
                      mean([e.tool_calls for e in eps]), mean([e.tool_errors for e in eps]),
                      {k: mean(v) for k, v in sorted(fams.items())}, eps)


async def demonstrations(runner: EpisodeRunner, tasks: Sequence[Task]
                         ) -> list[tuple[list[int], list[int], list[bytes]]]:
    """(context ids, assistant-turn ids, the images the context shows) per assistant turn of each
    task's demonstration, with the observations produced by really running its tool calls (the SFT
    warm-up's examples; the images are the screenshots of an image-aware runner, else empty)."""
    sem = asyncio.Semaphore(8)

    async def one(task):
        try:
            turns = runner.env.demonstration(task)
        except NoDemonstration as err:   # e.g. a word problem whose worked solution gave no expression
            log.info("%s; skipped", err)
            return []
        async with sem:
            episode = await runner.run(task, ScriptedPolicy(runner.tokenizer, turns), temperature=0.0)
        if not episode.success:
            log.warning("demonstration of %s does not solve it (reward %s); skipped", task.task_id, episode.reward)
            return []
        ids = episode.prompt_ids + episode.response_ids
        p = len(episode.prompt_ids)
        return [(ids[:p + s], ids[p + s:p + e], episode.images[:n])
                for (s, e), n in zip(episode.turns, episode.turn_images)]

    out = []
    for pairs in await asyncio.gather(*(one(t) for t in tasks)):
        out.extend(pairs)
    return out
