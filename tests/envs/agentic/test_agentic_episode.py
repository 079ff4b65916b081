"""Episodes, environments, group advantages and agentic samples (no model: scripted policies).

References are independent of the code under test: the chat template's own rendering of the
whole conversation for token exactness, NumPy float64 loops for the advantages, the environments'
checkers run against both right and wrong answers."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from openclaw_jax.envs.agentic.config import AgenticConfig
from openclaw_jax.envs.agentic.episode import EpisodeLimits, EpisodeRunner, ScriptedPolicy, make_env
from openclaw_jax.envs.agentic.episode import format_tool_call
from openclaw_jax.envs.agentic.rollout import episode_sample, group_advantages, token_advantages
from openclaw_jax.samples import Sample, SampleStore
from openclaw_jax.models.tokenizer import smollm2_tokenizer
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import pack


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def _run(env, tok, task, turns, limits=EpisodeLimits()):
    return asyncio.run(EpisodeRunner(env, tok, limits).run(task, ScriptedPolicy(tok, turns), temperature=0.0))


def test_episode_is_token_exact_and_masks_observations(tok):
    env = make_env(AgenticConfig(env="toolcall"))
    task = env.tasks("train", 1, seed=3)[0]
    ep = _run(env, tok, task, env.demonstration(task))
    assert ep.success and ep.end_reason == "answer" and ep.tool_calls == 1 and ep.tool_errors == 0
    # the token sequence is exactly what the chat template renders for the whole conversation
    full = tok.apply_chat_template(ep.messages, add_generation_prompt=False, tokenize=False)
    assert tok.decode(ep.prompt_ids + ep.response_ids) + "\n" == full
    # assistant turns are trained (exactly the scripted tokens + end of turn), the rest is not
    eos = tok.eos_token_ids[0]
    for (s, e), text in zip(ep.turns, env.demonstration(task)):
        assert ep.response_ids[s:e] == tok.encode(text) + [eos]
        assert all(m == 1 for m in ep.loss_mask[s:e])
    trained = {t for s, e in ep.turns for t in range(s, e)}
    untrained = [i for i in range(len(ep.response_ids)) if i not in trained]
    assert untrained and all(ep.loss_mask[i] == 0 for i in untrained)
    assert str(task.answer) in tok.decode([ep.response_ids[i] for i in untrained])  # the observation


@pytest.mark.parametrize("turn, expect", [
    ('<tool_call>\n{"name": "python", "arguments": {"code": "print(1"}\n</tool_call>', "malformed"),   # bad JSON
    ('<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>', "unknown tool"),
    ('<tool_call>\n{"name": "python", "arguments": "print(2)"}\n</tool_call>', "JSON object"),
    ('<tool_call>\n{"name": "python", "arguments": {"source": "print(2)"}}\n</tool_call>', "needs"),
    (format_tool_call("python", {"code": "1/0"}), "ZeroDivisionError"),
    (format_tool_call("python", {"code": "import time\nwhile True: time.sleep(1)"}), "timed out"),
    (format_tool_call("python", {"code": "print('z' * 5000)"}), "output truncated"),
    (format_tool_call("python", {"code": "import socket; socket.create_connection(('127.0.0.1', 22), 1)"}), "Error"),
])
def test_bad_tool_calls_become_error_observations(tok, turn, expect):
    from openclaw_jax.envs.sandbox import SandboxLimits
    from openclaw_jax.envs.agentic.toolcall import ToolCallEnv

    env = ToolCallEnv(sandbox=SandboxLimits(timeout_s=1.5))
    task = env.tasks("train", 1, seed=0)[0]
    ep = _run(env, tok, task, [turn, f"The answer is {task.answer}."],
              EpisodeLimits(max_observation_chars=300))
    assert ep.end_reason == "answer" and ep.success  # the episode went on to the final answer
    assert expect in ep.observations[0], ep.observations[0]
    assert ep.tool_errors >= 1
    if expect == "timed out":
        assert ep.sandbox_timeouts == 1


def test_episode_limits(tok):
    env = make_env(AgenticConfig(env="toolcall"))
    task = env.tasks("train", 1, seed=0)[0]
    call = format_tool_call("python", {"code": "print(1)"})
    ep = _run(env, tok, task, [call] * 10, EpisodeLimits(max_turns=3))
    assert ep.end_reason == "max_turns" and ep.num_turns == 3 and not ep.success
    ep = _run(env, tok, task, [call] * 10, EpisodeLimits(max_response_tokens=60))
    assert ep.end_reason in ("max_tokens", "length") and len(ep.response_ids) <= 60 and not ep.success


@pytest.mark.parametrize("name", ["toolcall", "terminal", "swe"])
def test_environments_demonstrations_solve_and_checkers_reject(tok, name):
    env = make_env(AgenticConfig(env=name))
    train, held = env.tasks("train", 6, seed=0), env.tasks("heldout", 6, seed=0)
    assert not {(t.prompt, str(t.data.get("files"))) for t in train} & {(t.prompt, str(t.data.get("files"))) for t in held}
    for task in train[:3] + held[:2]:
        assert _run(env, tok, task, env.demonstration(task)).success, task
        wrong = env.demonstration(task)[-1:]  # the final message only: no tool was used
        if name != "swe":
            wrong = ["The answer is 12345678."] if task.answer is not None and "path" not in task.data else wrong
        assert not _run(env, tok, task, wrong).success, task


@pytest.mark.parametrize("family, neighbour", [("min", "max"), ("lines", "count"), ("append", "create")])
def test_terminal_near_neighbour_families(tok, family, neighbour):
    """The families built to sit one command part away from another: their own demonstration solves
    them in the sandbox; the neighbour family's command (run on the same files) does not."""
    from openclaw_jax.envs.agentic.terminal import TerminalEnv

    env, other = TerminalEnv([family]), TerminalEnv([neighbour])
    tasks = env.tasks("train", 3, seed=0) + env.tasks("heldout", 2, seed=0)
    assert {t.family for t in tasks} == {family}
    for task in tasks:
        assert _run(env, tok, task, env.demonstration(task)).success, task
        wrong_command = other.tasks("train", 1, seed=0)[0].data["command"]
        if family == "append":   # `>` in place of `>>`: the file holds the new word alone
            wrong_command = task.data["command"].replace(">>", ">")
        elif family == "lines":  # the same log, counting only the lines of one level
            wrong_command = "grep -c '^INFO' log.txt"
        call = format_tool_call("bash", {"command": wrong_command})
        ep = _run(env, tok, task, [call, "Done."])
        if "path" not in task.data:  # answer with what the wrong command printed
            ep = _run(env, tok, task, [call, f"The answer is {ep.observations[0].split()[-1]}."])
        if family == "lines" and ep.observations[0].strip() == str(task.answer):
            continue  # every line of this log is INFO: the neighbour's count happens to be right
        assert not ep.success, (task, wrong_command, ep.observations)
    # the reference answers, from the files themselves
    for task in tasks:
        content = next(iter(task.data["files"].values()))
        numbers = [int(x) for x in content.split()] if family == "min" else None
        expected = {"min": lambda: min(numbers), "lines": lambda: content.count("\n"),
                    "append": lambda: content + task.prompt.split()[3] + "\n"}[family]()
        assert task.answer == expected, task


