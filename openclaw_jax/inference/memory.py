"""What the engine holds in device memory, from the served model's config and the `EngineConfig` alone (no
weights, nothing allocated): `serving_memory`, the serving side of the planner (`python -m openclaw_jax.plan`).

The engine runs on one device (its default device). What it holds there:

- the weights: the served model's params, and with `unrolled_decode` the decode's own copy of every layer
  (`decode_layers.fuse_layers`: q/k/v and gate/up fused; the LM head as well when it is not tied);
- the running batch's KV cache: at most `kv_cache_budget_bytes`, or the longest sequence alone when that is
  more (a new batch always takes its first sequence, in `bucket(1, min_batch_bucket)` rows);
- the prefix cache's pool, at most `prefix_cache_bytes` in whole blocks;
- with `lora_slots`: the adapter bank (`adapters.AdapterBank`: `lora_slots + 1` slots at `lora_max_rank`, slot
  0 all zeros) and the per-row copies a call gathers from it: a decode call's rows and a prefill call's,
  each at most the largest batch bucket.

Not counted: the prefill and decode programs' activations and temporaries, and the moments where a growing
cache or pool exists twice (old and new); keep headroom for them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.inference.adapters import adapter_slot_bytes
from openclaw_jax.inference.decode_layers import fuse_layers
from openclaw_jax.inference.scheduler import EngineConfig, bucket, cache_bucket
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder


def kv_bytes_per_token(cfg: ModelConfig) -> int:
    """K and V of one token over every layer, in the compute dtype (what the KV cache and the prefix pool hold)."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize


def _bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


@dataclasses.dataclass(frozen=True)
class ServingMemory:
    """The engine's device memory in bytes (module doc); `slots` adapter slots besides slot 0."""

    weights: int
    decode_weights: int
    kv_cache: int
    prefix_cache: int
    slot_bytes: int
    slots: int
    row_adapters: int
    longest_sequence: int
    kv_bytes_per_token: int

    @property
    def adapter_slots(self) -> int:
        """The bank: `slots` adapters and the zero slot 0 (none without slots)."""
        return (self.slots + 1) * self.slot_bytes if self.slots else 0

    @property
    def without_adapters(self) -> int:
        """Everything but the adapters' own slots (slot 0 and the gathered rows included)."""
        return self.weights + self.decode_weights + self.kv_cache + self.prefix_cache + self.row_adapters + \
            self.slot_bytes

    @property
    def total(self) -> int:
        return self.weights + self.decode_weights + self.kv_cache + self.prefix_cache + self.row_adapters + \
            self.adapter_slots

    def slots_within(self, budget: int) -> int:
        """The most adapter slots that fit in `budget` bytes beside everything else (0 when nothing does)."""
        return max(0, (int(budget) - self.without_adapters) // self.slot_bytes) if self.slot_bytes else 0

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "adapter_slots": self.adapter_slots, "total": self.total}


def serving_memory(cfg: ModelConfig, config: EngineConfig, *, longest_sequence: int) -> ServingMemory:
    """The device memory of an engine serving `cfg` (its params in `cfg.param_dtype`, K/V in `cfg.dtype`) with
    `config`, for sequences (prompt + new tokens) of at most `longest_sequence` tokens (module doc)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    decode = 0
    if config.unrolled_decode:
        fused = jax.eval_shape(lambda s: fuse_layers(graphdef, s), state)
        # a tied head is the embedding itself (no copy); an untied one is transposed once
        decode = _bytes(fused["layers"]) + (0 if cfg.tie_word_embeddings else _bytes(fused["head"]))
    per_token = kv_bytes_per_token(cfg)
    alone = bucket(1, config.min_batch_bucket) * cache_bucket(longest_sequence, config) * per_token
    block = config.prefix_cache_block
    slot = adapter_slot_bytes(cfg, max_rank=config.lora_max_rank, targets=tuple(config.lora_targets)) \
        if config.lora_slots else 0
    rows = bucket(config.max_batch_size, config.min_batch_bucket)
    return ServingMemory(weights=_bytes(state), decode_weights=decode,
                         kv_cache=max(config.kv_cache_budget_bytes, alone),
                         prefix_cache=config.prefix_cache_bytes // (block * per_token) * block * per_token,
                         slot_bytes=slot, slots=config.lora_slots, row_adapters=2 * rows * slot,
                         longest_sequence=int(longest_sequence), kv_bytes_per_token=per_token)
