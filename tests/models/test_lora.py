"""LoRA: init equals the base, only adapters train, merge equals the adapted model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.models.lora import LoRAConfig, LoRAParam, add_lora, lora_state, merge_lora
from openclaw_jax.models.weights import state_dict_from_model

CFG = ModelConfig(family="qwen2", vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, attention_bias=True)
IDS = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 7)), jnp.int32)


@nnx.jit
def forward(model, ids):
    return model(ids)


def _flat(state):
    return {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


@pytest.fixture(scope="module")
def base():
    return Decoder(CFG, rngs=nnx.Rngs(0))


def test_lora_params_on_targets_only(base):
    model = add_lora(base, LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v", "down")), rngs=nnx.Rngs(1))
    names = sorted(_flat(lora_state(model)))
    assert names == sorted(f"layers.{m}.{p}.lora_{ab}" for m, p in
                           [("self_attn", "q_proj"), ("self_attn", "v_proj"), ("mlp", "down_proj")] for ab in "ab")
    a = _flat(lora_state(model))["layers.self_attn.q_proj.lora_a"]
    b = _flat(lora_state(model))["layers.self_attn.q_proj.lora_b"]
    assert a.shape == (2, 32, 4) and b.shape == (2, 4, 4, 8)
    assert np.abs(a).max() > 0 and np.all(b == 0)
    with pytest.raises(ValueError, match="targets"):
        LoRAConfig(targets=("qq",))


def test_init_equals_base(base):
    model = add_lora(base, LoRAConfig(rank=4), rngs=nnx.Rngs(1))
    np.testing.assert_array_equal(np.asarray(forward(model, IDS)), np.asarray(forward(base, IDS)))


def test_only_adapters_receive_updates(base):
    model = add_lora(base, LoRAConfig(rank=4), rngs=nnx.Rngs(1))
    targets = jax.random.randint(jax.random.key(2), IDS.shape, 0, CFG.vocab_size)

    def loss_fn(m):
        logp = jax.nn.log_softmax(forward(m, IDS), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    grads = nnx.jit(nnx.grad(loss_fn, argnums=nnx.DiffState(0, LoRAParam)))(model)
    grad_names = set(_flat(grads))
    assert grad_names == set(_flat(lora_state(model)))
    # B starts at zero, so dL/dB != 0 while dL/dA = 0 at init (A's grad flows through B).
    g = _flat(grads)
    assert np.abs(g["layers.self_attn.q_proj.lora_b"]).max() > 0
    assert np.abs(g["layers.self_attn.q_proj.lora_a"]).max() == 0

    base_before = _flat(nnx.state(model, nnx.Not(LoRAParam)))
    lora_before = _flat(lora_state(model))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=LoRAParam)
    loss0 = float(loss_fn(model))

    @nnx.jit
    def train_step(model, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, LoRAParam))(model)
        optimizer.update(model, grads)
        return loss

    for _ in range(5):
        train_step(model, optimizer)
    for name, value in _flat(nnx.state(model, nnx.Not(LoRAParam))).items():
        np.testing.assert_array_equal(value, base_before[name], err_msg=name)
    changed = [n for n, v in _flat(lora_state(model)).items() if not np.array_equal(v, lora_before[n])]
    assert set(changed) == set(lora_before)
    assert float(loss_fn(model)) < loss0


def test_merge_equals_adapted_model(base):
    lora = LoRAConfig(rank=4, alpha=6.0)
    model = add_lora(base, lora, rngs=nnx.Rngs(1))
    # give B random values so the adapters actually change the model
    flat = list(nnx.to_flat_state(lora_state(model)))
    keys = jax.random.split(jax.random.key(3), len(flat))
    nnx.update(model, nnx.from_flat_state([(p, v.replace(0.1 * jax.random.normal(k, v.get_value().shape)))
                                           for k, (p, v) in zip(keys, flat)]))
    adapted = np.asarray(forward(model, IDS))
    assert np.abs(adapted - np.asarray(forward(base, IDS))).max() > 1e-3

    merged = merge_lora(model)
    assert merged.lora is None and not _flat(nnx.state(merged, LoRAParam))
    np.testing.assert_allclose(np.asarray(forward(merged, IDS)), adapted, atol=2e-5, rtol=0)
    # the merged kernel is W + alpha/r * A @ B (NumPy float64 reference), per layer
    lp = _flat(nnx.state(model))
    for layer in range(CFG.num_layers):
        w = lp["layers.mlp.up_proj.kernel"][layer].astype(np.float64)
        a = lp["layers.mlp.up_proj.lora_a"][layer].astype(np.float64)
        b = lp["layers.mlp.up_proj.lora_b"][layer].astype(np.float64)
        expected = w + (6.0 / 4) * a @ b
        got = _flat(nnx.state(merged))["layers.mlp.up_proj.kernel"][layer]
        np.testing.assert_allclose(got, expected, atol=1e-6)
        # o_proj has two input axes (heads, head_dim)
        w = lp["layers.self_attn.o_proj.kernel"][layer].astype(np.float64).reshape(32, 32)
        a = lp["layers.self_attn.o_proj.lora_a"][layer].astype(np.float64).reshape(32, 4)
        b = lp["layers.self_attn.o_proj.lora_b"][layer].astype(np.float64)
        got = _flat(nnx.state(merged))["layers.self_attn.o_proj.kernel"][layer].reshape(32, 32)
        np.testing.assert_allclose(got, w + 1.5 * a @ b, atol=1e-6)
    # the merged model exports with HF names (a plain Decoder)
    assert "model.layers.0.self_attn.q_proj.weight" in state_dict_from_model(merged)
    with pytest.raises(ValueError, match="merge_lora"):
        state_dict_from_model(model)
