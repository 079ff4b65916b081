"""Qwen2.5-VL (models/qwen_vl.py, models/vision.py) equals HF `transformers` (PyTorch CPU, float32)
on a tiny random checkpoint that `transformers` itself creates and saves: logits and per-token
log-probs for a text-only prompt and for prompts with images; the M-RoPE positions equal HF's
`get_rope_index`; the shipped Qwen2.5-VL configs parse as HF parses them."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from openclaw_jax.models.qwen_vl import QwenVLConfig, load_qwen_vl_checkpoint, mrope_positions
from openclaw_jax.models.vision import vision_layout

TOL = 1e-4
ROOT = Path(__file__).resolve().parents[2]
IMAGE, VSTART, VEND = 250, 248, 249
MERGE = 2


def _hf_config() -> transformers.Qwen2_5_VLConfig:
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    # window 56 px = 2 x 2 merged blocks: the test images have several windows, some cut at the edge
    vision = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=14,
                  spatial_merge_size=MERGE, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                  hidden_act="silu", tokens_per_second=2)
    return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE,
                                         video_token_id=251, vision_start_token_id=VSTART, vision_end_token_id=VEND,
                                         tie_word_embeddings=False, attn_implementation="eager")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(HF model, our model, our config): HF creates, randomises every weight and saves; we load the dir."""
    torch.manual_seed(0)
    hf = transformers.Qwen2_5_VLForConditionalGeneration(_hf_config()).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.3 * noise if "norm" in name or "ln_q" in name else 0.15 * noise)
    out = tmp_path_factory.mktemp("qwen25vl")
    hf.save_pretrained(out)
    model, cfg = load_qwen_vl_checkpoint(out)
    return hf, model, cfg


def _patches(rng, grid) -> np.ndarray:
    n = sum(t * h * w for t, h, w in grid)
    return rng.standard_normal((n, 3 * 2 * 14 * 14)).astype(np.float32)


