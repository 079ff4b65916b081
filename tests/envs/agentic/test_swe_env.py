"""The SWE environment's generated repositories and its shaped reward.

The repository table is checked by running each generated test file against the correct and the
buggy `lib.py` in this process (a module object, not the library's own `tests_passing`); the reward
by real episodes in the sandbox with scripted edits, against the rule worked out by hand."""

from __future__ import annotations

import asyncio
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from openclaw_jax.envs.agentic.config import AgenticConfig
from openclaw_jax.envs.agentic.episode import EpisodeRunner, ScriptedPolicy, episode_runner, make_env
from openclaw_jax.envs.agentic import swe_repos
from openclaw_jax.envs.agentic.episode import format_tool_call
from openclaw_jax.envs.agentic.swe import SWEEnv, shaped_reward
from openclaw_jax.models.tokenizer import smollm2_tokenizer

ALL_REPOS = swe_repos.repositories("train") + swe_repos.repositories("heldout")


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def _run_test_file(lib_source: str, fn: swe_repos.Function) -> dict[str, bool]:
    """Each test of the generated test_lib.py against `lib_source`: name -> passed."""
    lib = types.ModuleType("lib")
    exec(compile(lib_source, "lib.py", "exec"), lib.__dict__)
    saved = sys.modules.get("lib")
    sys.modules["lib"] = lib
    try:
        namespace: dict = {}
        exec(compile(swe_repos.unit_test_source(fn), "test_lib.py", "exec"), namespace)
    finally:
        if saved is None:
            sys.modules.pop("lib")
        else:
            sys.modules["lib"] = saved
    results = {}
    for name, test in sorted(namespace.items()):
        if name.startswith("test_"):
            try:
                test()
                results[name] = True
            except Exception:
                results[name] = False
    return results


@pytest.mark.parametrize("repo", ALL_REPOS, ids=lambda r: r.key)
def test_correct_source_passes_and_the_bug_fails_a_test(repo):
    fn = repo.function
    correct = _run_test_file(fn.source, fn)
    assert sorted(correct) == sorted(swe_repos.unit_test_names(fn)) and len(correct) >= 3
    assert all(correct.values()), correct
    buggy = _run_test_file(repo.buggy_source, fn)
    assert not all(buggy.values()), f"{repo.key}: the bug breaks no test"
    # the shaped reward's baseline agrees with the test file
    assert sum(swe_repos.tests_passing(repo.buggy_source, fn.tests)) == sum(buggy.values())
    # the demonstration's one edit turns the buggy source back into the correct one
    assert repo.buggy_source.count(repo.bug.bad) == 1
    assert repo.buggy_source.replace(repo.bug.bad, repo.bug.good, 1) == fn.source


def test_the_table_has_variety_and_a_clean_split():
    train, held = swe_repos.repositories("train"), swe_repos.repositories("heldout")
    assert len(train) + len(held) >= 16 and len(held) >= 4
    train_names, held_names = {r.function.name for r in train}, {r.function.name for r in held}
    assert held_names == swe_repos.HELDOUT_FUNCTIONS and not train_names & held_names
    assert not {r.function.source for r in train} & {r.function.source for r in held}
    kinds = Counter(r.bug.kind for r in ALL_REPOS)
    assert set(kinds) == set(swe_repos.BUG_KINDS) and len(kinds) >= 6
    assert set(r.bug.kind for r in held) <= set(r.bug.kind for r in train)   # held out: new functions, known kinds
    assert sum(len(fn.bugs) > 1 for fn in swe_repos.FUNCTIONS) >= 10
    # most bugs leave some tests passing, so a partial fix is visible in the shaped reward
    partial = [r for r in ALL_REPOS if any(swe_repos.tests_passing(r.buggy_source, r.function.tests))]
    assert len(partial) >= 0.8 * len(ALL_REPOS)


