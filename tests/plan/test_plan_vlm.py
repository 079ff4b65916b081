"""The planner on a (tiny) Qwen2.5-VL config.json: the QwenVL student and teacher with the screenshots'
patches in the batch (`python -m openclaw_jax.plan ... --images N --image-size WxH`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from flax import nnx

from openclaw_jax.models.qwen_vl import QwenVL, QwenVLConfig

from tests.helpers.vl_models import tiny_hf_vl_config

ROOT = Path(__file__).resolve().parents[2]


def tiny_vl_config() -> dict:
    return tiny_hf_vl_config(vocab_size=256, image=250, vision_start=248, vision_end=249, video=251,
                             max_position_embeddings=512, bos_token_id=1, eos_token_id=2).to_dict()


def test_plan_of_a_vision_language_model_counts_the_images(tmp_path):
    hf = tiny_vl_config()
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cmd = [sys.executable, "-m", "openclaw_jax.plan", "--config", str(ROOT / "configs/qwen25vl_7b_gui_gpu.yaml"),
           "--devices", "1", "--model-config", str(tmp_path / "config.json"), "--json", "--images", "2",
           "--image-size", "448x336", "trainer.max_seq_len=1024", "trainer.min_seq_bucket=512",
           "trainer.samples_per_step=2", "trainer.micro_batch_size=1", "mesh.fsdp=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    plan = json.loads(out.stdout.strip().splitlines()[-1])
    vision = plan["vision"]
    assert vision["grid"] == [[1, 24, 32]] * 2 and vision["image_tokens_per_sample"] == 2 * 192
    model = QwenVL(QwenVLConfig.from_hf_dict(hf), rngs=nnx.Rngs(0))
    want = sum(int(np.prod(v.get_value().shape)) for p, v in nnx.to_flat_state(nnx.state(model)) if p[0] == "visual")
    assert vision["vision_params"] == want
    # the batch holds the patches of both images, for the student rows and each teacher candidate row
    patches = 2 * 24 * 32 * (3 * 2 * 14 * 14) * 4   # float32 bytes per row
    b, c = 2, 2
    assert plan["resident_bytes"]["batch"] >= (b + b * c) * patches
    assert plan["fits"] is True


def test_plan_refuses_packing_for_a_vision_language_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_vl_config()))
    cmd = [sys.executable, "-m", "openclaw_jax.plan", "--config", str(ROOT / "configs/qwen25vl_7b_gui_gpu.yaml"),
           "--devices", "1", "--model-config", str(tmp_path / "config.json"), "trainer.packing=true", "mesh.fsdp=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 2 and "unpacked batches" in out.stderr
