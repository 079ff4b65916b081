"""Qwen2.5-VL: the vision transformer (`models/vision.py`) feeding our text decoder, with M-RoPE.

`QwenVL(cfg, rngs=...)` holds `visual` (a `VisionTransformer`) and `language_model` (a `Decoder`
whose config carries `mrope_section`). The forward (HF `Qwen2_5_VLForConditionalGeneration`):
1. the image patches go through the ViT + merger: one embedding per image token;
2. those embeddings replace the token embeddings at the `image_token_id` placeholders, in order
   (row-major over the batch: image k of `image_grid_thw` fills the k-th run of placeholders);
3. positions are 3 rows (temporal, height, width) per token (`mrope_positions`, HF `get_rope_index`):
   text tokens count up by one on all three rows; an image's tokens sit at (start, start + row,
   start + col) of its merged grid, and the text after it resumes at start + max(rows, cols);
4. the decoder runs on those embeddings and positions (causal over the sequence index as usual).

The trainer-facing surface is the text decoder's: `hidden_states(input_ids, positions,
attention_mask, segment_ids, *, pixel_values=None, image_grid_thw=None)`, `logits`,
`lm_head_kernel`, `cfg` (the text `ModelConfig`). `image_grid_thw` must be concrete (numpy or
nested tuples, not traced): it fixes the vision shapes and layout at trace time. pixel_values
are `[N, D]` (all images, HF's layout) or `[B, N_row, D]` (per row: the grid given is one row's, and
each row's placeholders show a prefix of those images -- a row with fewer images, e.g. a shorter
episode of same-size screenshots, leaves the trailing ones unused; see `QwenVL.flat_images`). Positions given
explicitly may be `[3, B, L]` (e.g. packed rows, each segment's from `mrope_positions`).
Generation: `prefill_hidden` (prompt with images into an empty KV cache, returns the rope deltas)
then `decode` / `decode_hidden` of text tokens at cache slots s, rotated at s + delta (HF's
`rope_deltas`).

Config: `QwenVLConfig.from_hf_dict` reads both the public Qwen2.5-VL `config.json` layout (text
keys at the top level, `rope_scaling: {type: mrope, mrope_section}`) and the newer transformers
one (`text_config` / `vision_config`, `rope_parameters`). Weights: `load_qwen_vl_checkpoint(dir)`
accepts both tensor namings (`model.layers.*` + `visual.*`, or `model.language_model.*` +
`model.visual.*`), placed param by param on their shards as `models/weights.py` does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.models.config import LoRAConfig, ModelConfig, ModelConfigError
from openclaw_jax.models.decoder import Decoder, KVCache
from openclaw_jax.models.vision import VisionConfig, VisionTransformer, as_grid
from openclaw_jax.models.weights import (CheckpointError, DictSource, SafetensorsSource, TensorMapping,
                                         TensorSource, _fsync_dir, _identity, _to_host, _write_checkpoint_files,
                                         apply_dtypes, hf_name_map, place_params, read_hf_config)

logger = logging.getLogger(__name__)

HF_MODEL_TYPES = ("qwen2_5_vl",)
DEFAULT_MROPE_SECTION = (16, 24, 24)
# keys of the text decoder's config that the public (legacy) layout keeps at the top level
_TEXT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling",
              "rope_parameters", "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype", "dtype",
              "hidden_act")


@dataclass(frozen=True)
class QwenVLConfig:
    text: ModelConfig
    vision: VisionConfig
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    def __post_init__(self) -> None:
        if self.text.mrope_section is None:
            raise ModelConfigError("a Qwen2.5-VL text config needs mrope_section")
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise ModelConfigError(f"vision out_hidden_size={self.vision.out_hidden_size} must equal the text "
                                   f"hidden_size={self.text.hidden_size}")

    def replace(self, **changes: Any) -> "QwenVLConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **text_overrides: Any) -> "QwenVLConfig":
        """From a Qwen2.5-VL `config.json` (either layout, see the module docstring)."""
        if hf.get("model_type") not in HF_MODEL_TYPES:
            raise ModelConfigError(f"config.json model_type={hf.get('model_type')!r} is not a vision-language model "
                                   f"we support ({HF_MODEL_TYPES})")
        text = {k: hf[k] for k in _TEXT_KEYS if k in hf}
        text.update(hf.get("text_config") or {})
        rope = dict(text.pop("rope_scaling", None) or text.get("rope_parameters") or {})
        rope_type = rope.get("rope_type", rope.get("type")) or "default"
        if rope_type not in ("mrope", "default"):
            raise ModelConfigError(f"config.json Qwen2.5-VL rope type {rope_type!r} is not supported (mrope only)")
        section = tuple(int(s) for s in rope.get("mrope_section") or DEFAULT_MROPE_SECTION)
        theta = text.get("rope_theta") or rope.get("rope_theta") or 1000000.0
        text["rope_theta"] = float(theta)
        text["rope_parameters"] = {"rope_theta": float(theta)}
        text["model_type"] = "qwen2"
        text["attention_bias"] = True  # q/k/v biases, no o bias
        text["head_dim"] = int(text["hidden_size"]) // int(text["num_attention_heads"])
        if "tie_word_embeddings" in hf:
            text["tie_word_embeddings"] = bool(hf["tie_word_embeddings"]) or bool(text.get("tie_word_embeddings"))
        text_cfg = ModelConfig.from_hf_dict(text, mrope_section=section, **text_overrides)
        vision = VisionConfig.from_hf_dict(hf.get("vision_config") or {}, dtype=text_cfg.dtype,
                                           param_dtype=text_cfg.param_dtype)
        ids = {k: int(hf[k]) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                       "vision_end_token_id") if hf.get(k) is not None}
        return cls(text=text_cfg, vision=vision, **ids)

    def to_hf_dict(self) -> dict[str, Any]:
        """The public Qwen2.5-VL `config.json` layout (text keys at the top level)."""
        hf = self.text.to_hf_dict()
        hf.pop("head_dim", None)
        hf.pop("attention_bias", None)
        hf.update(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl",
                  vision_config=self.vision.to_hf_dict(), image_token_id=self.image_token_id,
                  video_token_id=self.video_token_id, vision_start_token_id=self.vision_start_token_id,
                  vision_end_token_id=self.vision_end_token_id)
        return hf


def is_vl_config(hf: Mapping[str, Any]) -> bool:
    return hf.get("model_type") in HF_MODEL_TYPES


def apply_vl_dtypes(cfg: QwenVLConfig, dtype: Any = None, param_dtype: Any = None) -> QwenVLConfig:
    """`models/weights.apply_dtypes` for both towers."""
    text = apply_dtypes(cfg.text, dtype, param_dtype)
    return cfg.replace(text=text, vision=cfg.vision.replace(dtype=text.dtype, param_dtype=text.param_dtype))


# ---------------------------------------------------------------------------------------------
# M-RoPE positions


def _image_tables(grid: tuple[tuple[int, int, int], ...], merge: int):
    """Per image token of all images in order: (t, row, col) offsets, and the position step after it
    (max(rows, cols) on each image's last token, else 0)."""
    t_tab, h_tab, w_tab, step = [], [], [], []
    for t, h, w in grid:
        gh, gw = h // merge, w // merge
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        t_tab.append(tt.reshape(-1))
        h_tab.append(hh.reshape(-1))
        w_tab.append(ww.reshape(-1))
        s = np.zeros(t * gh * gw, np.int32)
        s[-1] = max(gh, gw)
        step.append(s)
    cat = lambda xs: np.concatenate(xs).astype(np.int32) if xs else np.zeros(1, np.int32)  # noqa: E731
    return cat(t_tab), cat(h_tab), cat(w_tab), cat(step)


def image_token_rank(is_img: jax.Array, n_tokens: int, row_tokens: int | None = None) -> jax.Array:
    """`[B, L]` int32: which image token (of `n_tokens`, in image order) each placeholder shows.

    `row_tokens=None`: the k-th placeholder of the flattened batch shows token k (HF's layout, all
    images of all rows in one list). `row_tokens=n`: every row has its own `n` tokens (row b's at
    b * n ...), and its k-th placeholder shows its own token k, so a row may show only a prefix."""
    B, L = is_img.shape
    if row_tokens is None:
        return jnp.clip(jnp.cumsum(is_img.reshape(-1)).reshape(B, L) - 1, 0, n_tokens - 1)
    within = jnp.clip(jnp.cumsum(is_img, axis=1) - 1, 0, row_tokens - 1)
    return within + jnp.arange(B, dtype=within.dtype)[:, None] * row_tokens


def mrope_positions(input_ids: jax.Array, image_grid_thw: Any, image_token_id: int, spatial_merge_size: int,
                    attention_mask: jax.Array | None = None,
                    segment_ids: jax.Array | None = None, *, per_row: bool = False) -> tuple[jax.Array, jax.Array]:
    """(positions `[3, B, L]` int32, rope deltas `[B]`): HF `get_rope_index` for text + images.

    Vectorised (no loop over tokens): the k-th image-token run of the flattened batch takes image k
    of `image_grid_thw` (static); a text token advances all rows by one, an image by max(rows, cols)
    of its merged grid; `per_row=True`: `image_grid_thw` is every row's own images' grid (the per-row
    layout of `QwenVL.flat_images`), each row's image-token runs take its images in order. Tokens
    outside `attention_mask` neither count nor advance (position 0, as HF).
    The delta (max position + 1 - tokens) shifts the positions of tokens decoded after the prompt.
    `segment_ids [B, L]` (packed rows, each sequence a contiguous run): positions restart at 0 in
    each segment (the images still fill the placeholders in row-major order); deltas are then per row.
    """
    grid = as_grid(image_grid_thw) if image_grid_thw is not None else ()
    t_tab, h_tab, w_tab, step_tab = (jnp.asarray(x) for x in _image_tables(grid, spatial_merge_size))
    B, L = input_ids.shape
    valid = jnp.ones((B, L), bool) if attention_mask is None else attention_mask.astype(bool)
    is_img = (input_ids == image_token_id) & valid if grid else jnp.zeros((B, L), bool)
    if per_row:
        rank = jnp.clip(jnp.cumsum(is_img, axis=1) - 1, 0, t_tab.shape[0] - 1)
    else:
        rank = image_token_rank(is_img, t_tab.shape[0])
    inc = jnp.where(valid, jnp.where(is_img, step_tab[rank], 1), 0)
    start = jnp.cumsum(inc, axis=1) - inc  # the running position before each token
    if segment_ids is not None:
        first = jnp.concatenate([jnp.ones((B, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
        # `start` never decreases along a row: the running max of segment-first values is the segment's start
        start = start - jax.lax.cummax(jnp.where(first, start, 0), axis=1)
    offsets = [jnp.where(is_img, tab[rank], 0) for tab in (t_tab, h_tab, w_tab)]
    positions = jnp.stack([jnp.where(valid, start + off, 0) for off in offsets]).astype(jnp.int32)
    top = jnp.max(jnp.where(valid[None], positions, -1), axis=(0, 2))
    deltas = top + 1 - jnp.sum(valid, axis=1)
    return positions, deltas.astype(jnp.int32)


def check_image_tokens(input_ids: Any, image_grid_thw: Any, image_token_id: int, spatial_merge_size: int, *,
                       per_row: bool = False) -> None:
    """Raise ValueError unless the placeholders in `input_ids` (concrete) match the images' token counts
    (`per_row`: each row's count is that of a prefix of `image_grid_thw`, one row's images)."""
    grid = as_grid(image_grid_thw) if image_grid_thw is not None else ()
    counts = [t * h * w // spatial_merge_size ** 2 for t, h, w in grid]
    ids = np.asarray(input_ids)
    if not per_row:
        have, want = int(np.sum(ids == image_token_id)), sum(counts)
        if have != want:
            raise ValueError(f"input_ids hold {have} image tokens (id {image_token_id}) but image_grid_thw {grid} "
                             f"gives {want}")
        return
    prefixes = set(np.cumsum([0] + counts).tolist())
    for b, have in enumerate(np.sum(ids == image_token_id, axis=1).tolist()):
        if have not in prefixes:
            raise ValueError(f"row {b} of input_ids holds {have} image tokens (id {image_token_id}), not the tokens "
                             f"of a prefix of its images {grid} (any of {sorted(prefixes)})")


# ---------------------------------------------------------------------------------------------
# the model


class QwenVL(nnx.Module):
    """Qwen2.5-VL: `QwenVL(cfg, rngs=nnx.Rngs(0))`; `lora` adapts the text decoder only."""

    def __init__(self, cfg: QwenVLConfig, *, rngs: nnx.Rngs, lora: LoRAConfig | None = None):
        self.vl_cfg = cfg
        self.cfg = cfg.text  # what the trainer and the sharding rules read (family, dtypes)
        self.lora = lora
        self.visual = VisionTransformer(cfg.vision, rngs=rngs, family=cfg.text.family)
        self.language_model = Decoder(cfg.text, rngs=rngs, lora=lora)

    def __call__(self, input_ids, positions=None, attention_mask=None, segment_ids=None, *, pixel_values=None,
                 image_grid_thw=None) -> jax.Array:
        """Logits float32 `[B, L, V]`."""
        return self.logits(self.hidden_states(input_ids, positions, attention_mask, segment_ids,
                                              pixel_values=pixel_values, image_grid_thw=image_grid_thw))

    @staticmethod
    def flat_images(input_ids: jax.Array, pixel_values: jax.Array | None, image_grid_thw: Any):
        """(pixel_values `[N, D]`, grid of every image) from either layout: `[N, D]` with the grid of
        all images, or per row `[B, N_row, D]` with the grid of one row's images (the same for every
        row, e.g. screenshots of one size; rows can then be sliced into micro-batches)."""
        if pixel_values is None or pixel_values.ndim == 2:
            return pixel_values, image_grid_thw
        if pixel_values.ndim != 3 or pixel_values.shape[0] != input_ids.shape[0]:
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)}: want [N, D] or [B={input_ids.shape[0]}, "
                             "N_row, D]")
        return pixel_values.reshape(-1, pixel_values.shape[-1]), as_grid(image_grid_thw) * input_ids.shape[0]

    def image_features(self, pixel_values: jax.Array, image_grid_thw: Any) -> jax.Array:
        """One embedding per image token `[n, H]` for all images of `image_grid_thw`, in order."""
        return self.visual(pixel_values, image_grid_thw)

    def embed(self, input_ids: jax.Array, pixel_values: jax.Array | None = None,
              image_grid_thw: Any = None) -> jax.Array:
        """Token embeddings `[B, L, H]` with the image features at the image-token placeholders."""
        h = self.language_model.embed(input_ids)
        if pixel_values is None:
            return h
        if image_grid_thw is None:
            raise ValueError("pixel_values need image_grid_thw")
        per_row = pixel_values.ndim == 3
        if not isinstance(input_ids, jax.core.Tracer):
            check_image_tokens(input_ids, image_grid_thw, self.vl_cfg.image_token_id,
                               self.vl_cfg.vision.spatial_merge_size, per_row=per_row)
        flat_pixels, flat_grid = self.flat_images(input_ids, pixel_values, image_grid_thw)
        features = self.image_features(flat_pixels, flat_grid).astype(h.dtype)
        is_img = input_ids == self.vl_cfg.image_token_id
        rank = image_token_rank(is_img, features.shape[0],
                                features.shape[0] // input_ids.shape[0] if per_row else None)
        return jnp.where(is_img[..., None], jnp.take(features, rank, axis=0), h)

    def positions(self, input_ids: jax.Array, image_grid_thw: Any = None, attention_mask: jax.Array | None = None,
                  segment_ids: jax.Array | None = None, *, per_row: bool = False) -> jax.Array:
        """M-RoPE positions `[3, B, L]` (`mrope_positions`; `per_row`: `image_grid_thw` is each row's)."""
        return mrope_positions(input_ids, image_grid_thw, self.vl_cfg.image_token_id,
                               self.vl_cfg.vision.spatial_merge_size, attention_mask, segment_ids,
                               per_row=per_row)[0]

    def hidden_states(self, input_ids: jax.Array, positions: jax.Array | None = None,
                      attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None, *,
                      pixel_values: jax.Array | None = None, image_grid_thw: Any = None) -> jax.Array:
        """Final-norm hidden states `[B, L, H]` (cfg.dtype). positions: `[3, B, L]`, `[B, L]` (text
        only: all three rows equal) or None (from the images' placement, `mrope_positions`, restarting
        in each segment when `segment_ids` pack several sequences in a row)."""
        embeds = self.embed(input_ids, pixel_values, image_grid_thw)
        if positions is None and pixel_values is not None:
            positions = self.positions(input_ids, image_grid_thw, attention_mask, segment_ids,
                                       per_row=pixel_values.ndim == 3)
        return self.language_model.hidden_states_from_embeds(embeds, positions, attention_mask, segment_ids)

    def logits(self, hidden: jax.Array) -> jax.Array:
        return self.language_model.logits(hidden)

    # -- generation: prefill with images, then decode text with shifted positions ----------------

    def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
        return self.language_model.init_cache(batch_size, max_len, dtype)

    def prefill_hidden(self, input_ids: jax.Array, cache: KVCache, *, pixel_values: jax.Array | None = None,
                       image_grid_thw: Any = None, attention_mask: jax.Array | None = None
                       ) -> tuple[jax.Array, KVCache, jax.Array]:
        """A prompt (with images) into an empty cache at slots 0..L-1: (hidden `[B, L, H]`, cache,
        rope deltas `[B]`). `attention_mask` marks each row's real tokens (right padding) so the
        deltas count only them; tokens decoded at slot s then rotate at position s + delta."""
        embeds = self.embed(input_ids, pixel_values, image_grid_thw)
        rope, deltas = mrope_positions(input_ids, image_grid_thw, self.vl_cfg.image_token_id,
                                       self.vl_cfg.vision.spatial_merge_size, attention_mask,
                                       per_row=pixel_values is not None and pixel_values.ndim == 3)
        hidden, cache = self.language_model.prefill_hidden(input_ids, cache, embeds=embeds, rope_positions=rope)
        return hidden, cache, deltas

    def decode_hidden(self, input_ids: jax.Array, positions: jax.Array, cache: KVCache, deltas: jax.Array,
                      segment_ids: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
        """Text tokens at cache slots `positions [B, L]` after a `prefill_hidden` (its `deltas`)."""
        rope = positions.astype(jnp.int32) + deltas.astype(jnp.int32)[:, None]
        return self.language_model.decode_hidden(input_ids, positions, cache, segment_ids,
                                                 rope_positions=jnp.broadcast_to(rope[None], (3,) + rope.shape))

    def decode(self, input_ids: jax.Array, positions: jax.Array, cache: KVCache,
               deltas: jax.Array) -> tuple[jax.Array, KVCache]:
        """(logits float32 `[B, L, V]`, new cache) of `decode_hidden`."""
        hidden, cache = self.decode_hidden(input_ids, positions, cache, deltas)
        return self.logits(hidden), cache

    def lm_head_kernel(self) -> jax.Array:
        return self.language_model.lm_head_kernel()


# ---------------------------------------------------------------------------------------------
# HF weights


def _prefixed(mp: TensorMapping, attr: str) -> TensorMapping:
    return dataclasses.replace(mp, path=(attr,) + mp.path)


def vl_name_map(cfg: QwenVLConfig) -> list[tuple[TensorMapping, int]]:
    """(mapping, layers) for every QwenVL param, HF names in the public checkpoint layout."""
    v = cfg.vision
    E, N, D, I = v.hidden_size, v.num_heads, v.head_dim, v.intermediate_size
    C = E * v.merge_unit
    out = [(_prefixed(mp, "language_model"), cfg.text.num_layers) for mp in hf_name_map(cfg.text)]

    def m(path, hf, stacked, hf_shape, to_ours=_identity, to_hf=_identity):
        return (TensorMapping(tuple(path.split(".")), hf, stacked, tuple(hf_shape), to_ours, to_hf), v.depth)

    def t(x):
        return x.T

    blk = "visual.blocks.{i}."
    out += [
        m("visual.patch_embed", "visual.patch_embed.proj.weight", False,
          (E, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size),
          lambda w: w.reshape(E, -1).T,
          lambda k: k.T.reshape(E, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)),
        m("visual.blocks.norm1.weight", blk + "norm1.weight", True, (E,)),
        m("visual.blocks.norm2.weight", blk + "norm2.weight", True, (E,)),
        m("visual.blocks.attn.qkv.kernel", blk + "attn.qkv.weight", True, (3 * E, E),
          lambda w: w.T.reshape(E, 3, N, D), lambda k: k.reshape(E, 3 * E).T),
        m("visual.blocks.attn.qkv.bias", blk + "attn.qkv.bias", True, (3 * E,),
          lambda b: b.reshape(3, N, D), lambda b: b.reshape(3 * E)),
        m("visual.blocks.attn.proj.kernel", blk + "attn.proj.weight", True, (E, E),
          lambda w: w.T.reshape(N, D, E), lambda k: k.reshape(E, E).T),
        m("visual.blocks.attn.proj.bias", blk + "attn.proj.bias", True, (E,)),
        m("visual.blocks.mlp.gate_proj.kernel", blk + "mlp.gate_proj.weight", True, (I, E), t, t),
        m("visual.blocks.mlp.gate_proj.bias", blk + "mlp.gate_proj.bias", True, (I,)),
        m("visual.blocks.mlp.up_proj.kernel", blk + "mlp.up_proj.weight", True, (I, E), t, t),
        m("visual.blocks.mlp.up_proj.bias", blk + "mlp.up_proj.bias", True, (I,)),
        m("visual.blocks.mlp.down_proj.kernel", blk + "mlp.down_proj.weight", True, (E, I), t, t),
        m("visual.blocks.mlp.down_proj.bias", blk + "mlp.down_proj.bias", True, (E,)),
        m("visual.merger.ln_q.weight", "visual.merger.ln_q.weight", False, (E,)),
        m("visual.merger.fc1.kernel", "visual.merger.mlp.0.weight", False, (C, C), t, t),
        m("visual.merger.fc1.bias", "visual.merger.mlp.0.bias", False, (C,)),
        m("visual.merger.fc2.kernel", "visual.merger.mlp.2.weight", False, (v.out_hidden_size, C), t, t),
        m("visual.merger.fc2.bias", "visual.merger.mlp.2.bias", False, (v.out_hidden_size,)),
    ]
    return out


# the newer transformers layout of the same tensors
_ALIASES = (("model.", "model.language_model."), ("visual.", "model.visual."))


class _AliasSource(TensorSource):
    """A source read under the public tensor names whichever layout it stores."""

    def __init__(self, inner: TensorSource):
        self.inner = inner
        self._names = set(inner.names())
        self._used: set[str] = set()

    def resolve(self, name: str) -> str:
        if name in self._names:
            return name
        for old, new in _ALIASES:
            if name.startswith(old) and new + name[len(old):] in self._names:
                return new + name[len(old):]
        return name

    def describe(self, name):
        return self.inner.describe(self.resolve(name))

    def shape(self, name):
        return self.inner.shape(self.resolve(name))

    def read(self, name):
        return self.inner.read(self.resolve(name))

    def names(self) -> Iterable[str]:
        return self._names


def _validate(cfg: QwenVLConfig, mappings, source: _AliasSource) -> None:
    problems, known = [], set()
    for mp, layers in mappings:
        for name in mp.names(layers):
            known.add(source.resolve(name))
            shape = source.shape(name)
            if shape is None:
                problems.append(f"tensor {name!r} is missing")
            elif tuple(shape) != mp.hf_shape:
                problems.append(f"tensor {name!r} has shape {list(shape)}, the config needs {list(mp.hf_shape)}")
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise CheckpointError(f"{source.inner.describe('')}: checkpoint does not match the Qwen2.5-VL config: "
                              + "; ".join(problems[:10]) + more)
    extra = [n for n in source.names() if n not in known and not n.endswith("rotary_emb.inv_freq")
             and not (cfg.text.tie_word_embeddings and n == "lm_head.weight")]
    if extra:
        raise CheckpointError(f"{source.describe(extra[0])}: unexpected tensors not used by the Qwen2.5-VL model: "
                              f"{extra[:10]}")


def build_vl_model(cfg: QwenVLConfig, source: TensorSource, mesh: jax.sharding.Mesh | None = None) -> QwenVL:
    """The abstract QwenVL, then each param read from `source` and placed on its shards."""
    source = _AliasSource(source)
    mappings = vl_name_map(cfg)
    _validate(cfg, mappings, source)
    return place_params(lambda: QwenVL(cfg, rngs=nnx.Rngs(0)), [(mp.path, mp) for mp, _ in mappings], source,
                        mesh, cfg.text.family)


def vl_model_from_state_dict(cfg: QwenVLConfig, state_dict: Mapping[str, Any],
                             mesh: jax.sharding.Mesh | None = None) -> QwenVL:
    return build_vl_model(cfg, state_dict if isinstance(state_dict, TensorSource) else DictSource(state_dict), mesh)


def load_qwen_vl_checkpoint(model_dir: str | os.PathLike, *, mesh: jax.sharding.Mesh | None = None,
                            dtype: str | None = None, param_dtype: str | None = None) -> tuple[QwenVL, QwenVLConfig]:
    """(QwenVL, QwenVLConfig) from an HF Qwen2.5-VL directory (config.json + safetensors)."""
    model_dir = Path(model_dir)
    cfg = apply_vl_dtypes(QwenVLConfig.from_hf_dict(read_hf_config(model_dir)), dtype, param_dtype)
    model = build_vl_model(cfg, SafetensorsSource(model_dir), mesh)
    logger.info("loaded Qwen2.5-VL checkpoint %s (%d text layers, %d vision blocks, param dtype %s)", model_dir,
                cfg.text.num_layers, cfg.vision.depth, cfg.text.param_dtype)
    return model, cfg


def vl_state_dict(model: QwenVL) -> dict[str, np.ndarray]:
    """`{hf_name: ndarray}` in the public Qwen2.5-VL layout."""
    if model.lora is not None:
        raise ValueError("model has LoRA adapters; merge them before exporting")
    flat = {tuple(p): v for p, v in nnx.to_flat_state(nnx.state(model))}
    out: dict[str, np.ndarray] = {}
    for mp, layers in vl_name_map(model.vl_cfg):
        value = _to_host(flat[mp.path].get_value())
        if mp.stacked:
            for i, name in enumerate(mp.names(layers)):
                out[name] = np.ascontiguousarray(mp.to_hf(value[i]))
        else:
            out[mp.hf_name] = np.ascontiguousarray(mp.to_hf(value))
    return out


def save_qwen_vl_checkpoint(model: QwenVL, out_dir: str | os.PathLike, max_shard_bytes: int | None = None, *,
                            extra_config: Mapping[str, Any] | None = None) -> Path:
    """Write `config.json` (public Qwen2.5-VL layout) + safetensors for `model`; `transformers` and
    `load_qwen_vl_checkpoint` load it. Each file is written to a temp name and renamed, weights
    first and `config.json` last. Multi-host: every process calls it (gather); process 0 writes."""
    tensors = vl_state_dict(model)
    out = Path(out_dir)
    if jax.process_index() != 0:
        return out
    hf_config = dict(extra_config or {})
    hf_config.update(model.vl_cfg.to_hf_dict())
    out.mkdir(parents=True, exist_ok=True)
    _write_checkpoint_files(out, tensors, hf_config, max_shard_bytes)
    _fsync_dir(out)
    logger.info("saved Qwen2.5-VL checkpoint to %s", out)
    return out
