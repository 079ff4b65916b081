"""`model.path: random` with `model.random.vision` (models/random_vl.py): the config makes a random Qwen2.5-VL
checkpoint with the `tiny_vl` tokenizer (vision tokens at ids 320..323, named in config.json) that
`load_pretrained` reads back as a QwenVL whose logits on a text + image prompt equal
`transformers.Qwen2_5_VLForConditionalGeneration` from the same directory (float32); bad vision values
are config errors that say what to change."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.configlib import ConfigError
from openclaw_jax.models.hub import load_pretrained
from openclaw_jax.models.image_processing import ImageProcessorConfig, process_images
from openclaw_jax.models.qwen_vl import QwenVL
from openclaw_jax.models.random_vl import RandomVLError, vision_token_ids
from openclaw_jax.models.tokenizer import TINY_VL_IDS, tokenizer_by_name
from openclaw_jax.runs.base_model import random_base_model
from tests.helpers.vl_models import RANDOM_VL_OVERRIDES, hf_vl_logits

from tests.trainer.test_vlm_train_step import png

VSTART, VEND, IMAGE, VIDEO = (TINY_VL_IDS[t] for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                                        "<|video_pad|>"))


def test_tiny_vl_tokenizer_has_the_vision_tokens_at_fixed_ids():
    tok = tokenizer_by_name("tiny_vl")
    assert (VSTART, VEND, IMAGE, VIDEO) == (320, 321, 322, 323) and tok.vocab_size == 324
    assert tok.encode("<|vision_start|><|image_pad|><|vision_end|>") == [320, 322, 321]
    assert {320, 321, 322, 323} <= tok.special_token_ids
    assert tok.encode("hello") == tokenizer_by_name("tiny").encode("hello")   # the tiny vocabulary below


def test_random_vl_checkpoint_loads_as_qwenvl_equal_to_transformers(tmp_path):
    cfg = load_experiment_config([], RANDOM_VL_OVERRIDES)
    random_base_model(cfg, tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert hf_config["model_type"] == "qwen2_5_vl" and hf_config["vocab_size"] == 324
    assert (hf_config["vision_start_token_id"], hf_config["vision_end_token_id"], hf_config["image_token_id"],
            hf_config["video_token_id"]) == (VSTART, VEND, IMAGE, VIDEO)

    pre = load_pretrained(tmp_path)
    assert isinstance(pre.model, QwenVL) and pre.vl_config.text.mrope_section == (1, 1, 2)
    assert pre.vl_config.vision.depth == 2 and pre.tokenizer.vocab_size == 324
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()

    proc = ImageProcessorConfig.for_vision(pre.vl_config.vision)
    pixels, grid = process_images([png(4)], proc)
    grid = [tuple(int(v) for v in g) for g in grid]
    n_image = grid[0][0] * grid[0][1] * grid[0][2] // 4
    text = pre.tokenizer.encode("Click the OK button.")
    ids = np.asarray([text[:3] + [VSTART] + [IMAGE] * n_image + [VEND] + text[3:]], np.int32)
    fwd = nnx.jit(lambda m, x, p: m(x, pixel_values=p, image_grid_thw=tuple(grid)))
    ours = np.asarray(fwd(pre.model, jnp.asarray(ids), jnp.asarray(pixels)))
    ref = hf_vl_logits(hf, ids, IMAGE, pixels, grid)
    diff = float(np.abs(ours - ref).max())
    print(f"max |logit diff| {diff:.2e} (logits up to {np.abs(ref).max():.2f})")
    assert ours.shape == ref.shape == (1, ids.shape[1], 324) and diff < 1e-4
    # the image reaches the text after it (the comparison is not blind to the vision tower)
    other = np.asarray(fwd(pre.model, jnp.asarray(ids), jnp.asarray(pixels[::-1].copy())))
    assert np.abs(other[0, -2:] - ours[0, -2:]).max() > 1e-6

    # the teacher copy and dtypes travel as for text models
    again = load_pretrained(tmp_path, dtype="bfloat16", param_dtype="float32", teacher_dtype="bfloat16")
    assert isinstance(again.teacher, QwenVL) and again.vl_config.vision.dtype == "bfloat16"
    assert again.teacher.vl_cfg.text.param_dtype == "bfloat16"


@pytest.mark.parametrize("override, needle", [
    ("model.random.vision.out_hidden_size=48", "must equal model.random.hidden_size=32"),
    ("model.random.vision.window_size=50", "must be a multiple of patch_size x spatial_merge_size = 28"),
    ("model.random.vision.fullatt_block_indexes=[2]", "must lie in [0, depth=2)"),
    ("model.random.vision.num_heads=3", "whole head_dim divisible by 4"),
    ("model.random.vision.depth=0", "model.random.vision.depth=0 must be > 0"),
    ("model.random.vision.mrope_section=[1, 1, 1]", "it must sum to head_dim / 2 = 4"),
    ("model.random.family=qwen3", "set model.random.family=qwen2"),
    ("model.random.head_dim=16", "must equal hidden_size=32"),
    ("model.tokenizer=tiny", "use model.tokenizer=tiny_vl"),
    ("model.random.vision.patch_size=x", "model.random.vision.patch_size"),
])
def test_bad_vision_values_are_config_errors(override, needle):
    with pytest.raises(ConfigError) as info:
        load_experiment_config([], RANDOM_VL_OVERRIDES + [override])
    assert needle in str(info.value), str(info.value)


def test_the_tokenizer_must_have_the_vision_tokens(tmp_path):
    with pytest.raises(RandomVLError, match=r"has no \['<\|vision_start\|>'.*use model.tokenizer=tiny_vl"):
        vision_token_ids(tokenizer_by_name("tiny"))
    cfg = load_experiment_config([], RANDOM_VL_OVERRIDES + ["model.tokenizer=qwen3"])
    random_base_model(cfg, tmp_path)   # the Qwen vocabulary has them: their ids go to config.json
    assert json.loads((tmp_path / "config.json").read_text())["image_token_id"] == 151655
