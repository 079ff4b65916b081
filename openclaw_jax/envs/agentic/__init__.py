"""General agentic RL (DESIGN section 13): episodes, environments, group rollouts.

Environments: `toolcall` (python interpreter; math), `terminal` (bash in a prepared directory),
`swe` (fix a small repository until its tests pass) and `easy` (a one-turn environment a tiny
random model can learn, for tests). `make_env(cfg)` builds one from the `agentic:` config.
"""

from __future__ import annotations

import random
from typing import Any

from openclaw_jax.envs.agentic.config import ENVIRONMENTS, AgenticConfig
from openclaw_jax.envs.agentic.episode import (
    Environment,
    Episode,
    EpisodeLimits,
    EpisodeRunner,
    PoolPolicy,
    ScriptedPolicy,
    Task,
    ToolError,
)


class EasyEnv(Environment):
    """One turn, no tools: the reply is correct when its first character is in the task's letter set.

    About half of a random model's replies start with one of them, so group-normalised GRPO has a
    signal from the first step; a model that learned it starts every reply with such a letter."""

    name = "easy"
    system_prompt = "Reply with one word."
    tools: list[dict[str, Any]] = []
    LETTERS = "abcdefghijklm"

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        self.check_split(split)
        rng = random.Random(f"easy/{split}/{seed}")
        words = ["cat", "sun", "tree", "road", "blue", "fish", "rain", "milk", "door", "star"]
        return [Task(f"easy/{split}/{seed}/{i}", f"Say a word ({rng.choice(words)} {i}).", self.LETTERS, {}, "easy")
                for i in range(n)]

    async def call(self, state, task, name, arguments) -> str:
        raise ToolError("this environment has no tools")

    async def score(self, state, task, final_text: str) -> float:
        text = final_text.strip().lower()
        return 1.0 if text[:1] and text[0] in task.answer else 0.0

    def demonstration(self, task: Task) -> list[str]:
        return ["apple"]


def make_env(cfg: AgenticConfig) -> Environment:
    from openclaw_jax.envs.sandbox import SandboxLimits

    limits = SandboxLimits(timeout_s=cfg.sandbox_timeout_s, memory_mb=cfg.sandbox_memory_mb)
    families = tuple(cfg.families)
    if cfg.env == "toolcall":
        from openclaw_jax.envs.agentic.toolcall import ToolCallEnv

        return ToolCallEnv(families or ("product", "sum"), limits)
    if cfg.env == "terminal":
        from openclaw_jax.envs.agentic.terminal import FAMILIES, TerminalEnv

        return TerminalEnv(families or FAMILIES, limits)
    if cfg.env == "swe":
        from openclaw_jax.envs.agentic.swe import SWEEnv

        return SWEEnv(limits)
    if cfg.env == "easy":
        return EasyEnv()
    raise ValueError(f"unknown agentic environment {cfg.env!r}; use one of {ENVIRONMENTS}")


__all__ = ["AgenticConfig", "EasyEnv", "Environment", "Episode", "EpisodeLimits", "EpisodeRunner", "PoolPolicy",
           "ScriptedPolicy", "Task", "ToolError", "make_env"]
