"""One image end to end over HTTP: a real `openai` client sends a chat request with a data-URL image to
the real gateway, in front of the real embedded server serving a tiny random Qwen2.5-VL checkpoint that
`transformers` created (its image requests through inference/vision.py); the next turn's feedback makes
the turn a sample, stored with its image blob; the trainer reads it through its input pipeline and
steps on it. The trainer's old pass on the stored sample equals the rollout log-probs the server
returned (the same ids, pixels and M-RoPE positions on both sides), the step moves the vision tower,
and other pixels in the blob give other log-probs."""

from __future__ import annotations

import base64
import hashlib
import os

import jax
import numpy as np
import openai
import torch
import transformers
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.gateway.server import start_gateway, stop_gateway
from openclaw_jax.inference.engine import Engine
from openclaw_jax.inference.scheduler import EngineConfig
from openclaw_jax.inference.server import InferenceServer
from openclaw_jax.inference.vision import VisionGenerator
from openclaw_jax.models.image_processing import ImageProcessorConfig
from openclaw_jax.models.qwen_vl import load_qwen_vl_checkpoint
from openclaw_jax.parallel.mesh import make_mesh
from openclaw_jax.samples.store import SampleStore, image_path
from openclaw_jax.trainer.input_pipeline import WindowPipeline
from openclaw_jax.trainer.loop import Trainer
from tests.helpers.scripted_pool import LoopThread
from tests.helpers.server_utils import TINY_ENGINE_KW, ServerThread
from tests.helpers.vl_models import tiny_hf_vl_config

from tests.e2e.test_image_pipeline import IMAGE, VEND, VSTART, tokenizer
from tests.trainer.test_vlm_train_step import BASE, png


def make_checkpoint(out) -> None:
    cfg = tiny_hf_vl_config(vocab_size=336, image=IMAGE, vision_start=VSTART, vision_end=VEND, video=323,
                            bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    hf = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen) if "norm" in name or "ln_q" in name
                    else 0.2 * torch.randn(p.shape, generator=gen))
    hf.save_pretrained(out)


