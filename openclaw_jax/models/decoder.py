"""One config-driven decoder for the Llama, Qwen2 and Qwen3 families (Flax NNX).

Differences between families are config flags on `ModelConfig`: `attention_bias` (Qwen2 q/k/v
bias), `qk_norm` (Qwen3 per-head RMSNorm on q and k before RoPE), `tie_word_embeddings`.

Layout choices
- Layers are *stacked*: every block param has a leading `num_layers` axis and the forward runs
  `jax.lax.scan` over it, so a 36-layer model compiles as fast as a 2-layer one. The block code
  itself sees one layer (the scan body merges the block graph with one slice of the params).
- Kernels are stored [in, out] with heads kept as their own axis (q: [H, heads, head_dim],
  o: [heads, head_dim, H]) so sharding rules can split whole heads over `tp`.
- Norms, RoPE sin/cos, attention scores and softmax run in float32; matmuls and activations in
  `cfg.dtype`; params are stored in `cfg.param_dtype`.
- Every param carries its logical axis names as `out_sharding` metadata (see
  `openclaw_jax.parallel.sharding`); activations are constrained at block boundaries whenever a
  mesh is active.

KV cache: `KVCache(k, v)` with k, v `[num_layers, B, max_len, kv_heads, head_dim]`. `decode`
writes this call's k/v at slot `positions[b, l]` of row b (out-of-range slots are dropped); a
query at position p attends to the cache slots before the call's first position and to the
call's own tokens at positions <= p (positions contiguous per row), so right-padded prefill and
one-token steps share one function. The layers read the cache in place and the new k/v are
scattered in once after the layer scan, so a decode step does not copy the cache.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.models.attention import AttentionMask, attention, cached_attention
from openclaw_jax.models.config import LoRAConfig, ModelConfig
from openclaw_jax.models.matmul import contract, einsum
from openclaw_jax.models.rope import apply_rope, rope_sin_cos
from openclaw_jax.parallel.sharding import constrain

_INIT_STDDEV = 0.02  # HF `initializer_range` default for these families.


class KVCache(NamedTuple):
    """Per-layer keys/values: `[num_layers, B, max_len, kv_heads, head_dim]` each."""

    k: jax.Array
    v: jax.Array


def _param(value: jax.Array, axes: Sequence[str | None], kind: type[nnx.Param] = nnx.Param) -> nnx.Param:
    # eager_sharding=False: the logical names are resolved to mesh axes by the parallel module
    # (which can fall back to replication for non-divisible dims), not at construction.
    return kind(value, out_sharding=tuple(axes), eager_sharding=False)


def init_normal(rngs: nnx.Rngs, shape: Sequence[int], dtype: jnp.dtype, stddev: float = _INIT_STDDEV) -> jax.Array:
    key = rngs.params()
    if isinstance(key, jax.core.Tracer):  # under jit / eval_shape: stay symbolic
        return (stddev * jax.random.normal(key, tuple(shape), jnp.float32)).astype(dtype)
    # Eager construction: draw on the host from a generator seeded by the key. Eager
    # jax.random.normal compiles one XLA program per distinct shape, which dominated the start-up
    # of small models on CPU; the values are still a deterministic function of the Rngs seed.
    seed = np.asarray(jax.random.key_data(key)).astype(np.uint64).ravel().tolist()
    draw = np.random.default_rng(seed).standard_normal(tuple(shape), dtype=np.float32)
    return jnp.asarray((stddev * draw).astype(dtype))


class LoRAParam(nnx.Param):
    """A trainable low-rank adapter param (the base params stay plain `nnx.Param`); see `models/lora.py`."""


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis, computed in float32."""

    def __init__(self, dim: int, axis_name: str, *, stack: tuple[int, ...], eps: float, dtype: jnp.dtype,
                 param_dtype: jnp.dtype):
        self.eps = eps
        self.dtype = dtype
        stack_axes = ("layers",) * len(stack)
        self.weight = _param(jnp.ones(stack + (dim,), param_dtype), stack_axes + (axis_name,))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return (normed * self.weight[...].astype(jnp.float32)).astype(self.dtype)


