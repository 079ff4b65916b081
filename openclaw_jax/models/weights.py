"""HF checkpoints (config.json + safetensors) <-> Decoder params, with the HF tensor names.

- `load_hf_checkpoint(dir, mesh=None, dtype=None)` reads `model.safetensors` or a sharded
  checkpoint (`model.safetensors.index.json`). It builds the abstract model (`nnx.eval_shape`),
  derives each param's target sharding, and places the params one HF tensor at a time with
  `jax.make_array_from_callback` (stacked layer params filled layer by layer, in place), so every
  device receives only its own shard, read straight from the memory-mapped file; neither a
  device nor the host ever holds the whole model. `dtype` is the compute dtype, `param_dtype`
  the stored one (`apply_dtypes`). `openclaw_jax.models.hub.load_pretrained` is the one loader
  the rest of the code calls (HF dirs and the packaged GGUF).
- `save_hf_checkpoint(model, cfg, out_dir, max_shard_bytes=None)` writes `config.json` and
  safetensors (sharded HF-style when `max_shard_bytes` is given) atomically.
- `state_dict_from_model` / `model_from_state_dict` convert to and from `{hf_name: ndarray}`.

The safetensors format (8-byte little-endian header length, JSON header, raw little-endian
bytes) is read and written here directly: this gives memory-mapped reads, bfloat16 through
`ml_dtypes`, and errors that name the file and the tensor when a file is truncated or corrupt.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.parallel.sharding import state_shardings

logger = logging.getLogger(__name__)

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"

_ST_TO_NP: dict[str, Any] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NP_TO_ST = {v: k for k, v in _ST_TO_NP.items()}


class CheckpointError(ValueError):
    """A checkpoint file is missing, corrupt, or does not match the model config."""


# ---------------------------------------------------------------------------------------------
# safetensors files


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def read_safetensors_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header; {tensor name: TensorInfo}.

    Raises CheckpointError naming the file (and the tensor) when the file is truncated, the
    header is not valid JSON, a dtype is unknown, or a tensor's byte range is inconsistent.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"safetensors file {str(path)!r} does not exist")
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: file is truncated ({size} bytes; a safetensors file starts with an "
                                  f"8-byte header length)")
        (header_len,) = struct.unpack("<Q", prefix)
        if 8 + header_len > size:
            raise CheckpointError(f"{path}: file is truncated or corrupt: header says {header_len} header bytes "
                                  f"but the file has only {size} bytes")
        raw = f.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header (not valid JSON: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (expected a JSON object)")
    data_start = 8 + header_len
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt header entry for tensor {name!r}: {entry!r}") from None
        if dtype_name not in _ST_TO_NP:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype_name!r}")
        dtype = _ST_TO_NP[dtype_name]
        expected = math.prod(shape) * dtype.itemsize
        if end - begin != expected or begin < 0:
            raise CheckpointError(f"{path}: tensor {name!r} byte range [{begin}, {end}) does not match its "
                                  f"dtype {dtype_name} and shape {list(shape)} ({expected} bytes)")
        if data_start + end > size:
            raise CheckpointError(f"{path}: file is truncated: tensor {name!r} needs bytes up to "
                                  f"{data_start + end} but the file has {size} bytes")
        infos[name] = TensorInfo(name, path, dtype, shape, data_start + begin, data_start + end)
    return infos


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` to `path` (via a temp file + rename, fsynced)."""
    path = Path(path)
    header: dict[str, Any] = {}
    arrays = []
    offset = 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        if arr.dtype not in _NP_TO_ST:
            raise CheckpointError(f"cannot write tensor {name!r} with dtype {arr.dtype} to safetensors")
        header[name] = {"dtype": _NP_TO_ST[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for arr in arrays:
                f.write(memoryview(arr.reshape(-1).view(np.uint8)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class _MemmapCache:
    def __init__(self) -> None:
        self._maps: dict[Path, np.memmap] = {}

    def read(self, info: TensorInfo) -> np.ndarray:
        mm = self._maps.get(info.file)
        if mm is None:
            mm = self._maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="r")
        return mm[info.start:info.end].view(info.dtype).reshape(info.shape)


# ---------------------------------------------------------------------------------------------
# tensor sources (a checkpoint directory or an in-memory state dict)


class TensorSource:
    """Named HF tensors, read one at a time (a checkpoint directory, a GGUF file, a state dict)."""

    def describe(self, name: str) -> str: ...
    def shape(self, name: str) -> tuple[int, ...] | None: ...
    def read(self, name: str) -> np.ndarray: ...
    def names(self) -> Iterable[str]: ...


class DictSource(TensorSource):
    def __init__(self, tensors: Mapping[str, Any]):
        self._tensors = tensors

    def describe(self, name):
        return "state dict"

    def shape(self, name):
        value = self._tensors.get(name)
        return None if value is None else tuple(np.shape(value))

    def read(self, name):
        return np.asarray(self._tensors[name])

    def names(self):
        return self._tensors.keys()


class SafetensorsSource(TensorSource):
    def __init__(self, model_dir: Path):
        single, index = model_dir / SAFETENSORS_FILE, model_dir / SAFETENSORS_INDEX
        self._infos: dict[str, TensorInfo] = {}
        if single.is_file():
            self._where = str(single)
            self._infos.update(read_safetensors_header(single))
        elif index.is_file():
            self._where = str(index)
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: corrupt index ({e!r}); expected JSON with a 'weight_map'") from None
            headers: dict[str, dict[str, TensorInfo]] = {}
            for name, file in weight_map.items():
                if file not in headers:
                    path = model_dir / file
                    if not path.is_file():
                        raise CheckpointError(f"{index}: tensor {name!r} is mapped to {file!r}, which does not "
                                              f"exist in {model_dir}")
                    headers[file] = read_safetensors_header(path)
                if name not in headers[file]:
                    raise CheckpointError(f"{model_dir / file}: tensor {name!r} listed in {SAFETENSORS_INDEX} is "
                                          f"not in this file")
                self._infos[name] = headers[file][name]
        else:
            raise CheckpointError(f"{model_dir}: no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX} found "
                                  f"(files: {sorted(p.name for p in model_dir.iterdir())[:20]})")
        self._mmaps = _MemmapCache()

    def describe(self, name):
        info = self._infos.get(name)
        return str(info.file) if info else self._where

    def shape(self, name):
        info = self._infos.get(name)
        return None if info is None else info.shape

    def read(self, name):
        return self._mmaps.read(self._infos[name])

    def names(self):
        return self._infos.keys()


# ---------------------------------------------------------------------------------------------
# the per-family HF name map


@dataclass(frozen=True)
class TensorMapping:
    """One of our params <-> one HF tensor (per layer `i` when `stacked`)."""

    path: tuple[str, ...]  # path in nnx.state(Decoder)
    hf_name: str  # "model.layers.{i}.self_attn.q_proj.weight"
    stacked: bool
    hf_shape: tuple[int, ...]  # per layer
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]

    def names(self, num_layers: int) -> list[str]:
        return [self.hf_name.format(i=i) for i in range(num_layers)] if self.stacked else [self.hf_name]


def _identity(x):
    return x


def _transpose(x):
    return x.T


def hf_name_map(cfg: ModelConfig) -> list[TensorMapping]:
    """HF tensor names for every Decoder param of this family/config.

    HF Linear weights are [out, in]; ours are [in, out] with attention heads as their own axis
    (q kernel [H, heads, head_dim], o kernel [heads, head_dim, H]).
    """
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    N, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def heads_in(heads):  # HF [heads*D, H] -> ours [H, heads, D]
        return (lambda w: w.T.reshape(H, heads, D)), (lambda k: k.reshape(H, heads * D).T)

    def heads_bias(heads):
        return (lambda b: b.reshape(heads, D)), (lambda b: b.reshape(heads * D))

    o_in = (lambda w: w.T.reshape(N, D, H)), (lambda k: k.reshape(N * D, H).T)

    def m(path, hf, stacked, hf_shape, conv=(_identity, _identity)):
        return TensorMapping(tuple(path.split(".")), hf, stacked, tuple(hf_shape), conv[0], conv[1])

    layer = "model.layers.{i}."
    out = [
        m("embed_tokens", "model.embed_tokens.weight", False, (V, H)),
        m("norm.weight", "model.norm.weight", False, (H,)),
        m("layers.input_layernorm.weight", layer + "input_layernorm.weight", True, (H,)),
        m("layers.post_attention_layernorm.weight", layer + "post_attention_layernorm.weight", True, (H,)),
        m("layers.self_attn.q_proj.kernel", layer + "self_attn.q_proj.weight", True, (N * D, H), heads_in(N)),
        m("layers.self_attn.k_proj.kernel", layer + "self_attn.k_proj.weight", True, (K * D, H), heads_in(K)),
        m("layers.self_attn.v_proj.kernel", layer + "self_attn.v_proj.weight", True, (K * D, H), heads_in(K)),
        m("layers.self_attn.o_proj.kernel", layer + "self_attn.o_proj.weight", True, (H, N * D), o_in),
        m("layers.mlp.gate_proj.kernel", layer + "mlp.gate_proj.weight", True, (I, H), (_transpose, _transpose)),
        m("layers.mlp.up_proj.kernel", layer + "mlp.up_proj.weight", True, (I, H), (_transpose, _transpose)),
        m("layers.mlp.down_proj.kernel", layer + "mlp.down_proj.weight", True, (H, I), (_transpose, _transpose)),
    ]
    if cfg.attention_bias:  # Qwen2
        out += [
            m("layers.self_attn.q_proj.bias", layer + "self_attn.q_proj.bias", True, (N * D,), heads_bias(N)),
            m("layers.self_attn.k_proj.bias", layer + "self_attn.k_proj.bias", True, (K * D,), heads_bias(K)),
            m("layers.self_attn.v_proj.bias", layer + "self_attn.v_proj.bias", True, (K * D,), heads_bias(K)),
        ]
    if cfg.qk_norm:  # Qwen3
        out += [
            m("layers.self_attn.q_norm.weight", layer + "self_attn.q_norm.weight", True, (D,)),
            m("layers.self_attn.k_norm.weight", layer + "self_attn.k_norm.weight", True, (D,)),
        ]
    if not cfg.tie_word_embeddings:
        out.append(m("lm_head.kernel", "lm_head.weight", False, (V, H), (_transpose, _transpose)))
    return out


# HF tensors that carry no parameters of ours (rotary caches some exporters include).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ---------------------------------------------------------------------------------------------
# loading


def _validate(cfg: ModelConfig, mappings: list[TensorMapping], source: TensorSource) -> None:
    problems = []
    for mp in mappings:
        for name in mp.names(cfg.num_layers):
            shape = source.shape(name)
            if shape is None:
                problems.append(f"{source.describe(name)}: tensor {name!r} is missing")
            elif tuple(shape) != mp.hf_shape:
                problems.append(f"{source.describe(name)}: tensor {name!r} has shape {list(shape)}, the config "
                                f"({cfg.family}, hidden={cfg.hidden_size}, heads={cfg.num_heads}/"
                                f"{cfg.num_kv_heads}x{cfg.head_dim}, vocab={cfg.vocab_size}) needs "
                                f"{list(mp.hf_shape)}")
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise CheckpointError("checkpoint does not match the model: " + "; ".join(problems[:10]) + more)
    known = {n for mp in mappings for n in mp.names(cfg.num_layers)}
    extra = [n for n in source.names() if n not in known]
    if cfg.tie_word_embeddings:
        extra = [n for n in extra if n != "lm_head.weight"]  # some exporters write the tied head
    extra = [n for n in extra if not n.endswith(_IGNORED_SUFFIXES)]
    if extra:
        raise CheckpointError(f"{source.describe(extra[0])}: unexpected tensors not used by a {cfg.family} model: "
                              f"{extra[:10]}; is the config.json right (e.g. attention_bias, tie_word_embeddings)?")


def build_model(cfg: ModelConfig, source: TensorSource, mesh: jax.sharding.Mesh | None):
    """The abstract model (`nnx.eval_shape`), its target shardings, then each param placed straight
    onto its shards, one HF tensor at a time (host memory ~ the largest tensor)."""
    mappings = hf_name_map(cfg)
    _validate(cfg, mappings, source)
    return place_params(lambda: Decoder(cfg, rngs=nnx.Rngs(0)), [(mp.path, mp) for mp in mappings], source, mesh,
                        cfg.family)


def place_params(make_model, paths: list[tuple[tuple, "TensorMapping"]], source: TensorSource,
                 mesh: jax.sharding.Mesh | None, family: str):
    """`make_model()` built abstractly, then each param (its HF tensor found through `paths`: param path ->
    mapping) read from `source` and placed straight onto its shards (on one device without a mesh)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(make_model))
    if mesh is not None:
        shardings = dict(nnx.to_flat_state(state_shardings(abstract, mesh, family)))
    else:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = None
    by_path = dict(paths)
    values = []
    for path, var in nnx.to_flat_state(abstract):
        path = tuple(path)
        mp = by_path.get(path)
        if mp is None:
            raise CheckpointError(f"internal: no HF name for param {'.'.join(map(str, path))}")
        target = var.get_value()
        sharding = shardings[path] if shardings is not None else device
        values.append((path, var.replace(_make_param(mp, source, target.shape, target.dtype, sharding))))
    return nnx.merge(graphdef, nnx.from_flat_state(values))


def _layer_sharding(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """The sharding of one layer of a stacked param (its leading, unsharded "layers" axis dropped)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec)
        if spec and spec[0] is not None:
            raise CheckpointError(f"internal: stacked params must not be sharded over layers (spec {sharding.spec})")
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec[1:]))
    return sharding


