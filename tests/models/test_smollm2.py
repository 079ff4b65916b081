"""The real SmolLM2-135M-Instruct (packaged GGUF) in our decoder against HF transformers.

Both sides read the same GGUF: ours through `load_pretrained("smollm2")` (gguf_to_hf ->
model_from_state_dict, GGUF tokenizer), transformers through `from_pretrained(gguf_file=...)` (its own
dequantiser and q/k un-permutation), float32 on CPU. The prompt is rendered with our chat template.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.models.gguf import smollm2_gguf_path
from openclaw_jax.models.hub import load_pretrained

pytestmark = pytest.mark.slow

N_NEW_TOKENS = 20
MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def _torch_model():
    import torch
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def _torch_greedy(model, prompt_ids: list[int], n_new: int) -> tuple[list[int], np.ndarray]:
    """Greedy continuation (no stopping at eos) and the logits of the full final sequence."""
    import torch

    ids = torch.tensor([prompt_ids])
    past = None
    step_input = ids
    new = []
    with torch.no_grad():
        for _ in range(n_new):
            out = model(input_ids=step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())
            new.append(token)
            step_input = torch.tensor([[token]])
        full = model(input_ids=torch.tensor([prompt_ids + new])).logits[0].numpy()
    return new, full


def _jax_greedy(model, prompt_ids: list[int], n_new: int) -> list[int]:
    """Prefill the prompt into the KV cache, then decode one token at a time."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, ids, positions, cache):
        logits, cache = nnx.merge(graphdef, state).decode(ids, positions, cache)
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

    L = len(prompt_ids)
    cache = model.init_cache(1, L + n_new)
    token, cache = step(state, jnp.asarray([prompt_ids], jnp.int32), jnp.arange(L, dtype=jnp.int32)[None], cache)
    new = [int(token[0])]
    for i in range(n_new - 1):
        token, cache = step(state, token[:, None], jnp.full((1, 1), L + i, jnp.int32), cache)
        new.append(int(token[0]))
    return new


def test_smollm2_greedy_tokens_and_logits_match_transformers():
    pretrained = load_pretrained("smollm2", dtype="float32")
    model, tokenizer = pretrained.model, pretrained.tokenizer
    assert pretrained.source == str(smollm2_gguf_path()) and pretrained.config.param_dtype == "float32"
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert prompt_ids[-4:] == tokenizer.encode("<|im_start|>assistant\n")

    ours = _jax_greedy(model, prompt_ids, N_NEW_TOKENS)

    ref_tokens, ref_logits = _torch_greedy(_torch_model(), prompt_ids, N_NEW_TOKENS)
    assert ours == ref_tokens, (tokenizer.decode(ours), tokenizer.decode(ref_tokens))
    assert "Paris" in tokenizer.decode(ours)

    # The full forward over prompt + continuation agrees with transformers' logits at every position.
    logits = np.asarray(model(jnp.asarray([prompt_ids + ours], jnp.int32))[0])
    assert logits.shape == ref_logits.shape == (len(prompt_ids) + N_NEW_TOKENS, 49152)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-3, rtol=0)  # observed max |diff| ~1.2e-4
    # and its greedy choices over the continuation are the tokens the cached decode produced
    assert list(logits[len(prompt_ids) - 1:-1].argmax(-1)) == ours
