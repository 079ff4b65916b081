"""General agentic RL (docs/design.md §13): episodes, environments, group rollouts.

Environments: `toolcall` (python interpreter; math), `terminal` (bash in a prepared directory),
`swe` (fix a small repository until its tests pass), `gui` (a real Tk application on its own Xvfb display,
acted on with click/type/key) and `easy` (a one-turn environment a tiny
random model can learn, for tests), each registered with `@register_environment(name)`.
`make_env(cfg)` builds one from the `agentic:` config, `episode_runner(cfg, env, tokenizer)` the
runner of its episodes.
"""

from __future__ import annotations

import random
from typing import Any

from openclaw_jax.envs.agentic import gui, swe, terminal, toolcall  # noqa: F401  (they register their environments)
from openclaw_jax.envs.agentic.config import AgenticConfig
from openclaw_jax.envs.agentic.episode import (
    ENVIRONMENTS,
    Environment,
    Episode,
    EpisodeLimits,
    EpisodeRunner,
    PoolPolicy,
    ScriptedPolicy,
    Task,
    ToolError,
    register_environment,
)
from openclaw_jax.envs.sandbox import SandboxLimits


@register_environment("easy")
class EasyEnv(Environment):
    """One turn, no tools: the reply is correct when its first character is in the task's letter set.

    About half of a random model's replies start with one of them, so group-normalised GRPO has a
    signal from the first step; a model that learned it starts every reply with such a letter."""

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
    """The environment `cfg.env` names (a ValueError lists the registered ones)."""
    limits = SandboxLimits(timeout_s=cfg.sandbox_timeout_s, memory_mb=cfg.sandbox_memory_mb)
    options = dict(cfg.env_options)
    try:
        return ENVIRONMENTS.get(cfg.env).from_config(tuple(cfg.families), limits, **options)
    except TypeError as err:
        if not options:
            raise
        raise ValueError(f"agentic.env_options={options} are not options of the {cfg.env!r} environment "
                         f"({err})") from None


def episode_runner(cfg: AgenticConfig, env: Environment, tokenizer, images: Any = None) -> EpisodeRunner:
    """The runner of `env`'s episodes with the `agentic:` config's limits and tool prompt (`images`: a
    vision-language policy's `ImageProcessorConfig`)."""
    limits = EpisodeLimits(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                           max_response_tokens=cfg.max_response_tokens, max_observation_chars=cfg.max_observation_chars,
                           timeout_s=cfg.episode_timeout_s)
    native = None if cfg.tool_prompt == "auto" else cfg.tool_prompt == "native"
    return EpisodeRunner(env, tokenizer, limits, native_tools=native, images=images)


__all__ = ["ENVIRONMENTS", "AgenticConfig", "EasyEnv", "Environment", "Episode", "EpisodeLimits", "EpisodeRunner",
           "PoolPolicy", "ScriptedPolicy", "Task", "ToolError", "episode_runner", "make_env", "register_environment"]
