"""Generation with images (inference/vision.py): the rollout log-probs of the sampled tokens equal a
full forward over prompt + response with the same images (the prefill placed the image features and
the decode rotated at slot + rope delta), and other pixels change them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from flax import nnx

import jax
import jax.numpy as jnp

from openclaw_jax.inference.vision import VisionGenerator
from openclaw_jax.models.qwen_vl import QwenVL

from tests.trainer.test_vlm_train_step import IMAGE, VEND, VSTART, png, prompt_with_image, vl_config


@pytest.fixture(scope="module")
def generator():
    return VisionGenerator(QwenVL(vl_config(), rngs=nnx.Rngs(3)))


def full_forward_logprobs(gen: VisionGenerator, prompt, output, image, temperature):
    model = nnx.merge(gen.graphdef, gen.state)
    pv, grid = gen.pixels([image])
    ids = jnp.asarray([list(prompt) + list(output)], jnp.int32)
    logits = model(ids, pixel_values=jnp.asarray(pv), image_grid_thw=grid)[0]
    lp = jax.nn.log_softmax(logits / temperature, axis=-1)
    n = len(prompt)
    return np.asarray([lp[n - 1 + i, t] for i, t in enumerate(output)])


def test_rollout_logprobs_equal_the_full_forward_with_the_image(generator):
    rng = np.random.default_rng(0)
    image = png(5)
    prompt = prompt_with_image(rng, 7, image)
    out = generator.generate(prompt, [image], max_new_tokens=8, temperature=1.0, seed=1)
    assert len(out.output_ids) == 8 and out.rope_delta < 0   # an image of 2x3 merged tokens spans fewer positions
    ref = full_forward_logprobs(generator, prompt, out.output_ids, image, 1.0)
    np.testing.assert_allclose(out.output_logprobs, ref, atol=1e-4)
    # the same tokens under another image: other log-probs (the prefill saw the pixels)
    other = full_forward_logprobs(generator, prompt, out.output_ids, png(6), 1.0)
    assert np.abs(other - ref).max() > 1e-3


def test_greedy_stops_and_checks_the_image_tokens(generator):
    rng = np.random.default_rng(1)
    image = png(7)
    prompt = prompt_with_image(rng, 5, image)
    first = generator.generate(prompt, [image], max_new_tokens=3, temperature=0.0)
    again = generator.generate(prompt, [image], max_new_tokens=3, temperature=0.0, seed=9)
    assert first.output_ids == again.output_ids
    stopped = generator.generate(prompt, [image], max_new_tokens=5, temperature=0.0,
                                 stop_token_ids=[first.output_ids[0]])
    assert stopped.output_ids == first.output_ids[:1] and stopped.finish_reason == "stop"
    with pytest.raises(ValueError, match="image tokens"):
        generator.generate([t for t in prompt if t != IMAGE] + [IMAGE], [image], max_new_tokens=2)


def test_sampling_without_a_seed_differs_per_call_and_a_seed_repeats(generator):
    """A group's episodes send one prompt without a seed: each must get its own sample (the image path
    once used seed 0 for all, so every GRPO group of the GUI agent was four equal episodes)."""
    rng = np.random.default_rng(2)
    image = png(8)
    prompt = prompt_with_image(rng, 6, image)
    unseeded = [tuple(generator.generate(prompt, [image], max_new_tokens=12, temperature=1.0).output_ids)
                for _ in range(4)]
    assert len(set(unseeded)) > 1
    seeded = [generator.generate(prompt, [image], max_new_tokens=12, temperature=1.0, seed=5).output_ids
              for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_sequences_decoded_together_equal_the_full_forward_and_each_decoded_alone(generator):
    """Concurrent requests share one batch cache (a row each, joining and leaving at different steps):
    every sequence's log-probs still equal its own full forward, and its tokens are the ones it gets alone."""
    rng = np.random.default_rng(3)
    requests = []
    for i, (n_text, new, temperature) in enumerate([(4, 9, 1.0), (11, 3, 0.0), (7, 14, 0.7), (2, 6, 1.0),
                                                     (9, 11, 1.0)]):
        image = png(20 + i)
        requests.append((prompt_with_image(rng, n_text, image), image, new, temperature, 100 + i))

    def run(req):
        prompt, image, new, temperature, seed = req
        return generator.generate(prompt, [image], max_new_tokens=new, temperature=temperature, seed=seed)

    alone = [run(req) for req in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(run, requests))
    for (prompt, image, new, temperature, _), a, t in zip(requests, alone, together):
        assert len(t.output_ids) == new and t.finish_reason == "length"
        assert t.output_ids == a.output_ids
        np.testing.assert_allclose(t.output_logprobs, full_forward_logprobs(generator, prompt, t.output_ids, image,
                                                                            temperature or 1.0), atol=1e-4)


def test_a_sequence_started_on_new_weights_decodes_on_them_beside_one_on_the_old():
    """Weights swapped while a sequence decodes: it finishes on the weights it started with, and a
    sequence prefilled on the new ones is decoded on the new ones (never one batch on mixed weights)."""
    gen = VisionGenerator(QwenVL(vl_config(), rngs=nnx.Rngs(4)), max_batch=4)
    old = gen.state
    new = jax.tree.map(lambda x: x * 1.05, old)
    rng = np.random.default_rng(4)
    image = png(30)
    prompt = prompt_with_image(rng, 5, image)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(gen.generate, prompt, [image], max_new_tokens=40, temperature=1.0, seed=1)
        while not gen._decoder._rows[0]:   # the first sequence is in the batch: swap the weights now
            time.sleep(0.001)
        gen.set_state(new)
        second = pool.submit(gen.generate, prompt, [image], max_new_tokens=6, temperature=1.0, seed=2)
        first, second = first.result(), second.result()
    gen.set_state(old)
    np.testing.assert_allclose(first.output_logprobs, full_forward_logprobs(gen, prompt, first.output_ids, image, 1.0),
                               atol=1e-4)
    gen.set_state(new)
    np.testing.assert_allclose(second.output_logprobs,
                               full_forward_logprobs(gen, prompt, second.output_ids, image, 1.0), atol=1e-4)
