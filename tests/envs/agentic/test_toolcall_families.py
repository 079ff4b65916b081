"""The tool-call environment's harder families (`bigproduct`, `chain`) and gsm demonstrations.

Demonstrations run through the real sandbox with a scripted policy, so the Python the agent would
write is executed, not trusted; wrong answers must be rejected; references are hand-derived or
computed here with plain integer arithmetic, not with the module's helpers."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from openclaw_jax.envs.agentic.config import AgenticConfig
from openclaw_jax.envs.agentic.episode import EpisodeLimits, EpisodeRunner, ScriptedPolicy, make_env
from openclaw_jax.envs.agentic.episode import NoDemonstration, format_tool_call
from openclaw_jax.envs.agentic.rollout import demonstrations
from openclaw_jax.envs.agentic.toolcall import ToolCallEnv, gsm_expression, numbers_match
from openclaw_jax.envs.sandbox import SandboxLimits, run_code
from openclaw_jax.models.tokenizer import smollm2_tokenizer


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def _run(env, tok, task, turns, limits=EpisodeLimits()):
    return asyncio.run(EpisodeRunner(env, tok, limits).run(task, ScriptedPolicy(tok, turns), temperature=0.0))


def _code(turn: str) -> str:
    return json.loads(turn.split("\n")[1])["arguments"]["code"]


def test_default_families_are_unchanged():
    """Existing configs (no `families`, or [product, sum]) get the same tasks as before the new families
    (pinned from the code before them)."""
    env = make_env(AgenticConfig(env="toolcall"))
    assert env.families == ("product", "sum")
    got = [(t.task_id, t.prompt, t.answer) for t in env.tasks("train", 4, seed=0)]
    assert got == [("sum/train/0/0", "What is 2726 + 7159 + 7239 + 7141?", 24265),
                   ("product/train/0/0", "What is 53974 * 8724?", 470869176),
                   ("product/train/0/1", "What is 36792 * 8937?", 328810104),
                   ("sum/train/0/1", "What is 8259 + 2624 + 3836 + 6699 + 3685 + 2485?", 27588)]
    assert env.demonstration(env.tasks("train", 4, seed=0)[1]) == [
        format_tool_call("python", {"code": "print(53974 * 8724)"}), "The answer is 470869176."]


def test_families_are_validated_by_name():
    assert make_env(AgenticConfig(env="toolcall", families=("chain", "bigproduct"))).families == ("chain", "bigproduct")
    with pytest.raises(ValueError, match=r"\['chaim'\] must be a non-empty subset of .*'chain'"):
        make_env(AgenticConfig(env="toolcall", families=("chaim",)))


@pytest.mark.parametrize("family", ["bigproduct", "chain", "gsm"])
def test_train_and_heldout_never_share_a_problem(family):
    env = ToolCallEnv([family])
    train, held = env.tasks("train", 200, seed=0), env.tasks("heldout", 60, seed=0)
    assert len({t.prompt for t in train}) == 200 and len({t.prompt for t in held}) == 60
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    # another seed's held-out problems are not training problems of this seed either (same hash split)
    if family != "gsm":
        assert not {t.prompt for t in train} & {t.prompt for t in env.tasks("heldout", 60, seed=1)}


def test_bigproduct_sizes_and_exact_answers():
    for task in ToolCallEnv(["bigproduct"]).tasks("train", 50, seed=0):
        a, b = map(int, re.fullmatch(r"What is (\d+) \* (\d+)\?", task.prompt).groups())
        assert 7 <= len(str(a)) <= 9 and 5 <= len(str(b)) <= 6
        assert task.answer == a * b and a * b < 2**53   # exact as a float, so the checker can be exact


@pytest.mark.parametrize("family", ["bigproduct", "chain"])
def test_demonstrations_solve_in_the_sandbox_and_wrong_answers_fail(tok, family):
    env = ToolCallEnv([family])
    calls = 2 if family == "chain" else 1
    for task in env.tasks("train", 3, seed=0) + env.tasks("heldout", 2, seed=0):
        turns = env.demonstration(task)
        ep = _run(env, tok, task, turns)
        assert ep.success and ep.end_reason == "answer", (task, ep.observations)
        assert ep.tool_calls == calls and ep.tool_errors == 0 and ep.num_turns == calls + 1
        assert ep.observations[calls - 1] == str(task.answer)   # the last call computed it (not just the answer turn)
        assert not _run(env, tok, task, ["The answer is 12345678."]).success
        n = int(task.answer)
        # the checker is exact on big integers: one off in the last digit, or only the leading digits, fail
        for wrong in {n + 1, n - 1, round(n, -(len(str(n)) - 7))} - {n}:
            assert not _run(env, tok, task, turns[:-1] + [f"The answer is {wrong}."]).success, wrong
        assert _run(env, tok, task, turns[:-1] + [f"So it is {n:,}."]).success   # the grouped form counts


def test_chain_needs_the_first_calls_output(tok):
    """What chain guarantees: the second call uses x and its last digit d, which the question never
    states; the answer is none of x, x + c, c (so one product-style call with the question's numbers
    does not solve it), and a second call with a misread x gives a rejected answer."""
    env = ToolCallEnv(["chain"])
    for task in env.tasks("train", 4, seed=0) + env.tasks("heldout", 2, seed=0):
        a, b, c = map(int, re.fullmatch(r"Let x = (\d+) \* (\d+)\. What is x \* d \+ (\d+), where d is the last "
                                        r"digit of x\?", task.prompt).groups())
        x = a * b
        d = x % 10
        assert task.answer == x * d + c and 2 <= d <= 9
        assert task.answer not in (x, x + c, c, a * b * c, a + b + c)
        assert str(x) not in task.prompt
        first, second, _ = env.demonstration(task)
        assert _code(first) == f"print({a} * {b})"
        ep = _run(env, tok, task, env.demonstration(task))
        assert ep.observations[0] == str(x) and str(x) in _code(second)
        # the same two steps with x misread by 10 (same last digit): the agent answers what it printed
        misread = format_tool_call("python", {"code": f"print({x + 10} * {d} + {c})"})
        ep = _run(env, tok, task, [first, misread, f"The answer is {(x + 10) * d + c}."])
        assert ep.tool_calls == 2 and not ep.success


def test_gsm_demonstrations_solve_or_say_why_not(tok):
    env = ToolCallEnv(["gsm"])
    train, held = env.tasks("train", 60, seed=0), env.tasks("heldout", 20, seed=0)
    with_demo = [t for t in train + held if "expr" in t.data]
    # most worked solutions read back as Python (about 92% measured); the rest have percentages or algebra
    assert len(with_demo) >= 0.8 * len(train + held)
    # every expression, run by Python in the sandbox, prints its task's answer
    out = run_code("\n".join(f"print({t.data['expr']})" for t in with_demo), "python", SandboxLimits(timeout_s=10))
    assert out.exit_code == 0, out.stderr
    assert all(numbers_match(float(v), t.answer) for v, t in zip(out.stdout.split(), with_demo, strict=True))
    for task in with_demo[:4] + [t for t in held if "expr" in t.data][:2]:
        ep = _run(env, tok, task, env.demonstration(task))
        assert ep.success and ep.tool_calls == 1 and ep.tool_errors == 0, (task, ep.observations)
        assert numbers_match(float(ep.observations[0]), task.answer)   # Python printed the answer
        assert not _run(env, tok, task, [f"The answer is {int(task.answer) + 1}."]).success
    without = [t for t in train + held if "expr" not in t.data]
    assert without, "no word problem without an expression among 80: pick a larger draw to test the skip"
    with pytest.raises(NoDemonstration, match=re.escape(without[0].task_id) + ".*no demonstration"):
        env.demonstration(without[0])
    # the warm-up's demonstrations skip such a task and keep the rest (a tool call and an answer each)
    mixed = without[:1] + with_demo[:2]
    pairs = asyncio.run(demonstrations(EpisodeRunner(env, tok), mixed))
    assert len(pairs) == 4 and "The answer is" in tok.decode(pairs[-1][1])


@pytest.mark.parametrize("question, solution, answer, expect", [
    # words, units and a unit ratio dropped; the earlier result 138 is inlined as the step that computed it
    ("There are 46 girls and 3 boys for every girl. How many kids?",
     "There are 46 girls x 3 boys/girl = 138 boys in the park.\nIn total there are 46 girls + 138 boys = 184 kids\n"
     "#### 184", 184, "46 + (46 * 3)"),
    # a rate ("£195/day") is not a division
    ("He earns £195 a day, 12 days a month.", "He earns £195/day * 12 days/month = £2340/month\n#### 2340", 2340,
     "195 * 12"),
    # the step is the arithmetic after the words, not the number before "because"
    ("Tickets are 17 each for 3 people.", "The tickets cost £51 because 17 x 3 = 51\n#### 51", 51, "17 * 3"),
    # steps chain: each earlier result becomes the expression that computed it
    ("Tom has 8 apples and buys 8 more, then 3 times as many as he has.",
     "He has 8 + 8 = 16 apples.\nHe buys 16 * 3 = 48.\nTotal 16 + 48 = 64\n#### 64", 64, "(8 + 8) + ((8 + 8) * 3)"),
    # ... except a number the question states, which stays literal
    ("Tom has 8 apples and buys 8 more. Ann has 16 pears.",
     "Tom has 8 + 8 = 16 apples.\nTogether 16 + 16 = 32\n#### 32", 32, "16 + 16"),
    # the answer is an earlier step, not the last equation
    ("She has 5 apples and buys 7; each weighs 2 grams. How many apples?",
     "She has 5 + 7 = 12 apples.\nThey weigh 12 * 2 = 24 grams.\n#### 12", 12, "5 + 7"),
    # a rounded intermediate (3.33) inlined would change the value: the step as written is kept
    ("Split 10 in 3 and take 3 parts, to 2 decimals.", "10 / 3 = 3.33\n3.33 * 3 = 9.99\n#### 9.99", 9.99, "3.33 * 3"),
    # algebra ("2x+140=198" reads as 2 + 140, which is not 198: dropped) and percentages give nothing
    ("Split 198 so that one part is 140 more.", "we get 2x+140=198\nso 2x=58\nx=29\n#### 29", 29, None),
    ("What is 50% of 50%?", "50% * 50% = 25%\n#### 25", 25, None),
])
def test_gsm_expression_reads_worked_solutions(question, solution, answer, expect):
    assert gsm_expression(question, solution, answer) == expect


def test_numbers_match_is_exact_on_big_integers_but_tolerates_float_noise():
    assert numbers_match(573.9999999999999, 574) and numbers_match(0.1 + 0.2, 0.3)
    assert not numbers_match(440040000, 440040051)          # within 1e-6 relative, but not the number
    assert not numbers_match(123456789012345 + 1, 123456789012345)
    assert not numbers_match(None, 1)