def _prompt(rng, before: int, grid_row, after: int) -> list[int]:
    t, h, w = grid_row
    text = lambda n: rng.integers(0, 240, size=n).tolist()  # noqa: E731  (below the special ids)
    return text(before) + [VSTART] + [IMAGE] * (t * h * w // MERGE ** 2) + [VEND] + text(after)


def _hf_logits(hf, ids, pixel_values=None, grid=None, attention_mask=None) -> np.ndarray:
    kwargs = {"input_ids": torch.tensor(ids, dtype=torch.long)}
    if pixel_values is not None:
        kwargs.update(pixel_values=torch.tensor(pixel_values), image_grid_thw=torch.tensor(grid, dtype=torch.long),
                      mm_token_type_ids=torch.tensor((np.asarray(ids) == IMAGE).astype(np.int64)))
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.tensor(attention_mask, dtype=torch.long)
    with torch.no_grad():
        return hf(**kwargs).logits.float().numpy()


def _logprobs(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log p(ids[t + 1] | ids[:t + 1]) `[B, L - 1]`."""
    lp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    return np.asarray(jnp.take_along_axis(lp[:, :-1], jnp.asarray(ids)[:, 1:, None], axis=-1)[..., 0])


def _compare(ours, ref, ids, mask=None):
    assert ours.shape == ref.shape and ours.dtype == np.float32
    keep = np.ones(ids.shape, bool) if mask is None else mask.astype(bool)
    logit_diff = float(np.abs(ours - ref)[keep].max())
    lp_diff = float(np.abs(_logprobs(ours, ids) - _logprobs(ref, ids))[keep[:, 1:] & keep[:, :-1]].max())
    print(f"max |logit diff| {logit_diff:.2e}, max |log-prob diff| {lp_diff:.2e}")
    assert logit_diff <= TOL, logit_diff
    assert lp_diff <= TOL, lp_diff
    # the logits are not trivially equal (e.g. all zero): the model does something
    assert float(np.abs(ref).max()) > 1.0


def test_config_round_trip(checkpoint):
    hf, _, cfg = checkpoint
    assert cfg.text.family == "qwen2" and cfg.text.attention_bias and cfg.text.mrope_section == (2, 3, 3)
    assert cfg.text.head_dim == 16 and cfg.vision.fullatt_block_indexes == (1,) and cfg.vision.window_size == 56
    assert cfg.image_token_id == IMAGE and not cfg.text.tie_word_embeddings
    again = QwenVLConfig.from_hf_dict(json.loads(json.dumps(cfg.to_hf_dict())))
    assert again == cfg
    # transformers reads our public-layout dict into the same architecture
    hf_again = transformers.Qwen2_5_VLConfig.from_dict(cfg.to_hf_dict())
    assert hf_again.text_config.rope_parameters["mrope_section"] == [2, 3, 3]
    assert hf_again.vision_config.fullatt_block_indexes == [1] and hf_again.text_config.num_hidden_layers == 2


def test_text_only_prompt(checkpoint):
    hf, model, _ = checkpoint
    ids = np.random.default_rng(0).integers(0, 240, size=(2, 11)).astype(np.int32)
    ours = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids)))
    _compare(ours, _hf_logits(hf, ids), ids)


def test_one_image_prompt(checkpoint):
    hf, model, _ = checkpoint
    rng = np.random.default_rng(1)
    grid = [(1, 6, 10)]  # 3 x 5 merged blocks: windows of 2 x 2 cut at the right and bottom edges
    ids = np.asarray([_prompt(rng, 5, grid[0], 6)], np.int32)
    pixels = _patches(rng, grid)
    ref = _hf_logits(hf, ids, pixels, grid)
    fwd = nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=grid))
    ours = np.asarray(fwd(model, jnp.asarray(ids), jnp.asarray(pixels)))
    _compare(ours, ref, ids)
    # the image matters: other pixels change the text tokens after it (the test can fail)
    other = np.asarray(fwd(model, jnp.asarray(ids), jnp.asarray(pixels[::-1].copy())))
    assert np.abs(other[0, -3:] - ours[0, -3:]).max() > 1e-2


def test_two_images_batch_with_padding(checkpoint):
    """Two rows with one image each (different grids), both left-padded to one length: the images
    fill the placeholders in row-major order and padding neither counts nor advances positions."""
    hf, model, _ = checkpoint
    rng = np.random.default_rng(2)
    grid = [(1, 4, 4), (1, 8, 6)]
    row0 = _prompt(rng, 3, grid[0], 12)
    row1 = _prompt(rng, 2, grid[1], 2)
    L = max(len(row0), len(row1))
    ids = np.zeros((2, L), np.int32)
    mask = np.zeros((2, L), np.int32)
    ids[0, L - len(row0):], mask[0, L - len(row0):] = row0, 1
    ids[1, L - len(row1):], mask[1, L - len(row1):] = row1, 1
    pixels = _patches(rng, grid)
    ref = _hf_logits(hf, ids, pixels, grid, mask)
    ours = np.asarray(nnx.jit(lambda m, x, p, a: m(x, attention_mask=a, pixel_values=p, image_grid_thw=grid))(
        model, jnp.asarray(ids), jnp.asarray(pixels), jnp.asarray(mask)))
    _compare(ours, ref, ids, mask)


def test_mrope_positions_match_get_rope_index(checkpoint):
    hf, _, _ = checkpoint
    rng = np.random.default_rng(3)
    grid = [(1, 4, 6), (1, 6, 4), (2, 4, 4)]
    ids = np.asarray([_prompt(rng, 2, grid[0], 3) + _prompt(rng, 1, grid[1], 0) + _prompt(rng, 0, grid[2], 4)],
                     np.int32)
    ref, ref_delta = hf.model.get_rope_index(torch.tensor(ids, dtype=torch.long),
                                             mm_token_type_ids=torch.tensor((ids == IMAGE).astype(np.int64)),
                                             image_grid_thw=torch.tensor(grid))
    ours, delta = mrope_positions(jnp.asarray(ids), grid, IMAGE, MERGE)
    np.testing.assert_array_equal(np.asarray(ours), ref.numpy())
    np.testing.assert_array_equal(np.asarray(delta), ref_delta.numpy().reshape(-1))


def test_vision_layout_matches_hf_window_index(checkpoint):
    from transformers.vision_utils import get_vision_window_index

    _, _, cfg = checkpoint
    grid = [(1, 6, 10), (2, 8, 4)]
    window_index, cu = get_vision_window_index(torch.tensor(grid), spatial_merge_size=MERGE, window_size=56,
                                               patch_size=14)
    layout = vision_layout(cfg.vision, grid)
    np.testing.assert_array_equal(np.argsort(layout.merged_inverse), window_index.numpy())
    bounds = np.flatnonzero(np.diff(layout.window_ids)) + 1
    np.testing.assert_array_equal(bounds, cu.numpy()[1:-1])


@pytest.mark.parametrize("name,layers,hidden,tied,vocab", [("qwen2.5-vl-3b-instruct", 36, 2048, True, 151936),
                                                            ("qwen2.5-vl-7b-instruct", 28, 3584, False, 152064)])
def test_shipped_configs_parse_like_transformers(name, layers, hidden, tied, vocab):
    raw = json.loads((ROOT / "configs" / "models" / name / "config.json").read_text())
    cfg = QwenVLConfig.from_hf_dict(raw)
    ref = transformers.Qwen2_5_VLConfig.from_dict(raw)
    t, v = cfg.text, cfg.vision
    assert (t.num_layers, t.hidden_size, t.tie_word_embeddings, t.vocab_size) == (layers, hidden, tied, vocab)
    rt = ref.text_config
    assert (t.num_layers, t.hidden_size, t.intermediate_size, t.num_heads, t.num_kv_heads, t.vocab_size) == (
        rt.num_hidden_layers, rt.hidden_size, rt.intermediate_size, rt.num_attention_heads, rt.num_key_value_heads,
        rt.vocab_size)
    assert t.rope_theta == rt.rope_parameters["rope_theta"]
    assert list(t.mrope_section) == rt.rope_parameters["mrope_section"]
    assert bool(ref.tie_word_embeddings) == t.tie_word_embeddings
    rv = ref.vision_config
    assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.out_hidden_size, v.window_size) == (
        rv.depth, rv.hidden_size, rv.intermediate_size, rv.num_heads, rv.out_hidden_size, rv.window_size)
    assert list(v.fullatt_block_indexes) == list(rv.fullatt_block_indexes) and v.out_hidden_size == t.hidden_size
    assert cfg.image_token_id == ref.image_token_id == 151655


@pytest.mark.parametrize("name", ["qwen2.5-vl-3b-instruct", "qwen2.5-vl-7b-instruct"])
def test_full_size_name_map_matches_transformers(name):
    """Every tensor of the real-size HF model (built on the meta device: no weights) has our name and
    shape, and our abstract model holds exactly as many parameters."""
    from openclaw_jax.models.qwen_vl import QwenVL, vl_name_map

    raw = json.loads((ROOT / "configs" / "models" / name / "config.json").read_text())
    cfg = QwenVLConfig.from_hf_dict(raw)
    with torch.device("meta"):
        hf = transformers.Qwen2_5_VLForConditionalGeneration(transformers.Qwen2_5_VLConfig.from_dict(raw))
    aliases = (("model.language_model.", "model."), ("model.visual.", "visual."))
    hf_shapes = {}
    for key, value in hf.state_dict().items():
        for new, old in aliases:
            if key.startswith(new):
                key = old + key[len(new):]
        hf_shapes[key] = tuple(value.shape)
    if cfg.text.tie_word_embeddings:
        hf_shapes.pop("lm_head.weight", None)
    ours = {n: mp.hf_shape for mp, layers in vl_name_map(cfg) for n in mp.names(layers)}
    assert ours == hf_shapes
    abstract = nnx.state(nnx.eval_shape(lambda: QwenVL(cfg, rngs=nnx.Rngs(0))))
    count = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(abstract))
    assert count == sum(int(np.prod(s)) for s in hf_shapes.values())
    print(f"{name}: {count / 1e9:.3f} B parameters")


def test_sharding_rules_cover_every_param(checkpoint):
    from jax.sharding import PartitionSpec

    from openclaw_jax.parallel.sharding import MESH_AXES, state_partition_specs

    _, model, cfg = checkpoint
    mesh = jax.make_mesh((1, 1, 1), MESH_AXES)
    specs = state_partition_specs(nnx.state(model), mesh, cfg.text.family)
    assert all(isinstance(s, PartitionSpec) for s in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec)))


def test_gradient_reaches_the_vision_tower(checkpoint):
    """The log-prob of the text after an image has a finite gradient that reaches the ViT's first
    block and the patch embedding (the trainer's passes will differentiate through pixels)."""
    _, model, _ = checkpoint
    rng = np.random.default_rng(4)
    grid = [(1, 4, 4)]
    ids = jnp.asarray([_prompt(rng, 2, grid[0], 4)], jnp.int32)
    pixels = jnp.asarray(_patches(rng, grid))
    graphdef, state = nnx.split(model)

    def loss(state):
        m = nnx.merge(graphdef, state)
        hidden = m.hidden_states(ids, pixel_values=pixels, image_grid_thw=grid)
        lp = jax.nn.log_softmax(m.logits(hidden)[:, :-1], axis=-1)
        return -jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1).sum()

    grads = jax.jit(jax.grad(loss))(state)
    patch = np.asarray(grads["visual"]["patch_embed"][...])
    qkv = np.asarray(grads["visual"]["blocks"]["attn"]["qkv"]["kernel"][...])
    assert np.isfinite(patch).all() and np.abs(patch).max() > 0
    assert np.isfinite(qkv).all() and np.abs(qkv[0]).max() > 0


def test_text_config_parser_points_to_the_vl_parser():
    from openclaw_jax.models.config import ModelConfig, ModelConfigError

    raw = json.loads((ROOT / "configs" / "models" / "qwen2.5-vl-3b-instruct" / "config.json").read_text())
    with pytest.raises(ModelConfigError, match="QwenVLConfig"):
        ModelConfig.from_hf_dict(raw)


def test_vision_tower_matches_transformers_with_frames(checkpoint):
    """The ViT + merger alone on a 2-frame grid and a cut-window image (frames are separate segments
    in the full-attention blocks, windows in the others)."""
    hf, model, _ = checkpoint
    grid = [(2, 4, 6), (1, 6, 10)]
    pixels = _patches(np.random.default_rng(5), grid)
    with torch.no_grad():
        ref = hf.model.visual(torch.tensor(pixels), grid_thw=torch.tensor(grid)).pooler_output.numpy()
    ours = np.asarray(nnx.jit(lambda m, p: m.visual(p, grid))(model, jnp.asarray(pixels)))
    assert ours.shape == ref.shape == (sum(t * h * w for t, h, w in grid) // MERGE ** 2, 64)
    diff = float(np.abs(ours - ref).max())
    print(f"vision max |diff| {diff:.2e}")
    assert diff <= TOL, diff


@pytest.mark.parametrize("size", [(100, 150), (37, 300), (900, 700)])
def test_image_processing_matches_transformers(size):
    """Our PIL/numpy processor gives HF `Qwen2VLImageProcessorPil`'s pixel_values and grid (offline,
    default settings; 900 x 700 with a small max_pixels is downscaled, 37 x 300 upscaled)."""
    import io

    from PIL import Image

    from openclaw_jax.models.image_processing import ImageProcessorConfig, process_images
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    h, w = size
    rgb = np.random.default_rng(h).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    max_pixels = 28 * 28 * 64
    ref = Qwen2VLImageProcessorPil(max_pixels=max_pixels)(images=[Image.fromarray(rgb)], return_tensors="np")
    png = io.BytesIO()
    Image.fromarray(rgb).save(png, format="PNG")
    pixels, grid = process_images([png.getvalue()], ImageProcessorConfig(max_pixels=max_pixels))
    np.testing.assert_array_equal(grid, ref["image_grid_thw"])
    assert pixels.shape == ref["pixel_values"].shape
    assert np.abs(pixels - ref["pixel_values"]).max() <= 1e-5


def test_prefill_then_decode_equals_full_forward(checkpoint):
    """Prompt with an image prefilled into a KV cache, then 4 tokens decoded one at a time at
    slot s / rope position s + delta: each step's logits equal the full forward's (HF-parity above)."""
    _, model, _ = checkpoint
    rng = np.random.default_rng(6)
    grid = [(1, 6, 4)]
    prompt = _prompt(rng, 3, grid[0], 2)
    tail = rng.integers(0, 240, size=4).tolist()
    ids = jnp.asarray([prompt + tail], jnp.int32)
    pixels = jnp.asarray(_patches(rng, grid))
    full = np.asarray(nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=grid))(model, ids, pixels))
    P = len(prompt)

    @nnx.jit
    def prefill(m, x, p):
        hidden, cache, deltas = m.prefill_hidden(x, m.init_cache(1, 32), pixel_values=p, image_grid_thw=grid)
        return m.logits(hidden), cache, deltas

    logits, cache, deltas = prefill(model, ids[:, :P], pixels)
    assert int(deltas[0]) == max(3, 2) - 3 * 2  # the 3 x 2 merged image: 6 tokens advance positions by 3
    assert np.abs(np.asarray(logits) - full[:, :P]).max() <= TOL
    step = nnx.jit(lambda m, x, pos, c, d: m.decode(x, pos, c, d))
    for s in range(P, P + 4):
        logits, cache = step(model, ids[:, s:s + 1], jnp.asarray([[s]], jnp.int32), cache, deltas)
        assert np.abs(np.asarray(logits)[:, 0] - full[:, s]).max() <= TOL, s


def test_saved_checkpoint_loads_in_transformers(checkpoint, tmp_path):
    """Our export (public tensor names, sharded) loads in transformers and in our loader, same logits."""
    from openclaw_jax.models.qwen_vl import save_qwen_vl_checkpoint

    _, model, _ = checkpoint
    save_qwen_vl_checkpoint(model, tmp_path / "out", max_shard_bytes=200_000)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path / "out",
                                                                        attn_implementation="eager").eval()
    again, _ = load_qwen_vl_checkpoint(tmp_path / "out")
    rng = np.random.default_rng(7)
    grid = [(1, 4, 6)]
    ids = np.asarray([_prompt(rng, 2, grid[0], 5)], np.int32)
    pixels = _patches(rng, grid)
    fwd = nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=grid))
    ours = np.asarray(fwd(model, jnp.asarray(ids), jnp.asarray(pixels)))
    _compare(ours, _hf_logits(hf, ids, pixels, grid), ids)
    assert np.array_equal(np.asarray(fwd(again, jnp.asarray(ids), jnp.asarray(pixels))), ours)


