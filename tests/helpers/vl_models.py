"""The tiny random Qwen2.5-VL shape the image tests share, as a `transformers` config (no download)."""

from __future__ import annotations

import transformers


def tiny_hf_vl_config(*, vocab_size: int, image: int, vision_start: int, vision_end: int, video: int,
                      max_position_embeddings: int = 1024, **text_extra) -> transformers.Qwen2_5_VLConfig:
    """One text layer of width 32 (M-RoPE sections 1/1/2) behind a one-block vision tower of width 16."""
    text = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "mrope_section": [1, 1, 2]}, **text_extra)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[0],
                  hidden_act="silu", tokens_per_second=2)
    return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=image,
                                         video_token_id=video, vision_start_token_id=vision_start,
                                         vision_end_token_id=vision_end, tie_word_embeddings=False)


# `model.path: random` with a vision tower (models/random_vl.py): a tiny Qwen2.5-VL with the tiny_vl tokenizer
RANDOM_VL_OVERRIDES = [
    "model.path=random", "model.tokenizer=tiny_vl", "model.random.family=qwen2", "model.random.hidden_size=32",
    "model.random.intermediate_size=64", "model.random.num_heads=4", "model.random.num_kv_heads=2",
    "model.random.head_dim=8", "model.random.num_layers=2", "model.random.tie_word_embeddings=false",
    "model.random.vision={depth: 2, hidden_size: 16, intermediate_size: 32, num_heads: 2, window_size: 56, "
    "fullatt_block_indexes: [1]}",
]


def hf_vl_logits(hf, ids, image_token_id: int, pixel_values=None, grid=None):
    """float32 logits of a `transformers` Qwen2.5-VL model (torch, no grad) on `ids` `[B, L]` (+ one grid list)."""
    import numpy as np
    import torch

    kwargs = {"input_ids": torch.tensor(np.asarray(ids), dtype=torch.long)}
    if pixel_values is not None:
        kwargs.update(pixel_values=torch.tensor(np.asarray(pixel_values)),
                      image_grid_thw=torch.tensor(grid, dtype=torch.long),
                      mm_token_type_ids=torch.tensor((np.asarray(ids) == image_token_id).astype(np.int64)))
    with torch.no_grad():
        return hf(**kwargs).logits.float().numpy()
