"""The terminal environment: a `bash` tool in a per-episode sandbox directory the task prepares.

Task families (generated offline from a seed; every task has its own checker):
  * `count`: how many lines of log.txt contain a word (answer checked in the final message);
  * `sum`: the sum of the numbers in numbers.txt (final message);
  * `max`: the largest number in numbers.txt (final message);
  * `create`: create a file with given content (checked in the directory);
  * `replace`: replace a word everywhere in notes.txt (checked in the directory);
  * `min`: the smallest number in numbers.txt (final message);
  * `lines`: how many lines log.txt has (final message);
  * `append`: add a word as a new last line of notes.txt (checked in the directory).
The last three sit next to an earlier family with the same file and a command that differs in one
part (`sort -n | head -1` against `| tail -1`, `wc -l` against `grep -c`, `>>` against `>`): a small
model that has seen both demonstrations picks the right one sometimes but not always, so its groups
of episodes carry a signal for RL.
Train and held-out tasks come from disjoint seed streams (and differ in their names and data).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from openclaw_jax.envs.agentic.catalog import register_environment
from openclaw_jax.envs.agentic.episode import Environment, Task, ToolError, format_tool_call
from openclaw_jax.envs.agentic.toolcall import last_number, numbers_match
from openclaw_jax.envs.sandbox import Sandbox, SandboxLimits

FAMILIES = ("count", "sum", "max", "create", "replace", "min", "lines", "append")
_WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "piano", "lemon", "comet", "amber", "delta", "frost")
_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")


def _task(family: str, rng: random.Random, task_id: str) -> Task:
    if family in ("count", "lines"):
        level = rng.choice(_LEVELS)
        lines = [f"{rng.choice(_LEVELS)} {rng.choice(_WORDS)} {rng.randint(1, 999)}" for _ in range(rng.randint(8, 30))]
        files = {"log.txt": "\n".join(lines) + "\n"}
        if family == "lines":
            return Task(task_id, "How many lines does log.txt have? Answer with the number.", len(lines),
                        {"files": files, "command": "wc -l < log.txt"}, family)
        answer = sum(line.split()[0] == level for line in lines)
        return Task(task_id, f"How many lines of log.txt start with {level}? Answer with the number.", answer,
                    {"files": files, "command": f"grep -c '^{level}' log.txt"}, family)
    if family in ("sum", "max", "min"):
        nums = [rng.randint(1, 9999) for _ in range(rng.randint(6, 20))]
        files = {"numbers.txt": "\n".join(map(str, nums)) + "\n"}
        if family == "sum":
            return Task(task_id, "What is the sum of the numbers in numbers.txt? Answer with the number.", sum(nums),
                        {"files": files, "command": "awk '{s += $1} END {print s}' numbers.txt"}, family)
        if family == "min":
            return Task(task_id, "What is the smallest number in numbers.txt? Answer with the number.", min(nums),
                        {"files": files, "command": "sort -n numbers.txt | head -1"}, family)
        return Task(task_id, "What is the largest number in numbers.txt? Answer with the number.", max(nums),
                    {"files": files, "command": "sort -n numbers.txt | tail -1"}, family)
    if family == "create":
        name, word = rng.choice(_WORDS) + str(rng.randint(1, 99)), rng.choice(_WORDS)
        return Task(task_id, f"Create a file named {name}.txt that contains the word {word}.", word,
                    {"files": {}, "path": f"{name}.txt", "command": f"echo {word} > {name}.txt"}, family)
    if family == "replace":
        old, new = rng.sample(_WORDS, 2)
        words = [rng.choice(_WORDS[:6] + (old,) * 3) for _ in range(rng.randint(6, 14))]
        text = " ".join(words) + "\n"
        return Task(task_id, f"In notes.txt, replace every {old} with {new}.", text.replace(old, new),
                    {"files": {"notes.txt": text}, "path": "notes.txt", "command": f"sed -i 's/{old}/{new}/g' notes.txt"},
                    family)
    if family == "append":
        word = rng.choice(_WORDS)
        text = "\n".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 6))) + "\n"
        return Task(task_id, f"Add the word {word} as a new last line of notes.txt.", text + word + "\n",
                    {"files": {"notes.txt": text}, "path": "notes.txt", "command": f"echo {word} >> notes.txt"}, family)
    raise ValueError(f"unknown terminal family {family!r}; use one of {FAMILIES}")


@register_environment("terminal")
class TerminalEnv(Environment):
    system_prompt = ("You are an assistant working in a Linux shell. Use the bash tool to look at and change files "
                     "in the current directory. When the task is done, say so; when asked for a number, answer "
                     "with the number.")
    tools = [{"type": "function", "function": {
        "name": "bash", "description": "Run a bash command in the task's directory and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]

    def __init__(self, families=FAMILIES, sandbox: SandboxLimits | None = None):
        self.families = self.check_families(families, FAMILIES)
        self.sandbox = sandbox or SandboxLimits(timeout_s=5.0, memory_mb=256)

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: SandboxLimits) -> "TerminalEnv":
        return cls(families or FAMILIES, sandbox)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        self.check_split(split)
        rng = random.Random(f"terminal/{split}/{seed}")  # disjoint streams per split
        return [_task(self.families[i % len(self.families)], rng, f"terminal/{split}/{seed}/{i}") for i in range(n)]

    async def start(self, task: Task) -> Sandbox:
        return await asyncio.to_thread(Sandbox, self.sandbox, files=task.data.get("files", {}))

    async def call(self, state: Sandbox, task: Task, name: str, arguments: dict[str, Any]) -> str:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError('bash needs {"command": "<shell command>"}')
        result = await asyncio.to_thread(state.run, command, "bash")
        if result.timed_out:
            raise ToolError(f"the command timed out after {self.sandbox.timeout_s:g} s")
        out = (result.stdout + result.stderr).strip()
        if result.exit_code != 0:
            out = f"exit code {result.exit_code}\n{out}"
        return out or "(no output)"

    async def score(self, state: Sandbox, task: Task, final_text: str) -> float:
        if "path" in task.data:
            try:
                content = state.read_file(task.data["path"]).decode("utf-8", "replace")
            except (OSError, ValueError):
                return 0.0
            if task.family == "create":
                return 1.0 if content.strip() == str(task.answer) else 0.0
            if task.family == "append":   # the original lines, then the word; a missing final newline is fine
                return 1.0 if content.rstrip("\n") == task.answer.rstrip("\n") else 0.0
            return 1.0 if content == task.answer else 0.0
        return 1.0 if numbers_match(last_number(final_text), float(task.answer)) else 0.0

    async def close(self, state: Sandbox) -> None:
        if state is not None:
            state.close()

    def demonstration(self, task: Task) -> list[str]:
        final = "Done." if "path" in task.data else f"The answer is {task.answer}."
        return [format_tool_call("bash", {"command": task.data["command"]}), final]
