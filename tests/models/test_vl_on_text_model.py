"""A Qwen2.5-VL on a pretrained text model (`model.vision`, models/random_vl.write_vl_on_text_model):
on text it equals the text model (both read by HF `transformers`: LlamaForCausalLM and
Qwen2_5_VLForConditionalGeneration), the vision tokens' rows are the mean embedding, the SmolLM2 +
vision tokenizer keeps SmolLM2's ids, and the config refuses what cannot work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file

from openclaw_jax.config import RandomVisionConfig, load_experiment_config
from openclaw_jax.configlib import ConfigError
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.models.hub import load_pretrained
from openclaw_jax.models.random_vl import RandomVLError, write_vl_on_text_model
from openclaw_jax.models.tokenizer import TINY_VL_IDS, tiny_vl_tokenizer, tokenizer_by_name
from openclaw_jax.models.weights import save_hf_checkpoint


def _text_model(tmp_path, *, tied: bool, qk_norm: bool = False):
    cfg = ModelConfig(family="qwen3" if qk_norm else "llama", vocab_size=320, hidden_size=64, intermediate_size=96,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=qk_norm, rope_theta=50000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=tied, max_position_embeddings=256, eos_token_id=(2,))
    text_dir = tmp_path / "text"
    save_hf_checkpoint(Decoder(cfg, rngs=nnx.Rngs(3)), cfg, text_dir)
    return text_dir


@pytest.mark.parametrize("tied", [True, False])
def test_text_logits_equal_the_text_model_in_transformers(tmp_path, tied):
    text_dir = _text_model(tmp_path, tied=tied)
    vision = RandomVisionConfig(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, window_size=56)
    write_vl_on_text_model(load_pretrained(str(text_dir), tokenizer=False), vision, tiny_vl_tokenizer(),
                           tmp_path / "vl", seed=1)
    hf_text = transformers.LlamaForCausalLM.from_pretrained(text_dir, torch_dtype=torch.float32).eval()
    hf_vl = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path / "vl",
                                                                           torch_dtype=torch.float32).eval()
    ids = torch.from_numpy(np.random.default_rng(0).integers(3, 300, (1, 40)))
    with torch.no_grad():
        want = hf_text(input_ids=ids).logits.numpy()
        got = hf_vl(input_ids=ids).logits.numpy()
    assert got.shape[-1] == 324
    np.testing.assert_allclose(got[..., :320], want, atol=2e-4, rtol=1e-4)
    # the vision tokens' rows (embeddings, and the head when untied) are the mean of the text model's
    src, dst = load_file(str(text_dir / "model.safetensors")), load_file(str(tmp_path / "vl" / "model.safetensors"))
    emb = next(v for k, v in dst.items() if k.endswith("embed_tokens.weight"))
    text_emb = src["model.embed_tokens.weight"]
    np.testing.assert_allclose(emb[TINY_VL_IDS["<|image_pad|>"]], text_emb.mean(0), atol=1e-6)
    if not tied:
        np.testing.assert_allclose(dst["lm_head.weight"][320:], np.repeat(src["lm_head.weight"].mean(0)[None], 4, 0),
                                   atol=1e-6)
    cfg = json.loads((tmp_path / "vl" / "config.json").read_text())
    assert cfg["rope_theta"] == 50000.0 and cfg["vision_config"]["out_hidden_size"] == 64


def test_a_text_model_that_cannot_be_a_qwen25vl_decoder_is_refused(tmp_path):
    text_dir = _text_model(tmp_path, tied=True, qk_norm=True)
    vision = RandomVisionConfig(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, window_size=56,
                                fullatt_block_indexes=(0,))
    with pytest.raises(RandomVLError, match="normalises q and k"):
        write_vl_on_text_model(load_pretrained(str(text_dir), tokenizer=False), vision, tiny_vl_tokenizer(),
                               tmp_path / "vl")


def test_smollm2_vl_tokenizer_keeps_smollm2_ids_and_adds_the_vision_tokens():
    plain, vl = tokenizer_by_name("smollm2"), tokenizer_by_name("smollm2_vl")
    assert vl.vocab_size == plain.vocab_size + 4
    text = vl.apply_chat_template([{"role": "user", "content": "Press the Save button at 54,78."}],
                                  tokenize=False, add_generation_prompt=True)
    assert vl.encode(text) == plain.encode(text)
    assert vl.encode("<|vision_start|><|image_pad|><|image_pad|><|vision_end|>") == [49152, 49154, 49154, 49153]
    assert vl.eos_token_ids == plain.eos_token_ids


@pytest.mark.parametrize("overrides, message", [
    (["model.path=random", "model.tokenizer=tiny_vl"], "model.random.vision instead"),
    (["model.tokenizer=smollm2"], "use smollm2_vl"),
])
def test_config_refuses_vision_without_a_pretrained_text_model_or_the_vision_tokens(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment_config([], ["model.vision={depth: 2}", *overrides])