def test_swe_editing_the_tests_does_not_win(tok):
    env = make_env(AgenticConfig(env="swe"))
    task = env.tasks("train", 1, seed=0)[0]
    cheat = format_tool_call("edit_file", {"path": "test_lib.py", "old": "assert", "new": "assert True or"})
    ep = _run(env, tok, task, [cheat, format_tool_call("run_tests", {}), "Done."])
    assert ep.tool_errors == 0 and not ep.success


def _ref_advantages(r, normalize):
    n = len(r)
    mean = sum(r) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / n)
    return [(x - mean) / (std + 1e-6) if normalize else x - mean for x in r]


def test_group_advantages_against_a_float64_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        r = [float(x) for x in rng.integers(0, 2, size=5)] if rng.random() < 0.5 else list(rng.random(4))
        if max(r) == min(r):
            continue
        for normalize in (True, False):
            np.testing.assert_allclose(group_advantages(r, normalize_std=normalize), _ref_advantages(r, normalize),
                                       rtol=1e-12, atol=1e-12)
    assert group_advantages([1, 1, 1], all_equal="drop") is None
    assert group_advantages([0, 0], all_equal="zero") == [0.0, 0.0]
    assert group_advantages([1, 1], all_equal="scale", all_equal_scale=0.2) == [0.2, 0.2]
    assert group_advantages([0, 0], all_equal="scale", all_equal_scale=0.2) == [-0.2, -0.2]


