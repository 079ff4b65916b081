"""JAX generation engine: exactness against full-sequence forwards, sampling params, stops, buckets.

References are independent of the engine's cached decode path: the full-sequence forward of a
freshly loaded Decoder (no KV cache) with float64 NumPy log-softmax, and HF `transformers` on
PyTorch for greedy argmax decisions.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from openclaw_jax.inference.engine import Engine, EngineConfig, bucket, spec_for
from openclaw_jax.models.tokenizer import load_tokenizer
from openclaw_jax.models.weights import load_hf_checkpoint

PROMPTS = [
    [5, 17, 42, 99, 3],
    [200, 201, 7],
    [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21],
    [300, 1, 2, 250],
]


def log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def setup(tiny_qwen3_dir):
    model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    ref_model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    tok = load_tokenizer(tiny_qwen3_dir)
    engine = Engine(model, tok, context_length=256, seed=0,
                    config=EngineConfig(max_batch_size=8, min_batch_bucket=8, min_prompt_bucket=32,
                                        min_cache_bucket=64, batch_wait_s=0.02))
    yield engine, ref_model, tok
    engine.shutdown()


REF_LEN = 64
_ref_fns: dict[int, object] = {}


def full_logits(model, ids):
    """Full-sequence forward (no KV cache): float32 logits [L, V] as float64 NumPy.

    The sequence is right-padded to REF_LEN so one compiled forward serves every length; the
    causal mask makes positions < L independent of the padding.
    """
    from flax import nnx
    key = id(model)
    if key not in _ref_fns:
        graphdef, state = nnx.split(model)
        fn = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
        _ref_fns[key] = (fn, state)
    fn, state = _ref_fns[key]
    assert len(ids) <= REF_LEN
    padded = np.zeros((1, REF_LEN), np.int32)
    padded[0, :len(ids)] = ids
    return np.asarray(fn(state, jnp.asarray(padded))[0, :len(ids)], np.float64)


def test_greedy_equals_stepwise_argmax_and_logprobs(setup, tiny_qwen3_dir):
    engine, ref, _ = setup
    import torch
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir).eval()
    outs = engine.generate_sync([spec_for(p, max_new_tokens=12, temperature=0, ignore_eos=True,
                                          return_logprob=True) for p in PROMPTS])
    for prompt, out in zip(PROMPTS, outs):
        assert out.finish_reason == {"type": "length", "length": 12}
        # Causality: the full forward over prompt + output gives, at position len(prompt)-1+t, the
        # logits a step-by-step loop sees before choosing token t (checked in order, so every
        # earlier choice already matched).
        ids = list(prompt) + out.output_ids
        jax_logits = full_logits(ref, ids)
        with torch.no_grad():
            hf_logits = hf(torch.tensor([ids])).logits[0].numpy()
        for step in range(12):
            pos = len(prompt) - 1 + step
            expected = int(np.argmax(jax_logits[pos]))
            assert int(np.argmax(hf_logits[pos])) == expected  # both references agree
            assert out.output_ids[step] == expected, (prompt, step)
            np.testing.assert_allclose(out.output_logprobs[step], log_softmax64(jax_logits[pos])[expected],
                                       atol=1e-5)


def test_sampled_logprobs_and_true_top_n(setup):
    engine, ref, _ = setup
    temperature = 0.7
    specs = [spec_for(p, max_new_tokens=8, temperature=temperature, top_p=0.9, top_k=50, sampling_seed=123 + i,
                      ignore_eos=True, return_logprob=True, top_logprobs_num=5, token_ids_logprob=(0, 7, 319))
             for i, p in enumerate(PROMPTS)]
    for prompt, out in zip(PROMPTS, engine.generate_sync(specs)):
        ids = list(prompt) + out.output_ids
        lp = log_softmax64(full_logits(ref, ids) / temperature)
        for step, tok in enumerate(out.output_ids):
            row = lp[len(prompt) - 1 + step]
            np.testing.assert_allclose(out.output_logprobs[step], row[tok], atol=1e-5)
            top = out.output_top_logprobs[step]
            assert len(top) == 5
            ref_top = np.argsort(-row, kind="stable")[:5]
            assert [t for _, t in top] == [int(t) for t in ref_top]
            np.testing.assert_allclose([v for v, _ in top], row[ref_top], atol=1e-5)
            got = out.output_token_ids_logprobs[step]
            assert [t for _, t in got] == [0, 7, 319]
            np.testing.assert_allclose([v for v, _ in got], row[[0, 7, 319]], atol=1e-5)


@pytest.mark.parametrize("start", [0, 2])
def test_prompt_logprobs(setup, start):
    engine, ref, _ = setup
    temperature = 1.3
    prompt = PROMPTS[2]
    out, = engine.generate_sync([spec_for(prompt, max_new_tokens=2, temperature=temperature, sampling_seed=1,
                                          return_logprob=True, logprob_start_len=start, top_logprobs_num=3)])
    lp = log_softmax64(full_logits(ref, prompt) / temperature)
    assert len(out.input_logprobs) == len(prompt) - start
    assert len(out.input_top_logprobs) == len(prompt) - start
    for k, t in enumerate(range(start, len(prompt))):
        if t == 0:
            assert out.input_logprobs[k] is None and out.input_top_logprobs[k] is None
            continue
        np.testing.assert_allclose(out.input_logprobs[k], lp[t - 1, prompt[t]], atol=1e-5)
        ref_top = np.argsort(-lp[t - 1], kind="stable")[:3]
        assert [i for _, i in out.input_top_logprobs[k]] == [int(i) for i in ref_top]


def test_prompt_logprobs_without_generation(setup):
    engine, ref, _ = setup
    prompt = PROMPTS[0]
    out, = engine.generate_sync([spec_for(prompt, max_new_tokens=0, return_logprob=True, logprob_start_len=0)])
    assert out.output_ids == [] and out.finish_reason == {"type": "length", "length": 0}
    lp = log_softmax64(full_logits(ref, prompt))
    np.testing.assert_allclose(out.input_logprobs[1:], [lp[t - 1, prompt[t]] for t in range(1, len(prompt))],
                               atol=1e-5)


def test_truncation_params_restrict_the_support(setup):
    engine, ref, _ = setup
    prompt = PROMPTS[0]
    n = 6
    specs = {
        "top_k": [spec_for(prompt, max_new_tokens=6, temperature=1.0, top_k=3, sampling_seed=s, ignore_eos=True)
                  for s in range(n)],
        "top_p": [spec_for(prompt, max_new_tokens=6, temperature=1.0, top_p=0.5, sampling_seed=100 + s,
                           ignore_eos=True) for s in range(n)],
        "min_p": [spec_for(prompt, max_new_tokens=6, temperature=1.0, min_p=0.3, sampling_seed=200 + s,
                           ignore_eos=True) for s in range(n)],
    }
    results = {k: engine.generate_sync(v) for k, v in specs.items()}
    for kind, outs in results.items():
        for out in outs:
            ids = list(prompt) + out.output_ids
            probs = np.exp(log_softmax64(full_logits(ref, ids)))
            for step, tok in enumerate(out.output_ids):
                p = probs[len(prompt) - 1 + step]
                order = np.argsort(-p, kind="stable")
                rank = int(np.where(order == tok)[0][0])
                if kind == "top_k":
                    assert rank < 3
                elif kind == "top_p":
                    assert p[order[:rank]].sum() <= 0.5 + 1e-5  # mass strictly before it is within top_p
                else:
                    assert p[tok] >= 0.3 * p.max() - 1e-6
    # the restrictions are not vacuous: unrestricted sampling leaves the top-3 at some point
    free = engine.generate_sync([spec_for(prompt, max_new_tokens=6, temperature=1.0, sampling_seed=300 + s,
                                          ignore_eos=True) for s in range(n)])
    ranks = []
    for out in free:
        ids = list(prompt) + out.output_ids
        lp = log_softmax64(full_logits(ref, ids))
        for step, tok in enumerate(out.output_ids):
            ranks.append(int(np.where(np.argsort(-lp[len(prompt) - 1 + step], kind="stable") == tok)[0][0]))
    assert max(ranks) >= 3


def test_degenerate_truncation_is_greedy(setup):
    engine, _, _ = setup
    prompt = PROMPTS[1]
    greedy, k1, p_small = engine.generate_sync([
        spec_for(prompt, max_new_tokens=8, temperature=0, ignore_eos=True),
        spec_for(prompt, max_new_tokens=8, temperature=1.0, top_k=1, sampling_seed=5, ignore_eos=True),
        spec_for(prompt, max_new_tokens=8, temperature=1.0, top_p=1e-4, sampling_seed=6, ignore_eos=True),
    ])
    assert k1.output_ids == greedy.output_ids
    assert p_small.output_ids == greedy.output_ids


def test_seeds_are_reproducible_and_sample_index_differs(setup):
    engine, _, _ = setup
    prompt = PROMPTS[3]

    def run(seed, idx=0):
        return engine.generate_sync([spec_for(prompt, max_new_tokens=10, temperature=1.0, sampling_seed=seed,
                                              ignore_eos=True, sample_index=idx)])[0].output_ids

    a, b = run(7), run(7)
    assert a == b
    others = [run(8), run(9), run(7, idx=1), run(7, idx=2)]
    assert all(o != a for o in others)
    # alone or batched with other work: the same seed gives the same tokens
    mixed = engine.generate_sync([spec_for(prompt, max_new_tokens=10, temperature=1.0, sampling_seed=7,
                                           ignore_eos=True)]
                                 + [spec_for(p, max_new_tokens=4, temperature=0.5) for p in PROMPTS])
    assert mixed[0].output_ids == a


def test_stop_token_ids_and_strings(setup):
    engine, _, tok = setup
    prompt = PROMPTS[0]
    base, = engine.generate_sync([spec_for(prompt, max_new_tokens=16, temperature=0, ignore_eos=True)])
    ids = base.output_ids
    stop_id = ids[5]
    first = ids.index(stop_id)
    out, = engine.generate_sync([spec_for(prompt, max_new_tokens=16, temperature=0, stop_token_ids=(stop_id,))])
    assert out.finish_reason == {"type": "stop", "matched": stop_id}
    assert out.output_ids == ids[:first + 1]  # the matched stop token is in output_ids ...
    assert out.text == tok.decode(ids[:first], skip_special_tokens=True)  # ... but not in the text
    # ignore_eos also ignores stop_token_ids (SGLang semantics)
    out, = engine.generate_sync([spec_for(prompt, max_new_tokens=16, temperature=0, stop_token_ids=(stop_id,),
                                          ignore_eos=True)])
    assert out.output_ids == ids

    # a stop string: the decoded text of one generated token, first occurrence wins
    pieces = [tok.decode([t]) for t in ids]
    k = next(i for i in range(3, len(ids)) if pieces[i].strip() and "\ufffd" not in pieces[i])
    stop = pieces[k]
    full = tok.decode(ids, skip_special_tokens=True)
    end = next(j for j in range(len(ids)) if stop in tok.decode(ids[:j + 1], skip_special_tokens=True))
    out, = engine.generate_sync([spec_for(prompt, max_new_tokens=16, temperature=0, ignore_eos=True, stop=(stop,))])
    assert out.finish_reason == {"type": "stop", "matched": stop}
    assert out.output_ids == ids[:end + 1]
    assert out.text == full[:full.find(stop)]
    kept, = engine.generate_sync([spec_for(prompt, max_new_tokens=16, temperature=0, ignore_eos=True, stop=(stop,),
                                           no_stop_trim=True)])
    assert kept.text == tok.decode(ids[:end + 1], skip_special_tokens=True) and kept.text.endswith(stop)


def test_eos_stops_generation(setup):
    engine, _, tok = setup
    prompt = PROMPTS[1]
    base, = engine.generate_sync([spec_for(prompt, max_new_tokens=16, temperature=0, ignore_eos=True)])
    # pretend the 3rd generated token is an EOS of this engine
    eos = base.output_ids[2]
    eng2 = Engine(_model_of(engine), tok, context_length=256, eos_token_ids=[eos],
                  config=engine.config)
    try:
        out, = eng2.generate_sync([spec_for(prompt, max_new_tokens=16, temperature=0)])
    finally:
        eng2.shutdown()
    first = base.output_ids.index(eos)
    assert out.output_ids == base.output_ids[:first + 1]
    assert out.finish_reason == {"type": "stop", "matched": eos}


def _model_of(engine):
    from flax import nnx
    return nnx.merge(engine._graphdef, engine.params)


def test_buckets_compile_once(setup):
    engine, _, _ = setup
    spec = dict(max_new_tokens=5, temperature=0.9, sampling_seed=3, return_logprob=True)
    engine.generate_sync([spec_for([1, 2, 3], **spec)])
    before = engine.compile_counts()
    # other prompt lengths and sampling values in the same buckets reuse the compiled steps
    engine.generate_sync([spec_for([4, 5, 6, 7, 8, 9], **spec)])
    engine.generate_sync([spec_for(list(range(1, 20)), max_new_tokens=7, temperature=0.3, top_p=0.8,
                                   sampling_seed=4)])
    engine.generate_sync([spec_for([9] * 30, **spec), spec_for([8] * 2, **spec)])
    assert engine.compile_counts() == before
    assert bucket(5, 32) == 32 and bucket(33, 32) == 64 and bucket(64) == 64
    # long prompts: 4 sizes per octave (at most 25% padding), never below the minimum
    assert [bucket(n, 16, 4) for n in (200, 300, 2022, 2300, 2561, 4096)] == [256, 320, 2048, 2560, 3072, 4096]
    assert bucket(700, 1024, 4) == 1024 and bucket(2300, 16, 1) == 4096
    # a turn's new tokens after a cached prefix are not padded to the cold prompts' floor
    from openclaw_jax.inference.scheduler import extend_bucket, prompt_bucket
    live = EngineConfig(min_prompt_bucket=512)
    assert (prompt_bucket(70, live), extend_bucket(70, live), extend_bucket(9, live)) == (512, 128, 16)


def test_requests_arriving_together_share_decode_steps(setup):
    engine, _, _ = setup
    steps_before = engine._steps
    outs = engine.generate_sync([spec_for([i + 1, i + 2], max_new_tokens=6, temperature=0, ignore_eos=True)
                                 for i in range(6)])
    assert all(len(o.output_ids) == 6 for o in outs)
    # one prefill gives the first token, then 5 decode steps serve all six sequences at once
    assert engine._steps - steps_before == 5


def test_continuous_batching_admits_into_free_rows(setup):
    engine, _, _ = setup
    long = engine.submit(spec_for([1, 2, 3], max_new_tokens=60, temperature=0, ignore_eos=True), stream=True)
    first = long.next_sync(timeout=60)  # the long sequence is decoding
    assert not first.finished
    short = engine.submit(spec_for([4, 5], max_new_tokens=3, temperature=0, ignore_eos=True))
    short_out = short.next_sync(timeout=60)
    while True:
        long_out = long.next_sync(timeout=60)
        if long_out.finished:
            break
    assert len(long_out.output_ids) == 60 and len(short_out.output_ids) == 3
    assert short_out.finished_time < long_out.finished_time


def test_running_batch_grows_for_requests_that_arrive_later(setup):
    """A batch formed for one request widens (rows, then cache length) for those that arrive while it
    decodes, instead of leaving them queued until it drains; every row's tokens stay those of a solo run."""
    ref_engine, _, _ = setup
    engine = Engine(_model_of(ref_engine), ref_engine.tokenizer, context_length=256, seed=0,
                    config=EngineConfig(max_batch_size=8, min_batch_bucket=1, min_prompt_bucket=32,
                                        min_cache_bucket=64, batch_wait_s=0.0))
    greedy = dict(temperature=0, ignore_eos=True)
    long_spec = spec_for([1, 2, 3], max_new_tokens=100, **greedy)
    # the third needs a 256-slot cache (prompt 140 + 8 new), the running batch has 128
    short_specs = [spec_for([4, 5], max_new_tokens=4, **greedy), spec_for(list(range(7, 47)), max_new_tokens=6, **greedy),
                   spec_for([9] * 140, max_new_tokens=8, **greedy)]
    try:
        long = engine.submit(long_spec, stream=True)
        first = long.next_sync(timeout=120)
        assert not first.finished and engine._batch.size == 1 and engine._batch.cache_len == 128
        shorts = [engine.submit(s) for s in short_specs]
        short_outs = [h.next_sync(timeout=120) for h in shorts]
        assert engine._batch.size >= 4 and engine._batch.cache_len == 256
        while not (long_out := long.next_sync(timeout=120)).finished:
            pass
    finally:
        engine.shutdown()
    assert all(o.finished_time < long_out.finished_time for o in short_outs)
    solo = [ref_engine.generate_sync([s])[0] for s in [long_spec] + short_specs]
    assert [o.output_ids for o in [long_out] + short_outs] == [o.output_ids for o in solo]


