"""The Qwen2.5-VL vision transformer (ViT + 2x2 patch merger) in Flax NNX.

Input: `pixel_values [N, C * T * P * P]`, the patches of every image (and frame) one after the
other, each row a `temporal_patch_size x patch_size x patch_size` cube of C channels, in the
order the HF image processor writes them (per image: t, h / m, w / m, m, m with m the spatial
merge size, i.e. every m x m merge block contiguous); `grid_thw`, static, the (t, h, w) patch
grid of each image. Output: `[N / m^2, out_hidden_size]`, one embedding per merged block (one LLM
image token), in the same block order.

The maths is Qwen2.5-VL's (HF `Qwen2_5_VisionTransformerPretrainedModel`):
- patch embedding: a bias-free linear map of each patch cube (HF's Conv3d with stride = kernel);
- 2-D rotary positions: head_dim / 4 frequencies on the patch row, head_dim / 4 on the column
  (rotate-half over the whole head);
- blocks: pre-RMSNorm (eps 1e-6) attention (fused qkv with bias, output proj with bias) and a
  gated MLP with biases; non-causal attention within *windows* of `window_size` pixels
  (window_size / patch / merge merged blocks a side) except in the `fullatt_block_indexes`
  blocks, which attend over the whole frame;
- the patches are permuted window by window before the blocks (so a window is a contiguous run)
  and the merged embeddings permuted back after the merger (RMSNorm, m^2 * C -> m^2 * C, GELU,
  -> out_hidden_size).

The layout (permutation, window and frame ids, rotary positions) depends only on `grid_thw`: it is
computed on the host in numpy (`vision_layout`) and enters jit as constants, so shapes are static;
windows and frames become segment ids of one masked attention call (no Python loop over windows).
Blocks are stacked and scanned like the text decoder's; a per-layer flag picks (`lax.cond`) full
attention (frames as segments) or window attention (the windows gathered into padded rows, so a
window layer costs windows x window^2 scores instead of N^2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.models.attention import attention
from openclaw_jax.models.config import ATTENTION, DTYPES, ModelConfigError
from openclaw_jax.models.decoder import Projection, RMSNorm, _param, init_normal
from openclaw_jax.models.rope import apply_rope
from openclaw_jax.parallel.sharding import constrain

_VISION_EPS = 1e-6  # HF hard-codes the vision RMSNorm eps

_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
}


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    tokens_per_second: int = 2
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention: str = "auto"
    attention_block_size: int = 0
    remat: bool = False

    def __post_init__(self) -> None:
        for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "in_channels",
                     "patch_size", "temporal_patch_size", "spatial_merge_size", "window_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"vision.{name}={value!r} must be a positive integer")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ModelConfigError(f"vision hidden_size={self.hidden_size} / num_heads={self.num_heads} must be an "
                                   "integer head_dim divisible by 4 (2-D rotary positions)")
        full = tuple(int(i) for i in self.fullatt_block_indexes)
        if any(not 0 <= i < self.depth for i in full):
            raise ModelConfigError(f"vision.fullatt_block_indexes={full} must lie in [0, depth={self.depth})")
        object.__setattr__(self, "fullatt_block_indexes", full)
        if self.hidden_act not in _ACTIVATIONS:
            raise ModelConfigError(f"vision.hidden_act={self.hidden_act!r} is not one of {sorted(_ACTIVATIONS)}")
        if self.window_size % (self.patch_size * self.spatial_merge_size):
            raise ModelConfigError(f"vision.window_size={self.window_size} must be a multiple of patch_size x "
                                   f"spatial_merge_size = {self.patch_size * self.spatial_merge_size}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ModelConfigError(f"vision.{name}={getattr(self, name)!r} is not one of {DTYPES}")
        if self.attention not in ATTENTION:
            raise ModelConfigError(f"vision.attention={self.attention!r} is not one of {ATTENTION}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per input patch row: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    def replace(self, **changes: Any) -> "VisionConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **overrides: Any) -> "VisionConfig":
        """From the HF `vision_config` dict (legacy `in_chans` or `in_channels`)."""
        try:
            values: dict[str, Any] = dict(
                depth=int(hf["depth"]), hidden_size=int(hf["hidden_size"]),
                intermediate_size=int(hf["intermediate_size"]), num_heads=int(hf["num_heads"]),
                out_hidden_size=int(hf["out_hidden_size"]))
        except KeyError as e:
            raise ModelConfigError(f"config.json vision_config lacks {e.args[0]!r}") from None
        values["in_channels"] = int(hf.get("in_channels", hf.get("in_chans", 3)))
        for key in ("patch_size", "temporal_patch_size", "spatial_merge_size", "window_size", "tokens_per_second"):
            if hf.get(key) is not None:
                values[key] = int(hf[key])
        if hf.get("fullatt_block_indexes") is not None:
            values["fullatt_block_indexes"] = tuple(int(i) for i in hf["fullatt_block_indexes"])
        if hf.get("hidden_act") is not None:
            values["hidden_act"] = str(hf["hidden_act"])
        theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta"))
        if theta is not None:
            values["rope_theta"] = float(theta)
        values.update(overrides)
        return cls(**values)

    def to_hf_dict(self) -> dict[str, Any]:
        return {"depth": self.depth, "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_heads": self.num_heads, "out_hidden_size": self.out_hidden_size, "in_chans": self.in_channels,
                "patch_size": self.patch_size, "temporal_patch_size": self.temporal_patch_size,
                "spatial_merge_size": self.spatial_merge_size, "spatial_patch_size": self.patch_size,
                "window_size": self.window_size, "fullatt_block_indexes": list(self.fullatt_block_indexes),
                "hidden_act": self.hidden_act, "tokens_per_second": self.tokens_per_second}


GridTHW = tuple[tuple[int, int, int], ...]


def as_grid(grid_thw: Any) -> GridTHW:
    """`grid_thw` (an `[n, 3]` array or nested sequence; concrete, not traced) as a static tuple."""
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    return tuple((int(t), int(h), int(w)) for t, h, w in grid)


@dataclass(frozen=True)
class VisionLayout:
    """Host-side index arrays for one `grid_thw` (see `vision_layout`); all numpy."""

    patch_order: np.ndarray     # [N] input patch row at each position of the window-ordered sequence
    merged_inverse: np.ndarray  # [N / m^2] window-ordered merged block of each block in input order
    window_ids: np.ndarray      # [N] window of each window-ordered patch (windows are contiguous runs)
    frame_ids: np.ndarray       # [N] frame segment (full attention) of each window-ordered patch
    rows: np.ndarray            # [N] patch row in its frame (rotary), window-ordered
    cols: np.ndarray            # [N] patch column in its frame (rotary), window-ordered
    window_gather: np.ndarray   # [num_windows, W] sequence index of each window slot (W: largest window)
    window_valid: np.ndarray    # [num_windows, W] the slot holds a patch (windows cut at an edge are short)
    window_scatter: np.ndarray  # [N] flat slot (window * W + slot) of each window-ordered patch


def _segments_from_bounds(bounds: np.ndarray, n: int) -> np.ndarray:
    """Segment index of 0..n-1 for cumulative boundaries `[0, b1, ..., n]` (HF cu_seqlens)."""
    return np.searchsorted(np.asarray(bounds)[1:], np.arange(n), side="right").astype(np.int32)


def vision_layout(cfg: VisionConfig, grid_thw: Any) -> VisionLayout:
    """The window permutation, segment ids and rotary rows/columns of the patches of `grid_thw`
    (HF `get_vision_window_index`, `get_vision_cu_seqlens`, `get_vision_position_ids`)."""
    grid = as_grid(grid_thw)
    m, unit = cfg.spatial_merge_size, cfg.merge_unit
    win = cfg.window_size // m // cfg.patch_size  # merged blocks per window side
    rows, cols, window_index, window_bounds, frame_bounds = [], [], [], [0], [0]
    offset = 0
    for t, h, w in grid:
        if h % m or w % m:
            raise ValueError(f"image grid {(t, h, w)}: h and w must be multiples of spatial_merge_size={m}")
        # rows/cols of each patch, merge blocks contiguous (t, h/m, w/m, m, m)
        hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (h // m, m, w // m, m)
        rows.append(np.tile(hh.reshape(block).transpose(0, 2, 1, 3).reshape(-1), t))
        cols.append(np.tile(ww.reshape(block).transpose(0, 2, 1, 3).reshape(-1), t))
        frame_bounds.extend(frame_bounds[-1] + h * w * (np.arange(t) + 1))
        # merged blocks grouped window by window (windows of win x win blocks, the last ones cut)
        gh, gw = h // m, w // m
        index = np.arange(t * gh * gw).reshape(t, gh, gw)
        pad_h, pad_w = win - gh % win, win - gw % win
        nh, nw = (gh + pad_h) // win, (gw + pad_w) // win
        padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-1)
        padded = padded.reshape(t, nh, win, nw, win).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, win * win)
        sizes = (padded >= 0).sum(-1).reshape(-1)
        flat = padded.reshape(-1)
        window_index.append(flat[flat >= 0] + offset)
        window_bounds.extend(window_bounds[-1] + np.cumsum(sizes) * unit)
        offset += t * gh * gw
    window_index = np.concatenate(window_index)
    n = offset * unit
    patch_order = (window_index[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)
    rows_in, cols_in = np.concatenate(rows), np.concatenate(cols)
    # empty windows (all padding) repeat a bound: drop them (HF `unique_consecutive`)
    bounds = np.unique(np.asarray(window_bounds))
    starts, sizes = bounds[:-1], np.diff(bounds)
    width = int(sizes.max())
    window_ids = _segments_from_bounds(bounds, n)
    slots = np.arange(width)[None, :]
    return VisionLayout(
        patch_order=patch_order.astype(np.int32),
        merged_inverse=np.argsort(window_index).astype(np.int32),
        window_ids=window_ids,
        frame_ids=_segments_from_bounds(np.asarray(frame_bounds), n),
        rows=rows_in[patch_order].astype(np.int32),
        cols=cols_in[patch_order].astype(np.int32),
        window_gather=np.minimum(starts[:, None] + slots, n - 1).astype(np.int32),
        window_valid=slots < sizes[:, None],
        window_scatter=(window_ids * width + np.arange(n) - starts[window_ids]).astype(np.int32),
    )


def merged_tokens(cfg: VisionConfig, grid_thw: Any) -> list[int]:
    """LLM tokens (merged blocks) of each image of `grid_thw`."""
    return [t * h * w // cfg.merge_unit for t, h, w in as_grid(grid_thw)]


def vision_rope(cfg: VisionConfig, rows: np.ndarray, cols: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos, sin `[1, N, head_dim]` float32: head_dim / 4 frequencies on the row, as many on the column,
    the pair repeated for rotate-half (HF `Qwen2_5_VLVisionRotaryEmbedding`)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, half, 2, dtype=np.float64) / half)
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    freqs = jnp.concatenate([jnp.asarray(rows, jnp.float32)[:, None] * inv_freq,
                             jnp.asarray(cols, jnp.float32)[:, None] * inv_freq], axis=-1)
    angles = jnp.concatenate([freqs, freqs], axis=-1)[None]
    return jnp.cos(angles), jnp.sin(angles)


class VisionAttention(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, stack: tuple[int, ...], rngs: nnx.Rngs):
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        E, N, D = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        common = dict(stack=stack, lora=None, dtype=dt, param_dtype=pdt, rngs=rngs)
        # HF's fused qkv Linear(E, 3E) as [E, 3, heads, head_dim]
        self.qkv = Projection((E,), (3, N, D), ("embed",), (None, "heads", "head_dim"), bias=True, **common)
        self.proj = Projection((N, D), (E,), ("heads", "head_dim"), ("embed",), bias=True, **common)
        self.implementation = cfg.attention
        self.block_size = cfg.attention_block_size

    def __call__(self, x, cos, sin, windows: "_Windows", is_full):
        """Full attention within each frame when `is_full`, else within each window: the windows'
        patches are gathered into `[num_windows, W]` rows (short windows masked), so a window layer
        costs num_windows * W^2 scores, not N^2."""
        qkv = self.qkv(x)  # [1, N, 3, heads, head_dim]
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kw = dict(causal=False, implementation=self.implementation, block_q=self.block_size,
                  block_k=self.block_size)

        def full(q, k, v):
            return attention(q, k, v, segment_ids=windows.frame_ids, **kw)

        def windowed(q, k, v):
            rows = [jnp.take(t[0], windows.gather, axis=0) for t in (q, k, v)]  # [nw, W, heads, head_dim]
            out = attention(*rows, kv_mask=windows.valid, **kw)
            flat = out.reshape((-1,) + out.shape[2:])
            return jnp.take(flat, windows.scatter, axis=0)[None]

        out = jax.lax.cond(is_full, full, windowed, q, k, v)
        return self.proj(out)


class _Windows(NamedTuple):
    """The layout arrays one vision block reads (jnp constants of `VisionLayout`)."""

    frame_ids: jax.Array | None  # [1, N]; None: one frame, no mask
    gather: jax.Array            # [nw, W]
    valid: jax.Array             # [nw, W]
    scatter: jax.Array           # [N]


class VisionMLP(nnx.Module):
    """down(act(gate(x)) * up(x)), all with biases."""

    def __init__(self, cfg: VisionConfig, *, stack: tuple[int, ...], rngs: nnx.Rngs):
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        E, I = cfg.hidden_size, cfg.intermediate_size
        common = dict(stack=stack, bias=True, lora=None, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.gate_proj = Projection((E,), (I,), ("embed",), ("mlp",), **common)
        self.up_proj = Projection((E,), (I,), ("embed",), ("mlp",), **common)
        self.down_proj = Projection((I,), (E,), ("mlp",), ("embed",), **common)
        self.act = cfg.hidden_act

    def __call__(self, x):
        return self.down_proj(_ACTIVATIONS[self.act](self.gate_proj(x)) * self.up_proj(x))


class VisionBlock(nnx.Module):
    def __init__(self, cfg: VisionConfig, *, stack: tuple[int, ...], rngs: nnx.Rngs):
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        E = cfg.hidden_size
        self.norm1 = RMSNorm(E, "norm", stack=stack, eps=_VISION_EPS, dtype=dt, param_dtype=pdt)
        self.attn = VisionAttention(cfg, stack=stack, rngs=rngs)
        self.norm2 = RMSNorm(E, "norm", stack=stack, eps=_VISION_EPS, dtype=dt, param_dtype=pdt)
        self.mlp = VisionMLP(cfg, stack=stack, rngs=rngs)

    def __call__(self, h, cos, sin, windows, is_full):
        h = h + self.attn(self.norm1(h), cos, sin, windows, is_full)
        return h + self.mlp(self.norm2(h))


class PatchMerger(nnx.Module):
    """RMSNorm each patch, concatenate each m x m block, Linear -> GELU -> Linear (HF `Qwen2_5_VLPatchMerger`)."""

    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        C = cfg.hidden_size * cfg.merge_unit
        common = dict(stack=(), bias=True, lora=None, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.ln_q = RMSNorm(cfg.hidden_size, "norm", stack=(), eps=_VISION_EPS, dtype=dt, param_dtype=pdt)
        self.fc1 = Projection((C,), (C,), ("embed",), ("mlp",), **common)
        self.fc2 = Projection((C,), (cfg.out_hidden_size,), ("mlp",), ("embed",), **common)
        self.unit = cfg.merge_unit

    def __call__(self, h):  # [N, E] -> [N / m^2, out]
        x = self.ln_q(h)
        x = x.reshape(x.shape[0] // self.unit, self.unit * x.shape[1])
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class VisionTransformer(nnx.Module):
    """`VisionTransformer(cfg, rngs=...)(pixel_values, grid_thw)` -> merged image embeddings (module docstring)."""

    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs, family: str = "qwen2"):
        self.cfg = cfg
        self.family = family  # sharding rule table of the activations
        pdt = jnp.dtype(cfg.param_dtype)
        # HF Conv3d weight [E, C, T, P, P] flattened over (C, T, P, P), stored [C*T*P*P, E]
        self.patch_embed = _param(init_normal(rngs, (cfg.patch_dim, cfg.hidden_size), pdt), (None, "embed"))
        self.blocks = VisionBlock(cfg, stack=(cfg.depth,), rngs=rngs)
        self.merger = PatchMerger(cfg, rngs=rngs)

    def __call__(self, pixel_values: jax.Array, grid_thw: Any) -> jax.Array:
        """pixel_values `[N, C*T*P*P]`, grid_thw static `[n, 3]` -> `[N / m^2, out_hidden_size]` (cfg.dtype)."""
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        layout = vision_layout(cfg, grid_thw)
        n = layout.patch_order.shape[0]
        if pixel_values.shape != (n, cfg.patch_dim):
            raise ValueError(f"pixel_values has shape {tuple(pixel_values.shape)}; grid_thw {as_grid(grid_thw)} "
                             f"needs ({n}, {cfg.patch_dim})")
        x = jnp.take(pixel_values, jnp.asarray(layout.patch_order), axis=0).astype(dt)
        h = jnp.dot(x, self.patch_embed[...].astype(dt), preferred_element_type=jnp.float32).astype(dt)[None]
        h = constrain(h, ("batch", "seq", "act_embed"), self.family)
        cos, sin = vision_rope(cfg, layout.rows, layout.cols)
        one_frame = int(layout.frame_ids.max()) == 0
        windows = _Windows(None if one_frame else jnp.asarray(layout.frame_ids)[None],
                           jnp.asarray(layout.window_gather), jnp.asarray(layout.window_valid),
                           jnp.asarray(layout.window_scatter))
        full = np.zeros(cfg.depth, bool)
        full[list(cfg.fullatt_block_indexes)] = True
        graphdef, stacked = nnx.split(self.blocks)

        def layer(h, xs):
            params, is_full = xs
            block = nnx.merge(graphdef, params)
            h = block(h, cos, sin, windows, is_full)
            return constrain(h, ("batch", "seq", "act_embed"), self.family), None

        if cfg.remat:
            layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable)
        h, _ = jax.lax.scan(layer, h, (stacked, jnp.asarray(full)))
        merged = self.merger(h[0])
        return jnp.take(merged, jnp.asarray(layout.merged_inverse), axis=0)