def test_no_baseline_imitates_the_solved_episodes():
    rng = np.random.default_rng(2)
    for _ in range(20):
        r = [float(x) for x in rng.integers(0, 2, size=4)]
        got = group_advantages(r, baseline="none", all_equal="drop", normalize_std=True)
        # no baseline: each episode's own reward, whatever normalize_std and all_equal say; no reward: dropped
        assert got == (None if sum(r) == 0 else r)
    with pytest.raises(ValueError, match="baseline"):
        group_advantages([1.0, 0.0], baseline="mean")
    with pytest.raises(ValueError, match="agentic.baseline"):
        AgenticConfig(baseline="mean")


def test_prm_step_advantages_and_samples_reach_the_batch(tok, tmp_path):
    env = make_env(AgenticConfig(env="toolcall"))
    task = env.tasks("train", 1, seed=0)[0]
    ep = _run(env, tok, task, env.demonstration(task))
    advs = token_advantages(ep, 0.5, step_scores=[1, 0], prm_weight=0.25)
    (s0, e0), (s1, e1) = ep.turns
    assert set(advs[s0:e0]) == {0.75} and set(advs[s1:e1]) == {0.5} and advs[e0] == 0.5
    sample = episode_sample(ep, advs, group_id="g", index=0, temperature=1.0, step_scores=[1, 0])
    with SampleStore(tmp_path / "s") as store:
        store.append(sample)
        store.append(Sample(session_id="old", turn_index=0, kind="rl", reward=-1.0, prompt_ids=[1, 2],
                            response_ids=[3, 4], rollout_logprobs=[-0.1, -0.2]))
        back = store.read(0)
    assert back[0].response_mask == ep.loss_mask and back[0].token_advantages == advs
    packed = pack(back, BatchSpec(samples_per_step=2, max_seq_len=1024, max_candidates=1))
    r = len(ep.response_ids)
    np.testing.assert_array_equal(packed.student["response_mask"][0, :r], np.asarray(ep.loss_mask, np.float32))
    np.testing.assert_allclose(packed.student["advantages"][0, :r], advs)
    # a conversation sample (no mask / per-token advantages) trains every token with its reward
    np.testing.assert_array_equal(packed.student["response_mask"][1, :2], [1, 1])
    np.testing.assert_array_equal(packed.student["advantages"][1, :2], [-1, -1])


# swe_cpu: every repository's demonstration, in tests/envs/agentic/test_swe_env.py
@pytest.mark.parametrize("config", ["toolcall_cpu", "toolcall_hard_cpu", "terminal_cpu"])
def test_demonstrations_fit_the_cpu_configs_limits(tok, config):
    """Every demonstration solves its task within the config's episode limits and sequence length
    (a demonstration cut by a limit would silently drop out of the warm-up)."""
    from pathlib import Path

    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.envs.agentic.episode import episode_runner

    cfg = load_experiment_config([str(Path(__file__).resolve().parents[3] / "configs" / f"{config}.yaml")])
    env = make_env(cfg.agentic)
    runner = episode_runner(cfg.agentic, env, tok)
    for task in env.tasks("train", 12, seed=1) + env.tasks("heldout", 3, seed=0):
        ep = asyncio.run(runner.run(task, ScriptedPolicy(tok, env.demonstration(task)), temperature=0.0))
        assert ep.success, (task.task_id, ep.end_reason)
        assert len(ep.prompt_ids) + len(ep.response_ids) <= cfg.trainer.max_seq_len, task.task_id


def test_prm_step_votes_from_the_judge(tok):
    """The judge votes on each tool-calling step from the observation that followed it (the rule
    judge: an error observation is -1, a passing test run +1); the final answer step gets 0."""
    from openclaw_jax.envs.agentic.rollout import step_votes
    from openclaw_jax.gateway.judge import RuleJudge
    from openclaw_jax.runs.agentic import judge_step_vote

    env = make_env(AgenticConfig(env="swe"))
    task = env.tasks("train", 1, seed=0)[0]
    turns = [format_tool_call("read_file", {"path": "nope.py"})] + env.demonstration(task)
    ep = _run(env, tok, task, turns, EpisodeLimits(max_turns=6))
    assert ep.success and ep.num_turns == 5
    votes = asyncio.run(step_votes(judge_step_vote(RuleJudge()), ep))
    assert votes[0] == -1 and votes[3] == 1 and votes[4] == 0, (votes, ep.observations)


