"""`easy`: a one-turn environment a tiny random model can learn (the tests' and the tiny runs')."""

from __future__ import annotations

import random
from typing import Any

from openclaw_jax.envs.agentic.catalog import register_environment
from openclaw_jax.envs.agentic.episode import Environment, Task, ToolError


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
