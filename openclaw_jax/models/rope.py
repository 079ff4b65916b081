"""Rotate-half rotary position embeddings, unscaled or with `llama3` / `yarn` frequency scaling.

The inverse frequencies depend only on the config, so they are computed once on the host in
float64 (`rope_frequencies`) and enter the jitted code as constants; the angles, sin and cos are
float32. The scaling rules follow the published methods as HF `transformers` implements them:
- `llama3` (Llama-3.1/3.2): wavelengths longer than original_max / low_freq_factor are divided by
  `factor`, shorter than original_max / high_freq_factor kept, smoothly interpolated in between.
- `yarn` (YaRN, Qwen): per-dimension blend of interpolated (inv_freq / factor) and extrapolated
  frequencies with a linear ramp between the correction dims of beta_fast and beta_slow rotations
  over the original context, and cos/sin multiplied by the attention factor
  (0.1 ln(factor) + 1 unless given).

Multimodal RoPE (M-RoPE, Qwen2-VL / Qwen2.5-VL): positions `[3, B, L]` (temporal, height, width)
and `mrope_section` (three sizes summing to head_dim / 2): frequency pair j takes its angle from
the position row of the section it falls in. Text tokens carry three equal rows, which is plain RoPE.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from openclaw_jax.models.config import RopeScaling


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> tuple[np.ndarray, float]:
    """(inverse frequencies float64 `[head_dim // 2]`, cos/sin multiplier)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is None:
        return inv_freq, 1.0
    if scaling.rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if scaling.rope_type == "yarn":
        return _yarn(inv_freq, head_dim, theta, scaling)
    raise ValueError(f"rope scaling type {scaling.rope_type!r} is not supported")


def _llama3(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
    old_len = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / s.low_freq_factor, old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, blended, scaled)


def _yarn(inv_freq: np.ndarray, head_dim: int, theta: float, s: RopeScaling) -> tuple[np.ndarray, float]:
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.attention_factor is not None:
        attention_factor = s.attention_factor
    elif s.mscale and s.mscale_all_dim:
        attention_factor = mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim)
    else:
        attention_factor = mscale(s.factor)

    def correction_dim(rotations: float) -> float:
        # the dimension whose wavelength makes `rotations` turns over the original context
        return head_dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolate = 1.0 - ramp  # 1: keep the original frequency, 0: interpolate (divide by factor)
    return inv_freq / s.factor * ramp + inv_freq * extrapolate, float(attention_factor)


def rope_sin_cos(positions: jax.Array, head_dim: int, theta: float,
                 scaling: RopeScaling | None = None,
                 mrope_section: tuple[int, ...] | None = None) -> tuple[jax.Array, jax.Array]:
    """cos, sin `[B, L, head_dim]` in float32 for rotate-half RoPE.

    positions `[B, L]`, or `[3, B, L]` with `mrope_section` (M-RoPE, see the module docstring).
    """
    inv_freq, factor = rope_frequencies(head_dim, theta, scaling)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    if positions.ndim == 3:
        if mrope_section is None or positions.shape[0] != 3:
            raise ValueError(f"positions of shape {positions.shape} need M-RoPE (mrope_section and 3 rows)")
        bounds = np.cumsum((0,) + tuple(mrope_section))
        # frequency pairs [bounds[i], bounds[i+1]) rotate with position row i (3 static slices)
        angles = jnp.concatenate([angles[i, ..., bounds[i]:bounds[i + 1]] for i in range(3)], axis=-1)
    angles = jnp.concatenate([angles, angles], axis=-1)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos, sin


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on x `[B, L, heads, head_dim]` (in float32, result in x's dtype)."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)
