"""load_pretrained: HF directories and the embedded SmolLM2."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.models.hub import Pretrained, load_pretrained
from openclaw_jax.models.tokenizer import tiny_test_tokenizer
from tests.helpers.hf_models import hf_logits, make_hf_model


def test_load_pretrained_hf_directory(tmp_path):
    hf, cfg = make_hf_model("qwen3", tie=True, num_heads=4, num_kv_heads=2, head_dim=8, vocab=320)
    hf.save_pretrained(tmp_path)
    tiny_test_tokenizer(320).save_pretrained(tmp_path)
    pre = load_pretrained(tmp_path)
    assert isinstance(pre, Pretrained) and pre.source == str(tmp_path)
    assert pre.config.family == "qwen3" and pre.config.tie_word_embeddings
    assert pre.hf_config["model_type"] == "qwen3"
    ids = pre.tokenizer.encode("The answer is 42. Thank you!")
    assert ids and max(ids) < 320 and pre.tokenizer.vocab_size == 320
    batch = np.asarray([ids], np.int32)
    ours = np.asarray(nnx.jit(lambda m, x: m(x))(pre.model, jnp.asarray(batch)))
    assert np.abs(ours - hf_logits(hf, batch)).max() <= 1e-4

    bf16 = load_pretrained(tmp_path, dtype="bfloat16")
    assert bf16.config.param_dtype == "bfloat16" and bf16.config.dtype == "bfloat16"
    assert bf16.model.embed_tokens.get_value().dtype == jnp.bfloat16


def test_load_pretrained_unknown_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an embedded model"):
        load_pretrained(tmp_path / "nope")


def _greedy(model, prompt: list[int], n_new: int) -> list[int]:
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, ids, positions, cache):
        logits, cache = nnx.merge(graphdef, state).decode(ids, positions, cache)
        return jnp.argmax(logits[:, -1], axis=-1), cache

    cache = model.init_cache(1, len(prompt) + n_new)
    token, cache = step(state, jnp.asarray([prompt], jnp.int32), jnp.arange(len(prompt), dtype=jnp.int32)[None], cache)
    out = [int(token[0])]
    for i in range(n_new - 1):
        token, cache = step(state, token[:, None].astype(jnp.int32),
                            jnp.asarray([[len(prompt) + i]], jnp.int32), cache)
        out.append(int(token[0]))
    return out


@pytest.mark.slow
def test_load_pretrained_smollm2_answers():
    pre = load_pretrained("smollm2")
    cfg = pre.config
    assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert cfg.tie_word_embeddings and cfg.param_dtype == "float32"
    assert pre.source.endswith(".gguf") and pre.tokenizer.vocab_size == cfg.vocab_size
    prompt = pre.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    text = pre.tokenizer.decode(_greedy(pre.model, prompt, 12), skip_special_tokens=True)
    assert "Paris" in text, text
