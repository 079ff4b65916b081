"""An image's size and end, read from its structure (wire/image_probe.py), against Pillow's own reading of
images Pillow wrote in every served format and variant; and the limits `decode_data_url` and
`extract_images` check with it, before anything decodes."""

from __future__ import annotations

import base64
import io
import random

import pytest
from PIL import Image

from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.image_probe import ImageProbeError, probe_image
from openclaw_jax.wire.images import ImageLimits, decode_data_url, extract_images

VARIANTS = [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("GIF", {}), ("WEBP", {}),
            ("WEBP", {"lossless": True}), ("PNG", {"save_all": True}), ("GIF", {"save_all": True}),
            ("WEBP", {"save_all": True})]


def encoded(fmt: str, kw: dict, width: int, height: int, seed: int) -> bytes:
    image = Image.effect_noise((width, height), 40 + seed % 30).convert("RGB" if fmt == "JPEG" else "RGBA")
    if kw.get("save_all"):
        kw = {**kw, "append_images": [image.rotate(90, expand=False)]}
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("fmt, kw", VARIANTS, ids=[f"{f}{'-' + '-'.join(k) if k else ''}" for f, k in VARIANTS])
def test_probe_reads_what_pillow_reads(fmt, kw):
    rng = random.Random(f"{fmt}{kw}")
    for seed in range(6):
        width, height = rng.randint(1, 300), rng.randint(1, 300)
        data = encoded(fmt, kw, width, height, seed)
        header = probe_image(data, fmt.lower())
        assert (header.width, header.height) == Image.open(io.BytesIO(data)).size == (width, height)
        assert header.end == len(data)
        for cut in (len(data) // 2, len(data) - 1):   # truncated anywhere: never a size, always an error
            with pytest.raises(ImageProbeError):
                probe_image(data[:cut], fmt.lower())


def url(data: bytes, fmt: str = "png") -> str:
    return f"data:image/{fmt};base64," + base64.b64encode(data).decode()


def test_limits_are_checked_from_the_header_and_name_their_setting():
    small = encoded("PNG", {}, 64, 48, 0)
    assert decode_data_url(url(small), "x").pixels == 64 * 48
    gateway = ImageLimits(max_image_pixels=64 * 47, prefix="gateway")
    with pytest.raises(WireError, match=r"64 x 48 = 3072 pixels; at most 3008 .*gateway.max_image_pixels"):
        decode_data_url(url(small), "x", gateway)
    with pytest.raises(WireError, match="7 bytes follow the end of the PNG"):
        decode_data_url(url(small + b"trailer"), "x")
    parts = [{"type": "image_url", "image_url": {"url": url(small)}}] * 3
    server = ImageLimits(max_images=2, prefix="--")
    with pytest.raises(WireError, match=r"at most 2 images .*--max-images-per-request"):
        extract_images([{"role": "user", "content": parts}], server)
    with pytest.raises(WireError, match=r"9216 pixels in all; at most 9000 .*--max-request-image-pixels"):
        extract_images([{"role": "user", "content": parts}], ImageLimits(max_total_pixels=9000, prefix="--"))
