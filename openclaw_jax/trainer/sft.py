"""Supervised warm-up: token cross-entropy on response tokens (chunked over the vocabulary).

Used to give a small model a prior before online RL (e.g. to follow hints in its prompt, as a
pretrained instruct model does), and by tests that need a tiny model with a known behaviour.
`sft_loss` is pure and jittable; `SFTTrainer` holds the params and optimizer state.

Examples with images (a vision-language model, e.g. GUI demonstrations with their screenshots):
`(prompt ids, response ids, images)`; a batch takes the per-row pixel layout of `QwenVL` (its
longest row's images' grid, each row a prefix of it), one compile per (length bucket, grid).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from openclaw_jax import ops
from openclaw_jax.models.image_processing import ImageProcessorConfig, process_images
from openclaw_jax.trainer.batch import bucket_length


def sft_loss(params: nnx.State, graphdef: nnx.GraphDef, input_ids: jax.Array, target_mask: jax.Array,
             chunk_size: int = 128, pixel_values: jax.Array | None = None, image_grid: tuple = ()) -> jax.Array:
    """Mean negative log-likelihood of `input_ids[:, 1:]` where `target_mask[:, 1:]` is 1.

    input_ids, target_mask: [B, L]; target_mask[b, t] = 1 marks token t as a target (predicted
    from position t - 1).
    """
    model = nnx.merge(graphdef, params)
    if pixel_values is None:
        hidden = model.hidden_states(input_ids)[:, :-1]
    else:   # a QwenVL: each row's images `[B, N_row, D]` of the static grid
        hidden = model.hidden_states(input_ids, pixel_values=pixel_values, image_grid_thw=image_grid)[:, :-1]
    targets = input_ids[:, 1:]
    mask = target_mask[:, 1:].astype(jnp.float32)
    logp = ops.token_logprobs(hidden, model.lm_head_kernel(), targets, chunk_size=chunk_size)
    return -(logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def _sft_step(params, opt_state, input_ids, target_mask, pixel_values=None, *, tx, graphdef, chunk_size,
              image_grid=()):
    loss, grads = jax.value_and_grad(sft_loss)(params, graphdef, input_ids, target_mask, chunk_size, pixel_values,
                                               image_grid)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def pack_examples(examples: Sequence[tuple], pad_id: int, min_bucket: int = 32,
                  quantum: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(prompt ids, response ids[, images]) examples -> right-padded [B, L] ids and response target mask
    (L: a power of two up to `quantum`, then a multiple of it: 658 tokens pad to 768, not 1024)."""
    length = bucket_length(max(len(e[0]) + len(e[1]) for e in examples), min_bucket, quantum=quantum)
    ids = np.full((len(examples), length), pad_id, np.int32)
    mask = np.zeros((len(examples), length), np.float32)
    for i, (prompt, response, *_) in enumerate(examples):
        p, r = len(prompt), len(response)
        ids[i, :p] = prompt
        ids[i, p:p + r] = response
        mask[i, p:p + r] = 1.0
    return ids, mask


def example_pixels(examples: Sequence[tuple], processor: ImageProcessorConfig
                   ) -> tuple[np.ndarray | None, tuple[tuple[int, int, int], ...]]:
    """(pixel_values `[B, N_row, D]`, the longest row's grid) of the examples' images, or (None, ())
    when none has any. Every row's images must be a prefix of the longest row's (same-size images)."""
    rows = [list(e[2]) if len(e) > 2 else [] for e in examples]
    if not any(rows):
        return None, ()
    parts = [process_images(images, processor) for images in rows]
    grids = [tuple(tuple(int(v) for v in g) for g in grid) for _, grid in parts]
    grid = max(grids, key=len)
    if any(g != grid[:len(g)] for g in grids):
        raise ValueError(f"the examples' images have grids {sorted(set(grids))}, not prefixes of one: batch "
                         "examples whose images have the same sizes together")
    n = max(p.shape[0] for p, _ in parts)
    pixels = np.zeros((len(rows), n, parts[0][0].shape[1]), np.float32)
    for i, (p, _) in enumerate(parts):
        pixels[i, :p.shape[0]] = p
    return pixels, grid


class SFTTrainer:
    """Adam on the whole model; `step(examples)` returns the batch loss."""

    def __init__(self, model: nnx.Module, *, lr: float = 3e-3, pad_id: int = 0, chunk_size: int = 128,
                 images: ImageProcessorConfig | None = None):
        """`images`: the image processor of a vision-language `model` (examples may then carry images)."""
        self.images = images
        self.graphdef, self.params = nnx.split(model)
        self.tx = optax.adam(lr)
        self.opt_state = self.tx.init(self.params)
        # a loaded model's params carry their mesh's shardings; without pinning the outputs to the
        # same ones, XLA's choice differs and the second step of every shape compiles again
        shardings = jax.tree.map(lambda x: x.sharding, (self.params, self.opt_state))
        self.params, self.opt_state = jax.device_put((self.params, self.opt_state), shardings)
        self._step = jax.jit(_sft_step, static_argnames=("tx", "graphdef", "chunk_size", "image_grid"),
                             out_shardings=(*shardings, None))
        self.pad_id = pad_id
        self.chunk_size = chunk_size

    def step(self, examples: Sequence[tuple]) -> float:
        ids, mask = pack_examples(examples, self.pad_id)
        pixels, grid = (None, ())
        if any(len(e) > 2 and e[2] for e in examples):
            if self.images is None:
                raise ValueError("these examples carry images: build SFTTrainer(..., images=<the model's image "
                                 "processor>) for a vision-language model")
            pixels, grid = example_pixels(examples, self.images)
        self.params, self.opt_state, loss = self._step(
            self.params, self.opt_state, jnp.asarray(ids), jnp.asarray(mask),
            None if pixels is None else jnp.asarray(pixels),
            tx=self.tx, graphdef=self.graphdef, chunk_size=self.chunk_size, image_grid=grid)
        return float(loss)

    def model(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.params)
