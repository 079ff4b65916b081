"""The SWE-style environment: a small Python repository with an injected bug and failing tests.

Each repository (generated offline, `swe_repos.py`) is one correct function with its tests, into
which one bug of one kind (a flipped comparison, an off-by-one, a wrong operator, constant, index,
variable or return value) is injected by replacing a line. Tools: `list_files`, `read_file`,
`edit_file` (replace an exact snippet) and `run_tests` (the tests in the sandbox). The checker
restores the test file and runner before running them, so editing the tests cannot win.

Reward (`shaped_reward=True`, the default): the share of the tests the bug broke that pass again,
net of tests that passed with the bug and fail now, (passed - passed_with_bug) / (tests -
passed_with_bug), at least 0. Doing nothing or breaking lib.py (a syntax error: no test passes)
scores 0; only a repository where every test passes scores 1, so an episode's success
(`reward >= 1`) still means "all tests pass". With `shaped_reward=False` the reward is that
success, 1 or 0. Train and held-out repositories use different functions; `families` (optional)
keeps only bugs of those kinds.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
from collections import Counter
from typing import Any

from openclaw_jax.envs.agentic.catalog import register_environment
from openclaw_jax.envs.agentic.episode import Environment, Task, ToolError, format_tool_call
from openclaw_jax.envs.agentic.swe_repos import (BUG_KINDS, HELDOUT_FUNCTIONS, Repository, repositories, tests_passing,
                                                 unit_test_names, unit_test_source)
from openclaw_jax.envs.sandbox import Sandbox, SandboxLimits

# The runner of the agent's run_tests and of the checker. The checker passes a fresh nonce that
# prefixes each result line: lib.py runs in the runner's process, and a plain `print("PASS ...")`
# in it must not count as a passing test. A lib.py that exits or raises at import fails every test.
_RUNNER = """import sys, traceback
tag = sys.argv[1] + ' ' if len(sys.argv) > 1 else ''
try:
    import test_lib
except BaseException:
    print(tag + 'ERROR cannot import the tests')
    print(traceback.format_exc(limit=1).strip().splitlines()[-1])
    sys.exit(1)
failed = 0
for name in sorted(dir(test_lib)):
    if name.startswith('test_'):
        try:
            getattr(test_lib, name)()
            print(tag + 'PASS', name)
        except BaseException:
            failed += 1
            print(tag + 'FAIL', name)
            print(traceback.format_exc(limit=1).strip().splitlines()[-1])
print('all tests passed' if not failed else f'{failed} failed')
sys.exit(1 if failed else 0)
"""
PROMPT = "The tests in this repository fail. Find the bug in lib.py and fix it."


def shaped_reward(passed: int, total: int, passed_with_bug: int) -> float:
    """(passed - passed_with_bug) / (total - passed_with_bug), at least 0: the share of the tests the
    bug broke that pass again, with each newly broken test cancelling one fixed test. 1.0 exactly
    when all `total` pass; 0 when nothing changed (the bug alone already passes `passed_with_bug`)."""
    if not 0 <= passed_with_bug < total:
        raise ValueError(f"passed_with_bug={passed_with_bug} must be in [0, total={total}): a bug breaks a test")
    return max(0.0, (passed - passed_with_bug) / (total - passed_with_bug))


def _spread(pool: list[Repository], rng: random.Random) -> list[Repository]:
    """`pool` shuffled so that every function comes once before any comes twice: a short draw (the
    held-out evaluation, the warm-up's demonstrations) covers as many functions as it can."""
    shuffled = rng.sample(pool, len(pool))
    seen: Counter[str] = Counter()
    ranks = []
    for repo in shuffled:
        ranks.append(seen[repo.function.name])
        seen[repo.function.name] += 1
    return [repo for _, repo in sorted(zip(ranks, shuffled), key=lambda pair: pair[0])]


def _repo_task(repo: Repository, split: str, i: int) -> Task:
    fn, bug = repo.function, repo.bug
    tests = unit_test_source(fn)
    passed_with_bug = sum(tests_passing(repo.buggy_source, fn.tests))
    if passed_with_bug == len(fn.tests):
        raise ValueError(f"swe repository {repo.key}: the bug breaks no test; change the bug or add a test")
    files = {"lib.py": repo.buggy_source, "test_lib.py": tests, "run_tests.py": _RUNNER}
    return Task(f"swe/{split}/{repo.key}/{i}", PROMPT, None,
                {"files": files, "good": bug.good, "bad": bug.bad, "tests": tests, "test_names": unit_test_names(fn),
                 "passed_with_bug": passed_with_bug}, bug.kind)


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

    def __init__(self, sandbox: SandboxLimits | None = None, *, kinds: tuple[str, ...] = tuple(BUG_KINDS),
                 shaped_reward: bool = True):
        self.sandbox = sandbox or SandboxLimits(timeout_s=10.0, memory_mb=256)
        self.kinds = self.check_families(kinds, tuple(BUG_KINDS))
        self.shaped_reward = shaped_reward

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: SandboxLimits, *, shaped_reward: bool = True) -> "SWEEnv":
        """`families`: bug kinds to keep (empty: all); `agentic.env_options: {shaped_reward: false}` makes
        the reward 1/0 (all tests pass or not)."""
        return cls(sandbox, kinds=families or tuple(BUG_KINDS), shaped_reward=shaped_reward)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        self.check_split(split)
        pool = repositories(split, self.kinds)
        if not pool:
            raise ValueError(f"no {split} swe repository has a bug of the kinds {list(self.kinds)}; add kinds to "
                             f"agentic.families (held-out functions: {sorted(HELDOUT_FUNCTIONS)})")
        # every repository once before any twice; each pass over the pool its own shuffle
        order: list[Repository] = []
        for epoch in itertools.count():
            if len(order) >= n:
                break
            order += _spread(pool, random.Random(f"swe/{split}/{seed}/{epoch}"))
        return [_repo_task(repo, split, i) for i, repo in enumerate(order[:n])]

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

    async def passed_tests(self, state: Sandbox, task: Task) -> int | None:
        """How many of the original tests pass on the repository as it is now (the test file and runner
        restored first); None when the run timed out."""
        await asyncio.to_thread(state.write_files, {"test_lib.py": task.data["tests"], "run_tests.py": _RUNNER})
        nonce = secrets.token_hex(8)
        result = await asyncio.to_thread(state.run, f"python3 run_tests.py {nonce}", "bash")
        if result.timed_out:
            return None
        passing = {parts[2] for parts in map(str.split, result.stdout.splitlines())
                   if len(parts) == 3 and parts[:2] == [nonce, "PASS"]}
        return len(passing & set(task.data["test_names"]))

    async def score(self, state: Sandbox, task: Task, final_text: str) -> float:
        passed = await self.passed_tests(state, task)
        total = len(task.data["test_names"])
        if passed is None:     # an infinite loop in lib.py is no fix
            return 0.0
        if not self.shaped_reward:
            return 1.0 if passed == total else 0.0
        return shaped_reward(passed, total, task.data["passed_with_bug"])

    async def close(self, state: Sandbox) -> None:
        if state is not None:
            state.close()

    def demonstration(self, task: Task) -> list[str]:
        return [format_tool_call("read_file", {"path": "lib.py"}),
                format_tool_call("edit_file", {"path": "lib.py", "old": task.data["bad"], "new": task.data["good"]}),
                format_tool_call("run_tests", {}), "The bug is fixed and the tests pass."]
