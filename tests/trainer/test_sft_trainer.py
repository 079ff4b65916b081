"""SFTTrainer on a loaded (sharded) checkpoint: one compile per batch shape, and the loss goes down."""

from __future__ import annotations

import numpy as np
from flax import nnx

from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.models.hub import load_pretrained
from openclaw_jax.models.tokenizer import tiny_test_tokenizer
from openclaw_jax.models.weights import save_hf_checkpoint
from openclaw_jax.trainer.sft import SFTTrainer


def test_steps_on_a_loaded_checkpoint_compile_once_per_shape(tmp_path):
    tok = tiny_test_tokenizer()
    cfg = ModelConfig(family="qwen3", vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True, max_position_embeddings=128)
    save_hf_checkpoint(Decoder(cfg, rngs=nnx.Rngs(0)), cfg, tmp_path)
    tok.save_pretrained(tmp_path)
    model = load_pretrained(str(tmp_path)).model   # params carry the load mesh's shardings
    sft = SFTTrainer(model, lr=1e-2, pad_id=tok.pad_token_id)
    rng = np.random.default_rng(0)
    batch = [(list(rng.integers(3, 60, 10)), list(rng.integers(3, 60, 6))) for _ in range(4)]
    losses = [sft.step(batch) for _ in range(4)]
    # before the outputs were pinned to the inputs' shardings, step 2 compiled the same shape again
    assert sft._step._cache_size() == 1
    assert losses[-1] < losses[0]
