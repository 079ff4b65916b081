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

import jax.numpy as jnp
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
    return vl_hf_config(_hf_text_keys(random, rms_norm_eps=1e-6, rope_theta=1000000.0), random.head_dim,
                        random.vision, tokenizer)


def _hf_text_keys(shape: Any, *, rms_norm_eps: float, rope_theta: float) -> dict[str, Any]:
    """The text decoder's HF config keys from a shape with ModelConfig's field names (a ModelConfig or
    a RandomModelConfig)."""
    return {"hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
            "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_heads,
            "num_key_value_heads": shape.num_kv_heads, "max_position_embeddings": shape.max_position_embeddings,
            "rms_norm_eps": rms_norm_eps, "rope_theta": rope_theta,
            "tie_word_embeddings": bool(shape.tie_word_embeddings)}


def vl_hf_config(text: dict[str, Any], head_dim: int, v: Any, tokenizer: Any) -> dict[str, Any]:
    """A Qwen2.5-VL `config.json` of the text decoder `text` (its HF keys) and the vision tower `v`
    (RandomVisionConfig), with the tokenizer's vocabulary and vision token ids."""
    ids = vision_token_ids(tokenizer)
    vocab = int(tokenizer.vocab_size)
    if max(ids.values()) >= vocab:
        raise RandomVLError(f"the vision token ids {ids} must lie below the vocabulary size {vocab}")
    eos = [int(e) for e in tokenizer.eos_token_ids]
    return {
        "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "vocab_size": vocab,
        **text, "hidden_act": "silu",
        "rope_scaling": {"type": "mrope", "rope_type": "default", "mrope_section": list(v.sections(head_dim))},
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "vision_config": {
            "depth": v.depth, "hidden_size": v.hidden_size, "intermediate_size": v.intermediate_size,
            "num_heads": v.num_heads, "out_hidden_size": v.out_hidden_size or text["hidden_size"],
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


def write_vl_on_text_model(text_model: Any, vision: Any, tokenizer: Any, out_dir: str | Path, *, seed: int = 0
                           ) -> QwenVLConfig:
    """A Qwen2.5-VL whose text decoder is the pretrained `text_model` (`models.hub.Pretrained`: a Decoder
    whose heads are hidden_size / num_heads wide, e.g. SmolLM2) and whose vision tower (`vision`:
    RandomVisionConfig) is random (seed `seed`), saved as an HF directory with `tokenizer`.

    The decoder's weights are copied unchanged, q/k/v biases (Qwen2's, absent from a Llama) are zero and
    the vocabulary rows of tokens the text model lacks (the tokenizer's vision tokens) are the mean of
    its embeddings: on text, the result computes what the text model does (M-RoPE with equal
    positions is RoPE)."""
    tc = text_model.config
    if tc.head_dim * tc.num_heads != tc.hidden_size:
        raise RandomVLError(f"the text model's head_dim {tc.head_dim} x num_heads {tc.num_heads} is not its "
                            f"hidden_size {tc.hidden_size}: a Qwen2.5-VL text decoder needs head_dim = hidden_size / num_heads")
    if tc.qk_norm:
        raise RandomVLError("the text model normalises q and k (Qwen3): a Qwen2.5-VL text decoder does not")
    if tokenizer.vocab_size < tc.vocab_size:
        raise RandomVLError(f"the tokenizer has {tokenizer.vocab_size} ids, fewer than the text model's "
                            f"{tc.vocab_size}")
    text = _hf_text_keys(tc, rms_norm_eps=tc.rms_norm_eps, rope_theta=tc.rope_theta)
    cfg = QwenVLConfig.from_hf_dict(vl_hf_config(text, tc.head_dim, vision, tokenizer))
    model = QwenVL(cfg, rngs=nnx.Rngs(seed))
    source = nnx.to_pure_dict(nnx.state(text_model.model, nnx.Param))
    target_state = nnx.state(model.language_model, nnx.Param)
    target = nnx.to_pure_dict(target_state)

    def graft(dst: dict, src: dict, path: str) -> dict:
        out = {}
        for key, value in dst.items():
            here = f"{path}/{key}"
            if isinstance(value, dict):
                out[key] = graft(value, src.get(key, {}), here)
                continue
            if key not in src:   # Qwen2's q/k/v biases: zero keeps the Llama function
                if "bias" not in here:
                    raise RandomVLError(f"the text model has no weight for {here}")
                out[key] = jnp.zeros_like(value)
                continue
            have = jnp.asarray(src[key], value.dtype)
            if have.shape != value.shape and here.endswith(("embed_tokens", "lm_head/kernel")):
                axis = 0 if here.endswith("embed_tokens") else 1   # [V, H] embeddings, [H, V] head
                pad = jnp.repeat(jnp.mean(have, axis=axis, keepdims=True), value.shape[axis] - have.shape[axis],
                                 axis=axis)
                have = jnp.concatenate([have, pad], axis=axis)
            if have.shape != value.shape:
                raise RandomVLError(f"{here}: the text model's shape {have.shape} is not the decoder's {value.shape}")
            out[key] = have
        return out

    nnx.replace_by_pure_dict(target_state, graft(target, source, "language_model"))
    nnx.update(model.language_model, target_state)
    save_qwen_vl_checkpoint(model, out_dir)
    tokenizer.save_pretrained(out_dir)
    return cfg
