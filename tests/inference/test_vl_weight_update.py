"""Weight updates of a server with an image path (a Qwen2.5-VL policy: the engine serves the text decoder,
inference/vision.py the images): `/update_weights_from_disk` and the trainer's in-process push
(`InProcessWeightSync(engine, vision)`) swap both under one version. A real server on 127.0.0.1, random
QwenVL checkpoints from the config (models/random_vl.py): after each update, /generate with an image
equals an in-process `VisionGenerator` on the new model (same seed) and names the new weight_version; a
text prompt is served by the engine with the new weights (its log-probs are the new model's); a bad
update changes nothing."""

from __future__ import annotations

import asyncio
import base64

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import requests
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.inference.engine import Engine
from openclaw_jax.inference.scheduler import EngineConfig
from openclaw_jax.inference.server import InferenceServer
from openclaw_jax.inference.vision import VisionGenerator, swap_served_weights
from openclaw_jax.models.hub import load_pretrained
from openclaw_jax.models.image_processing import ImageProcessorConfig
from openclaw_jax.models.qwen_vl import QwenVL
from openclaw_jax.models.vision_prompt import render_image_prompt
from openclaw_jax.pool.weight_sync import InProcessWeightSync
from openclaw_jax.runs.base_model import random_base_model
from tests.helpers.server_utils import TINY_ENGINE_KW, ServerThread
from tests.helpers.vl_models import RANDOM_VL_OVERRIDES

from tests.trainer.test_vlm_train_step import png


def _checkpoint(root, seed: int):
    cfg = load_experiment_config([], RANDOM_VL_OVERRIDES + [f"model.random.seed={seed}"])
    out = root / f"vl_seed{seed}"
    random_base_model(cfg, out)
    return out


def _image_request(url, ids, image, key=None):
    body = {"input_ids": ids, "image_data": ["data:image/png;base64," + base64.b64encode(image).decode()],
            "return_logprob": True, "sampling_params": {"max_new_tokens": 5, "temperature": 1.0, "sampling_seed": 7,
                                                         "ignore_eos": True}}
    r = requests.post(url + "/generate", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"} if key else None)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    return [t for _, t, *_ in meta["output_token_logprobs"]], [lp for lp, *_ in meta["output_token_logprobs"]], meta


def _expect_image(model, ids, image, got_tokens, got_lps):
    want = VisionGenerator(model).generate(ids, [image], max_new_tokens=5, temperature=1.0, seed=7)
    assert got_tokens == want.output_ids
    np.testing.assert_allclose(got_lps, want.output_logprobs, atol=1e-4)


def _text_logprobs(model, prompt, output):
    """log p(output[i] | prompt + output[:i]) under `model` (a text prompt: plain positions)."""
    ids = jnp.asarray([prompt + output], jnp.int32)
    lp = jax.nn.log_softmax(nnx.jit(lambda m, x: m(x))(model, ids)[0], axis=-1)
    n = len(prompt)
    return np.asarray([lp[n - 1 + i, t] for i, t in enumerate(output)])


def _text_request(url, prompt):
    body = {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 3, "ignore_eos": True}}
    r = requests.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    return [t for _, t, *_ in meta["output_token_logprobs"]], [lp for lp, *_ in meta["output_token_logprobs"]], meta