def test_weight_swap_changes_outputs_and_version(setup, tiny_qwen3_dir_b):
    engine, ref, _ = setup
    from flax import nnx
    other, _ = load_hf_checkpoint(tiny_qwen3_dir_b)
    prompt = PROMPTS[0]
    before, = engine.generate_sync([spec_for(prompt, max_new_tokens=6, temperature=0, ignore_eos=True)])
    old_state = engine.params
    engine.swap_weights(nnx.split(other)[1], "v2")
    # (the swap itself may prefill the cached prefixes of earlier tests under the new weights: shapes
    # of their own); the same request after it compiles nothing
    compiled = engine.compile_counts()
    try:
        after, = engine.generate_sync([spec_for(prompt, max_new_tokens=6, temperature=0, ignore_eos=True)])
        assert engine.compile_counts() == compiled  # swapped params reuse the compiled steps
        assert after.weight_version == "v2" and before.weight_version == "default"
        ids = list(prompt)
        for _ in range(6):
            ids.append(int(np.argmax(full_logits(other, ids)[-1])))
        assert after.output_ids == ids[len(prompt):]
        assert after.output_ids != before.output_ids
    finally:
        engine.swap_weights(old_state, "default")
    with pytest.raises(ValueError, match="shape"):
        bad = jax.tree.map(lambda x: x[..., :1] if getattr(x, "ndim", 0) == 2 else x, old_state)
        engine.swap_weights(bad, "bad")


