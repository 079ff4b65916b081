"""Prefix cache of the JAX engine: a warm request (prefix K/V reused) equals a cold one.

References: an engine with the cache off (`prefix_cache_bytes=0`: every prompt is a full
prefill, the path before the cache existed) and, for one case, the plain full forward of a
freshly loaded Decoder (no KV cache) with float64 log-softmax. Blocks are 16 tokens so the tiny
random model's prompts span several blocks.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import jax.numpy as jnp

from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
from openclaw_jax.models.tokenizer import load_tokenizer
from openclaw_jax.models.weights import load_hf_checkpoint

BLOCK = 16
NEW = 6
TOL = 1e-4


def make_engine(model_dir, **config):
    model, _ = load_hf_checkpoint(model_dir)
    kw = dict(max_batch_size=4, min_prompt_bucket=64, min_cache_bucket=64, batch_wait_s=0.02,
              prefix_cache_block=BLOCK)
    kw.update(config)
    return Engine(model, load_tokenizer(model_dir), context_length=512, seed=0, config=EngineConfig(**kw))


@pytest.fixture(scope="module")
def engines(tiny_qwen3_dir):
    warm = make_engine(tiny_qwen3_dir)
    cold = make_engine(tiny_qwen3_dir, prefix_cache_bytes=0)
    yield warm, cold
    warm.shutdown()
    cold.shutdown()


def tokens(seed, n):
    return [int(t) for t in np.random.default_rng(seed).integers(10, 300, n)]


def spec(prompt, **kw):
    args = dict(max_new_tokens=NEW, temperature=0, ignore_eos=True, return_logprob=True, top_logprobs_num=4)
    args.update(kw)
    return spec_for(prompt, **args)


def assert_same(warm_out, cold_out):
    """Greedy tokens identical; output and top-N log-probs within TOL."""
    assert warm_out.output_ids == cold_out.output_ids
    np.testing.assert_allclose(warm_out.output_logprobs, cold_out.output_logprobs, atol=TOL, rtol=0)
    for w, c in zip(warm_out.output_top_logprobs, cold_out.output_top_logprobs):
        assert [t for _, t in w] == [t for _, t in c]
        np.testing.assert_allclose([v for v, _ in w], [v for v, _ in c], atol=TOL, rtol=0)


def session_prompts(warm, seed, turns):
    """Turn k = turn k-1's prompt + its (warm) answer + a new user message; yields (prompt, warm output)."""
    prompt = tokens(seed, 70)  # the "system prompt"
    for turn in range(turns):
        prompt = prompt + tokens(seed * 100 + turn, 9 + 3 * turn)
        out, = warm.generate_sync([spec(prompt)])
        yield prompt, out
        prompt = prompt + out.output_ids


def test_multi_turn_session_matches_cold_and_compiles_once(engines):
    warm, cold = engines
    previous = None
    for turn, (prompt, out) in enumerate(session_prompts(warm, seed=1, turns=4)):
        ref, = cold.generate_sync([spec(prompt)])
        assert_same(out, ref)
        assert ref.cached_tokens == 0
        # turn k reuses every whole block of turn k-1's prompt and answer (K/V of all but the
        # answer's last token, which was never fed back), never the last prompt token
        expected = 0 if previous is None else min(len(previous) + NEW - 1, len(prompt) - 1) // BLOCK * BLOCK
        assert out.cached_tokens == expected, turn
        previous = prompt
    # the same session again (cache flushed): same shapes, nothing compiles
    warm.flush_prefix_cache()
    compiled = warm.compile_counts()
    list(session_prompts(warm, seed=1, turns=4))
    assert warm.compile_counts() == compiled


def test_extend_prefill_equals_full_forward(engines, tiny_qwen3_dir):
    """A cache hit against the decoder's plain full forward (no engine, no KV cache)."""
    warm, _ = engines
    from flax import nnx
    ref_model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    base = tokens(7, 50)
    warm.generate_sync([spec(base)])
    prompt = base + tokens(8, 11)
    out, = warm.generate_sync([spec(prompt)])
    assert out.cached_tokens == 48
    graphdef, state = nnx.split(ref_model)
    ids = prompt + out.output_ids
    logits = np.asarray(nnx.merge(graphdef, state)(jnp.asarray([ids], jnp.int32))[0], np.float64)
    lp = logits - logits.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    for step, tok in enumerate(out.output_ids):
        row = lp[len(prompt) - 1 + step]
        assert tok == int(np.argmax(row))
        assert abs(out.output_logprobs[step] - row[tok]) <= TOL


