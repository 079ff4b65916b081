"""RoPE scaling (`llama3`, `yarn`): parsed from both HF config forms, other types rejected, and the
decoder's logits equal HF `transformers` (PyTorch CPU, float32) at lengths where the scaling matters."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from openclaw_jax.models.config import ModelConfig, ModelConfigError, RopeScaling
from openclaw_jax.models.rope import rope_frequencies
from openclaw_jax.models.weights import model_from_state_dict
from tests.helpers.hf_models import hf_logits, hf_state_dict, make_hf_model

TOL = 1e-4

# Llama-3.1 style with a small original context: wavelengths 6.3 (kept), 19.9 and 62.8 (the
# smoothed band between 64/4 and 64/1), 199+ (divided by the factor).
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
# YaRN as Qwen ships it (factor 4 over the original context); the correction ramp spans dims 0..3.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}

CASES = [  # (family, scaling, head_dim, theta, sequence length)
    ("llama", LLAMA3, 16, 10000.0, 80),     # past original_max (64)
    ("qwen3", YARN, 32, 10000.0, 48),       # past original_max (32); attention factor 1.139
    ("qwen2", dict(YARN, beta_fast=16, beta_slow=2, attention_factor=1.25), 8, 100000.0, 40),
]


@pytest.mark.parametrize("family,scaling,head_dim,theta,length", CASES,
                         ids=[f"{c[0]}-{c[1]['rope_type']}" for c in CASES])
def test_scaled_rope_logits_match_transformers(family, scaling, head_dim, theta, length):
    hf, cfg = make_hf_model(family, tie=False, num_heads=4, num_kv_heads=2, head_dim=head_dim, rope_theta=theta,
                            rope_scaling=scaling, seed=7)
    assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == scaling["rope_type"]
    # our frequencies and cos/sin factor equal HF's own RoPE initialisation
    inv_freq, factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf.config, None)
    ours, our_factor = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    np.testing.assert_allclose(ours, inv_freq.numpy(), rtol=1e-6)
    assert abs(our_factor - factor) < 1e-9
    model = model_from_state_dict(cfg, hf_state_dict(hf))
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, (1, length)).astype(np.int32)
    got = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids)))
    ref = hf_logits(hf, ids)
    assert np.abs(got - ref).max() <= TOL, np.abs(got - ref).max()
    # the scaling matters at this length: the same weights with unscaled RoPE are visibly off
    plain, _ = make_hf_model(family, tie=False, num_heads=4, num_kv_heads=2, head_dim=head_dim, rope_theta=theta,
                             seed=7)
    assert np.abs(hf_logits(plain, ids) - ref).max() > 100 * TOL


def _hf(**extra):
    base = {"model_type": "qwen2", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 131072}
    base.update(extra)
    return base


def test_both_config_forms_parse_the_same():
    legacy = ModelConfig.from_hf_dict(_hf(rope_theta=1e6, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}))
    new = ModelConfig.from_hf_dict(_hf(rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}))
    assert legacy == new and legacy.rope_theta == 1e6
    assert legacy.rope_scaling == RopeScaling("yarn", 4.0, 32768)
    unscaled = ModelConfig.from_hf_dict(_hf(rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
    assert unscaled.rope_scaling is None and unscaled.rope_theta == 5e5
    # written back (legacy `rope_scaling` key), transformers reads the same parameters and we do too
    for cfg in (legacy, ModelConfig.from_hf_dict(_hf(model_type="llama", rope_scaling=LLAMA3))):
        hf = cfg.to_hf_dict()
        assert ModelConfig.from_hf_dict(hf) == cfg
        config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[cfg.family]
        params = config_cls(**hf).rope_parameters
        for key, value in cfg.rope_scaling.to_hf().items():
            assert params[key] == value, key


@pytest.mark.parametrize("scaling,match", [
    ({"rope_type": "linear", "factor": 2.0}, "'linear' is not supported"),
    ({"type": "dynamic", "factor": 2.0}, "'dynamic' is not supported"),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}, "'longrope' is not supported"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, "needs low_freq_factor"),
    ({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 8192}, "factor=0.5 must be >= 1"),
])
def test_unsupported_or_invalid_scaling_is_rejected(scaling, match):
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_hf_dict(_hf(rope_scaling=scaling))
