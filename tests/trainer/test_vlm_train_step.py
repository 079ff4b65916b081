"""A trainer step on samples with images (a QwenVL student and teacher): the images go from the sample
store's blobs through `trainer.vision_batch.attach_images` into the old, teacher and train passes; the
passes see the pixels (other pixels, other log-probs) and the vision tower gets a gradient."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.models.image_processing import (ImageProcessorConfig, image_token_count, process_image,
                                                  process_images)
from openclaw_jax.models.qwen_vl import QwenVL, QwenVLConfig
from openclaw_jax.parallel.mesh import make_mesh
from openclaw_jax.samples.sample import Sample
from openclaw_jax.samples.store import SampleStore, read_image
from openclaw_jax.samples.tail import SampleTail
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batcher import pack
from openclaw_jax.trainer.loop import Trainer
from openclaw_jax.trainer.vision_batch import attach_images

from tests.helpers.vl_models import tiny_hf_vl_config

IMAGE, VSTART, VEND, VOCAB = 250, 248, 249, 256
BASE = ["trainer.samples_per_step=2", "loss.top_k=4", "trainer.chunk_size=8", "gateway.max_candidates=2",
        "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8", "trainer.optimizer.lr=1e-3",
        "trainer.packing=false", "trainer.shared_prefix_teacher=false"]


def vl_config() -> QwenVLConfig:
    return QwenVLConfig.from_hf_dict(tiny_hf_vl_config(vocab_size=VOCAB, image=IMAGE, vision_start=VSTART,
                                                       vision_end=VEND, video=251,
                                                       max_position_embeddings=512).to_dict())


def png(seed: int) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


PROC = ImageProcessorConfig()


def prompt_with_image(rng, n_text: int, image: bytes) -> list[int]:
    n = image_token_count(process_image(image, PROC)[1], PROC.merge_size)
    text = [int(x) for x in rng.integers(3, 200, n_text)]
    return text[:2] + [VSTART] + [IMAGE] * n + [VEND] + text[2:]


def write_store(directory, images: list[bytes]):
    rng = np.random.default_rng(0)
    with SampleStore(directory) as st:
        for i, (kind, reward, hints) in enumerate([("opd+rl", 1.0, 1), ("rl", -1.0, 0)]):
            r = 5 + i
            image = images[i]
            prompt = prompt_with_image(rng, 6, image)
            sample = Sample(session_id=f"s{i}", turn_index=0, kind=kind, reward=reward, prompt_ids=prompt,
                            response_ids=[int(x) for x in rng.integers(3, 200, r)],
                            rollout_logprobs=list(-rng.random(r) - 0.5), hints=["look closer"] * hints,
                            hint_prompt_ids=[prompt + [7, 8, 9]] * hints, weight_version="0",
                            image_sha256=[hashlib.sha256(image).hexdigest()])
            st.append(sample, images=[image])


def read_batch(directory, spec, vl_cfg):
    tail = SampleTail(directory)
    packed = pack(tail.read(0, 2), spec)
    packed = attach_images(packed, lambda h: read_image(tail.directory, h), PROC, vl_cfg.image_token_id)
    tail.close()
    return packed


@pytest.fixture(scope="module")
def trainer_and_cfg():
    vl = vl_config()
    cfg = load_experiment_config([], BASE)
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    trainer = Trainer(cfg, QwenVL(vl, rngs=nnx.Rngs(0)), QwenVL(vl, rngs=nnx.Rngs(1)), mesh,
                      samples=cfg.sample_spec())
    return trainer, vl


def visual_params(trainer) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.array(v.get_value(), np.float32)
            for p, v in nnx.to_flat_state(trainer.state.trainable) if p[0] == "visual"}


def test_images_from_the_store_reach_every_pass_and_train_the_vision_tower(tmp_path, trainer_and_cfg):
    trainer, vl = trainer_and_cfg
    write_store(tmp_path / "a", [png(1), png(2)])
    write_store(tmp_path / "b", [png(3), png(4)])   # the same tokens, other pixels
    spec = trainer.train_step.spec
    pa, pb = read_batch(tmp_path / "a", spec, vl), read_batch(tmp_path / "b", spec, vl)
    assert pa.image_grid == ((1, 4, 6),) and pa.student["pixel_values"].shape == (2, 24, 3 * 2 * 14 * 14)
    assert "pixel_values" in pa.teacher and pa.teacher["pixel_values"].shape[:2] == (2, 2)
    np.testing.assert_array_equal(pa.student["input_ids"], pb.student["input_ids"])
    assert not np.allclose(pa.student["pixel_values"], pb.student["pixel_values"])

    outs = []
    for p in (pa, pb):
        seen = trainer.train_step.loss_batch(trainer.state, p)   # the old pass's and the teacher pass's outputs
        outs.append((np.asarray(seen.old_logprobs), np.asarray(seen.teacher_logprobs_at_tokens)))
    mask = pa.student["response_mask"] > 0
    assert np.all(np.isfinite(outs[0][0][mask]))
    assert np.abs(outs[0][0][mask] - outs[1][0][mask]).max() > 1e-4     # the old pass sees the pixels
    tmask = pa.teacher["candidate_mask"] > 0
    assert np.abs(outs[0][1][tmask] - outs[1][1][tmask]).max() > 1e-4   # so does the teacher's

    before = visual_params(trainer)
    metrics = trainer.train_on(pa)
    after = visual_params(trainer)
    assert np.isfinite(metrics["loss"])
    moved = [k for k in before if np.abs(after[k] - before[k]).max() > 0]
    assert any("patch_embed" in k for k in moved), moved   # the gradient reached the pixels' first layer


def test_batches_with_images_refuse_packing_and_mixed_grids(tmp_path, trainer_and_cfg):
    trainer, vl = trainer_and_cfg
    write_store(tmp_path, [png(1), png(2)])
    tail = SampleTail(tmp_path)
    samples = tail.read(0, 2)
    import dataclasses

    with pytest.raises(ValueError, match="unpacked batches"):
        dataclasses.replace(trainer.train_step.spec, packing=True)   # a QwenVL student's spec refuses packing
    packed_spec = dataclasses.replace(trainer.train_step.spec, packing=True, image_processor=None)
    with pytest.raises(ValueError, match="must not be packed"):
        attach_images(pack(samples, packed_spec), lambda h: read_image(tail.directory, h), PROC, IMAGE)
    bad = dataclasses.replace(samples[1], prompt_ids=[t for t in samples[1].prompt_ids if t != IMAGE][:4] + [IMAGE])
    with pytest.raises(ValueError, match="image tokens"):
        attach_images(pack([samples[0], bad], trainer.train_step.spec), lambda h: read_image(tail.directory, h), PROC,
                      IMAGE)
    tail.close()


def test_old_pass_equals_the_full_forward_with_a_screen_inside_the_response(tmp_path, trainer_and_cfg):
    """A GUI episode's sample: the first screen in the prompt, the next one inside the response (the
    tool message after a click, masked out of the loss). The old pass's log-probs of the trained tokens
    equal the model's own full forward over prompt + response with both images."""
    trainer, vl = trainer_and_cfg
    rng = np.random.default_rng(5)
    rows = []
    with SampleStore(tmp_path) as st:
        for i in range(2):
            screens = [png(40 + i), png(50 + i)]
            prompt = prompt_with_image(rng, 6, screens[0])
            observation = prompt_with_image(rng, 4, screens[1])
            first, last = [int(x) for x in rng.integers(3, 200, 5)], [int(x) for x in rng.integers(3, 200, 3)]
            response = first + observation + last
            mask = [1] * len(first) + [0] * len(observation) + [1] * len(last)
            st.append(Sample(session_id=f"e{i}", turn_index=0, kind="rl", reward=1.0 - 2 * i, prompt_ids=prompt,
                             response_ids=response, rollout_logprobs=[-0.5] * len(response), weight_version="0",
                             response_mask=mask, token_advantages=[1.0 - 2 * i] * len(response),
                             image_sha256=[hashlib.sha256(b).hexdigest() for b in screens]), images=screens)
            rows.append((prompt, response, np.asarray(mask, bool), screens))
    packed = read_batch(tmp_path, trainer.train_step.spec, vl)
    # the old pass alone (the public phase function, with the step's settings for this batch's images)
    settings = dataclasses.replace(trainer.train_step.settings, image_grid=packed.image_grid)
    inputs = S.StudentInputs(**{k: jnp.asarray(v) for k, v in packed.student.items()})
    old = jax.jit(functools.partial(S.old_pass, settings=settings))(trainer.state.graphdef, trainer.state.student,
                                                                     inputs)
    old_lp = np.asarray(old.old_logprobs)
    model = nnx.merge(trainer.state.graphdef, *trainer.state.student)
    for b, (prompt, response, mask, screens) in enumerate(rows):
        pv, grid = process_images(screens, PROC)
        logits = model(jnp.asarray([prompt + response], jnp.int32), pixel_values=jnp.asarray(pv),
                       image_grid_thw=tuple(tuple(int(v) for v in g) for g in grid))[0]
        lp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
        ref = np.asarray([lp[len(prompt) - 1 + t, tok] for t, tok in enumerate(response)])
        np.testing.assert_allclose(old_lp[b, :len(response)][mask], ref[mask], atol=1e-4)


