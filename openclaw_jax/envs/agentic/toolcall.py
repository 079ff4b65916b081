"""The tool-call environment: math solved with a `python` tool (a code interpreter in the sandbox).

Task families (all generated offline, answers checked numerically):
  * `product`: a product of two large numbers ("What is 48213 * 9127?");
  * `sum`: a sum of many multi-digit terms;
  * `gsm`: GSM-style word problems from reasoning-gym's offline `gsm_symbolic` generator
    (`envs/questions.py`, whose train / held-out splits are disjoint by seed).
The generated families are split into train / held-out by a hash of the problem text, so the two
never share a problem. The answer is the last number in the agent's final (tool-free) message.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from typing import Any, Sequence

from openclaw_jax.envs.agentic.episode import Environment, Task, ToolError, format_tool_call, register_environment
from openclaw_jax.envs.questions import gsm_heldout, gsm_train_stream
from openclaw_jax.envs.sandbox import SandboxLimits, run_code

FAMILIES = ("product", "sum", "gsm")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numbers_match(value: float | None, answer: float) -> bool:
    return value is not None and abs(value - answer) <= 1e-6 * max(1.0, abs(answer))


def _is_heldout(text: str) -> bool:
    return hashlib.sha256(text.encode()).digest()[0] % 4 == 0


def _generated(family: str, rng: random.Random) -> tuple[str, int, str]:
    """(question, answer, python expression)."""
    if family == "product":
        a, b = rng.randint(1000, 99999), rng.randint(100, 9999)
        return f"What is {a} * {b}?", a * b, f"{a} * {b}"
    if family == "sum":
        terms = [rng.randint(100, 9999) for _ in range(rng.randint(4, 6))]
        expr = " + ".join(map(str, terms))
        return f"What is {expr}?", sum(terms), expr
    raise ValueError(f"unknown generated family {family!r}")


@register_environment("toolcall")
class ToolCallEnv(Environment):
    system_prompt = "Solve the math problem: compute it with the python tool, then give the answer as a number."
    tools = [{"type": "function", "function": {
        "name": "python", "description": "Run Python code in a sandbox and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                       "required": ["code"]}}}]

    def __init__(self, families: Sequence[str] = ("product", "sum"), sandbox: SandboxLimits | None = None):
        self.families = self.check_families(families, FAMILIES)
        self.sandbox = sandbox or SandboxLimits(timeout_s=5.0, memory_mb=256)

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: SandboxLimits) -> "ToolCallEnv":
        return cls(families or ("product", "sum"), sandbox)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        self.check_split(split)
        out: list[Task] = []
        per = {f: n // len(self.families) + (i < n % len(self.families)) for i, f in enumerate(self.families)}
        for family, count in per.items():
            if family == "gsm":
                qs = gsm_heldout(count, seed) if split == "heldout" else \
                    [q for _, q in zip(range(count), gsm_train_stream(seed))]
                out += [Task(f"gsm/{split}/{seed}/{i}", q.text, float(q.answer), {}, "gsm") for i, q in enumerate(qs)]
                continue
            rng = random.Random(f"{family}/{seed}")
            seen: set[str] = set()
            while len(seen) < count:
                question, answer, expr = _generated(family, rng)
                if question in seen or _is_heldout(question) != (split == "heldout"):
                    continue
                seen.add(question)
                out.append(Task(f"{family}/{split}/{seed}/{len(seen) - 1}", question, answer, {"expr": expr}, family))
        random.Random(seed).shuffle(out)
        return out

    async def call(self, state: Any, task: Task, name: str, arguments: dict[str, Any]) -> str:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError('python needs {"code": "<python source>"}')
        result = await asyncio.to_thread(run_code, code, "python", self.sandbox)
        if result.timed_out:
            raise ToolError(f"the code timed out after {self.sandbox.timeout_s:g} s")
        if result.exit_code != 0:
            raise ToolError(f"exit code {result.exit_code}\n{result.stderr.strip()[-400:]}")
        return result.stdout.strip() or "(no output: print the value you want to see)"

    async def score(self, state: Any, task: Task, final_text: str) -> float:
        return 1.0 if numbers_match(last_number(final_text), float(task.answer)) else 0.0

    def demonstration(self, task: Task) -> list[str]:
        if "expr" not in task.data:
            raise ValueError(f"task {task.task_id} has no demonstration (only generated families have one)")
        answer = task.answer
        return [format_tool_call("python", {"code": f"print({task.data['expr']})"}), f"The answer is {answer}."]
