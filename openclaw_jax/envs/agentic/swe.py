"""The SWE-style environment: a small Python repository with an injected bug and a failing test.

Each repository (made offline) is one correct function with its tests, into which one bug is
injected by replacing a line. Tools: `list_files`, `read_file`, `edit_file` (replace an exact
snippet) and `run_tests` (the tests in the sandbox). Reward: the original tests pass on the final
repository (the checker restores the test file first, so editing the tests cannot win).
Train and held-out repositories use different functions.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from openclaw_jax.envs.agentic.episode import Environment, Task, ToolError, format_tool_call, register_environment
from openclaw_jax.envs.sandbox import Sandbox, SandboxLimits

# (function name, correct source, tests, (correct line, buggy line))
_REPOS = [
    ("total", "def total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n",
     ["total([1, 2, 3]) == 6", "total([]) == 0", "total([5]) == 5"], ("        s += x", "        s -= x")),
    ("is_even", "def is_even(n):\n    return n % 2 == 0\n",
     ["is_even(4)", "not is_even(7)", "is_even(0)"], ("    return n % 2 == 0", "    return n % 2 == 1")),
    ("largest", "def largest(xs):\n    best = xs[0]\n    for x in xs:\n        if x > best:\n            best = x\n"
     "    return best\n", ["largest([3, 9, 2]) == 9", "largest([-1, -5]) == -1"], ("        if x > best:", "        if x < best:")),
    ("vowels", "def vowels(s):\n    n = 0\n    for ch in s:\n        if ch in 'aeiou':\n            n += 1\n    return n\n",
     ["vowels('banana') == 3", "vowels('xyz') == 0", "vowels('you') == 2"], ("        if ch in 'aeiou':", "        if ch in 'aeio':")),
    ("factorial", "def factorial(n):\n    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out\n",
     ["factorial(5) == 120", "factorial(0) == 1", "factorial(3) == 6"], ("    for i in range(2, n + 1):", "    for i in range(2, n):")),
    ("reverse", "def reverse(s):\n    return s[::-1]\n", ["reverse('abc') == 'cba'", "reverse('') == ''"],
     ("    return s[::-1]", "    return s[::1]")),
    ("fib", "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
     ["fib(1) == 1", "fib(6) == 8", "fib(0) == 0"], ("        a, b = b, a + b", "        a, b = b, a - b")),
    ("mean", "def mean(xs):\n    return sum(xs) / len(xs)\n", ["mean([2, 4]) == 3", "mean([5]) == 5"],
     ("    return sum(xs) / len(xs)", "    return sum(xs) / (len(xs) + 1)")),
    ("last", "def last(xs):\n    return xs[-1]\n", ["last([1, 2, 3]) == 3", "last([7]) == 7"],
     ("    return xs[-1]", "    return xs[0]")),
    ("clamp", "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
     ["clamp(5, 0, 3) == 3", "clamp(-2, 0, 3) == 0", "clamp(2, 0, 3) == 2"], ("    if x > hi:", "    if x > lo:")),
    ("square", "def square(x):\n    return x * x\n", ["square(3) == 9", "square(-2) == 4"], ("    return x * x", "    return x + x")),
    ("count_words", "def count_words(s):\n    return len(s.split())\n", ["count_words('a b c') == 3", "count_words('') == 0"],
     ("    return len(s.split())", "    return len(s.split(' '))")),
]
HELDOUT_FUNCTIONS = ("fib", "clamp", "count_words")
_RUNNER = ("import sys, traceback\nimport test_lib\nfailed = 0\nfor name in sorted(dir(test_lib)):\n"
           "    if name.startswith('test_'):\n        try:\n            getattr(test_lib, name)()\n"
           "            print('PASS', name)\n        except Exception:\n            failed += 1\n"
           "            print('FAIL', name)\n            print(traceback.format_exc(limit=1).strip().splitlines()[-1])\n"
           "print('all tests passed' if not failed else f'{failed} failed')\nsys.exit(1 if failed else 0)\n")


def _repo_task(entry, split: str, i: int) -> Task:
    name, source, tests, (good, bad) = entry
    assert source.count(good) == 1 and bad not in source, name  # the bug and its fix are unambiguous
    test_src = f"from lib import {name}\n\n\n" + "".join(
        f"def test_{name}_{k}():\n    assert {t}\n\n\n" for k, t in enumerate(tests))
    files = {"lib.py": source.replace(good, bad, 1), "test_lib.py": test_src, "run_tests.py": _RUNNER}
    return Task(f"swe/{split}/{name}/{i}", "The tests in this repository fail. Find the bug in lib.py and fix it.",
                None, {"files": files, "good": good.strip(), "bad": bad.strip(), "tests": test_src}, name)


@register_environment("swe")
class SWEEnv(Environment):
    system_prompt = "You are a software engineer. Use the tools to inspect the repository, fix the bug, and run the tests."
    tools = [
        {"type": "function", "function": {"name": "list_files", "description": "List the repository's files.",
                                          "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                          "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                         "required": ["path"]}}},
        {"type": "function", "function": {
            "name": "edit_file", "description": "Replace the exact text `old` by `new` in a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                           "new": {"type": "string"}},
                           "required": ["path", "old", "new"]}}},
        {"type": "function", "function": {"name": "run_tests", "description": "Run the tests.",
                                          "parameters": {"type": "object", "properties": {}}}},
    ]

    def __init__(self, sandbox: SandboxLimits | None = None):
        self.sandbox = sandbox or SandboxLimits(timeout_s=10.0, memory_mb=256)

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: SandboxLimits) -> "SWEEnv":
        return cls(sandbox)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        self.check_split(split)
        pool = [r for r in _REPOS if (r[0] in HELDOUT_FUNCTIONS) == (split == "heldout")]
        rng = random.Random(f"swe/{split}/{seed}")
        order = [rng.choice(pool) for _ in range(n)] if n > len(pool) else rng.sample(pool, n)
        return [_repo_task(entry, split, i) for i, entry in enumerate(order)]

    async def start(self, task: Task) -> Sandbox:
        return await asyncio.to_thread(Sandbox, self.sandbox, files=task.data["files"])

    async def call(self, state: Sandbox, task: Task, name: str, arguments: dict[str, Any]) -> str:
        if name == "list_files":
            result = await asyncio.to_thread(state.run, "ls -1", "bash")
            return result.stdout.strip() or "(empty)"
        if name == "run_tests":
            return await self._run_tests(state)
        path = arguments.get("path")
        if not isinstance(path, str) or not path:
            raise ToolError(f'{name} needs {{"path": "<file>"}}')
        try:
            text = state.read_file(path).decode("utf-8", "replace")
        except (OSError, ValueError) as err:
            raise ToolError(f"cannot read {path}: {type(err).__name__}") from None
        if name == "read_file":
            return text
        old, new = arguments.get("old"), arguments.get("new")
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            raise ToolError('edit_file needs {"path": ..., "old": "<exact text>", "new": "<replacement>"}')
        if old not in text:
            raise ToolError(f"the text to replace was not found in {path}")
        await asyncio.to_thread(state.write_files, {path: text.replace(old, new, 1)})
        return f"edited {path}"

    async def _run_tests(self, state: Sandbox) -> str:
        result = await asyncio.to_thread(state.run, "python3 run_tests.py 2>&1 | tail -20", "bash")
        if result.timed_out:
            raise ToolError(f"the tests timed out after {self.sandbox.timeout_s:g} s")
        return result.stdout.strip()

    async def score(self, state: Sandbox, task: Task, final_text: str) -> float:
        await asyncio.to_thread(state.write_files, {"test_lib.py": task.data["tests"], "run_tests.py": _RUNNER})
        result = await asyncio.to_thread(state.run, "python3 run_tests.py", "bash")
        return 1.0 if result.exit_code == 0 and not result.timed_out else 0.0

    async def close(self, state: Sandbox) -> None:
        if state is not None:
            state.close()

    def demonstration(self, task: Task) -> list[str]:
        return [format_tool_call("read_file", {"path": "lib.py"}),
                format_tool_call("edit_file", {"path": "lib.py", "old": task.data["bad"], "new": task.data["good"]}),
                format_tool_call("run_tests", {}), "The bug is fixed and the tests pass."]