def test_packed_row_equals_separate_sequences(checkpoint):
    """Two image prompts packed in one row (segment_ids): M-RoPE positions restart per segment and
    each segment's logits equal its own unpacked forward (the trainer's packed layout)."""
    _, model, _ = checkpoint
    rng = np.random.default_rng(8)
    grids = [(1, 4, 6), (1, 6, 4)]
    seqs = [_prompt(rng, 2, grids[0], 3), _prompt(rng, 4, grids[1], 2)]
    pix = [_patches(rng, [g]) for g in grids]
    fwd = nnx.jit(lambda m, x, p, g: m(x, pixel_values=p, image_grid_thw=g), static_argnums=3)
    alone = [np.asarray(fwd(model, jnp.asarray([s], jnp.int32), jnp.asarray(p), (g,)))[0]
             for s, p, g in zip(seqs, pix, grids)]
    packed = jnp.asarray([seqs[0] + seqs[1]], jnp.int32)
    segments = jnp.asarray([[0] * len(seqs[0]) + [1] * len(seqs[1])], jnp.int32)
    positions, _ = mrope_positions(packed, grids, IMAGE, MERGE, segment_ids=segments)
    for k, s in enumerate(seqs):
        sep, _ = mrope_positions(jnp.asarray([s], jnp.int32), [grids[k]], IMAGE, MERGE)
        at = slice(0, len(s)) if k == 0 else slice(len(seqs[0]), None)
        np.testing.assert_array_equal(np.asarray(positions)[:, 0, at], np.asarray(sep)[:, 0])
    out = np.asarray(nnx.jit(lambda m, x, p, sg: m(x, segment_ids=sg, pixel_values=p, image_grid_thw=grids))(
        model, packed, jnp.asarray(np.concatenate(pix)), segments))[0]
    assert np.abs(out[:len(seqs[0])] - alone[0]).max() <= TOL
    assert np.abs(out[len(seqs[0]):] - alone[1]).max() <= TOL