def test_a_frozen_vision_tower_keeps_its_weights_while_the_decoder_trains(tmp_path):
    """`trainer.freeze=[visual]`: a step moves the text decoder and leaves the vision tower as loaded
    (it is not among the trained params and is served as it was); an unknown module is refused."""
    vl = vl_config()
    cfg = load_experiment_config([], BASE + ["trainer.freeze=[visual]"])
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    model = QwenVL(vl, rngs=nnx.Rngs(0))
    loaded = {".".join(map(str, k)): np.array(v.get_value(), np.float32)
              for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    trainer = Trainer(cfg, model, QwenVL(vl, rngs=nnx.Rngs(1)), mesh, samples=cfg.sample_spec())
    assert not visual_params(trainer)   # the tower is not trained
    write_store(tmp_path, [png(1), png(2)])
    assert np.isfinite(trainer.train_on(read_batch(tmp_path, trainer.train_step.spec, vl))["loss"])
    served = {".".join(map(str, k)): np.array(v.get_value(), np.float32)
              for k, v in nnx.to_flat_state(nnx.state(trainer.serving_model(), nnx.Param))}
    assert served.keys() == loaded.keys()
    for k in served:
        if k.startswith("visual."):
            np.testing.assert_array_equal(served[k], loaded[k], err_msg=k)
    assert max(np.abs(served[k] - loaded[k]).max() for k in served if k.startswith("language_model.")) > 0
    with pytest.raises(ValueError, match="not a top-level module"):
        Trainer(load_experiment_config([], BASE + ["trainer.freeze=[vision]"]), QwenVL(vl, rngs=nnx.Rngs(0)),
                QwenVL(vl, rngs=nnx.Rngs(1)), mesh, samples=cfg.sample_spec())