def test_weight_updates_swap_the_image_path_with_the_engine(tmp_path):
    first, second = _checkpoint(tmp_path, 0), _checkpoint(tmp_path, 1)
    pre = load_pretrained(first)
    model, tok = pre.model, pre.tokenizer
    engine = Engine(model.language_model, tok, context_length=512, seed=0, weight_version="0",
                    config=EngineConfig(**TINY_ENGINE_KW))
    server = InferenceServer(engine, tok, model_path=str(first), served_model_name="tiny-vl",
                             vision=VisionGenerator(model, weight_version="0"), weight_dirs=[tmp_path])
    policy = ServerThread(server.make_app()).start()
    image = png(31)
    msgs = [{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>Where is OK?"}]
    ids, _, _ = render_image_prompt(tok, msgs, [image], ImageProcessorConfig.for_vision(pre.vl_config.vision))
    prompt = tok.encode("Click the button.")
    try:
        tokens, lps, meta = _image_request(policy.url, ids, image)
        assert meta["weight_version"] == "0"
        _expect_image(load_pretrained(first, tokenizer=False).model, ids, image, tokens, lps)

        # from disk: both paths take the new checkpoint under version 1
        r = requests.post(policy.url + "/update_weights_from_disk",
                          json={"model_path": str(second), "weight_version": "1"}, timeout=120)
        assert r.status_code == 200 and r.json()["success"], r.text
        new = load_pretrained(second, tokenizer=False).model
        tokens2, lps2, meta = _image_request(policy.url, ids, image)
        assert meta["weight_version"] == "1" and (tokens2, lps2) != (tokens, lps)
        _expect_image(new, ids, image, tokens2, lps2)
        out, text_lps, meta = _text_request(policy.url, prompt)
        assert meta["weight_version"] == "1"
        np.testing.assert_allclose(text_lps, _text_logprobs(new, prompt, out), atol=1e-4)
        assert requests.get(policy.url + "/get_weight_version", timeout=30).json()["weight_version"] == "1"

        # the trainer's in-process push (the embedded pool of train.py): a third model, version 2
        third = QwenVL(pre.vl_config, rngs=nnx.Rngs(5))
        graphdef, state = nnx.split(third)
        asyncio.run(InProcessWeightSync(engine, vision=server.vision)(graphdef, state, "2"))
        tokens3, lps3, meta = _image_request(policy.url, ids, image)
        assert meta["weight_version"] == "2"
        _expect_image(third, ids, image, tokens3, lps3)
        out, text_lps, meta = _text_request(policy.url, prompt)
        assert meta["weight_version"] == "2"
        np.testing.assert_allclose(text_lps, _text_logprobs(third, prompt, out), atol=1e-4)
        # the image path holds the engine's text weights, not a second copy of them
        lm = dict(nnx.to_flat_state(server.vision.state["language_model"]))
        assert all(v.get_value() is dict(nnx.to_flat_state(engine.params))[k].get_value() for k, v in lm.items())

        # a checkpoint of another shape is refused; nothing changes
        other = load_experiment_config([], RANDOM_VL_OVERRIDES + ["model.random.vision.depth=3",
                                                                  "model.random.vision.fullatt_block_indexes=[2]"])
        random_base_model(other, tmp_path / "deeper")
        r = requests.post(policy.url + "/update_weights_from_disk",
                          json={"model_path": str(tmp_path / "deeper"), "weight_version": "3"}, timeout=120)
        assert r.status_code == 400 and "vision depth=3, the served model has 2" in r.json()["message"], r.text
        bad = dict(nnx.to_flat_state(state))
        key = next(k for k in bad if k[0] == "visual")
        bad[key] = bad[key].replace(jnp.zeros((1,) + bad[key].get_value().shape))
        with pytest.raises(ValueError, match="has shape"):
            swap_served_weights(engine, server.vision, nnx.from_flat_state(list(bad.items())), "4")
        assert engine.weight_version == "2" and server.vision.weight_version == "2"
        _expect_image(third, ids, image, *_image_request(policy.url, ids, image)[:2])
    finally:
        policy.stop()
        engine.shutdown()


def test_train_embedded_pool_serves_images_and_takes_the_trainers_pushes(tmp_path):
    """train.py's embedded pool for a `model.random.vision` policy: the server has the image path, and the
    trainer's push (`_start_embedded_pool`'s, as `Trainer.run` calls it) reaches it under the new version."""
    from types import SimpleNamespace

    from openclaw_jax import train as T
    from tests.trainer.test_vlm_train_step import BASE

    cfg = load_experiment_config([], RANDOM_VL_OVERRIDES + BASE + [f"run_dir={tmp_path}", "policy.port=0"])
    base = T.load_base_model(cfg)
    assert isinstance(base.model, QwenVL) and isinstance(base.teacher, QwenVL)
    trainer = T.build_trainer(cfg, base)
    image = png(33)
    ids, _, _ = render_image_prompt(base.tokenizer, [{"role": "user", "content": "<|vision_start|><|image_pad|>"
                                                      "<|vision_end|>Where?"}], [image],
                                    ImageProcessorConfig.for_vision(trainer.serving_model().vl_cfg.vision))

    async def scenario():
        run = SimpleNamespace(cfg=cfg, base=base, trainer=trainer, is_main=True, cleanups=[], run_dir=tmp_path)
        (url,), push = await T._start_embedded_pool(run)
        try:   # the run's own key (made per run); without it the server serves nothing
            assert (await asyncio.to_thread(requests.post, url + "/generate", json={"input_ids": [1]})).status_code == 401
            tokens, lps, meta = await asyncio.to_thread(_image_request, url, ids, image, run.pool_api_key)
            assert meta["weight_version"] == trainer.weight_version
            _expect_image(trainer.serving_model(), ids, image, tokens, lps)
            graphdef, state = nnx.split(trainer.serving_model())
            state = jax.tree.map(lambda x: x * 1.25, state)
            await push(graphdef, state, "9")
            tokens, lps, meta = await asyncio.to_thread(_image_request, url, ids, image, run.pool_api_key)
            assert meta["weight_version"] == "9"
            _expect_image(nnx.merge(graphdef, state), ids, image, tokens, lps)
        finally:
            for cleanup in reversed(run.cleanups):
                await cleanup()

    asyncio.run(scenario())