def test_per_row_pixel_layout_equals_flat(checkpoint):
    """pixel_values `[B, N_row, D]` with one row's grid (same-size screenshots) equals HF's flat
    layout with every image's grid."""
    _, model, _ = checkpoint
    rng = np.random.default_rng(9)
    grid = (1, 4, 4)
    ids = jnp.asarray([_prompt(rng, 2, grid, 3), _prompt(rng, 2, grid, 3)], jnp.int32)
    pixels = _patches(rng, [grid, grid])
    flat = nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=[grid, grid]))(model, ids, jnp.asarray(pixels))
    rows = nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=[grid]))(
        model, ids, jnp.asarray(pixels.reshape(2, 16, -1)))
    assert np.abs(np.asarray(rows) - np.asarray(flat)).max() <= 1e-6
    # each row alone (a micro-batch of one) gives the same logits
    one = nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=[grid]))(
        model, ids[1:], jnp.asarray(pixels.reshape(2, 16, -1)[1:]))
    assert np.abs(np.asarray(one)[0] - np.asarray(flat)[1]).max() <= TOL


def test_per_row_layout_rows_with_fewer_images_equal_hf_per_row(checkpoint):
    """Rows showing different numbers of same-size images (episodes with more or fewer screenshots):
    the per-row layout takes the longest row's grid, a shorter row shows a prefix of it and its
    trailing patches are never read; each row's logits equal HF on that row alone with its own images."""
    hf, model, _ = checkpoint
    rng = np.random.default_rng(11)
    grid = (1, 4, 4)
    n = 4 * 4 // MERGE ** 2
    text = lambda k: rng.integers(0, 240, size=k).tolist()  # noqa: E731
    two = text(2) + [VSTART] + [IMAGE] * n + [VEND] + text(3) + [VSTART] + [IMAGE] * n + [VEND] + text(2)
    one = text(3) + [VSTART] + [IMAGE] * n + [VEND] + text(3 + n + 3)   # same length, one image
    none = text(len(two))                                               # no image at all
    ids = np.asarray([one, two, none], np.int64)
    pix = _patches(rng, [grid] * 5)
    rows = np.zeros((3, 32, pix.shape[1]), np.float32)
    rows[0, :16] = pix[:16]                 # row 0: its one image, then 16 unused (zero) patches
    rows[1] = pix[16:48]                    # row 1: two images
    rows[2] = pix[48:80]                    # row 2: patches it never reads
    ours = np.asarray(nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=[grid, grid]))(
        model, jnp.asarray(ids, jnp.int32), jnp.asarray(rows)))
    want = [_hf_logits(hf, ids[:1], pix[:16], [grid]), _hf_logits(hf, ids[1:2], pix[16:48], [grid, grid]),
            _hf_logits(hf, ids[2:])]
    for b in range(3):
        _compare(ours[b:b + 1], want[b], ids[b:b + 1])
    with pytest.raises(ValueError, match="prefix of its images"):   # a row whose count is no prefix's
        model(jnp.asarray([one[:-1] + [IMAGE]], jnp.int32), pixel_values=jnp.asarray(rows[:1]),
              image_grid_thw=[grid, grid])