def test_registered_environments_and_their_lookup_errors():
    """Environments register by decorator (`@register_environment`); the config refuses an unknown
    name at load, naming the registered ones, and `make_env` builds each from its section."""
    from openclaw_jax.configlib import ConfigError
    from openclaw_jax.envs.agentic.catalog import ENVIRONMENTS

    assert set(ENVIRONMENTS.names()) >= {"easy", "swe", "terminal", "toolcall"}
    for name in ENVIRONMENTS.names():
        assert make_env(AgenticConfig(env=name)).name == name
    with pytest.raises(ConfigError, match=r"agentic.env='nope' must be one of .*toolcall"):
        AgenticConfig(env="nope")
    with pytest.raises(ValueError, match=r"unknown agentic environment 'nope'; registered: .*easy"):
        ENVIRONMENTS.get("nope")


def test_run_wiring_builds_the_driver_and_demonstrations_from_the_experiment_config(tok, tmp_path):
    """`runs.agentic` turns the experiment config into the envs' own arguments: the driver's
    environment, task sets and backlog, and the warm-up's demonstrations (each solves its task)."""
    from openclaw_jax.config import ExperimentConfig
    from openclaw_jax.envs.agentic.episode import episode_runner
    from openclaw_jax.envs.agentic.rollout import demonstrations
    from openclaw_jax.runs.agentic import AgenticDriver

    cfg = ExperimentConfig(agentic=AgenticConfig(enabled=True, env="easy", train_tasks=6, heldout_tasks=2, backlog=0))
    driver = AgenticDriver(cfg, [], tok, store_dir=str(tmp_path / "samples"), offset_fn=lambda: 0)
    assert driver.env.name == "easy" and len(driver.train_tasks) == 6 and len(driver.heldout) == 2
    assert driver.runner.limits.max_turns == cfg.agentic.max_turns
    assert driver.backlog > 0
    pairs = asyncio.run(demonstrations(episode_runner(cfg.agentic, driver.env, tok), driver.train_tasks[:3]))
    assert len(pairs) == 3 and all(tok.decode(turn).startswith("apple") and images == [] for _, turn, images in pairs)


class _StopsOnEndOfText(ScriptedPolicy):
    """Ends each turn on <|endoftext|>, the tokenizer's other end-of-sequence token, where the chat
    template closes assistant turns with <|im_end|> (a sampled policy may stop on either)."""

    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer, turns)
        self.eos = tokenizer.encode("<|endoftext|>")[0]


def test_a_turn_ending_on_another_end_of_sequence_token_keeps_the_episode_token_exact():
    from openclaw_jax.models.tokenizer import tokenizer_by_name

    tiny = tokenizer_by_name("tiny")   # Qwen3's template (an empty think block on a final assistant turn)
    end_of_text, im_end = tiny.encode("<|endoftext|>"), tiny.encode("<|im_end|>")
    assert len(end_of_text) == len(im_end) == 1 and set(end_of_text + im_end) <= set(tiny.eos_token_ids)
    env = make_env(AgenticConfig(env="toolcall"))
    task = env.tasks("train", 1, seed=3)[0]
    ep = asyncio.run(EpisodeRunner(env, tiny, EpisodeLimits()).run(
        task, _StopsOnEndOfText(tiny, env.demonstration(task)), temperature=0.0))
    assert ep.success and ep.end_reason == "answer" and ep.tool_calls == 1, ep.observations
    # Every turn is the policy's tokens as sampled, ending on <|endoftext|>; what follows each turn is
    # exactly what the template writes after that turn's own end marker (<|im_end|>) in the whole conversation.
    full = tiny.apply_chat_template(ep.messages, tools=env.tools, add_generation_prompt=False, tokenize=False)
    got = tiny.decode(ep.prompt_ids + ep.response_ids, skip_special_tokens=False)
    assert [ep.response_ids[e - 1] for _, e in ep.turns] == end_of_text * len(ep.turns)
    assert got.replace("<|endoftext|>", "<|im_end|>") + "\n" == full.replace("<think>\n\n</think>\n\n", ""), (got, full)