@functools.lru_cache(maxsize=None)
def _placement_fns(shape: tuple[int, ...], dtype: np.dtype, sharding: jax.sharding.Sharding):
    """Jitted (zeros, set layer i) for a stacked param: the stack is filled in place (donated)."""
    zeros = jax.jit(lambda: jax.numpy.zeros(shape, dtype), out_shardings=sharding)
    set_layer = jax.jit(lambda stack, layer, i: stack.at[i].set(layer), donate_argnums=0, out_shardings=sharding)
    return zeros, set_layer


def _make_param(mp: TensorMapping, source: TensorSource, shape, dtype, sharding) -> jax.Array:
    """One param on its shards. Each HF tensor is read (memory-mapped), converted to our layout
    and dtype once, and every device copies only its own slice; stacked params are filled one
    layer at a time on the devices, so at most one converted HF tensor is on the host at once."""

    def converted(name: str) -> np.ndarray:
        raw = source.read(name)
        try:
            return np.asarray(mp.to_ours(raw)).astype(dtype, copy=False)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{source.describe(name)}: cannot read tensor {name!r}: {e}") from e

    def place(value: np.ndarray, target_shape, target_sharding) -> jax.Array:
        return jax.make_array_from_callback(tuple(target_shape), target_sharding,
                                            lambda index: np.ascontiguousarray(value[index]))

    if not mp.stacked:
        return place(converted(mp.hf_name), shape, sharding)
    zeros, set_layer = _placement_fns(tuple(shape), np.dtype(dtype), sharding)
    layer_sharding = _layer_sharding(sharding)
    stack = zeros()
    for i, name in enumerate(mp.names(shape[0])):
        layer = place(converted(name), shape[1:], layer_sharding)
        stack = set_layer(stack, layer, np.int32(i))
        del layer
    return stack