def test_the_table_refuses_ambiguous_bugs():
    with pytest.raises(ValueError, match="exactly once"):
        swe_repos._function("twice", "def twice(x):\n    y = x\n    y = x\n    return y\n", ["twice(1) == 1"] * 3,
                            ("constant", "y = x", "y = 0"))
    clamp = "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n"
    tests = ["clamp(5, 0, 3) == 3", "clamp(-2, 0, 3) == 0", "clamp(2, 0, 3) == 2"]
    with pytest.raises(ValueError, match="occur once in the buggy source"):   # "return hi" twice: which to fix?
        swe_repos._function("clamp", clamp, tests, ("return", "return lo", "return hi"))
    swe_repos._function("clamp", clamp, tests, ("return", "return lo", "return -lo"))   # unambiguous: accepted


def test_draws_cover_every_repository_before_repeating():
    env = SWEEnv()
    train_pool = swe_repos.repositories("train")

    def keys(tasks):
        return ["/".join(t.task_id.split("/")[2:4]) for t in tasks]

    train = env.tasks("train", 2 * len(train_pool), seed=0)
    assert sorted(keys(train[:len(train_pool)])) == sorted(r.key for r in train_pool)
    assert sorted(keys(train[len(train_pool):])) == sorted(r.key for r in train_pool)
    assert keys(train[:len(train_pool)]) != keys(train[len(train_pool):])    # each pass its own order
    n_functions = len({r.function.name for r in train_pool})
    assert len({k.split("/")[0] for k in keys(train[:n_functions])}) == n_functions
    held = env.tasks("heldout", len(swe_repos.HELDOUT_FUNCTIONS), seed=0)
    assert {k.split("/")[0] for k in keys(held)} == swe_repos.HELDOUT_FUNCTIONS
    assert keys(env.tasks("train", 7, seed=3)) == keys(env.tasks("train", 20, seed=3))[:7]
    assert {t.family for t in train} == {r.bug.kind for r in train_pool}
    assert not {t.data["files"]["lib.py"] for t in train} & {t.data["files"]["lib.py"]
                                                             for t in env.tasks("heldout", 20, seed=0)}


def test_shaped_reward_rule():
    assert shaped_reward(1, 4, 1) == 0.0          # nothing changed
    assert shaped_reward(0, 4, 1) == 0.0          # worse than the bug is still 0
    assert shaped_reward(2, 4, 1) == pytest.approx(1 / 3)
    assert shaped_reward(4, 4, 1) == 1.0
    assert shaped_reward(3, 4, 0) == 0.75
    assert shaped_reward(3, 3, 2) == 1.0
    with pytest.raises(ValueError, match="a bug breaks a test"):
        shaped_reward(4, 4, 4)


def _task(env, key):
    return next(t for t in env.tasks("train", 64, seed=0) if f"/{key}/" in t.task_id)


def _reward(env, tok, task, edits):
    turns = [format_tool_call("edit_file", {"path": "lib.py", "old": old, "new": new}) for old, new in edits]
    ep = asyncio.run(EpisodeRunner(env, tok).run(task, ScriptedPolicy(tok, turns + ["Done."]), temperature=0.0))
    assert ep.tool_errors == 0 and ep.end_reason == "answer", ep.observations
    return ep.reward, ep.success


def test_shaped_reward_of_real_episodes(tok):
    """vowels/comparison: the bug (`not in`) passes 1 of 4 tests (vowels('banana') == 3 by chance:
    three consonants), so 3 tests are the ones to win back."""
    shaped, binary = SWEEnv(), SWEEnv(shaped_reward=False)
    task = _task(shaped, "vowels/comparison")
    assert task.data["passed_with_bug"] == 1 and "if ch not in 'aeiou':" in task.data["files"]["lib.py"]
    bad = "if ch not in 'aeiou':"
    cases = [
        ([], 0.0),                                                # untouched
        ([(bad, "if ch in 'aeio':")], 1 / 3),                     # half fix: banana, xyz pass; you, queue fail
        ([(bad, "if ch in 'xyz':")], 0.0),                        # worse than the bug: 0 tests pass, not < 0
        ([(bad, "if ch in 'aeiou'")], 0.0),                       # a syntax error: nothing passes
        ([(bad, "if ch in 'aeiou':")], 1.0),                      # the fix
    ]
    for edits, expected in cases:
        reward, success = _reward(shaped, tok, task, edits)
        assert reward == pytest.approx(expected) and success == (expected == 1.0), (edits, reward)
        reward, success = _reward(binary, tok, task, edits)
        assert reward == (1.0 if expected == 1.0 else 0.0) and success == (expected == 1.0), (edits, reward)
    # a fix that breaks a test the bug left passing: 2 won back, 1 lost, of 2 broken -> (3 - 2) / 2
    total = _task(shaped, "total/operator")     # s -= x: total([]) and total([-2, 2]) still pass
    assert _reward(shaped, tok, total, [("s -= x", "s += abs(x)")]) == (0.5, False)