def test_prefill_groups_hold_at_most_max_prefill_rows():
    from types import SimpleNamespace

    from openclaw_jax.inference.scheduler import prefill_groups

    seqs = [SimpleNamespace(prompt_len=n) for n in (5, 30, 7, 60, 2)]
    lens = lambda groups: [[s.prompt_len for s in g] for g in groups]  # noqa: E731
    assert lens(prefill_groups(seqs, EngineConfig())) == [[5, 30, 7, 60, 2]]
    assert lens(prefill_groups(seqs, EngineConfig(max_prefill_rows=2))) == [[5, 30], [7, 60], [2]]
    assert lens(prefill_groups(seqs, EngineConfig(max_prefill_rows=1))) == [[5], [30], [7], [60], [2]]
    # the token budget still splits first where it is the tighter limit
    assert lens(prefill_groups(seqs, EngineConfig(max_prefill_rows=4, max_prefill_tokens=64, min_prompt_bucket=16))) \
        == [[5, 30], [7], [60], [2]]
    with pytest.raises(ValueError, match="max_prefill_rows"):
        EngineConfig(max_prefill_rows=-1)


def test_long_caches_are_bucketed_in_four_sizes_per_octave():
    """Past 4096 slots a running batch's cache grows in quarters of an octave (5120, 6144, 7168, 8192, 10240,
    ...), not to the next power of two; below that, and with cache_bucket_steps=1, powers of two."""
    from openclaw_jax.inference.scheduler import cache_bucket
    fine, pow2 = EngineConfig(min_cache_bucket=64), EngineConfig(min_cache_bucket=64, cache_bucket_steps=1)
    needs = [100, 3000, 4096, 4097, 5120, 5121, 7000, 8192, 8193, 13000]
    assert [cache_bucket(n, fine) for n in needs] == [128, 4096, 4096, 5120, 5120, 6144, 7168, 8192, 10240, 14336]
    assert [cache_bucket(n, pow2) for n in needs] == [128, 4096, 4096, 8192, 8192, 8192, 8192, 8192, 16384, 16384]
    assert cache_bucket(100, EngineConfig(min_cache_bucket=4096)) == 4096
    with pytest.raises(ValueError, match="cache_bucket_steps=0"):
        EngineConfig(cache_bucket_steps=0)