def test_partial_prefix_hit(engines):
    warm, cold = engines
    first = tokens(20, 80)
    warm.generate_sync([spec(first)])
    # shares 40 tokens (2 whole blocks) with `first`, then diverges
    second = first[:40] + tokens(21, 30)
    unrelated = tokens(22, 45)
    outs = warm.generate_sync([spec(second), spec(unrelated)])
    refs = cold.generate_sync([spec(second), spec(unrelated)])
    assert [o.cached_tokens for o in outs] == [32, 0]
    for out, ref in zip(outs, refs):
        assert_same(out, ref)


def test_interleaved_sessions_share_one_batch(engines):
    """Two sessions' turns (and one new prompt) admitted together: extend rows with different
    prefix lengths and a cold prefill in the same round."""
    warm, cold = engines
    a, b = tokens(30, 100), tokens(31, 60)
    firsts = warm.generate_sync([spec(a), spec(b)])
    a2 = a + firsts[0].output_ids + tokens(32, 13)
    b2 = b + firsts[1].output_ids + tokens(33, 25)
    fresh = tokens(34, 20)
    outs = warm.generate_sync([spec(a2), spec(b2), spec(fresh)])
    refs = cold.generate_sync([spec(a2), spec(b2), spec(fresh)])
    assert [o.cached_tokens for o in outs] == [96, 64, 0]  # whole blocks of 100 + 5 and 60 + 5 tokens
    for out, ref in zip(outs, refs):
        assert_same(out, ref)


