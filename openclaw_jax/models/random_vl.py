"""A random Qwen2.5-VL checkpoint from the experiment config (`model.path: random` with
`model.random.vision`, `openclaw_jax.config.RandomModelConfig` / `RandomVisionConfig`).

The text decoder has `model.random`'s shape (family qwen2: q/k/v biases, head_dim = hidden_size /
num_heads, M-RoPE sections summing to head_dim / 2), the vision tower `model.random.vision`'s; the
vocabulary is the tokenizer's, which must hold the vision tokens (`<|vision_start|>`, `<|vision_end|>`,
`<|image_pad|>`, `<|video_pad|>`, e.g. `tiny_vl`); the config names their ids. The directory is what
`transformers.Qwen2_5_VLForConditionalGeneration` and `models.hub.load_pretrained` read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flax import nnx

from openclaw_jax.models.qwen_vl import QwenVL, QwenVLConfig, save_qwen_vl_checkpoint

VISION_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                 "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}


class RandomVLError(ValueError):
    """The tokenizer or shape cannot make a random Qwen2.5-VL model."""


def vision_token_ids(tokenizer: Any) -> dict[str, int]:
    """The ids of the four vision tokens in `tokenizer` (config.json keys -> ids); raises naming the missing."""
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    missing = [tok for tok in VISION_TOKENS.values() if tok not in vocab]
    if missing:
        raise RandomVLError(f"tokenizer {getattr(tokenizer, 'name', '?')!r} has no {missing}: a vision-language model "
                            "needs them; use model.tokenizer=tiny_vl (or a Qwen2.5-VL tokenizer directory)")
    return {key: int(vocab[tok]) for key, tok in VISION_TOKENS.items()}


def random_vl_hf_config(random: Any, tokenizer: Any) -> dict[str, Any]:
    """The `config.json` (public Qwen2.5-VL layout) of a random model of shape `random` (RandomModelConfig)."""
    v = random.vision
    ids = vision_token_ids(tokenizer)
    vocab = int(tokenizer.vocab_size)
    if max(ids.values()) >= vocab:
        raise RandomVLError(f"the vision token ids {ids} must lie below the vocabulary size {vocab}")
    eos = [int(e) for e in tokenizer.eos_token_ids]
    return {
        "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "vocab_size": vocab,
        "hidden_size": random.hidden_size, "intermediate_size": random.intermediate_size,
        "num_hidden_layers": random.num_layers, "num_attention_heads": random.num_heads,
        "num_key_value_heads": random.num_kv_heads, "max_position_embeddings": random.max_position_embeddings,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
        "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": list(v.sections(random.head_dim))},
        "tie_word_embeddings": bool(random.tie_word_embeddings), "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "vision_config": {
            "depth": v.depth, "hidden_size": v.hidden_size, "intermediate_size": v.intermediate_size,
            "num_heads": v.num_heads, "out_hidden_size": v.out_hidden_size or random.hidden_size,
            "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size, "window_size": v.window_size,
            "fullatt_block_indexes": list(v.fullatt_block_indexes), "hidden_act": "silu", "in_channels": 3,
            "tokens_per_second": 2},
        **ids,
    }


def write_random_vl_model(random: Any, tokenizer: Any, out_dir: str | Path) -> QwenVLConfig:
    """A random QwenVL of shape `random` (seed `random.seed`) saved as an HF directory with the tokenizer."""
    cfg = QwenVLConfig.from_hf_dict(random_vl_hf_config(random, tokenizer))
    model = QwenVL(cfg, rngs=nnx.Rngs(random.seed))
    save_qwen_vl_checkpoint(model, out_dir)
    tokenizer.save_pretrained(out_dir)
    return cfg
