"""The engine's fused decode layers (openclaw_jax/inference/decode_layers.py) against the model's block path."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.inference import kernels
from openclaw_jax.inference.decode_layers import write_cache_slots, decode_step, fuse_layers
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder, KVCache
from openclaw_jax.models.lora import LoRAConfig, add_lora


def _cfg(**kw):
    base = dict(family="qwen2", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=8, max_position_embeddings=64, dtype="float32", param_dtype="float32")
    base.update(kw)
    return ModelConfig(**base)


def _model_and_cache(dtype="float32", **kw):
    """A small model in `dtype` and a random stacked cache of 3 rows x 16 slots in the same dtype."""
    model = Decoder(_cfg(dtype=dtype, param_dtype=dtype, **kw), rngs=nnx.Rngs(0))
    cfg = model.cfg
    rng = np.random.default_rng(0)
    shape = (cfg.num_layers, 3, 16, cfg.num_kv_heads, cfg.head_dim)
    cache = KVCache(jnp.asarray(rng.standard_normal(shape), dtype), jnp.asarray(rng.standard_normal(shape), dtype))
    return model, cache


@pytest.mark.parametrize("kw", [dict(), dict(attention_bias=True), dict(qk_norm=True, tie_word_embeddings=True)],
                         ids=["plain", "bias", "qk_norm_tied"])
def test_fused_decode_matches_block_path(kw):
    model, cache = _model_and_cache(**kw)
    graphdef, state = nnx.split(model)
    cfg = model.cfg
    s = cache.k.shape[2]
    tokens = jnp.asarray([5, 17, 90], jnp.int32)

    def run_blocks(positions):
        layer_graphdef, layer_states = kernels.split_layers(graphdef, state)
        return jax.jit(lambda st, ls, c: kernels._decode_logits(nnx.merge(graphdef, st), layer_graphdef, ls, tokens,
                                                                positions, c))(state, layer_states, cache)

    def run_fused(positions):
        # the fused step takes the engine's per-layer cache; compared here in the stacked layout
        def step(st, weights, c):
            m = nnx.merge(graphdef, st)
            per_layer = KVCache(tuple(c.k), tuple(c.v))
            logits, out = decode_step(cfg, weights, m.embed, m.norm, tokens, positions, per_layer)
            return logits, KVCache(jnp.stack(out.k), jnp.stack(out.v))
        return jax.jit(step)(state, fuse_layers(graphdef, state), cache)

    close = dict(rtol=1e-5, atol=1e-5)
    # an empty prefix, a middle slot, the last slot
    positions = jnp.asarray([0, 7, s - 1], jnp.int32)
    ref_logits, ref_cache = run_blocks(positions)
    logits, new_cache = run_fused(positions)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), **close)
    np.testing.assert_allclose(np.asarray(new_cache.k), np.asarray(ref_cache.k), **close)
    np.testing.assert_allclose(np.asarray(new_cache.v), np.asarray(ref_cache.v), **close)
    # and the block path is the model's own decode
    full, _ = model.decode(tokens[:, None], positions[:, None], cache)
    np.testing.assert_allclose(np.asarray(ref_logits), np.asarray(full[:, 0]), **close)

    # A row past the cache end (how the decode loop parks a stopped row) writes nothing; its logits
    # are discarded by the loop (the fused path attends to its cache only, without its own key).
    positions = jnp.asarray([0, 7, s], jnp.int32)
    ref_logits, ref_cache = run_blocks(positions)
    logits, new_cache = run_fused(positions)
    np.testing.assert_allclose(np.asarray(logits[:2]), np.asarray(ref_logits[:2]), **close)
    np.testing.assert_allclose(np.asarray(new_cache.k), np.asarray(ref_cache.k), **close)
    np.testing.assert_array_equal(np.asarray(new_cache.v[:, 2]), np.asarray(cache.v[:, 2]))


def test_lora_models_keep_the_block_path():
    model = add_lora(Decoder(_cfg(), rngs=nnx.Rngs(0)), LoRAConfig(rank=2), rngs=nnx.Rngs(1))
    graphdef, state = nnx.split(model)
    assert fuse_layers(graphdef, state) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_writes_equal_a_plain_scatter(dtype):
    """Each row's new key lands at its slot, bit for bit (a bfloat16 cache is scattered as uint16 bits);
    a slot past the end writes nothing."""
    rng = np.random.default_rng(0)
    cache = jnp.asarray(rng.standard_normal((3, 8, 2, 4)), dtype)
    new = jnp.asarray(rng.standard_normal((3, 2, 4)), jnp.float32)  # written in the cache's dtype
    rows, positions = jnp.arange(3), jnp.asarray([0, 5, 8], jnp.int32)
    got = jax.jit(write_cache_slots)(cache, rows, positions, new)
    assert got.dtype == cache.dtype
    want = np.asarray(cache.astype(jnp.float32)).copy()
    want[0, 0] = np.asarray(new[0].astype(dtype).astype(jnp.float32))
    want[1, 5] = np.asarray(new[1].astype(dtype).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), want)


def test_bfloat16_fused_decode_matches_block_path():
    """A bfloat16 model (bf16 weights and cache, float32 accumulation) decodes the same on both paths, to
    bfloat16's precision."""
    model, cache = _model_and_cache("bfloat16")
    graphdef, state = nnx.split(model)
    cfg = model.cfg
    s = cache.k.shape[2]
    tokens, positions = jnp.asarray([5, 17, 90], jnp.int32), jnp.asarray([0, 7, s - 1], jnp.int32)

    def step(st, weights, c):
        m = nnx.merge(graphdef, st)
        logits, out = decode_step(cfg, weights, m.embed, m.norm, tokens, positions, KVCache(tuple(c.k), tuple(c.v)))
        return logits, KVCache(jnp.stack(out.k), jnp.stack(out.v))

    logits, new_cache = jax.jit(step)(state, fuse_layers(graphdef, state), cache)
    full, ref_cache = model.decode(tokens[:, None], positions[:, None], cache)
    assert new_cache.k.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full[:, 0]), rtol=0.02, atol=0.02)
    for got, want in ((new_cache.k, ref_cache.k), (new_cache.v, ref_cache.v)):
        np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32)),
                                   rtol=0.02, atol=0.02)