@pytest.mark.parametrize("start", [0, 37])
def test_prompt_logprobs_are_computed_not_cached(engines, start):
    warm, cold = engines
    prompt = tokens(40, 90)
    warm.generate_sync([spec(prompt)])
    kw = dict(logprob_start_len=start, max_new_tokens=2)
    out, = warm.generate_sync([spec(prompt, **kw)])
    ref, = cold.generate_sync([spec(prompt, **kw)])
    # position start - 1 predicts token `start`: only whole blocks before it come from the cache
    assert out.cached_tokens == (max(start - 1, 0) // BLOCK) * BLOCK
    assert len(out.input_logprobs) == len(ref.input_logprobs) == len(prompt) - start
    assert (out.input_logprobs[0] is None) == (start == 0)
    got = [x for x in out.input_logprobs if x is not None]
    want = [x for x in ref.input_logprobs if x is not None]
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    for w, c in zip(out.input_top_logprobs, ref.input_top_logprobs):
        assert (w is None) == (c is None)
        if w is not None:
            assert [t for _, t in w] == [t for _, t in c]
    assert_same(out, ref)


def test_lru_eviction_under_a_small_budget(tiny_qwen3_dir, engines):
    _, cold = engines
    probe = make_engine(tiny_qwen3_dir, prefix_cache_bytes=0)
    per_block = probe._kv_bytes_per_token * BLOCK
    probe.shutdown()
    engine = make_engine(tiny_qwen3_dir, prefix_cache_bytes=6 * per_block)  # room for 6 blocks
    try:
        a, b, c = tokens(50, 49), tokens(51, 49), tokens(52, 33)

        def run(prompt):
            out, = engine.generate_sync([spec(prompt)])
            ref, = cold.generate_sync([spec(prompt)])
            assert_same(out, ref)
            return out.cached_tokens

        assert [run(a), run(b)] == [0, 0]      # 3 + 3 blocks: full
        assert run(a) == 48                    # hit; a is now more recent than b
        assert run(c) == 0                     # 2 blocks: b's last two are evicted (LRU leaves)
        stats = engine.prefix_cache_stats()
        assert stats["evicted_blocks"] == 2 and stats["used_blocks"] == 6 and stats["capacity_blocks"] == 6
        assert run(b) == 16                    # only b's first block is left; its 2 others evict a's tail
        assert run(a) == 16
        assert engine.prefix_cache_stats()["used_blocks"] <= 6
    finally:
        engine.shutdown()


def test_weight_swap_invalidates_without_refresh(tiny_qwen3_dir, tiny_qwen3_dir_b):
    from flax import nnx
    engine = make_engine(tiny_qwen3_dir, prefix_refresh_tokens=0)
    cold_b = make_engine(tiny_qwen3_dir_b, prefix_cache_bytes=0)
    other, _ = load_hf_checkpoint(tiny_qwen3_dir_b)
    try:
        prompt = tokens(60, 70)
        engine.generate_sync([spec(prompt)])
        assert engine.generate_sync([spec(prompt)])[0].cached_tokens == 64
        # same version string: the weights still changed, so the entries must go
        engine.swap_weights(nnx.split(other)[1], None)
        ref, = cold_b.generate_sync([spec(prompt)])
        after, = engine.generate_sync([spec(prompt)])
        assert after.cached_tokens == 0
        assert_same(after, ref)
        again, = engine.generate_sync([spec(prompt)])  # re-cached under the new weights
        assert again.cached_tokens == 64
        assert_same(again, ref)
        stats = engine.prefix_cache_stats()
        assert stats["invalidations"] == 1 and stats["refreshes"] == 0
    finally:
        engine.shutdown()
        cold_b.shutdown()


@pytest.mark.parametrize("chunk", [8192, 32])
def test_hot_prefixes_survive_weight_swaps_and_a_rollback(tiny_qwen3_dir, tiny_qwen3_dir_b, chunk):
    """A session's next turn after a swap reuses its whole prompt so far, and its log-probs equal a fresh
    engine's with the new weights (no prefix cache); swapping back (a rollback) refreshes again. With
    32-token chunks each prefix is recomputed as a cold prefill and extends of the chunks before it."""
    from flax import nnx

    engine = make_engine(tiny_qwen3_dir, prefix_refresh_chunk_tokens=chunk)
    cold_a = make_engine(tiny_qwen3_dir, prefix_cache_bytes=0)
    cold_b = make_engine(tiny_qwen3_dir_b, prefix_cache_bytes=0)
    state_a = nnx.split(load_hf_checkpoint(tiny_qwen3_dir)[0])[1]
    state_b = nnx.split(load_hf_checkpoint(tiny_qwen3_dir_b)[0])[1]
    try:
        prompt = tokens(100, 70)
        for turn, (state, version, cold) in enumerate([(state_b, "v2", cold_b), (state_a, "v1", cold_a),
                                                        (state_b, "v3", cold_b)]):
            out, = engine.generate_sync([spec(prompt)])
            engine.swap_weights(state, version)
            # turn k + 1: turn k's prompt + answer + a new message; the K/V of all of it but the
            # answer's last token (never fed back) was cached, in whole blocks
            prompt = prompt + out.output_ids + tokens(101 + turn, 9)
            after, = engine.generate_sync([spec(prompt)])
            ref, = cold.generate_sync([spec(prompt)])
            assert after.weight_version == version
            assert after.cached_tokens == (len(prompt) - 9 - 1) // BLOCK * BLOCK > 0, turn
            assert_same(after, ref)
        stats = engine.prefix_cache_stats()
        assert stats["refreshes"] == 3 and stats["refreshed_tokens"] > 0
    finally:
        for e in (engine, cold_a, cold_b):
            e.shutdown()


def test_refresh_waits_for_the_running_turn_without_pausing_it(tiny_qwen3_dir, tiny_qwen3_dir_b):
    """With a cached prefix to recompute, a swap during a turn lets the turn finish first, on the weights it
    started with and never paused, and installs the new weights (and their refreshed prefix) after it.
    (Swapping mid-turn without the wait: test_answer_decoded_across_a_weight_swap_is_not_cached.)"""
    import threading

    from flax import nnx
    state_b = nnx.split(load_hf_checkpoint(tiny_qwen3_dir_b)[0])[1]
    engine = make_engine(tiny_qwen3_dir, prefix_refresh_wait_s=120.0)
    try:
        system = tokens(130, 70)
        engine.generate_sync([spec(system)])  # something hot to recompute at the swap
        turn = engine.submit(spec(tokens(131, 20), max_new_tokens=400), stream=True)
        turn.next_sync(timeout=60)
        swapped_at: list[float] = []
        swapper = threading.Thread(target=lambda: (engine.swap_weights(state_b, "v2"), swapped_at.append(time.time())))
        swapper.start()
        out = turn.next_sync(timeout=120)
        while not out.finished:
            out = turn.next_sync(timeout=120)
        swapper.join(120)
        assert swapped_at and swapped_at[0] >= out.finished_time
        assert [s["version"] for s in out.weight_versions] == ["default"] and len(out.output_ids) == 400
        after, = engine.generate_sync([spec(system + tokens(132, 5))])
        assert after.weight_version == "v2" and after.cached_tokens == 64
        assert engine.prefix_cache_stats()["refreshes"] == 1
    finally:
        engine.shutdown()


def test_a_request_said_to_be_coming_holds_the_refresh_until_it_arrives(tiny_qwen3_dir, tiny_qwen3_dir_b, caplog):
    """`expect_request` (a person's turn has begun; their client builds its prompt) holds the recompute's next
    chunk as a request being served does: until the hold ends, or until a request arrives and is served.
    Without a hold the refresh does not wait."""
    import logging
    import re
    import threading

    from flax import nnx
    state_a = nnx.split(load_hf_checkpoint(tiny_qwen3_dir)[0])[1]
    state_b = nnx.split(load_hf_checkpoint(tiny_qwen3_dir_b)[0])[1]
    engine = make_engine(tiny_qwen3_dir, prefix_refresh_wait_s=120.0, compile_ahead=False)
    system = tokens(140, 70)

    def waited_s() -> float:
        found = re.findall(r"recomputed in [\d.]+ s \(([\d.]+) s of it waiting", caplog.text)
        assert found, caplog.text
        return float(found[-1])

    try:
        with pytest.raises(ValueError, match="within_s"):
            engine.expect_request(float("nan"))
        caplog.set_level(logging.INFO, logger="openclaw_jax.inference.weight_swap")
        engine.generate_sync([spec(system)])
        engine.swap_weights(state_b, "v2")  # no hold: the refresh starts at once
        assert waited_s() < 0.5
        engine.generate_sync([spec(system + tokens(141, 5))])
        assert engine.expect_request(1.5) == 1.5
        engine.swap_weights(state_a, "v3")  # the hold runs out: the refresh waited it out
        assert 1.4 <= waited_s() < 10
        engine.generate_sync([spec(system + tokens(142, 5))])
        engine.expect_request(60.0)
        swapper = threading.Thread(target=engine.swap_weights, args=(state_b, "v4"))
        swapper.start()
        time.sleep(1.0)
        assert swapper.is_alive() and engine.weight_version == "v3"  # held
        came, = engine.generate_sync([spec(system + tokens(143, 5))])  # the request said to be coming
        swapper.join(60)
        assert not swapper.is_alive() and engine.weight_version == "v4" and came.weight_version == "v3"
        assert 0.9 <= waited_s() < 30
    finally:
        engine.shutdown()


def test_a_turn_served_during_the_refresh_is_caught_up(tiny_qwen3_dir, tiny_qwen3_dir_b, monkeypatch):
    """A turn that finishes on the old weights while the refresh runs (after it chose its prefixes) is
    recomputed too before the new weights serve: the session's next turn after the swap extends only its new
    message, and equals a fresh engine's with the new weights."""
    from flax import nnx

    from openclaw_jax.inference import weight_swap
    state_b = nnx.split(load_hf_checkpoint(tiny_qwen3_dir_b)[0])[1]
    engine = make_engine(tiny_qwen3_dir)
    cold_b = make_engine(tiny_qwen3_dir_b, prefix_cache_bytes=0)
    real_refresh, served = weight_swap.refresh_prefixes, []

    def refresh_with_a_turn_meanwhile(prefixes, **kw):
        if not served:  # the person's turn arrives after the refresh took its list of hot prefixes
            served.append(engine.generate_sync([spec(turn)])[0])
        return real_refresh(prefixes, **kw)

    monkeypatch.setattr(weight_swap, "refresh_prefixes", refresh_with_a_turn_meanwhile)
    try:
        first, = engine.generate_sync([spec(tokens(140, 70))])
        turn = tokens(140, 70) + first.output_ids + tokens(141, 30)
        engine.swap_weights(state_b, "v2")
        assert served and served[0].weight_version == "default"
        nxt = turn + served[0].output_ids + tokens(142, 9)
        after, = engine.generate_sync([spec(nxt)])
        ref, = cold_b.generate_sync([spec(nxt)])
        assert after.weight_version == "v2"
        assert after.cached_tokens == (len(nxt) - 9 - 1) // BLOCK * BLOCK
        assert_same(after, ref)
    finally:
        engine.shutdown()
        cold_b.shutdown()


def test_refresh_budget_keeps_the_most_recent_prefixes(tiny_qwen3_dir, tiny_qwen3_dir_b):
    """Two sessions sharing a system prompt: with room for one entry only the most recently used one
    is recomputed; with a token budget, the prefix is cut to it."""
    from flax import nnx
    state_b = nnx.split(load_hf_checkpoint(tiny_qwen3_dir_b)[0])[1]
    system = tokens(110, 48)  # 3 blocks shared by both sessions
    a, b = system + tokens(111, 40), system + tokens(112, 40)  # 5 whole blocks each
    for config, expected in ((dict(prefix_refresh_entries=1), (48, 80)),
                             (dict(prefix_refresh_tokens=4 * BLOCK), (48, 64))):
        engine = make_engine(tiny_qwen3_dir, **config)
        try:
            engine.generate_sync([spec(a)])
            engine.generate_sync([spec(b)])  # b is the most recent
            engine.swap_weights(state_b, "v2")
            got = tuple(engine.generate_sync([spec(p + tokens(113, 3))])[0].cached_tokens for p in (a, b))
            assert got == expected, config
        finally:
            engine.shutdown()


def test_hot_paths_order_and_budget(tiny_qwen3_dir):
    """The host bookkeeping alone: leaves newest first, a shared prefix counted once, cut to the budget."""
    engine = make_engine(tiny_qwen3_dir)
    try:
        system = tokens(120, 32)
        a, b, c = system + tokens(121, 33), system + tokens(122, 17), tokens(123, 17)
        for prompt in (a, b, c):
            engine.generate_sync([spec(prompt, max_new_tokens=1)])
        pc = engine._prefix
        whole = lambda p: p[:len(p) // BLOCK * BLOCK]
        assert engine._call_in_engine(lambda: pc.hot_paths(10_000, 10)) == [whole(c), whole(b), whole(a)]
        assert engine._call_in_engine(lambda: pc.hot_paths(10_000, 2)) == [whole(c), whole(b)]
        # 4 blocks: c (1), b (3: system 2 + 1), then only room for nothing new of a
        assert engine._call_in_engine(lambda: pc.hot_paths(4 * BLOCK, 10)) == [whole(c), whole(b)]
        # 5 blocks: a's first new block fits after the shared system prompt
        assert engine._call_in_engine(lambda: pc.hot_paths(5 * BLOCK, 10)) == [whole(c), whole(b), a[:48]]
    finally:
        engine.shutdown()


def test_answer_decoded_across_a_weight_swap_is_not_cached(tiny_qwen3_dir, tiny_qwen3_dir_b):
    """A sequence whose steps ran on two weight versions leaves nothing in the cache, even when the
    cache was already synced to the new weights (by another request's prefill) before it ended."""
    from flax import nnx
    engine = make_engine(tiny_qwen3_dir, prefix_refresh_wait_s=0)  # the swap does not wait for `long`
    other, _ = load_hf_checkpoint(tiny_qwen3_dir_b)
    try:
        prompt = tokens(90, 20)
        # submitted together: a batch of 2 rows, the companion's soon free for `short`
        long = engine.submit(spec(prompt, max_new_tokens=480), stream=True)
        companion = engine.submit(spec(tokens(92, 20), max_new_tokens=1))
        long.next_sync(timeout=60)
        companion.next_sync(timeout=60)
        engine.swap_weights(nnx.split(other)[1], "v2")
        short, = engine.generate_sync([spec(tokens(91, 20), max_new_tokens=2)])
        out = long.next_sync(timeout=120)
        while not out.finished:
            out = long.next_sync(timeout=120)
        assert short.finished_time < out.finished_time  # the cache synced while `long` still ran
        assert [s["version"] for s in out.weight_versions] == ["default", "v2"]
        follow, = engine.generate_sync([spec(prompt + out.output_ids)])
        # only the prompt's whole block, recomputed under v2 at the swap; none of the answer's
        assert follow.cached_tokens == len(prompt) // BLOCK * BLOCK
    finally:
        engine.shutdown()


def test_cached_tokens_in_generate_response(engines):
    from openclaw_jax.wire.sglang_results import build_generate_response
    warm, _ = engines
    prompt = tokens(70, 40)
    warm.generate_sync([spec(prompt)])
    s = spec(prompt + tokens(71, 5))
    out, = warm.generate_sync([s])
    meta = build_generate_response(out, s)["meta_info"]
    assert meta["cached_tokens"] == out.cached_tokens == 32


def test_disabled_cache_and_config_validation(engines):
    _, cold = engines
    prompt = tokens(80, 60)
    cold.generate_sync([spec(prompt)])
    assert cold.generate_sync([spec(prompt)])[0].cached_tokens == 0
    assert cold.prefix_cache_stats()["capacity_blocks"] == 0
    with pytest.raises(ValueError, match="prefix_cache_block=48"):
        EngineConfig(prefix_cache_block=48)
    with pytest.raises(ValueError, match="prefix_cache_bytes=-1"):
        EngineConfig(prefix_cache_bytes=-1)
    with pytest.raises(ValueError, match="prefix_refresh_tokens=-1"):
        EngineConfig(prefix_refresh_tokens=-1)
    with pytest.raises(ValueError, match="prefix_refresh_chunk_tokens=0"):
        EngineConfig(prefix_refresh_chunk_tokens=0)
