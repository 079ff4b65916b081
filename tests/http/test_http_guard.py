"""Unit tests of the shared serving guard: strict bounded JSON, the text budget's lower bound on
token counts, tokenizing off the event loop, and the guard's config validation."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time

import pytest

from openclaw_jax.models.tokenizer import tiny_test_tokenizer
from openclaw_jax.wire import json_safe
from openclaw_jax.http.http_guard import GuardConfig, bearer_matches
from openclaw_jax.http.text_budget import TextBudget


def reference_depth(value) -> int:
    """Containers on the deepest path (0 for a scalar), recursively: the independent definition."""
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


def random_tree(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.2:
        return rng.choice([1, "s", None, 2.5, True])
    if rng.random() < 0.5:
        return [random_tree(rng, depth - 1) for _ in range(rng.randrange(0, 3))]
    return {f"k{i}": random_tree(rng, depth - 1) for i in range(rng.randrange(0, 3))}


def test_depth_limit_matches_the_recursive_definition():
    rng = random.Random(0)
    for _ in range(400):
        tree = random_tree(rng, rng.randrange(1, 12))
        raw = json.dumps(tree).encode()
        limit = rng.randrange(4, 10)
        if reference_depth(tree) <= limit:
            assert json_safe.loads(raw, max_depth=limit) == tree
        else:
            with pytest.raises(json_safe.JSONRejected, match=f"more than {limit} levels"):
                json_safe.loads(raw, max_depth=limit)
    with pytest.raises(json_safe.JSONRejected, match="levels deep"):
        json_safe.loads(b"[" * 100000 + b"]" * 100000)


@pytest.mark.parametrize("raw,needle", [
    (b'{"a": "\\udfff"}', "lone surrogate"),
    (b'{"\\ud800": 1}', "lone surrogate"),
    (b'["ok", ["\\udc00x"]]', "lone surrogate"),
    (b'{"a": "\xed\xa0\x80"}', "not valid UTF-8"),
    (b'{"a": "\xff"}', "not valid UTF-8"),
    (b'{"a": NaN}', "NaN is not valid JSON"),
    (b'{"a": -Infinity}', "-Infinity is not valid JSON"),
    (b"   ", "empty"),
    (b'{"a": 1} x', "not valid JSON"),
])
def test_rejections(raw, needle):
    with pytest.raises(json_safe.JSONRejected, match=needle):
        json_safe.loads(raw)


def test_valid_documents_pass_unchanged():
    assert json_safe.loads(b'{"a": "\\ud83d\\ude00", "b": [1, {"c": null}]}') == {"a": "\U0001F600",
                                                                                  "b": [1, {"c": None}]}
    assert math.isnan(json_safe.loads(b"[NaN]", allow_nonfinite=True)[0])
    assert json_safe.loads('{"x": "caf\u00e9"}') == {"x": "caf\u00e9"}


def test_text_budget_lower_bound_holds_for_the_tokenizer():
    tok = tiny_test_tokenizer()
    budget = TextBudget(tok, max_tokens=64)
    # Independent of the budget's own scan: the longest decoded token, in characters.
    longest = max(len(tok.decode([i])) for i in range(tok.vocab_size))
    assert budget.token_chars >= longest
    rng = random.Random(3)
    alphabet = "ab \n\u00e9\u4e2d<|>" + "".join(chr(c) for c in range(33, 127))
    specials = [tok.id_to_token(i) for i in sorted(tok.special_token_ids)]
    for _ in range(300):
        parts = [rng.choice(specials) if rng.random() < 0.1 else
                 "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 20))) for _ in range(rng.randrange(1, 30))]
        text = "".join(parts)
        assert len(tok.encode(text)) >= math.ceil(len(text) / budget.token_chars), text
    assert budget.too_long(64 * budget.token_chars) is None
    assert "cannot fit 64 tokens" in budget.too_long(64 * budget.token_chars + 1)
    assert TextBudget(tok, max_tokens=64, max_text_chars=10).too_long(11) is not None


def test_large_texts_are_tokenized_without_blocking_the_loop():
    tok = tiny_test_tokenizer()
    budget = TextBudget(tok, max_tokens=10 ** 6)
    text = "a " * 200_000
    messages = [{"role": "user", "content": text}]

    async def measure(coro_factory):
        gaps = []
        done = False

        async def ticker():
            last = time.perf_counter()
            while not done:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        result = await coro_factory()
        elapsed = time.perf_counter() - t0
        done = True
        await task
        return result, elapsed, max(gaps)

    ids, elapsed, gap = asyncio.run(measure(lambda: budget.encode(text)))
    assert ids == tok.encode(text)
    rendered, elapsed2, gap2 = asyncio.run(measure(lambda: budget.render(messages)))
    assert rendered == tok.apply_chat_template(messages, add_generation_prompt=True)
    # Inline, one gap would span the whole tokenization; on a worker thread the loop keeps ticking.
    assert gap < max(0.5 * elapsed, 0.05) and gap2 < max(0.5 * elapsed2, 0.05), (gap, elapsed, gap2, elapsed2)


def test_guard_config_and_bearer():
    with pytest.raises(ValueError, match=r"gateway\.max_connections=0 must be >= 1"):
        GuardConfig(max_connections=0, prefix="gateway")
    with pytest.raises(ValueError, match=r"--header-timeout=0 must be > 0"):
        GuardConfig(header_timeout_s=0, prefix="--")
    key = b"k3y"
    assert bearer_matches({"Authorization": "Bearer k3y"}, key)
    assert bearer_matches({"Authorization": "bearer  k3y "}, key)
    for header in ("Bearer k3", "Basic k3y", "k3y", "", "Bearer \udcff\udcfe", "Bearer k3y\ud800"):
        assert not bearer_matches({"Authorization": header}, key), header