def test_bfloat16_forward_tracks_float32(checkpoint, tmp_path):
    """The checkpoint loaded with bfloat16 compute and params (norms, softmax, rotary in float32)
    runs an image prompt with finite logits close to the float32 ones."""
    from openclaw_jax.models.qwen_vl import save_qwen_vl_checkpoint

    _, model, _ = checkpoint
    save_qwen_vl_checkpoint(model, tmp_path / "ck")
    half, cfg = load_qwen_vl_checkpoint(tmp_path / "ck", dtype="bfloat16")
    assert cfg.text.dtype == cfg.vision.dtype == cfg.vision.param_dtype == "bfloat16"
    assert half.visual.patch_embed[...].dtype == jnp.bfloat16
    rng = np.random.default_rng(10)
    grid = [(1, 4, 6)]
    ids = jnp.asarray([_prompt(rng, 2, grid[0], 4)], jnp.int32)
    pixels = jnp.asarray(_patches(rng, grid))
    fwd = nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=grid))
    ref, low = np.asarray(fwd(model, ids, pixels)), np.asarray(fwd(half, ids, pixels))
    assert low.dtype == np.float32 and np.isfinite(low).all()
    rel = np.abs(low - ref).max() / np.abs(ref).max()
    print(f"bfloat16 vs float32: max |diff| / max |logit| = {rel:.3f}")
    assert rel < 0.1, rel