def test_a_long_session_decodes_in_a_cache_a_quarter_octave_past_it(tiny_smollm2_dir, caplog):
    """A 4.2 k-token prompt decodes in a 5120-slot running cache (not 8192), and its greedy tokens and log-probs
    are HF transformers' on the same checkpoint (full forwards, float64 log-softmax)."""
    import torch
    import transformers
    model, _ = load_hf_checkpoint(tiny_smollm2_dir)
    engine = Engine(model, load_tokenizer(tiny_smollm2_dir), context_length=8192, seed=0,
                    config=EngineConfig(max_batch_size=1, min_prompt_bucket=512, min_cache_bucket=4096,
                                        max_prefill_rows=1, batch_wait_s=0.0))
    prompt = np.random.default_rng(0).integers(10, 49000, size=4200).tolist()
    try:
        with caplog.at_level("DEBUG", logger="openclaw_jax.inference.engine"):
            out = engine.generate_sync([spec_for(prompt, max_new_tokens=8, temperature=0, ignore_eos=True,
                                                 return_logprob=True)])[0]
    finally:
        engine.shutdown()
    assert [r.getMessage() for r in caplog.records if "running batch" in r.getMessage()] == \
        ["new running batch: 1 rows x 5120 cache slots"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_smollm2_dir).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.output_ids])).logits[0].numpy()
    for step, token in enumerate(out.output_ids):
        row = log_softmax64(logits[len(prompt) - 1 + step])
        assert token == int(np.argmax(row)), step
        np.testing.assert_allclose(out.output_logprobs[step], row[token], atol=1e-4)