class Projection(nnx.Module):
    """y = x . W (+ b) (+ scale * (x . A) . B): contracts the last len(in_shape) dims of x.

    W is [*stack, *in_shape, *out_shape]. With LoRA, A is [*stack, *in_shape, r] (random) and
    B is [*stack, r, *out_shape] (zeros), so the adapted model equals the base at init. A and B may
    also carry a leading batch-row axis after the stack (`[*stack, B, *in_shape, r]`): each row of x
    then gets its own adapter (multi-adapter serving).
    """

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...], in_axes: tuple[str, ...],
                 out_axes: tuple[str, ...], *, stack: tuple[int, ...], bias: bool, lora: LoRAConfig | None,
                 dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs):
        self.in_ndim = len(in_shape)
        self.dtype = dtype
        stack_axes = ("layers",) * len(stack)
        self.kernel = _param(init_normal(rngs, stack + in_shape + out_shape, param_dtype), stack_axes + in_axes + out_axes)
        self.bias = _param(jnp.zeros(stack + out_shape, param_dtype), stack_axes + out_axes) if bias else None
        if lora is not None:
            fan_in = 1
            for d in in_shape:
                fan_in *= d
            self.lora_scale = lora.scale
            self.lora_a = _param(init_normal(rngs, stack + in_shape + (lora.rank,), param_dtype, fan_in ** -0.5),
                                 stack_axes + in_axes + ("lora_rank",), LoRAParam)
            self.lora_b = _param(jnp.zeros(stack + (lora.rank,) + out_shape, param_dtype),
                                 stack_axes + ("lora_rank",) + out_axes, LoRAParam)
        else:
            self.lora_scale = None
            self.lora_a = None
            self.lora_b = None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        y = contract(x, self.kernel[...], self.in_ndim, self.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        if self.lora_a is not None:
            a, b = self.lora_a[...].astype(self.dtype), self.lora_b[...].astype(self.dtype)
            if a.ndim == self.in_ndim + 2:
                # one adapter per batch row (a [B, *in, r], b [B, r, *out]): multi-adapter serving
                # (`openclaw_jax.inference.adapters`)
                rows, rank = a.shape[0], a.shape[-1]
                low = einsum("bsi,bir->bsr", x.reshape(rows, -1, a[0].size // rank), a.reshape(rows, -1, rank),
                             self.dtype)
                delta = einsum("bsr,bro->bso", low, b.reshape(rows, rank, -1), self.dtype)
                return y + self.lora_scale * delta.reshape(y.shape)
            low = contract(x, a, self.in_ndim, self.dtype)
            y = y + self.lora_scale * contract(low, b, 1, self.dtype)
        return y


def _targets(lora: LoRAConfig | None, name: str) -> LoRAConfig | None:
    return lora if lora is not None and name in lora.targets else None


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, stack: tuple[int, ...], lora: LoRAConfig | None, rngs: nnx.Rngs):
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        H, N, K, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        common = dict(stack=stack, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.q_proj = Projection((H,), (N, D), ("embed",), ("heads", "head_dim"), bias=cfg.attention_bias,
                                 lora=_targets(lora, "q"), **common)
        self.k_proj = Projection((H,), (K, D), ("embed",), ("kv_heads", "head_dim"), bias=cfg.attention_bias,
                                 lora=_targets(lora, "k"), **common)
        self.v_proj = Projection((H,), (K, D), ("embed",), ("kv_heads", "head_dim"), bias=cfg.attention_bias,
                                 lora=_targets(lora, "v"), **common)
        self.o_proj = Projection((N, D), (H,), ("heads", "head_dim"), ("embed",), bias=False,
                                 lora=_targets(lora, "o"), **common)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(D, "head_dim", stack=stack, eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)
            self.k_norm = RMSNorm(D, "head_dim", stack=stack, eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)
        else:
            self.q_norm = None
            self.k_norm = None
        self.dtype = dt

    def __call__(self, x, cos, sin, mask, cache_k, cache_v, write_positions):
        """Full forward (cache None): causal attention under `mask` (an `AttentionMask`: padding,
        segments, implementation); returns (out, None, None), or (out, k, v) with
        `mask.return_kv` (prefill into an empty cache).

        Cached: attend to the cache slots before this call's first position (read in place) and
        to this call's own tokens causally by position; returns (out, k, v) of the new tokens,
        which the caller writes into the cache once, after all layers (no per-layer cache copy).
        """
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache_k is None:
            # a prefill into a cache (return_kv) is inference: never differentiated
            out = attention(q, k, v, causal=True, kv_mask=mask.kv_mask, segment_ids=mask.segment_ids,
                            implementation=mask.implementation, block_q=mask.block_size, block_k=mask.block_size,
                            forward_only=mask.return_kv)
            if mask.return_kv:
                return self.o_proj(out), k, v
            return self.o_proj(out), None, None
        out = cached_attention(q, k, v, cache_k, cache_v, write_positions, None if mask is None else mask.segment_ids)
        return self.o_proj(out), k.astype(cache_k.dtype), v.astype(cache_v.dtype)


class MLP(nnx.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, stack: tuple[int, ...], lora: LoRAConfig | None, rngs: nnx.Rngs):
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        H, I = cfg.hidden_size, cfg.intermediate_size
        common = dict(stack=stack, bias=False, dtype=dt, param_dtype=pdt, rngs=rngs)
        self.gate_proj = Projection((H,), (I,), ("embed",), ("mlp",), lora=_targets(lora, "gate"), **common)
        self.up_proj = Projection((H,), (I,), ("embed",), ("mlp",), lora=_targets(lora, "up"), **common)
        self.down_proj = Projection((I,), (H,), ("mlp",), ("embed",), lora=_targets(lora, "down"), **common)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    """Pre-norm decoder block; constructed stacked (`stack=(num_layers,)`), called on one layer."""

    def __init__(self, cfg: ModelConfig, *, stack: tuple[int, ...], lora: LoRAConfig | None, rngs: nnx.Rngs):
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        H = cfg.hidden_size
        self.family = cfg.family
        self.input_layernorm = RMSNorm(H, "norm", stack=stack, eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)
        self.self_attn = Attention(cfg, stack=stack, lora=lora, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(H, "norm", stack=stack, eps=cfg.rms_norm_eps, dtype=dt,
                                                param_dtype=pdt)
        self.mlp = MLP(cfg, stack=stack, lora=lora, rngs=rngs)

    def __call__(self, h, cos, sin, mask, cache_k, cache_v, write_positions):
        attn, cache_k, cache_v = self.self_attn(self.input_layernorm(h), cos, sin, mask, cache_k, cache_v,
                                                write_positions)
        h = h + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return constrain(h, ("batch", "seq", "act_embed"), self.family), cache_k, cache_v


class Decoder(nnx.Module):
    """Causal LM. `Decoder(cfg, rngs=nnx.Rngs(0))`; `lora=LoRAConfig(...)` adds adapters (see lora.py)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, lora: LoRAConfig | None = None):
        self.cfg = cfg
        self.lora = lora
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        self.embed_tokens = _param(init_normal(rngs, (cfg.vocab_size, cfg.hidden_size), pdt), ("vocab", "embed"))
        self.layers = Block(cfg, stack=(cfg.num_layers,), lora=lora, rngs=rngs)
        self.norm = RMSNorm(cfg.hidden_size, "norm", stack=(), eps=cfg.rms_norm_eps, dtype=dt, param_dtype=pdt)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Projection((cfg.hidden_size,), (cfg.vocab_size,), ("embed",), ("vocab",), stack=(),
                                      bias=False, lora=None, dtype=dt, param_dtype=pdt, rngs=rngs)

    # -- public API ---------------------------------------------------------------------------

    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None) -> jax.Array:
        """Logits float32 `[B, L, V]`."""
        return self.logits(self.hidden_states(input_ids, positions, attention_mask, segment_ids))

    def hidden_states(self, input_ids: jax.Array, positions: jax.Array | None = None,
                      attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None) -> jax.Array:
        """Final-norm hidden states `[B, L, H]` in cfg.dtype.

        positions (RoPE) default to 0..L-1 per row (as HF does without position_ids). Attention is
        causal over the sequence index; `attention_mask[b, j] = False` (`[B, L]`) hides key j from
        every query; with `segment_ids` `[B, L]` (packing) a query sees only keys of its own
        segment. No `[B, L, L]` mask is built: `cfg.attention` computes it per block from indices.
        """
        return self.hidden_states_from_embeds(self.embed(input_ids), positions, attention_mask, segment_ids)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        """Token embeddings `[B, L, H]` in cfg.dtype."""
        return jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(jnp.dtype(self.cfg.dtype))

    def hidden_states_from_embeds(self, embeds: jax.Array, positions: jax.Array | None = None,
                                  attention_mask: jax.Array | None = None,
                                  segment_ids: jax.Array | None = None) -> jax.Array:
        """`hidden_states` from input embeddings `[B, L, H]` (e.g. with image features placed in them).

        positions `[B, L]`, or `[3, B, L]` (temporal, height, width) for M-RoPE (`cfg.mrope_section`);
        attention stays causal over the sequence index either way.
        """
        B, L = embeds.shape[:2]
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
        mask = AttentionMask(None if attention_mask is None else attention_mask.astype(bool),
                             None if segment_ids is None else segment_ids.astype(jnp.int32),
                             self.cfg.attention, self.cfg.attention_block_size)
        h, _ = self._run(embeds, positions, mask, None)
        return h

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden `[..., H]` -> float32 logits `[..., V]`."""
        dt = jnp.dtype(self.cfg.dtype)
        out = jnp.einsum("...h,hv->...v", hidden.astype(dt), self.lm_head_kernel(), preferred_element_type=jnp.float32)
        if out.ndim == 3:
            out = constrain(out, ("batch", "seq", "act_vocab"), self.cfg.family)
        return out

    def lm_head_kernel(self) -> jax.Array:
        """The LM-head matrix `[H, V]` in cfg.dtype (the transposed embedding when tied)."""
        dt = jnp.dtype(self.cfg.dtype)
        if self.lm_head is None:
            return self.embed_tokens[...].T.astype(dt)
        return self.lm_head.kernel[...].astype(dt)

    def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
        cfg = self.cfg
        shape = (cfg.num_layers, batch_size, max_len, cfg.num_kv_heads, cfg.head_dim)
        dt = jnp.dtype(dtype or cfg.dtype)
        return KVCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt))

    def decode(self, input_ids: jax.Array, positions: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """(logits float32 `[B, L, V]`, new cache); see the module docstring for slot semantics."""
        hidden, cache = self.decode_hidden(input_ids, positions, cache)
        return self.logits(hidden), cache

    def decode_hidden(self, input_ids: jax.Array, positions: jax.Array, cache: KVCache,
                      segment_ids: jax.Array | None = None, *, embeds: jax.Array | None = None,
                      rope_positions: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
        """Like `decode` but returns final-norm hidden states `[B, L, H]`.

        `segment_ids [B, L]`: the row holds several continuations of the cached prefix (each a
        contiguous segment, positions from the prefix's length), which never see each other; the
        returned cache is then meaningless (their k/v share slots), only the hidden states count.
        `embeds` replace the token embeddings; `rope_positions` (`[B, L]` or M-RoPE `[3, B, L]`)
        rotate q/k instead of `positions`, which then only name the cache slots (vision-language models).
        """
        mask = None if segment_ids is None else AttentionMask(segment_ids=segment_ids)
        h = self.embed(input_ids) if embeds is None else embeds
        return self._run(h, positions.astype(jnp.int32), mask, cache, rope_positions)

    def prefill_hidden(self, input_ids: jax.Array, cache: KVCache, *, embeds: jax.Array | None = None,
                       rope_positions: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
        """`decode_hidden` of tokens at positions 0..L-1 into an *empty* cache (a prompt prefill).

        Same result, but the attention is the full forward's (`cfg.attention`: blockwise or fused,
        no `[L, L]` scores or mask), not the dense attention over the cache. Right padding is
        harmless (causal); k/v are written at slots 0..L-1. `embeds`, `rope_positions`: as in `decode_hidden`.
        """
        B, L = input_ids.shape
        positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
        mask = AttentionMask(None, None, self.cfg.attention, self.cfg.attention_block_size, return_kv=True)
        h = self.embed(input_ids) if embeds is None else embeds
        return self._run(h, positions, mask, cache, rope_positions)

    # -- internals ----------------------------------------------------------------------------

    def _run(self, h, positions, mask, cache: KVCache | None, rope_positions=None):
        """The layer scan from input embeddings h `[B, L, H]`. positions `[B, L]`: the cache slots
        and, unless `rope_positions` are given, the RoPE positions; in the full forward (no cache)
        positions may be M-RoPE rows `[3, B, L]` themselves."""
        cfg = self.cfg
        h = constrain(h.astype(jnp.dtype(cfg.dtype)), ("batch", "seq", "act_embed"), cfg.family)
        rope = positions if rope_positions is None else rope_positions
        cos, sin = rope_sin_cos(rope, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.mrope_section)
        if positions.ndim == 3:
            if cache is not None:
                raise ValueError("with a KV cache, give the slots as positions [B, L] and M-RoPE rows as "
                                 "rope_positions [3, B, L]")
            positions = None  # only the cache path reads write positions
        graphdef, stacked = nnx.split(self.layers)

        def layer(h, xs):
            layer_params, cache_k, cache_v = xs
            block = nnx.merge(graphdef, layer_params)
            h, cache_k, cache_v = block(h, cos, sin, mask, cache_k, cache_v, positions)
            return h, (cache_k, cache_v)

        if cfg.remat:
            layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable)
        if cache is None:
            h, _ = jax.lax.scan(layer, h, (stacked, None, None))
            new_cache = None
        else:
            cache_axes = ("cache_layers", "batch", "cache_seq", "act_kv_heads", "act_head_dim")
            ck = constrain(cache.k, cache_axes, cfg.family)
            cv = constrain(cache.v, cache_axes, cfg.family)
            # The layers only read the cache; this call's k/v ([layers, B, L, K, D]) are written
            # once afterwards, in place when the caller donates the cache. A prefill (mask with
            # return_kv) does not read the empty cache at all.
            cache_xs = (None, None) if mask is not None and mask.return_kv else (ck, cv)
            h, (new_k, new_v) = jax.lax.scan(layer, h, (stacked,) + cache_xs)
            new_k, new_v = new_k.astype(ck.dtype), new_v.astype(cv.dtype)
            if cache_xs[0] is None and ck.shape[2] == new_k.shape[2]:
                # a prefill that fills its whole cache (slots 0..L-1): the new k/v are the cache
                ck, cv = new_k, new_v
            else:
                rows = jnp.broadcast_to(jnp.arange(h.shape[0])[:, None], positions.shape)
                # mode="drop": slots past the cache end (padding beyond max_len) are ignored.
                ck = ck.at[:, rows, positions].set(new_k, mode="drop")
                cv = cv.at[:, rows, positions].set(new_v, mode="drop")
            new_cache = KVCache(constrain(ck, cache_axes, cfg.family), constrain(cv, cache_axes, cfg.family))
        return self.norm(h), new_cache
