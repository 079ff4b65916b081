"""OpenAI ``image_url`` content parts with data URLs: read, checked, and turned into placeholders.

A user (or tool) message may carry ``{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}`` parts. Only inline data URLs of PNG, JPEG, WebP or GIF are
served: a remote ``http(s)://`` URL is refused (the servers fetch nothing), and so is any data
that is not valid base64 of an image in the declared format. Every problem is a `WireError`
(HTTP 400) naming the field (``messages[i].content[j].image_url.url``).

Before anything decodes an image, its size is read from its structure (`wire.image_probe`) and
checked against `ImageLimits`: pixels per image (``max_image_pixels``), images per request, pixels
and encoded bytes summed over the request. Bytes after the image's end are refused (a decoder
ignores them, so they would only cost memory and disk). Decoding itself happens later, on worker
threads (`models.image_processing`, which checks the decoder's size against the same limit).

`extract_images` rewrites such a message's content into one string, the text parts joined with
nothing between them and each image replaced by `IMAGE_PLACEHOLDER`, exactly what Qwen2.5-VL's
chat template renders for a list of parts; the images come back in prompt order. After the chat
template has rendered, `expand_image_placeholders` (models/tokenizer/chat_template.py) widens the
k-th placeholder to the image's token count. Pure functions, no I/O; imports nothing of ours but
`wire.errors` and `wire.image_probe`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.image_probe import ImageProbeError, probe_image

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VISION_END = "<|vision_end|>"
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
MAX_IMAGE_BYTES = 20 << 20
MAX_IMAGES_PER_REQUEST = 32
DEFAULT_MAX_IMAGE_PIXELS = 16_777_216   # 4096 x 4096: 48 MiB of RGB when decoded

_MAGIC = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpeg": (b"\xff\xd8\xff",),
    "webp": (b"RIFF",),
    "gif": (b"GIF87a", b"GIF89a"),
}
_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|webp|gif);base64,(.*)$", re.DOTALL | re.IGNORECASE)
_IMAGE_ROLES = ("user", "tool")


@dataclass(frozen=True)
class ImageLimits:
    """What one request's images may cost. ``prefix`` names the settings in errors: "gateway" ->
    ``gateway.max_image_pixels``, "--" -> ``--max-image-pixels`` (the model server's flags)."""

    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_images: int = MAX_IMAGES_PER_REQUEST
    max_total_pixels: int = 4 * DEFAULT_MAX_IMAGE_PIXELS
    max_image_bytes: int = MAX_IMAGE_BYTES
    max_total_bytes: int = 4 * MAX_IMAGE_BYTES
    prefix: str = "server"

    def __post_init__(self) -> None:
        for name in ("max_image_pixels", "max_images", "max_total_pixels", "max_image_bytes", "max_total_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{self.key(name)}={getattr(self, name)} must be >= 1")

    def key(self, name: str) -> str:
        flag = {"max_images": "max_images_per_request", "max_total_pixels": "max_request_image_pixels",
                "max_total_bytes": "max_request_image_bytes"}.get(name, name)
        return "--" + flag.replace("_", "-") if self.prefix == "--" else f"{self.prefix}.{flag}"


DEFAULT_LIMITS = ImageLimits()


@dataclass(frozen=True)
class ImageInput:
    """One image of a request: its encoded bytes, format, content hash (sha256, hex) and size in pixels
    (from its header; 0 when not measured)."""

    data: bytes
    mime: str
    sha256: str
    width: int = 0
    height: int = 0

    @classmethod
    def of(cls, data: bytes, mime: str, width: int = 0, height: int = 0) -> "ImageInput":
        return cls(bytes(data), mime, hashlib.sha256(data).hexdigest(), width, height)

    @property
    def pixels(self) -> int:
        return self.width * self.height


def decode_data_url(url: Any, where: str, limits: ImageLimits = DEFAULT_LIMITS) -> ImageInput:
    """A ``data:image/<fmt>;base64,...`` URL -> ImageInput, measured and checked against ``limits``;
    anything else is a WireError naming ``where``."""
    if not isinstance(url, str):
        raise WireError(f"{where} must be a string (a data:image/...;base64 URL)", param=where)
    head = url[:16].lower()
    if head.startswith(("http://", "https://")):
        raise WireError(f"{where}: remote image URLs are not fetched; send the image inline as a "
                        "data:image/png;base64,... URL", param=where)
    match = _DATA_URL.match(url)
    if match is None:
        raise WireError(f"{where} must be a data URL data:image/(png|jpeg|webp|gif);base64,<data>; got "
                        f"{url[:40]!r}{'...' if len(url) > 40 else ''}", param=where)
    fmt = match.group(1).lower().replace("jpg", "jpeg")
    text = re.sub(r"\s+", "", match.group(2))
    if len(text) > limits.max_image_bytes * 4 // 3 + 4:
        raise WireError(f"{where}: the image is larger than {limits.max_image_bytes} bytes "
                        f"({limits.key('max_image_bytes')})", param=where)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{where}: the data is not valid base64", param=where) from None
    if not data:
        raise WireError(f"{where}: the image is empty", param=where)
    if not any(data.startswith(m) for m in _MAGIC[fmt]) or (fmt == "webp" and data[8:12] != b"WEBP"):
        raise WireError(f"{where}: the data is not a {fmt.upper()} image (its first bytes do not match the "
                        f"declared image/{fmt})", param=where)
    try:
        header = probe_image(data, fmt)
    except ImageProbeError as err:
        raise WireError(f"{where}: the {fmt.upper()} image cannot be read: {err}", param=where) from None
    if header.pixels > limits.max_image_pixels:
        raise WireError(f"{where}: the image is {header.width} x {header.height} = {header.pixels} pixels; at most "
                        f"{limits.max_image_pixels} are accepted ({limits.key('max_image_pixels')}); send it "
                        "scaled down", param=where)
    if header.end != len(data):
        raise WireError(f"{where}: {len(data) - header.end} bytes follow the end of the {fmt.upper()} image; send "
                        "the image alone", param=where)
    return ImageInput.of(data, f"image/{fmt}", header.width, header.height)


def check_request_images(images: Sequence[ImageInput], limits: ImageLimits, where: str = "messages") -> None:
    """The request-wide limits: how many images, their pixels and encoded bytes summed."""
    if len(images) > limits.max_images:
        raise WireError(f"at most {limits.max_images} images are accepted per request "
                        f"({limits.key('max_images')}), got {len(images)}", param=where)
    pixels = sum(im.pixels for im in images)
    if pixels > limits.max_total_pixels:
        raise WireError(f"the request's images have {pixels} pixels in all; at most {limits.max_total_pixels} are "
                        f"accepted ({limits.key('max_total_pixels')})", param=where)
    size = sum(len(im.data) for im in images)
    if size > limits.max_total_bytes:
        raise WireError(f"the request's images are {size} bytes in all; at most {limits.max_total_bytes} are "
                        f"accepted ({limits.key('max_total_bytes')})", param=where)


def _image_part_url(part: Mapping[str, Any], where: str) -> Any:
    if part.get("type") == "image_url":
        inner = part.get("image_url")
        if isinstance(inner, str):
            return inner
        if not isinstance(inner, Mapping):
            raise WireError(f"{where}.image_url must be an object with a 'url'", param=f"{where}.image_url")
        detail = inner.get("detail")
        if detail not in (None, "auto", "low", "high"):
            raise WireError(f"{where}.image_url.detail={detail!r} must be auto, low or high",
                            param=f"{where}.image_url.detail")
        return inner.get("url")
    return part.get("image")


def extract_images(messages: Any, limits: ImageLimits = DEFAULT_LIMITS) -> tuple[Any, list[ImageInput]]:
    """Messages with image parts -> (messages whose image-bearing contents are placeholder strings,
    the images in prompt order), every image checked against ``limits``. Messages without images come
    back unchanged (the same objects)."""
    if not isinstance(messages, list):
        return messages, []
    images: list[ImageInput] = []
    out = []
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list) or not any(
                isinstance(p, dict) and p.get("type") in ("image_url", "image") for p in content):
            out.append(msg)
            continue
        role = msg.get("role")
        if role not in _IMAGE_ROLES:
            raise WireError(f"messages[{i}]: images are accepted in user (and tool) messages only, not in "
                            f"{role!r} messages", param=f"messages[{i}].content")
        pieces = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(part, dict) and part.get("type") in ("image_url", "image"):
                if len(images) == limits.max_images:   # before decoding one more
                    check_request_images([*images, images[-1]], limits)
                images.append(decode_data_url(_image_part_url(part, where), f"{where}.image_url.url", limits))
                check_request_images(images, limits)
                pieces.append(IMAGE_PLACEHOLDER)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif isinstance(part, str):
                pieces.append(part)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise WireError(f"{where} must be a text or image_url part, got {kind!r}", param=where)
        out.append({**msg, "content": "".join(pieces)})
    return out, images


def count_placeholders(texts: Sequence[str]) -> int:
    return sum(t.count(IMAGE_PAD) for t in texts if isinstance(t, str))


def image_data_url(image: ImageInput) -> str:
    """An image as the data URL it came in (for `/generate`'s `image_data`)."""
    return f"data:{image.mime};base64," + base64.b64encode(image.data).decode("ascii")
