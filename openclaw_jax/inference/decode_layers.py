"""The decode step's layers over decode-only weight copies: fused projections, one matmul each.

A decode step multiplies 1..B rows by every weight matrix, so on CPU its time is the number and
shape of the matmuls (each a library call that streams its weights from memory) and whatever
copies XLA adds around them, not the FLOPs. The model's `Block` (the training layout: q/k/v and
gate/up as separate `[H, ...]` kernels, heads as their own axis) makes 7 matmuls per layer; here
each layer's weights are re-laid out once, when the engine installs them (`fuse_layers`):

  * `wqkv [H, (N + 2K) * D]`: q, k and v in one matmul (columns are the three kernels side by side,
    so every output element is the same dot product as before);
  * `wgu [H, 2 * I]`: gate and up in one matmul;
  * `wo [N * D, H]`, `wd [I, H]`: the output projections as plain 2-D matrices.

Attention for one query per row (`decode_attention`) is `cached_attention`'s softmax for L = 1,
with the new key/value as a separate term (the cache is written once, after all layers).

The arithmetic is the block's (`openclaw_jax.models.decoder.Block`): RMSNorm, RoPE, scores and
softmax in float32, matmuls in the compute dtype; only the grouping of the matmuls differs.
Models with LoRA adapters, and params sharded over several devices (the concatenations would
regather them), keep the generic path (`fuse_layers` returns None).

Measured on the 2-core AVX2 CPU (b16, 128-slot cache, one core, CPU time per step, the loop compiled
without YNNPACK dots as `kernels.decode_loop_fused_jit` is): 183 ms against 237 ms for the block
path; the matmuls are ~2/3 of what is left, attention (the cache transposes of the batched dot
included) ~1/4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.models.rope import apply_rope

# LM-head columns per matmul: the [H, V] kernel is kept as [H, HEAD_CHUNK] pieces
HEAD_CHUNK = 8192
# static marker the decode loop receives instead of a layer graphdef (kernels._decode_logits)
FUSED = "fused-decode-layers"


def fuse_layers(graphdef, state):
    """A tuple (one dict per layer) of decode weights, or None when the model has LoRA adapters."""
    model = nnx.merge(graphdef, state)
    if getattr(model, "lora", None) is not None:
        return None
    if any(len(x.sharding.device_set) > 1 for x in jax.tree.leaves(state) if hasattr(x, "sharding")):
        return None
    cfg = model.cfg
    blk = model.layers
    att, mlp = blk.self_attn, blk.mlp
    stacked = {"ln1": blk.input_layernorm.weight, "q": att.q_proj.kernel, "k": att.k_proj.kernel,
               "v": att.v_proj.kernel, "o": att.o_proj.kernel, "ln2": blk.post_attention_layernorm.weight,
               "gate": mlp.gate_proj.kernel, "up": mlp.up_proj.kernel, "down": mlp.down_proj.kernel}
    if att.q_proj.bias is not None:
        stacked.update(bq=att.q_proj.bias, bk=att.k_proj.bias, bv=att.v_proj.bias)
    if att.q_norm is not None:
        stacked.update(q_norm=att.q_norm.weight, k_norm=att.k_norm.weight)
    stacked = {name: p[...] for name, p in stacked.items()}

    layers = tuple(_fused_layer(stacked, jnp.int32(i)) for i in range(cfg.num_layers))
    head = model.lm_head_kernel()  # [H, V] (the transposed embedding when tied)
    chunks = tuple(jnp.array(head[:, j:j + HEAD_CHUNK]) for j in range(0, head.shape[1], HEAD_CHUNK))
    return {"layers": layers, "head": chunks}


@jax.jit
def _fused_layer(w, i):
    """Layer i's decode weights from the stacked block params (one compilation for every layer:
    the index is traced)."""
    w = {name: x[i] for name, x in w.items()}
    flat = lambda x: x.reshape(x.shape[0], -1)  # [H, heads, D] -> [H, heads * D]
    layer = {"ln1": w["ln1"], "ln2": w["ln2"], "wd": w["down"],
             "wqkv": jnp.concatenate([flat(w["q"]), flat(w["k"]), flat(w["v"])], axis=1),
             "wo": w["o"].reshape(-1, w["o"].shape[-1]),  # [N, D, H] -> [N * D, H]
             "wgu": jnp.concatenate([w["gate"], w["up"]], axis=1)}
    if "bq" in w:
        layer["bqkv"] = jnp.concatenate([w["bq"].reshape(-1), w["bk"].reshape(-1), w["bv"].reshape(-1)])
    if "q_norm" in w:
        layer["q_norm"], layer["k_norm"] = w["q_norm"], w["k_norm"]
    return layer


def _rms(x, weight, eps, dtype):
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(dtype)


def decode_attention(q, k_new, v_new, cache_k, cache_v, positions):
    """One query per row over the cache slots before its position and its own new key.

    q `[B, N, D]`, k_new / v_new `[B, K, D]`, cache_k / cache_v `[B, S, K, D]` (read as stored),
    positions `[B]` (slots < position are visible). The same softmax as
    `openclaw_jax.models.attention.cached_attention` with L = 1, in float32.
    """
    b, n, d = q.shape
    s_len, kh = cache_k.shape[1], cache_k.shape[2]
    g = n // kh
    qg = q.reshape(b, kh, g, d)
    scale = d ** -0.5
    old = jnp.einsum("bkgd,bskd->bkgs", qg, cache_k.astype(q.dtype), preferred_element_type=jnp.float32) * scale
    new = jnp.einsum("bkgd,bkd->bkg", qg, k_new.astype(q.dtype), preferred_element_type=jnp.float32) * scale
    visible = jnp.arange(s_len, dtype=jnp.int32)[None, :] < positions[:, None]            # [B, S]
    old = jnp.where(visible[:, None, None, :], old, -jnp.inf)
    m = jnp.maximum(jnp.max(old, axis=-1), new)                                            # [B, K, G]
    p_old = jnp.exp(old - m[..., None])
    p_new = jnp.exp(new - m)
    denom = jnp.sum(p_old, axis=-1) + p_new
    out = (jnp.einsum("bkgs,bskd->bkgd", p_old.astype(q.dtype), cache_v.astype(q.dtype),
                      preferred_element_type=jnp.float32)
           + p_new[..., None] * v_new[:, :, None, :].astype(jnp.float32))                  # [B, K, G, D]
    return (out / denom[..., None]).reshape(b, n, d).astype(q.dtype)


def decode_layer(cfg, layer, h, cos, sin, cache_k, cache_v, positions):
    """One decoder block for h `[B, H]` at `positions [B]`; returns (h, k, v) with k/v `[B, K, D]`
    (written into the cache by the caller, after all layers). cos/sin `[B, 1, D]`."""
    dt = jnp.dtype(cfg.dtype)
    N, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    b = h.shape[0]
    x = _rms(h, layer["ln1"], cfg.rms_norm_eps, dt)
    qkv = jnp.dot(x, layer["wqkv"].astype(dt))
    if "bqkv" in layer:
        qkv = qkv + layer["bqkv"].astype(dt)
    q = qkv[:, :N * D].reshape(b, 1, N, D)
    k = qkv[:, N * D:(N + K) * D].reshape(b, 1, K, D)
    v = qkv[:, (N + K) * D:].reshape(b, K, D)
    if "q_norm" in layer:
        q = _rms(q, layer["q_norm"], cfg.rms_norm_eps, dt)
        k = _rms(k, layer["k_norm"], cfg.rms_norm_eps, dt)
    q, k = apply_rope(q, cos, sin)[:, 0], apply_rope(k, cos, sin)[:, 0]
    attn = decode_attention(q, k, v, cache_k, cache_v, positions)
    h = h + jnp.dot(attn.reshape(b, N * D), layer["wo"].astype(dt))
    x = _rms(h, layer["ln2"], cfg.rms_norm_eps, dt)
    gu = jnp.dot(x, layer["wgu"].astype(dt))
    inter = gu.shape[-1] // 2
    h = h + jnp.dot(jax.nn.silu(gu[:, :inter]) * gu[:, inter:], layer["wd"].astype(dt))
    return h, k.astype(cache_k.dtype), v.astype(cache_v.dtype)


def decode_head(cfg, head, h):
    """float32 logits `[B, V]` of final-norm hidden states h `[B, H]` from the LM-head pieces."""
    dt = jnp.dtype(cfg.dtype)
    return jnp.concatenate([jnp.dot(h.astype(dt), w.astype(dt), preferred_element_type=jnp.float32) for w in head],
                           axis=-1)