def test_forged_results_and_early_exits_do_not_count(tok):
    env = SWEEnv()
    task = _task(env, "vowels/comparison")
    forge = "".join(f"print('PASS {name}')\n" for name in task.data["test_names"])
    assert _reward(env, tok, task, [("def vowels(s):", forge + "def vowels(s):")]) == (0.0, False)
    for exit_call in ("import sys; sys.exit(0)", "import os; os._exit(0)"):
        assert _reward(env, tok, task, [("def vowels(s):", exit_call + "\ndef vowels(s):")]) == (0.0, False)
        assert _reward(SWEEnv(shaped_reward=False), tok, task,
                       [("def vowels(s):", exit_call + "\ndef vowels(s):")]) == (0.0, False)


def test_options_and_families_from_the_config():
    assert make_env(AgenticConfig(env="swe")).shaped_reward is True
    assert make_env(AgenticConfig(env="swe", env_options={"shaped_reward": False})).shaped_reward is False
    index_only = make_env(AgenticConfig(env="swe", families=("index",)))
    assert {t.family for t in index_only.tasks("train", 10, 0) + index_only.tasks("heldout", 3, 0)} == {"index"}
    with pytest.raises(ValueError, match="must be a non-empty subset"):
        make_env(AgenticConfig(env="swe", families=("typo",)))
    with pytest.raises(ValueError, match="not options of the 'swe' environment"):
        make_env(AgenticConfig(env="swe", env_options={"shaped": True}))
    variable_only = make_env(AgenticConfig(env="swe", families=("variable",)))
    assert {t.task_id.split("/")[2] for t in variable_only.tasks("heldout", 4, 0)} == {"clamp"}


def test_every_demonstration_fits_the_swe_cpu_config(tok):
    """Every repository's demonstration solves it within swe_cpu.yaml's episode limits and sequence
    length (a demonstration cut by a limit would silently drop out of the warm-up), and the config's
    draws reach every training repository (warm-up) and every held-out function (evaluation)."""
    from openclaw_jax.config import load_experiment_config

    cfg = load_experiment_config([str(Path(__file__).resolve().parents[3] / "configs" / "swe_cpu.yaml")])
    a = cfg.agentic
    env = make_env(a)
    assert a.heldout_tasks >= 4
    held = env.tasks("heldout", a.heldout_tasks, seed=a.seed)
    assert {t.task_id.split("/")[2] for t in held} == swe_repos.HELDOUT_FUNCTIONS
    warmup = env.tasks("train", a.warmup_examples, seed=a.seed + 7919)
    assert len({"/".join(t.task_id.split("/")[2:4]) for t in warmup}) == len(swe_repos.repositories("train"))
    runner = episode_runner(a, env, tok)
    for task in warmup + env.tasks("heldout", len(swe_repos.repositories("heldout")), seed=0):
        ep = asyncio.run(runner.run(task, ScriptedPolicy(tok, env.demonstration(task)), temperature=0.0))
        assert ep.success and ep.reward == 1.0, (task.task_id, ep.end_reason, ep.observations)
        assert len(ep.prompt_ids) + len(ep.response_ids) <= cfg.trainer.max_seq_len, task.task_id