def apply_dtypes(cfg: ModelConfig, dtype: Any = None, param_dtype: Any = None) -> ModelConfig:
    """`dtype` = compute dtype, `param_dtype` = dtype the params are stored in. Only `dtype` given:
    both (pure precision, the old behaviour); only `param_dtype`: float32 compute."""
    if dtype is None and param_dtype is None:
        return cfg
    compute = jax.numpy.dtype(dtype).name if dtype is not None else "float32"
    stored = jax.numpy.dtype(param_dtype).name if param_dtype is not None else compute
    return cfg.replace(dtype=compute, param_dtype=stored)


def read_hf_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(model_dir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: no {CONFIG_FILE} (is this an HF model directory?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def load_hf_checkpoint(model_dir: str | os.PathLike, *, mesh: jax.sharding.Mesh | None = None,
                       dtype: str | None = None, param_dtype: str | None = None):
    """(Decoder, ModelConfig) from an HF directory; dtypes as in `apply_dtypes`."""
    model_dir = Path(model_dir)
    cfg = apply_dtypes(ModelConfig.from_hf_dict(read_hf_config(model_dir)), dtype, param_dtype)
    source = SafetensorsSource(model_dir)
    model = build_model(cfg, source, mesh)
    logger.info("loaded %s checkpoint %s (%d layers, param dtype %s)", cfg.family, model_dir, cfg.num_layers,
                cfg.param_dtype)
    return model, cfg


def model_from_state_dict(cfg: ModelConfig, state_dict: Mapping[str, Any], mesh: jax.sharding.Mesh | None = None):
    """A Decoder from `{hf_name: array}` (HF layout, or any lazy Mapping: tensors are read one at a
    time), each param placed straight on its shards."""
    return build_model(cfg, state_dict if isinstance(state_dict, TensorSource) else DictSource(state_dict), mesh)


# ---------------------------------------------------------------------------------------------
# saving


def _to_host(value: jax.Array) -> np.ndarray:
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        from jax.experimental import multihost_utils

        value = multihost_utils.process_allgather(value, tiled=True)
    return np.asarray(jax.device_get(value))


def state_dict_from_model(model) -> dict[str, np.ndarray]:
    """`{hf_name: ndarray}` in HF layout and the param dtype (bfloat16 as ml_dtypes.bfloat16)."""
    if getattr(model, "lora", None) is not None:
        raise ValueError("model has LoRA adapters; export merge_lora(model) instead")
    cfg = model.cfg
    flat = {tuple(p): v for p, v in nnx.to_flat_state(nnx.state(model))}
    out: dict[str, np.ndarray] = {}
    for mp in hf_name_map(cfg):
        value = _to_host(flat[mp.path].get_value())
        if mp.stacked:
            for i, name in enumerate(mp.names(cfg.num_layers)):
                out[name] = np.ascontiguousarray(mp.to_hf(value[i]))
        else:
            out[mp.hf_name] = np.ascontiguousarray(mp.to_hf(value))
    return out


def _shard_plan(tensors: Mapping[str, np.ndarray], max_shard_bytes: int | None) -> list[list[str]]:
    names = sorted(tensors)
    if max_shard_bytes is None:
        return [names]
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be positive (or None for one file)")
    shards: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = tensors[name].nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _write_checkpoint_files(directory: Path, tensors: Mapping[str, np.ndarray], hf_config: Mapping[str, Any],
                            max_shard_bytes: int | None) -> list[str]:
    plan = _shard_plan(tensors, max_shard_bytes)
    written = []
    if len(plan) == 1 and max_shard_bytes is None:
        write_safetensors(directory / SAFETENSORS_FILE, tensors)
        written.append(SAFETENSORS_FILE)
    else:
        weight_map = {}
        for k, names in enumerate(plan):
            file = f"model-{k + 1:05d}-of-{len(plan):05d}.safetensors"
            write_safetensors(directory / file, {n: tensors[n] for n in names})
            weight_map.update({n: file for n in names})
            written.append(file)
        index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
                 "weight_map": dict(sorted(weight_map.items()))}
        _write_json(directory / SAFETENSORS_INDEX, index)
        written.append(SAFETENSORS_INDEX)
    _write_json(directory / CONFIG_FILE, hf_config)
    written.append(CONFIG_FILE)
    return written


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_hf_checkpoint(model, cfg: ModelConfig | None, out_dir: str | os.PathLike,
                       max_shard_bytes: int | None = None, *, extra_config: Mapping[str, Any] | None = None) -> Path:
    """Write `config.json` + safetensors for `model` (HF names; loadable by `transformers`).

    Atomic: into a fresh directory the files are written in a temp directory that is renamed
    into place; into an existing directory (e.g. one holding tokenizer files) each file is
    written to a temp name and renamed, weights first and `config.json` last, and stale weight
    files from an earlier save are removed. `extra_config` keys (e.g. the original HF config's
    token ids) are kept unless ours define them. Multi-host: every process must call this (the
    gather is collective); only process 0 writes. A text decoder only: `models.hub.save_checkpoint`
    also saves a Qwen2.5-VL model (`models.qwen_vl.save_qwen_vl_checkpoint`).
    """
    cfg = cfg or model.cfg
    tensors = state_dict_from_model(model)
    if jax.process_index() != 0:
        return Path(out_dir)
    hf_config = dict(extra_config or {})
    hf_config.update(cfg.to_hf_dict())
    out = Path(out_dir)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _write_checkpoint_files(tmp, tensors, hf_config, max_shard_bytes)
            _fsync_dir(tmp)
            os.rename(tmp, out)
            _fsync_dir(out.parent)
            logger.info("saved checkpoint to %s", out)
            return out
        except OSError:
            if not out.exists():
                raise
            # Someone created out_dir meanwhile: fall through to the in-place path.
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    written = set(_write_checkpoint_files(out, tensors, hf_config, max_shard_bytes))
    for stale in list(out.iterdir()):
        is_weight = stale.name == SAFETENSORS_INDEX or (stale.name.startswith("model")
                                                        and stale.name.endswith(".safetensors"))
        if is_weight and stale.name not in written:
            stale.unlink()
    _fsync_dir(out)
    logger.info("saved checkpoint to %s", out)
    return out
