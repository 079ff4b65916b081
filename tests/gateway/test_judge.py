"""Judge: vote parsing, majority, hint acceptance/de-dup/sort/cap, three-case rule, rule judge."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from openclaw_jax.gateway.judge import (
    HintVote,
    ModelJudge,
    NextState,
    RuleJudge,
    build_judgement,
    eval_vote_messages,
    extract_hint,
    hint_augmented_messages,
    hint_vote_messages,
    last_boxed_content,
    majority_vote,
    parse_hint_vote,
    parse_score,
    sample_kind,
    select_hints,
)


@pytest.mark.parametrize("text,expected", [
    ("\\boxed{1}", 1),
    ("\\boxed{-1}", -1),
    ("\\boxed{0}", 0),
    ("I think \\boxed{ +1 } fits", 1),
    ("first \\boxed{-1}, on reflection \\boxed{0}", 0),      # the last box counts
    ("first \\boxed{1}, on reflection \\boxed{maybe}", None),  # ... even when it is not a score
    ("\\boxed{-1} then cut off \\boxed{1", -1),                # an unclosed box is no box
    ("\\boxed{2}", None),
    ("\\boxed{1.0}", None),
    ("\\boxed{\\text{1}}", None),
    ("\\boxed{\u22121}", -1),                                  # typographic minus
    ("the answer is 1", None),
    ("", None),
    (None, None),
])
def test_parse_score(text, expected):
    assert parse_score(text) == expected


def test_last_boxed_content_balances_braces():
    assert last_boxed_content("x \\boxed{a{b}c} y") == "a{b}c"
    assert last_boxed_content("nothing") is None


@pytest.mark.parametrize("votes,expected", [
    ([1, 1, -1], 1),
    ([-1, -1, 1], -1),
    ([-1, -1, 0], -1),
    ([0, 0, 1], 0),
    ([1, -1, None], 0),          # tie between valid votes
    ([1, None, None], 1),        # majority of the *valid* votes
    ([None, None, None], 0),     # no valid vote
    ([], 0),
    ([1, 1, -1, -1, 0], 0),      # tie for first place
    ([1, 1, -1, -1, 1], 1),
    ([7, 7, -1], -1),            # out-of-range values are not votes
])
def test_majority_vote(votes, expected):
    assert majority_vote(votes) == expected


def test_extract_hint():
    assert extract_hint("\\boxed{1} [HINT_START] Use metric units. [HINT_END]") == "Use metric units."
    # The last start marker wins; the end marker must follow it.
    assert extract_hint("[HINT_START]old[HINT_END] then [HINT_START]new one[HINT_END]") == "new one"
    assert extract_hint("\\boxed{1} [HINT_START] never closed") is None
    assert extract_hint("[HINT_END] [HINT_START]") is None
    assert extract_hint(None) is None
    assert parse_hint_vote("\\boxed{-1}") == HintVote(-1, None)


def test_select_hints_acceptance_dedup_sort_cap():
    ten = "x" * 10
    eleven = "y" * 11
    votes = [
        HintVote(1, "Answer in French, not English."),
        HintVote(-1, "A rejected vote's hint is never used."),
        HintVote(1, ten),                          # exactly 10 chars: not longer than 10
        HintVote(1, "   " + eleven + "   "),       # 11 chars after stripping: accepted
        HintVote(None, "No vote, so no hint even if long enough."),
        HintVote(1, "Answer  in French,\nnot English."),   # duplicate up to whitespace
        HintVote(1, "Keep it short."),
        HintVote(1, None),
        HintVote(0, "A zero vote is not an acceptance."),
        HintVote(1, "Always cite the source you used for each number."),
    ]
    assert select_hints(votes, max_candidates=10) == [
        eleven, "Keep it short.", "Answer in French, not English.",
        "Always cite the source you used for each number."]
    assert select_hints(votes, max_candidates=2) == [eleven, "Keep it short."]
    assert select_hints(votes) == [eleven, "Keep it short.", "Answer in French, not English."]
    # Equal lengths keep vote order.
    assert select_hints([HintVote(1, "b" * 12), HintVote(1, "a" * 12)]) == ["b" * 12, "a" * 12]
    assert select_hints([HintVote(1, "short")], min_chars=3) == ["short"]


@pytest.mark.parametrize("score,hints,kind", [
    (1, ["h" * 20], "opd+rl"), (-1, ["h" * 20], "opd+rl"), (0, ["h" * 20], "opd"),
    (1, [], "rl"), (-1, [], "rl"), (0, [], None)])
def test_sample_kind_three_cases(score, hints, kind):
    assert sample_kind(score, hints) == kind


def test_build_judgement_counts_failures_as_no_vote():
    j = build_judgement(
        ["\\boxed{-1}", None, "\\boxed{-1}"],
        ["\\boxed{1} [HINT_START]Please reply in French from now on.[HINT_END]", None,
         "\\boxed{1} [HINT_START]Reply in French.[HINT_END]"],
        judge="t")
    assert j.eval_score == -1 and j.eval_votes == (-1, None, -1)
    assert j.hints == ("Reply in French.", "Please reply in French from now on.")
    assert j.hint_votes == (1, None, 1)
    assert j.kind == "opd+rl"
    assert j.raw["eval"][1] is None and j.judge == "t"


def test_judge_prompts_carry_reply_next_state_and_format():
    ns = NextState("tool", "Traceback: KeyError 'x'", name="python")
    for msgs in (eval_vote_messages("my reply", ns), hint_vote_messages("my reply", ns)):
        assert [m["role"] for m in msgs] == ["system", "user"]
        assert "my reply" in msgs[1]["content"] and "Traceback: KeyError 'x'" in msgs[1]["content"]
        assert "tool" in msgs[1]["content"] and 'named "python"' in msgs[1]["content"]
    eval_text = eval_vote_messages("r", ns)[1]["content"]
    assert all(s in eval_text for s in ("\\boxed{1}", "\\boxed{-1}", "\\boxed{0}"))
    hint_text = hint_vote_messages("r", NextState("user", "no"))[1]["content"]
    assert "[HINT_START]" in hint_text and "[HINT_END]" in hint_text and "\\boxed{-1}" in hint_text
    assert "user's next message" in hint_text


def test_hint_augmented_messages():
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "4", "tool_call_id": "c"},
    ]
    out = hint_augmented_messages(messages, "Show the working.")
    assert out[3] == {"role": "user", "content": "What is 2+2?\n\n[user's hint / instruction]\nShow the working."}
    assert out[:3] == messages[:3] and out[4:] == messages[4:]
    assert messages[3]["content"] == "What is 2+2?"  # input untouched
    no_user = hint_augmented_messages([{"role": "system", "content": "s"}], "Be brief please.")
    assert no_user == [{"role": "system", "content": "s"},
                       {"role": "user", "content": "[user's hint / instruction]\nBe brief please."}]


@pytest.mark.parametrize("role,text,score,hint", [
    ("user", "Thanks, that's perfect!", 1, None),
    ("user", "No, that's wrong. You should answer in French.", -1, "You should answer in French."),
    ("user", "Thanks, but that is not what I asked for.", -1, None),
    # an instruction alone asks for a change: -1, the instruction is the hint
    ("user", "Please always use bullet points for lists.", -1, "Please always use bullet points for lists."),
    ("user", "Great. From now on, use metric units! And tell me about Paris.", 1,
     "From now on, use metric units!"),
    ("user", "Now tell me about Berlin.", 1, None),  # moves on to the next task
    ("user", "No problem, next question: what is 3+3?", 0, None),
    ("user", "Use tabs.", -1, None),  # an instruction of 10 chars or fewer is not accepted as a hint
    # a correction's hint is what follows its verdict words; praise with a "but" objects
    ("user", "Nope, it's Thursday.", -1, "it's Thursday."),
    ("user", "Good start, but we're on Python 3.", -1, "we're on Python 3."),
    ("user", "ok but make it shorter please", -1, "make it shorter please"),
    ("user", "I asked for JavaScript, not Python.", -1, "I asked for JavaScript, not Python."),
    ("user", "ValueError: cannot reshape array of size 5 into shape (2,3)", -1, None),
    ("user", "Can you put that in a bulleted list?", -1, "Can you put that in a bulleted list?"),
    ("user", "Can you redo it?", -1, None),  # asks for no change in particular
    ("user", "Thanks anyway.", 0, None),
    ("user", "No thanks.", 0, None),
    ("user", "What if I use milk instead?", 0, None),  # a question, not an instruction
    ("user", "Where exactly is that setting?", 0, None),
    ("user", "Sounds good, and what about Friday?", 1, None),
    # an aside gives information for later, no verdict: a hint-only sample
    ("user", "For future reference: please always use bullet points for lists.", 0,
     "For future reference: please always use bullet points for lists."),
    ("tool", "Traceback (most recent call last):\nValueError: bad", -1, None),
    ("tool", "process finished, exit code 2", -1, None),
    ("tool", "All 12 tests passed.", 1, None),
    ("tool", "exit code 0", 1, None),
    ("tool", "42", 0, None),
])
def test_rule_judge(role, text, score, hint):
    j = RuleJudge().judge_now("some reply", NextState(role, text))
    assert j.eval_score == score
    assert j.hints == ((hint,) if hint else ())
    assert j.judge == "rule" and len(j.raw["eval"]) == 1 and len(j.raw["hint"]) == 1


def test_model_judge_runs_all_votes_concurrently_with_distinct_seeds():
    """2*m calls are in flight at once; failures are no votes; seeds differ per vote."""
    m = 3
    eval_answers = ["\\boxed{1}", "\\boxed{-1}", "\\boxed{1}"]
    hint_answers = ["\\boxed{1} [HINT_START]Say which file you changed.[HINT_END]", "boom",
                    "\\boxed{-1}"]
    calls = []

    class ScriptedPool:
        def __init__(self):
            self.in_flight = 0
            self.max_in_flight = 0
            self.all_started = asyncio.Event()

        async def generate(self, input_ids, *, sampling_params=None, **kw):
            calls.append((list(input_ids), sampling_params))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if len(calls) == 2 * m:
                self.all_started.set()
            await asyncio.wait_for(self.all_started.wait(), 5)  # deadlocks if calls were sequential
            self.in_flight -= 1
            seed = sampling_params.sampling_seed
            index = seed - 100
            text = eval_answers[index] if index < m else hint_answers[index - m]
            if text == "boom":
                raise RuntimeError("worker died")
            return SimpleNamespace(text=text)

    class FakeTokenizer:
        def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **kw):
            assert add_generation_prompt and tokenize
            # One id per character of the whole conversation: enough to tell prompts apart.
            return [ord(c) % 256 for m_ in messages for c in m_["content"]]

    pool = ScriptedPool()
    judge = ModelJudge(pool, FakeTokenizer(), votes=m, temperature=0.7, max_new_tokens=64,
                       eval_regex="EVAL", hint_regex="HINT")
    j = asyncio.run(judge.judge("the reply", NextState("user", "which file?"), seed=100))
    assert pool.max_in_flight == 2 * m
    seeds = [p.sampling_seed for _, p in calls]
    assert sorted(seeds) == list(range(100, 100 + 2 * m))
    assert all(p.temperature == 0.7 and p.max_new_tokens == 64 for _, p in calls)
    # eval votes (seeds 100..) carry the eval answer format, hint votes the hint one
    assert all(p.regex == ("EVAL" if p.sampling_seed < 100 + m else "HINT") for _, p in calls)
    eval_prompt = FakeTokenizer().apply_chat_template(eval_vote_messages("the reply", NextState("user", "which file?")),
                                                     add_generation_prompt=True)
    assert sum(ids == eval_prompt for ids, _ in calls) == m
    assert j.eval_score == 1 and j.eval_votes == (1, -1, 1)
    assert j.hint_votes == (1, None, -1)
    assert j.hints == ("Say which file you changed.",)
    assert j.raw["hint"][1] is None


def test_model_judge_timeout_is_no_vote():
    class SlowPool:
        async def generate(self, input_ids, *, sampling_params=None, **kw):
            await asyncio.sleep(10)

    class Tok:
        def apply_chat_template(self, messages, **kw):
            return [1, 2, 3]

    judge = ModelJudge(SlowPool(), Tok(), votes=2, timeout_s=0.05)
    j = asyncio.run(judge.judge("r", NextState("user", "thanks")))
    assert j.eval_votes == (None, None) and j.eval_score == 0 and j.hints == ()
    assert j.kind is None


def test_judge_without_hints_casts_eval_votes_only():
    """`hints=False` (the `rl` method): no hint call at all, so no hint and no hint-only sample."""
    calls = []

    class Pool:
        async def generate(self, input_ids, *, sampling_params=None, **kw):
            calls.append(sampling_params.sampling_seed)
            return SimpleNamespace(text="\\boxed{-1} [HINT_START]Please keep it short.[HINT_END]")

    class Tok:
        def apply_chat_template(self, messages, **kw):
            return [ord(c) % 256 for m_ in messages for c in m_["content"]]

    j = asyncio.run(ModelJudge(Pool(), Tok(), votes=3, hints=False).judge("r", NextState("user", "no"), seed=7))
    assert calls == [7, 8, 9] and j.eval_score == -1 and j.hints == () and j.hint_votes == ()
    # the rule judge: a correction with an instruction still scores -1, with no hint
    text = "That's wrong. Please keep your answer under 60 characters."
    assert RuleJudge().judge_now("r", NextState("user", text)).kind == "opd+rl"
    off = RuleJudge(hints=False).judge_now("r", NextState("user", text))
    assert off.eval_score == -1 and off.hints == () and off.kind == "rl" and off.raw["hint"] == []
    # an instruction alone asks for a change (-1): with hints an opd+rl sample, without them rl only
    assert RuleJudge().judge_now("r", NextState("user", "Please use tabs instead.")).kind == "opd+rl"
    assert RuleJudge(hints=False).judge_now("r", NextState("user", "Please use tabs instead.")).kind == "rl"
    # a neutral message is no sample
    assert RuleJudge().judge_now("r", NextState("user", "Interesting.")).kind is None


def test_rule_judge_reads_a_huge_reaction_in_bounded_time():
    """A pasted log as the person's next message: the patterns read a bounded prefix, each in linear time,
    so the judge (on the gateway's event loop) answers at once. Unbounded, these inputs took seconds at
    20 k characters and grow with the square of the length."""
    import time

    for text in ("a" * 1_000_000, "ab " * 300_000, "Thanks! " + "x" * 1_000_000, "E" * 1_000_000):
        start = time.perf_counter()
        RuleJudge().judge_now("r", NextState("user", text))
        assert time.perf_counter() - start < 5.0
