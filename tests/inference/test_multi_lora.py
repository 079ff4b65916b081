"""Many people's LoRA adapters served at once by the engine (inference/adapters.py, adapter_serving.py).

The reference for a row served with adapter X is HF `transformers` in float64 on the *merged* weights
W + (alpha / r) * A_X B_X (the merge computed in NumPy float64): each row of a batch that mixes
adapters (and rows without one) must give that model's prompt and output log-probs and greedy tokens.
An update of one adapter changes its rows only (the others bit-exact); eviction and reload give the
same log-probs bit for bit; nothing recompiles when adapters are loaded, updated or evicted.
"""

from __future__ import annotations

import numpy as np
import pytest

from openclaw_jax.inference.adapters import AdapterError, read_adapter
from openclaw_jax.inference.decode_layers import FUSED
from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
from openclaw_jax.models.tokenizer import load_tokenizer
from openclaw_jax.models.weights import load_hf_checkpoint
from tests.helpers.lora_refs import (ATOL, check_row, merged_hf, random_adapter, ref_log_probs,
                                     write_peft_adapter)

PROMPTS = [[5, 17, 42, 99, 3], [200, 201, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [300, 1, 2, 250]]
MAX_NEW = 6

def spec(prompt, lora):
    return spec_for(prompt, max_new_tokens=MAX_NEW, temperature=0, ignore_eos=True, return_logprob=True,
                    logprob_start_len=0, top_logprobs_num=3, lora_path=lora)


@pytest.fixture(scope="module")
def setup(tiny_qwen3_dir, tmp_path_factory):
    model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    cfg = model.cfg
    adapters = {"alice": random_adapter(cfg, 1, rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down")),
                "bob": random_adapter(cfg, 2, rank=8, alpha=8.0, targets=("q", "v", "down")),
                "carol": random_adapter(cfg, 3, rank=2, alpha=4.0, targets=("o", "gate", "up"))}
    lora_dir = tmp_path_factory.mktemp("adapters")
    write_peft_adapter(lora_dir, "alice", adapters["alice"])
    write_peft_adapter(lora_dir, "bob", adapters["bob"])
    engine = Engine(model, load_tokenizer(tiny_qwen3_dir), context_length=256, seed=0,
                    config=EngineConfig(max_batch_size=4, min_batch_bucket=4, min_prompt_bucket=32,
                                        min_cache_bucket=64, batch_wait_s=0.05, lora_slots=2, lora_max_rank=8,
                                        lora_dir=str(lora_dir)))
    engine.load_adapter("carol", adapters["carol"])  # handed in as arrays, not resident yet
    refs = {name: merged_hf(tiny_qwen3_dir, a) for name, a in adapters.items()}
    refs[None] = merged_hf(tiny_qwen3_dir, None)
    yield engine, adapters, refs, lora_dir
    engine.shutdown()


MIXED = [(PROMPTS[0], "alice"), (PROMPTS[1], "bob"), (PROMPTS[2], None), (PROMPTS[3], "alice")]


def test_peft_adapter_directories_are_read(setup):
    _, adapters, _, lora_dir = setup
    back = read_adapter(lora_dir, "bob")
    assert (back.rank, back.alpha, sorted(back.weights)) == (8, 8.0, ["down", "q", "v"])
    for t, (a, b) in adapters["bob"].weights.items():
        np.testing.assert_array_equal(back.weights[t][0], a.reshape(back.weights[t][0].shape))
        np.testing.assert_array_equal(back.weights[t][1], b.reshape(back.weights[t][1].shape))
    with pytest.raises(AdapterError, match="does not exist"):
        read_adapter(lora_dir, "nobody")
    config = lora_dir / "bob" / "adapter_config.json"
    text = config.read_text()
    try:
        config.write_text(text.replace('"use_rslora": false', '"use_rslora": true'))
        with pytest.raises(AdapterError, match="use_rslora=True is not served"):
            read_adapter(lora_dir, "bob")
    finally:
        config.write_text(text)


def test_mixed_batch_gives_each_row_its_merged_models_logprobs(setup):
    engine, _, refs, _ = setup
    assert engine._layer_graphdef == FUSED  # decode: the fused layers, each row's adapter beside each matrix
    steps = engine._steps
    outs = engine.generate_sync([spec(p, lora) for p, lora in MIXED])
    # one prefill gives the first token, then the four rows of three people decode together
    assert engine._steps - steps == MAX_NEW - 1
    for (prompt, lora), out in zip(MIXED, outs):
        check_row(out, prompt, refs[lora])
    # the adapters matter far beyond the tolerance: the base model's log-probs differ
    base = ref_log_probs(refs[None], list(PROMPTS[1]) + outs[1].output_ids)
    tokens = list(PROMPTS[1]) + outs[1].output_ids
    assert max(abs(outs[1].output_logprobs[s] - base[len(PROMPTS[1]) - 1 + s, tokens[len(PROMPTS[1]) + s]])
               for s in range(MAX_NEW)) > 50 * ATOL


def test_updating_one_adapter_changes_its_rows_only(setup, tiny_qwen3_dir):
    engine, adapters, refs, lora_dir = setup
    before = engine.generate_sync([spec(p, lora) for p, lora in MIXED])
    compiled = engine.compile_counts()
    new_bob = random_adapter(engine.model_config, 12, rank=8, alpha=8.0, targets=("q", "v", "down"))
    assert engine.load_adapter("bob", new_bob) is True  # resident: overwritten in its slot
    after = engine.generate_sync([spec(p, lora) for p, lora in MIXED])
    assert engine.compile_counts() == compiled
    for (prompt, lora), old, new in zip(MIXED, before, after):
        if lora == "bob":
            check_row(new, prompt, merged_hf(tiny_qwen3_dir, new_bob))
            assert new.output_logprobs != old.output_logprobs
        else:  # bit-exact
            assert (new.output_ids, new.output_logprobs, new.input_logprobs) == \
                (old.output_ids, old.output_logprobs, old.input_logprobs)
    # re-read from its directory: the original values again
    engine.load_adapter("bob")
    again = engine.generate_sync([spec(p, lora) for p, lora in MIXED])
    assert again[1].output_logprobs == before[1].output_logprobs


def test_lru_eviction_and_reload_give_the_same_logprobs(setup):
    engine, _, refs, _ = setup
    one = lambda lora, p=PROMPTS[1]: engine.generate_sync([spec(p, lora)])[0]  # noqa: E731
    one("alice")
    first = one("bob")
    assert engine.adapter_stats()["resident"] == ["alice", "bob"]  # both slots, least recently used first
    compiled = engine.compile_counts()
    evictions = engine.adapter_stats()["evictions"]
    check_row(one("carol", PROMPTS[2]), PROMPTS[2], refs["carol"])  # both slots full: evicts the LRU (alice)
    assert engine.adapter_stats()["resident"] == ["bob", "carol"]
    one("alice")                                                     # evicts bob
    assert engine.adapter_stats()["resident"] == ["carol", "alice"]
    reloaded = one("bob")                                            # evicts carol, reads bob from its directory
    stats = engine.adapter_stats()
    assert stats["resident"] == ["alice", "bob"] and stats["evictions"] == evictions + 3
    assert (reloaded.output_ids, reloaded.output_logprobs, reloaded.input_logprobs) == \
        (first.output_ids, first.output_logprobs, first.input_logprobs)
    assert engine.compile_counts() == compiled


def test_more_people_than_slots_wait_for_a_free_slot(setup):
    engine, _, refs, _ = setup
    rows = [(PROMPTS[0], "alice"), (PROMPTS[1], "bob"), (PROMPTS[2], "carol"), (PROMPTS[3], None)]
    outs = engine.generate_sync([spec(p, lora) for p, lora in rows], timeout=300)
    for (prompt, lora), out in zip(rows, outs):
        check_row(out, prompt, refs[lora])


def test_an_unreadable_adapter_aborts_its_request_only(setup, tmp_path):
    engine, _, refs, lora_dir = setup
    broken = lora_dir / "erin"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((lora_dir / "bob" / "adapter_config.json").read_text())
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    bad, good = engine.generate_sync([spec(PROMPTS[0], "erin"), spec(PROMPTS[2], None)], timeout=120)
    assert bad.finish_reason["type"] == "abort" and "cannot be read" in bad.finish_reason["message"]
    check_row(good, PROMPTS[2], refs[None])
    assert "erin" not in engine.adapter_stats()["resident"]


def test_the_layer_scan_decode_serves_adapters_alike(setup, tiny_qwen3_dir):
    """Without the unrolled decode layers, the adapters ride in the model's params (`Projection`)."""
    _, _, refs, lora_dir = setup
    model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    engine = Engine(model, load_tokenizer(tiny_qwen3_dir), context_length=256, seed=0,
                    config=EngineConfig(max_batch_size=4, min_batch_bucket=4, min_prompt_bucket=32, min_cache_bucket=64,
                                        batch_wait_s=0.05, lora_slots=2, lora_max_rank=8, lora_dir=str(lora_dir),
                                        unrolled_decode=False))
    try:
        assert engine._layer_graphdef is None
        for (prompt, lora), out in zip(MIXED, engine.generate_sync([spec(p, lora) for p, lora in MIXED])):
            check_row(out, prompt, refs[lora])
    finally:
        engine.shutdown()


def test_unknown_or_unfitting_adapters_are_refused(setup):
    engine, adapters, _, _ = setup
    with pytest.raises(ValueError, match="no adapter of that name"):
        engine.submit(spec(PROMPTS[0], "mallory"))
    with pytest.raises(ValueError, match="not a person id"):
        engine.submit(spec(PROMPTS[0], "../alice"))
    c = engine.model_config  # one slot: A [L, in, 8] and B [L, 8, out] of all seven projections, float32
    ins_outs = [(c.hidden_size, c.num_heads * c.head_dim), (c.hidden_size, c.num_kv_heads * c.head_dim),
                (c.hidden_size, c.num_kv_heads * c.head_dim), (c.num_heads * c.head_dim, c.hidden_size),
                (c.hidden_size, c.intermediate_size), (c.hidden_size, c.intermediate_size),
                (c.intermediate_size, c.hidden_size)]
    assert engine.adapter_stats()["slot_bytes"] == sum(c.num_layers * 8 * (i + o) * 4 for i, o in ins_outs)
    too_big = random_adapter(engine.model_config, 5, rank=16, alpha=16.0, targets=("q",))
    with pytest.raises(AdapterError, match="lora_max_rank=8"):
        engine.load_adapter("dave", too_big)
    assert not engine.adapter_stats()["resident"].count("dave")


def test_a_weight_swap_keeps_the_adapters_on_the_new_base(setup, tiny_qwen3_dir_b):
    """Adapters are deltas on whatever base serves: after a swap each row is its adapter merged into the
    new weights, with the compiled steps reused."""
    from flax import nnx

    engine, adapters, _, _ = setup
    rows = [(PROMPTS[0], "alice"), (PROMPTS[2], None)]
    engine.generate_sync([spec(p, lora) for p, lora in rows])
    compiled = engine.compile_counts()
    old_state = engine.params
    engine.swap_weights(nnx.split(load_hf_checkpoint(tiny_qwen3_dir_b)[0])[1], "v2")
    try:
        outs = engine.generate_sync([spec(p, lora) for p, lora in rows])
        assert engine.compile_counts() == compiled
        for (prompt, lora), out in zip(rows, outs):
            assert out.weight_version == "v2"
            check_row(out, prompt, merged_hf(tiny_qwen3_dir_b, adapters.get(lora)))
    finally:
        engine.swap_weights(old_state, "default")