def test_one_image_through_gateway_server_store_and_trainer(tmp_path):
    ckpt = tmp_path / "qwen25vl"
    make_checkpoint(ckpt)
    tok = tokenizer()
    model, vl = load_qwen_vl_checkpoint(ckpt)
    proc = ImageProcessorConfig.for_vision(vl.vision)
    engine = Engine(model.language_model, tok, context_length=1024, seed=0, config=EngineConfig(**TINY_ENGINE_KW))
    server = InferenceServer(engine, tok, model_path=str(ckpt), served_model_name="tiny-vl", weight_dirs=[ckpt.parent])
    server.vision = VisionGenerator(model)
    policy = ServerThread(server.make_app()).start()
    lt = LoopThread()
    store_dir = tmp_path / "store"
    gcfg = GatewayConfig(port=0, policy_urls=(policy.url,), judge="rule", store_dir=str(store_dir), model="tiny-vl",
                         default_max_tokens=6, request_timeout_s=120.0, pool_max_retries=0)
    gateway, runner, url = lt.run(start_gateway(gcfg, tokenizer=tok, image_processor=proc), timeout=120)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        image = png(21)
        data_url = "data:image/png;base64," + base64.b64encode(image).decode()
        first = [{"role": "user", "content": [{"type": "text", "text": "Click the OK button. "},
                                              {"type": "image_url", "image_url": {"url": data_url}}]}]
        headers = {"X-Session-Id": "gui-1", "X-Turn-Type": "main"}
        reply = client.chat.completions.create(model="tiny-vl", messages=first, max_tokens=6, extra_headers=headers)
        assert reply.usage.completion_tokens >= 1 and reply.usage.prompt_tokens > 6
        # the next state: approval (eval +1) with an instruction (a hint), then the session ends
        nxt = first + [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                       {"role": "user", "content": "Thanks, that works. You should always press OK first."}]
        client.chat.completions.create(model="tiny-vl", messages=nxt, max_tokens=2,
                                       extra_headers={**headers, "X-Session-Done": "true"})
        lt.run(gateway.drain(60))
        # a weight update reaches the image path too, under the same version (tests/inference/test_vl_weight_update.py)
        import requests

        r = requests.post(policy.url + "/update_weights_from_disk", json={"model_path": str(ckpt),
                                                                          "weight_version": "v2"}, timeout=60)
        assert r.status_code == 200 and r.json()["success"], r.text
        assert engine.weight_version == server.vision.weight_version == "v2"
    finally:
        lt.run(stop_gateway(gateway, runner))
        lt.stop()
        policy.stop()
        engine.shutdown()

    sha = hashlib.sha256(image).hexdigest()
    with SampleStore(store_dir, readonly=True) as st:
        samples = list(st)
    assert len(samples) == 1
    sample = samples[0]
    assert sample.image_sha256 == [sha] and os.path.exists(image_path(store_dir, sha))
    assert sample.kind == "opd+rl" and sample.hint_prompt_ids[0].count(IMAGE) == sample.prompt_ids.count(IMAGE) == 6

    cfg = load_experiment_config([], BASE + ["trainer.samples_per_step=1"])
    student, _ = load_qwen_vl_checkpoint(ckpt)
    teacher, _ = load_qwen_vl_checkpoint(ckpt)
    trainer = Trainer(cfg, student, teacher, make_mesh((1, 1, 1), devices=jax.devices()[:1]),
                      samples=cfg.sample_spec())

    def old_logprobs():
        with WindowPipeline(store_dir, trainer.train_step.spec) as pipeline:
            (packed,) = pipeline.batches(0, 1)
        old = trainer.train_step.loss_batch(trainer.state, packed)
        return packed, np.asarray(old.old_logprobs)[0, :len(sample.response_ids)]

    packed, lp = old_logprobs()
    np.testing.assert_allclose(lp, sample.rollout_logprobs, atol=2e-4)   # the policy's own log-probs

    # other pixels under the same hash name: other log-probs (the trainer reads the pixels from the blob;
    # read_image would refuse the changed bytes, so the check goes through the processor directly)
    from openclaw_jax.trainer.vision_batch import attach_images
    from openclaw_jax.trainer.batcher import pack

    other = attach_images(pack([sample], trainer.train_step.spec), lambda h: png(22), proc, IMAGE)
    lp_other = np.asarray(trainer.train_step.loss_batch(trainer.state, other).old_logprobs)[
        0, :len(sample.response_ids)]
    assert np.abs(lp_other - lp).max() > 1e-4

    before = {k: np.array(v.get_value()) for k, v in nnx.to_flat_state(trainer.state.trainable) if k[0] == "visual"}
    metrics = trainer.train_on(packed)
    after = {k: np.array(v.get_value()) for k, v in nnx.to_flat_state(trainer.state.trainable) if k[0] == "visual"}
    assert np.isfinite(metrics["loss"]) and metrics["time/teacher_pass"] > 0   # the hint's teacher pass ran
    assert any(np.abs(after[k] - before[k]).max() > 0 for k in before)


def test_the_server_cli_serves_a_qwen25vl_directory_with_images(tmp_path):
    """`python -m openclaw_jax.inference --model <Qwen2.5-VL dir>`: /generate with image_data runs the image
    path (the same tokens and log-probs as VisionGenerator in process, same seed); text prompts run in the
    engine on the text decoder."""
    import requests

    from openclaw_jax.models.vision_prompt import render_image_prompt
    from tests.helpers.server_utils import ServerProcess

    ckpt = tmp_path / "qwen25vl"
    make_checkpoint(ckpt)
    tok = tokenizer()
    tok.save_pretrained(ckpt)
    model, vl = load_qwen_vl_checkpoint(ckpt)
    image = png(23)
    msgs = [{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>Where is OK?"}]
    ids, _, _ = render_image_prompt(tok, msgs, [image], ImageProcessorConfig.for_vision(vl.vision))
    want = VisionGenerator(model).generate(ids, [image], max_new_tokens=5, temperature=1.0, seed=7,
                                           stop_token_ids=[])
    server = ServerProcess(ckpt, log_path=tmp_path / "server.log").start()
    try:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        body = {"input_ids": ids, "image_data": [url], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 5, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True}}
        r = requests.post(server.url + "/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        got = [(lp, t) for lp, t, *_ in meta["output_token_logprobs"]]
        assert [t for _, t in got] == want.output_ids
        np.testing.assert_allclose([lp for lp, _ in got], want.output_logprobs, atol=1e-4)
        text = requests.post(server.url + "/generate", json={"input_ids": [5, 6, 7], "sampling_params": {
            "max_new_tokens": 2}}, timeout=120)
        assert text.status_code == 200 and text.json()["meta_info"]["completion_tokens"] >= 1
    finally:
        server.terminate()
