"""Supervised warm-up: token cross-entropy on response tokens (chunked over the vocabulary).

Used to give a small model a prior before online RL (e.g. to follow hints in its prompt, as a
pretrained instruct model does), and by tests that need a tiny model with a known behaviour.
`sft_loss` is pure and jittable; `SFTTrainer` holds the params and optimizer state.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from openclaw_jax import ops
from openclaw_jax.trainer.batcher import bucket_length


def sft_loss(params: nnx.State, graphdef: nnx.GraphDef, input_ids: jax.Array, target_mask: jax.Array,
             chunk_size: int = 128) -> jax.Array:
    """Mean negative log-likelihood of `input_ids[:, 1:]` where `target_mask[:, 1:]` is 1.

    input_ids, target_mask: [B, L]; target_mask[b, t] = 1 marks token t as a target (predicted
    from position t - 1).
    """
    model = nnx.merge(graphdef, params)
    hidden = model.hidden_states(input_ids)[:, :-1]
    targets = input_ids[:, 1:]
    mask = target_mask[:, 1:].astype(jnp.float32)
    logp = ops.token_logprobs(hidden, model.lm_head_kernel(), targets, chunk_size=chunk_size)
    return -(logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)


@functools.partial(jax.jit, static_argnames=("tx", "graphdef", "chunk_size"))
def _sft_step(params, opt_state, input_ids, target_mask, *, tx, graphdef, chunk_size):
    loss, grads = jax.value_and_grad(sft_loss)(params, graphdef, input_ids, target_mask, chunk_size)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def pack_examples(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
                  min_bucket: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(prompt ids, response ids) pairs -> right-padded [B, L] ids and response target mask."""
    length = bucket_length(max(len(p) + len(r) for p, r in examples), min_bucket)
    ids = np.full((len(examples), length), pad_id, np.int32)
    mask = np.zeros((len(examples), length), np.float32)
    for i, (prompt, response) in enumerate(examples):
        p, r = len(prompt), len(response)
        ids[i, :p] = prompt
        ids[i, p:p + r] = response
        mask[i, p:p + r] = 1.0
    return ids, mask


class SFTTrainer:
    """Adam on the whole model; `step(examples)` returns the batch loss."""

    def __init__(self, model: nnx.Module, *, lr: float = 3e-3, pad_id: int = 0, chunk_size: int = 128):
        self.graphdef, self.params = nnx.split(model)
        self.tx = optax.adam(lr)
        self.opt_state = self.tx.init(self.params)
        self.pad_id = pad_id
        self.chunk_size = chunk_size

    def step(self, examples: Sequence[tuple[Sequence[int], Sequence[int]]]) -> float:
        ids, mask = pack_examples(examples, self.pad_id)
        self.params, self.opt_state, loss = _sft_step(
            self.params, self.opt_state, jnp.asarray(ids), jnp.asarray(mask),
            tx=self.tx, graphdef=self.graphdef, chunk_size=self.chunk_size)
        return float(loss)

    def model(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.params)
