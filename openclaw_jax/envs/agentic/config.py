"""`agentic:` section of the experiment config (general agentic RL, docs/design.md §13); imports only configlib and
the environments' names (`catalog.py`: no environment is imported)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from openclaw_jax.configlib import require
from openclaw_jax.envs.agentic.catalog import ENVIRONMENTS


@dataclass(frozen=True)
class AgenticConfig:
    """Group rollouts of an environment feeding the trainer (instead of the gateway's conversations)."""

    enabled: bool = False
    # a registered environment (`@register_environment`: toolcall | terminal | swe | gui | easy; the built-in
    # ones are known by name in `catalog.py` and imported when built)
    env: str = "toolcall"
    families: tuple[str, ...] = ()       # task families of the environment (empty = its defaults)
    # the environment's own keyword options (`from_config`), e.g. gui: {screenshot_scale: 0.5}
    env_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    train_tasks: int = 4096              # size of the generated training task set (cycled)
    heldout_tasks: int = 32
    # --- group rollouts and advantages
    group_size: int = 4                  # n episodes per task
    groups_in_flight: int = 2            # groups rolled out at once
    normalize_std: bool = True           # A = (r - mean) / (std + eps), else r - mean
    all_equal: Literal["drop", "zero", "scale"] = "drop"   # groups whose rewards are all equal
    all_equal_scale: float = 0.1         # "scale": A = scale * (2r - 1) for every episode of such a group
    # "group": GRPO's A = r - mean(r) (normalize_std, all_equal apply); "none": A = r, the solved episodes
    # imitated and reward-free groups dropped (filtered imitation; envs/agentic/rollout.py)
    baseline: Literal["group", "none"] = "group"
    backlog: int = 0                     # pause new groups while this many samples wait (0 = 2 batches)
    # --- PRM step votes (the judge votes on each tool-calling step from its observation)
    prm: bool = False
    prm_weight: float = 0.5              # step advantage = outcome advantage + prm_weight * step vote
    # --- episodes
    max_turns: int = 4
    max_new_tokens: int = 96             # per assistant turn
    max_response_tokens: int = 384       # assistant + observation tokens per episode
    max_observation_chars: int = 512
    episode_timeout_s: float = 300.0
    tool_prompt: Literal["auto", "native", "system"] = "auto"   # tools via the template or our system prompt
    sandbox_timeout_s: float = 5.0
    sandbox_memory_mb: int = 256
    # --- held-out evaluation (greedy) and the SFT warm-up on generated demonstrations
    eval_every: int = 5                  # trainer steps between held-out evaluations (0 = start/end only)
    eval_concurrency: int = 16
    # also this many sampled episodes per held-out task at gateway.temperature (0 = greedy only): the
    # policy's expected success, what RL optimises, reported beside the greedy success
    eval_samples: int = 0
    warmup_steps: int = 0                # SFT steps before RL (0 = none)
    warmup_batch_size: int = 8
    warmup_lr: float = 1e-4
    warmup_examples: int = 256           # demonstrations generated for the warm-up

    def __post_init__(self):
        require(self.env in ENVIRONMENTS, f"agentic.env={self.env!r} must be one of {ENVIRONMENTS.names()}")
        for name in ("train_tasks", "group_size", "groups_in_flight", "max_turns", "max_new_tokens",
                     "max_response_tokens", "max_observation_chars", "eval_concurrency", "warmup_batch_size",
                     "warmup_examples"):
            require(getattr(self, name) > 0, f"agentic.{name}={getattr(self, name)} must be > 0")
        require(self.group_size >= 2 or self.all_equal != "drop",
                 f"agentic.group_size={self.group_size}: a group of one always has equal rewards and would always "
                 "be dropped; use group_size >= 2 or all_equal=zero|scale")
        for name in ("heldout_tasks", "backlog", "eval_every", "warmup_steps", "eval_samples"):
            require(getattr(self, name) >= 0, f"agentic.{name}={getattr(self, name)} must be >= 0")
        require(self.episode_timeout_s > 0 and self.sandbox_timeout_s > 0,
                 "agentic.episode_timeout_s and agentic.sandbox_timeout_s must be > 0")
        require(self.sandbox_memory_mb >= 16, f"agentic.sandbox_memory_mb={self.sandbox_memory_mb} must be >= 16")
        require(self.baseline in ("group", "none"), f"agentic.baseline={self.baseline!r} must be group or none")
        require(self.warmup_lr > 0, f"agentic.warmup_lr={self.warmup_lr} must be > 0")
