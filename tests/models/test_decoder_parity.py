"""Decoder logits equal HF `transformers` (PyTorch CPU, float32) on the same random weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.models.weights import model_from_state_dict
from tests.helpers.hf_models import hf_logits, hf_state_dict, make_hf_model

TOL = 1e-4

# (family, tied embeddings, heads, kv heads, head_dim, rope theta): GQA ratios 1, 2 and 4;
# head_dim != hidden / heads (hidden is 32) wherever the family allows it.
CASES = [
    ("llama", True, 4, 4, 16, 10000.0),
    ("llama", False, 4, 1, 8, 500000.0),
    ("qwen2", False, 4, 2, 8, 1000000.0),
    ("qwen2", True, 4, 4, 8, 10000.0),
    ("qwen3", False, 4, 1, 16, 1000000.0),
    ("qwen3", True, 4, 2, 24, 10000.0),
]


def _ids(rng, batch, length, vocab):
    return rng.integers(0, vocab, size=(batch, length)).astype(np.int32)


@pytest.mark.parametrize("family,tie,heads,kv_heads,head_dim,theta", CASES,
                         ids=[f"{c[0]}-{'tied' if c[1] else 'untied'}-gqa{c[2] // c[3]}-hd{c[4]}" for c in CASES])
def test_full_forward_matches_transformers(family, tie, heads, kv_heads, head_dim, theta):
    hf, cfg = make_hf_model(family, tie=tie, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                            rope_theta=theta, seed=heads * 10 + kv_heads)
    assert cfg.family == family and cfg.tie_word_embeddings == tie and cfg.head_dim == head_dim
    assert cfg.rope_theta == theta
    model = model_from_state_dict(cfg, hf_state_dict(hf))
    ids = _ids(np.random.default_rng(0), 2, 12, cfg.vocab_size)
    ours = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids)))
    ref = hf_logits(hf, ids)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= TOL, np.abs(ours - ref).max()
    # hidden_states @ lm_head_kernel reproduces the logits (the API the chunked ops rely on).
    hidden = nnx.jit(lambda m, x: m.hidden_states(x))(model, jnp.asarray(ids))
    again = np.asarray(jnp.einsum("blh,hv->blv", hidden, model.lm_head_kernel()))
    assert np.abs(again - ref).max() <= TOL


def test_left_padded_attention_mask_matches_transformers():
    """attention_mask hides padding keys exactly like HF (real tokens' logits equal)."""
    hf, cfg = make_hf_model("qwen3", tie=False, num_heads=4, num_kv_heads=2, head_dim=8)
    model = model_from_state_dict(cfg, hf_state_dict(hf))
    rng = np.random.default_rng(1)
    ids = _ids(rng, 2, 10, cfg.vocab_size)
    mask = np.ones((2, 10), dtype=bool)
    mask[1, :4] = False  # row 1 is left-padded by 4
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    ours = np.asarray(nnx.jit(lambda m, x, p, a: m(x, p, a))(model, jnp.asarray(ids), jnp.asarray(positions),
                                                              jnp.asarray(mask)))
    ref = hf_logits(hf, ids, mask)
    assert np.abs(ours[mask] - ref[mask]).max() <= TOL
    # and equal to the unpadded row on its own
    alone = hf_logits(hf, ids[1:, 4:])
    assert np.abs(ours[1, 4:] - alone[0]).max() <= TOL


@pytest.mark.parametrize("family,tie,heads,kv_heads,head_dim", [
    ("llama", True, 4, 2, 16), ("qwen2", False, 4, 2, 8), ("qwen3", False, 4, 1, 16)])
def test_kv_cache_decode_matches_full_forward(family, tie, heads, kv_heads, head_dim):
    """Right-padded prefill of rows with different lengths, then one token at a time: every real
    position's logits equal HF's full forward over that row alone."""
    hf, cfg = make_hf_model(family, tie=tie, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, seed=3)
    model = model_from_state_dict(cfg, hf_state_dict(hf))
    graphdef, state = nnx.split(model)

    @jax.jit
    def decode(state, ids, positions, cache):
        return nnx.merge(graphdef, state).decode(ids, positions, cache)

    rng = np.random.default_rng(2)
    lengths, bucket, steps, max_len = [5, 8, 3], 8, 4, 16
    rows = [_ids(rng, 1, n + steps, cfg.vocab_size)[0] for n in lengths]
    prompt = np.zeros((3, bucket), np.int32)
    for b, n in enumerate(lengths):
        prompt[b, :n] = rows[b][:n]
    positions = np.broadcast_to(np.arange(bucket, dtype=np.int32), (3, bucket))
    cache = model.init_cache(3, max_len)
    assert cache.k.shape == (cfg.num_layers, 3, max_len, cfg.num_kv_heads, cfg.head_dim)
    logits, cache = decode(state, jnp.asarray(prompt), jnp.asarray(positions), cache)
    got = {b: [np.asarray(logits[b, :n])] for b, n in enumerate(lengths)}
    for step in range(steps):
        token = np.array([[rows[b][n + step]] for b, n in enumerate(lengths)], np.int32)
        pos = np.array([[n + step] for n in lengths], np.int32)
        logits, cache = decode(state, jnp.asarray(token), jnp.asarray(pos), cache)
        for b in range(3):
            got[b].append(np.asarray(logits[b]))
    for b, n in enumerate(lengths):
        ours = np.concatenate(got[b], axis=0)
        ref = hf_logits(hf, rows[b][None])[0]
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() <= TOL, (b, np.abs(ours - ref).max())


def test_decode_hidden_matches_decode_logits():
    hf, cfg = make_hf_model("llama", tie=False, num_heads=4, num_kv_heads=2, head_dim=8)
    model = model_from_state_dict(cfg, hf_state_dict(hf))
    ids = jnp.asarray(_ids(np.random.default_rng(4), 2, 6, cfg.vocab_size))
    pos = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    hidden, _ = model.decode_hidden(ids, pos, model.init_cache(2, 8))
    ref = hf_logits(hf, np.asarray(ids))
    assert hidden.shape == (2, 6, cfg.hidden_size)
    assert np.abs(np.asarray(model.logits(hidden)) - ref).max() <= TOL


def test_bfloat16_params_run_and_stay_close():
    """bf16 params/activations (the GPU setting): output float32 logits near the f32 reference."""
    hf, cfg = make_hf_model("qwen3", tie=False, num_heads=4, num_kv_heads=2, head_dim=8)
    model = model_from_state_dict(cfg.replace(dtype="bfloat16", param_dtype="bfloat16"), hf_state_dict(hf))
    assert model.layers.self_attn.q_proj.kernel.get_value().dtype == jnp.bfloat16
    ids = _ids(np.random.default_rng(5), 2, 8, cfg.vocab_size)
    logits = np.asarray(model(jnp.asarray(ids)))
    ref = hf_logits(hf, ids)
    assert logits.dtype == np.float32
    # bf16 matmuls alone give 0.015-0.031 x max|ref| on this model (measured over input seeds);
    # twice that leaves room for accumulation-order noise, not for a lost float32 step.
    assert np.abs(logits - ref).max() < 0.06 * np.abs(ref).max()


def _subjaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr


def _primitive_input_dtypes(jaxpr, names, found):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in names:
            found.setdefault(eqn.primitive.name, set()).update(str(v.aval.dtype) for v in eqn.invars
                                                               if hasattr(v.aval, "dtype"))
        for sub in _subjaxprs(eqn):
            _primitive_input_dtypes(sub, names, found)
    return found


@pytest.mark.parametrize("remat", [False, True])
def test_bfloat16_model_keeps_norms_softmax_and_rope_in_float32(remat):
    """docs/design.md §12: with bf16 compute, norms (rsqrt), softmax (exp, max), RoPE (sin, cos) and the
    output log-probs run in float32. Read from the traced program, so a norm or a softmax done in
    bf16 fails here even where the tiny model's logits would stay within the tolerance above."""
    hf, cfg = make_hf_model("qwen3", tie=False, num_heads=4, num_kv_heads=2, head_dim=8)
    model = model_from_state_dict(cfg.replace(dtype="bfloat16", param_dtype="bfloat16", remat=remat),
                                  hf_state_dict(hf))
    graphdef, state = nnx.split(model)
    ids = jnp.asarray(_ids(np.random.default_rng(5), 2, 8, cfg.vocab_size))

    def forward(state, ids):
        logits = nnx.merge(graphdef, state)(ids)
        return jax.nn.log_softmax(logits, axis=-1)

    closed = jax.make_jaxpr(forward)(state, ids)
    found = _primitive_input_dtypes(closed.jaxpr, {"rsqrt", "exp", "sin", "cos", "reduce_max"}, {})
    assert {"rsqrt", "exp"} <= set(found), f"expected norms and a softmax in the program, found {sorted(found)}"
    for name, dtypes in found.items():
        assert dtypes == {"float32"}, f"{name} runs on {sorted(dtypes)}; it must run in float32"
    # and the bf16 parts really are bf16 (the test would be vacuous on an all-float32 program)
    dots = _primitive_input_dtypes(closed.jaxpr, {"dot_general"}, {})
    assert "bfloat16" in dots.get("dot_general", set())


def test_remat_gives_the_same_loss_and_grads():
    """cfg.remat wraps each block in jax.checkpoint: same values, and it differentiates."""
    hf, cfg = make_hf_model("qwen2", tie=False, num_heads=4, num_kv_heads=2, head_dim=8)
    ids = jnp.asarray(_ids(np.random.default_rng(6), 2, 8, cfg.vocab_size))

    def loss_and_grads(remat):
        model = model_from_state_dict(cfg.replace(remat=remat), hf_state_dict(hf))
        loss_fn = lambda m: jnp.mean(jax.nn.logsumexp(m(ids), axis=-1))  # noqa: E731
        return nnx.jit(nnx.value_and_grad(loss_fn))(model)

    loss_a, grads_a = loss_and_grads(False)
    loss_b, grads_b = loss_and_grads(True)
    assert abs(float(loss_a) - float(loss_b)) <= 1e-6
    for (path, a), (_, b) in zip(nnx.to_flat_state(grads_a), nnx.to_flat_state(grads_b)):
        np.testing.assert_allclose(np.asarray(b.get_value()), np.asarray(a.get_value()), atol=1e-6, err_msg=str(path))
