"""An encoded image's size and where its data ends, read from its structure alone (no decoding).

`probe_image(data, fmt)` walks the container of a PNG (chunks up to ``IEND``), JPEG (marker
segments and entropy-coded scans up to ``EOI``), GIF (blocks up to the trailer) or WebP (the RIFF
size) and returns the picture's width and height, as the decoder (Pillow) will report them, and
the offset where the image ends. It reads each byte at most a constant number of times (the JPEG
scan is a search for 0xFF) and allocates nothing in proportion to the picture: a 13,000 x 13,000
PNG of a few kilobytes is measured here, before anything would decode its 507 MB of pixels.

Anything it cannot follow is an :class:`ImageProbeError` (a ValueError) saying what: truncated
data, a missing header, a zero size, an unsupported variant (hierarchical JPEG with several frames,
a GIF whose first frame extends past its screen). Pure functions, no I/O; imports nothing of ours.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


class ImageProbeError(ValueError):
    """The data is not an image of the declared format that this module can measure."""


@dataclass(frozen=True)
class ImageHeader:
    width: int
    height: int
    end: int   # the offset just past the image's last byte (== len(data) unless bytes follow it)

    @property
    def pixels(self) -> int:
        return self.width * self.height


def _need(data: bytes, end: int, what: str) -> None:
    if end > len(data):
        raise ImageProbeError(f"the data ends inside the {what} (truncated)")


def _png(data: bytes) -> ImageHeader:
    _need(data, 33, "PNG header")
    length, kind = struct.unpack_from(">I4s", data, 8)
    if kind != b"IHDR" or length != 13:
        raise ImageProbeError("the PNG does not start with its IHDR chunk")
    width, height = struct.unpack_from(">II", data, 16)
    pos = 8
    while True:
        _need(data, pos + 8, "PNG chunk header")
        length, kind = struct.unpack_from(">I4s", data, pos)
        if length > 0x7FFFFFFF:
            raise ImageProbeError(f"a PNG chunk declares {length} bytes (more than PNG allows)")
        pos += 12 + length
        _need(data, pos, f"PNG chunk {kind!r}")
        if kind == b"IEND":
            return ImageHeader(width, height, pos)


# Frame headers (SOFn): baseline, extended, progressive, lossless, and their arithmetic/differential forms.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}   # RSTn, TEM: no length


def _jpeg(data: bytes) -> ImageHeader:
    pos, size, frames = 2, None, 0
    while True:
        _need(data, pos + 2, "JPEG marker")
        if data[pos] != 0xFF:
            raise ImageProbeError(f"the JPEG has no marker at byte {pos}")
        while pos + 1 < len(data) and data[pos + 1] == 0xFF:   # fill bytes
            pos += 1
        _need(data, pos + 2, "JPEG marker")
        marker = data[pos + 1]
        pos += 2
        if marker == 0xD9:   # EOI
            if size is None:
                raise ImageProbeError("the JPEG has no frame header (SOF)")
            return ImageHeader(size[0], size[1], pos)
        if marker in _STANDALONE:
            continue
        _need(data, pos + 2, "JPEG segment length")
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2:
            raise ImageProbeError(f"a JPEG segment declares {length} bytes")
        _need(data, pos + length, f"JPEG segment 0x{marker:02X}")
        if marker in _SOF_MARKERS:
            frames += 1
            if frames > 1:
                raise ImageProbeError("the JPEG has more than one frame (hierarchical JPEG is not served)")
            _need(data, pos + 7, "JPEG frame header")
            height, width = struct.unpack_from(">HH", data, pos + 3)
            size = (width, height)
        pos += length
        if marker == 0xDA:   # start of scan: entropy-coded data up to the next marker that is not RSTn
            while True:
                pos = data.find(b"\xff", pos)
                if pos < 0 or pos + 1 >= len(data):
                    raise ImageProbeError("the JPEG ends inside a scan (truncated: no EOI)")
                following = data[pos + 1]
                if following == 0x00 or 0xD0 <= following <= 0xD7 or following == 0xFF:
                    pos += 1 if following == 0xFF else 2
                    continue
                break


def _gif_sub_blocks(data: bytes, pos: int) -> int:
    while True:
        _need(data, pos + 1, "GIF data sub-block")
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos
        _need(data, pos, "GIF data sub-block")


def _gif(data: bytes) -> ImageHeader:
    _need(data, 13, "GIF screen descriptor")
    width, height, packed = struct.unpack_from("<HHB", data, 6)
    pos = 13 + (3 << ((packed & 7) + 1) if packed & 0x80 else 0)
    first = True
    while True:
        _need(data, pos + 1, "GIF block")
        kind = data[pos]
        if kind == 0x3B:   # trailer
            return ImageHeader(width, height, pos + 1)
        if kind == 0x21:   # extension: label, then sub-blocks
            _need(data, pos + 2, "GIF extension")
            pos = _gif_sub_blocks(data, pos + 2)
        elif kind == 0x2C:   # image descriptor, local colour table, LZW code size, sub-blocks
            _need(data, pos + 10, "GIF image descriptor")
            left, top, w, h, flags = struct.unpack_from("<HHHHB", data, pos + 1)
            if first and (left + w > width or top + h > height):
                raise ImageProbeError(f"the GIF's first frame ({w} x {h} at {left}, {top}) extends past its "
                                      f"{width} x {height} screen")
            first = False
            pos += 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
            pos = _gif_sub_blocks(data, pos + 1)
        else:
            raise ImageProbeError(f"the GIF has an unknown block 0x{kind:02X} at byte {pos}")


def _webp(data: bytes) -> ImageHeader:
    _need(data, 30, "WebP header")
    (riff_size,) = struct.unpack_from("<I", data, 4)
    end = 8 + riff_size
    kind = data[12:16]
    body = 20
    if kind == b"VP8X":
        width = 1 + int.from_bytes(data[body + 4:body + 7], "little")
        height = 1 + int.from_bytes(data[body + 7:body + 10], "little")
    elif kind == b"VP8L":
        if data[body] != 0x2F:
            raise ImageProbeError("the lossless WebP has no signature byte")
        bits = int.from_bytes(data[body + 1:body + 5], "little")
        width, height = 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    elif kind == b"VP8 ":
        if data[body + 3:body + 6] != b"\x9d\x01\x2a":
            raise ImageProbeError("the lossy WebP has no frame start code")
        width, height = (v & 0x3FFF for v in struct.unpack_from("<HH", data, body + 6))
    else:
        raise ImageProbeError(f"the WebP's first chunk {kind!r} is not VP8, VP8L or VP8X")
    _need(data, end, "WebP RIFF container")
    return ImageHeader(width, height, end)


_PROBES = {"png": _png, "jpeg": _jpeg, "gif": _gif, "webp": _webp}


def probe_image(data: bytes, fmt: str) -> ImageHeader:
    """Width, height and end of an image of format ``fmt`` (png, jpeg, gif, webp) whose magic bytes
    were checked already; ImageProbeError when it cannot be measured."""
    try:
        probe = _PROBES[fmt]
    except KeyError:
        raise ImageProbeError(f"unknown image format {fmt!r}") from None
    header = probe(bytes(data) if not isinstance(data, bytes) else data)
    if header.width < 1 or header.height < 1:
        raise ImageProbeError(f"the image declares a size of {header.width} x {header.height} pixels")
    return header
