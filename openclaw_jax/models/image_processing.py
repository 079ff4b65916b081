"""Images -> Qwen2.5-VL `pixel_values` + `image_grid_thw` (HF `Qwen2VLImageProcessor`, PIL backend).

Per image: RGB, resized (PIL bicubic) to the `smart_resize` size (both sides multiples of
patch x merge, pixel count within [min_pixels, max_pixels], aspect ratio kept as far as possible),
scaled to [0, 1], normalised with the OpenAI CLIP mean/std, and cut into patches in the order the
ViT expects (`models/vision.py`): rows `[gh * gw, C * T * P * P]`, every merge x merge block
contiguous, the single frame repeated `temporal_patch_size` times. The LLM sees
`gh * gw / merge^2` image tokens per image.

Decoding is bounded: an image whose decoder reports more than `max_decode_pixels` (width x height,
read from the header before any pixel is decoded) is refused with :class:`ImageDecodeError`, as is
any image the decoder cannot read (corrupt or truncated data). Servers check the same limit on the
wire (`wire.images.ImageLimits`) before the bytes get here; this is the last line for every caller.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
DEFAULT_MAX_DECODE_PIXELS = 16_777_216   # 4096 x 4096 (wire.images.DEFAULT_MAX_IMAGE_PIXELS)


class ImageDecodeError(ValueError):
    """An image that is not decoded: unreadable, or larger than the decode limit."""
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImageProcessorConfig:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD

    @classmethod
    def for_vision(cls, vision: Any, **overrides: Any) -> "ImageProcessorConfig":
        """The processor that matches a `VisionConfig` (patch, temporal patch and merge sizes)."""
        return cls(patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                   merge_size=vision.spatial_merge_size, **overrides)


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """The (height, width) the image is resized to (HF `smart_resize`)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _open_encoded(data: bytes, max_pixels: int):
    """A lazily opened PIL image (header read, no pixels decoded), its size checked against ``max_pixels``."""
    from PIL import Image, UnidentifiedImageError

    try:
        pil = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"the image cannot be read: {type(err).__name__}: {err}") from None
    width, height = pil.size
    if width * height > max_pixels:
        raise ImageDecodeError(f"the image is {width} x {height} = {width * height} pixels; at most {max_pixels} "
                               "are decoded")
    return pil


def _to_pil(image: Any, max_pixels: int = DEFAULT_MAX_DECODE_PIXELS):
    from PIL import Image

    if isinstance(image, (bytes, bytearray, memoryview)):
        image = _open_encoded(bytes(image), max_pixels)
    elif isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (3, 4):
            raise ValueError(f"a numpy image must be uint8 [H, W, 3|4], got {image.dtype} {image.shape}")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise TypeError(f"cannot read an image from {type(image).__name__} (PIL image, uint8 array or encoded bytes)")
    try:
        return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"the image cannot be decoded: {type(err).__name__}: {err}") from None


def process_image(image: Any, cfg: ImageProcessorConfig = ImageProcessorConfig(), *,
                  max_decode_pixels: int = DEFAULT_MAX_DECODE_PIXELS) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image (PIL image, uint8 `[H, W, 3]` array, or PNG/JPEG/... bytes) -> (patches float32
    `[gh * gw, C * T * P * P]`, grid (1, gh, gw)); ImageDecodeError for an unreadable or too large one."""
    from PIL import Image

    pil = _to_pil(image, max_decode_pixels)
    factor = cfg.patch_size * cfg.merge_size
    height, width = smart_resize(pil.height, pil.width, factor, cfg.min_pixels, cfg.max_pixels)
    pil = pil.resize((width, height), resample=Image.Resampling.BICUBIC)
    x = np.asarray(pil).astype(np.float64) * (1 / 255)
    x = ((x.astype(np.float32) - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32))
    x = x.transpose(2, 0, 1)  # [C, H, W]
    P, m, T = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = height // P, width // P
    x = x.reshape(3, gh // m, m, P, gw // m, m, P).transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, P, P)
    x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (T,) + x.shape[5:])  # the frame repeated T times
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * T * P * P), dtype=np.float32), (1, gh, gw)


def image_grid(image: Any, cfg: ImageProcessorConfig = ImageProcessorConfig()) -> tuple[int, int, int]:
    """The grid (1, gh, gw) `process_image` gives `image`, from its size alone (no pixel work)."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray, memoryview)):
        pil = Image.open(io.BytesIO(bytes(image)))   # reads the header only
    else:
        pil = _to_pil(image)
    return grid_of_size(pil.width, pil.height, cfg)


def grid_of_size(width: int, height: int, cfg: ImageProcessorConfig = ImageProcessorConfig()) -> tuple[int, int, int]:
    """The grid (1, gh, gw) of an image of ``width`` x ``height`` pixels (from its header: no decoding)."""
    height, width = smart_resize(height, width, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)
    return 1, height // cfg.patch_size, width // cfg.patch_size


def process_images(images: Sequence[Any], cfg: ImageProcessorConfig = ImageProcessorConfig(), *,
                   max_decode_pixels: int = DEFAULT_MAX_DECODE_PIXELS) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values `[sum N_i, C*T*P*P]` float32, image_grid_thw `[n, 3]` int64) for several images
    (one decoded at a time)."""
    if not images:
        return np.zeros((0, 3 * cfg.temporal_patch_size * cfg.patch_size ** 2), np.float32), np.zeros((0, 3), np.int64)
    parts = [process_image(image, cfg, max_decode_pixels=max_decode_pixels) for image in images]
    return np.concatenate([p for p, _ in parts]), np.asarray([g for _, g in parts], np.int64)


def image_token_count(grid_row: Sequence[int], merge_size: int = 2) -> int:
    """LLM image tokens of one image of grid (t, h, w)."""
    t, h, w = (int(v) for v in grid_row)
    return t * h * w // merge_size ** 2


VL_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")


def processor_for_model_dir(model: Any) -> ImageProcessorConfig | None:
    """The image processor of an HF model directory whose `config.json` is a Qwen2(.5)-VL one (patch,
    temporal patch and merge sizes from `vision_config`; min/max pixels, mean and std from
    `preprocessor_config.json` when it is there), else None (a text model, or not a directory)."""
    import json
    from pathlib import Path

    path = Path(str(model))
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(hf, dict) or hf.get("model_type") not in VL_MODEL_TYPES:
        return None
    vision = hf.get("vision_config") or {}
    kw: dict[str, Any] = {k: int(vision[k]) for k in ("patch_size", "temporal_patch_size") if k in vision}
    if "spatial_merge_size" in vision:
        kw["merge_size"] = int(vision["spatial_merge_size"])
    try:
        pre = json.loads((path / "preprocessor_config.json").read_text())
    except (OSError, ValueError):
        pre = {}
    for key in ("min_pixels", "max_pixels"):
        if isinstance(pre.get(key), int):
            kw[key] = int(pre[key])
    for key, name in (("image_mean", "mean"), ("image_std", "std")):
        if isinstance(pre.get(key), list) and len(pre[key]) == 3:
            kw[name] = tuple(float(v) for v in pre[key])
    return ImageProcessorConfig(**kw)
