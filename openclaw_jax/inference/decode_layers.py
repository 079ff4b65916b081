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

Each layer's cache is its own `[B, S, K, D]` array (the engine keeps its running cache in that
form, `kernels.zeros_cache_jit(..., per_layer=True)`): a layer writes its new key/value into its cache first and
attention then reads the updated cache, so XLA updates it in place (reading the old cache beside
an update made it copy each layer's cache twice a step). Attention for one query per row
(`decode_attention`) is `cached_attention`'s softmax for L = 1 over the slots up to the row's own.

The arithmetic is the block's (`openclaw_jax.models.decoder.Block`): RMSNorm, RoPE, scores and
softmax in float32, matmuls in the compute dtype with float32 accumulation (`models.matmul.contract`);
only the grouping of the matmuls differs.
Models with LoRA adapters, and params sharded over several devices (the concatenations would
regather them), keep the generic path (`fuse_layers` returns None). Per-row adapters of multi-adapter
serving ride along instead: each layer's dict may carry `lora` (see `decode_layer`).

Measured on the 2-core AVX2 CPU (b16, 128-slot cache, one core, CPU time per step, the loop compiled
without YNNPACK dots as the fused loop then was): 183 ms against 237 ms for the block path, when
attention still transposed and copied the caches (see `decode_attention` and above). Without those
copies, `bench/decode.py` at 16 rows (2 cores, minutes apart): 79.0 -> 117.1 tok/s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.models.matmul import contract, einsum
from openclaw_jax.models.rope import apply_rope, rope_sin_cos

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
    # the LM head as [V, H], each logit a dot of two contiguous rows: the embedding itself when
    # tied (no copy), else the head kernel transposed once
    head = model.embed_tokens[...] if model.lm_head is None else jnp.array(model.lm_head.kernel[...].T)
    return {"layers": layers, "head": head}


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


def decode_attention(q, cache_k, cache_v, positions):
    """One query per row over the cache slots up to and including its position.

    q `[B, N, D]`, cache_k / cache_v `[B, S, K, D]` (read as stored, the row's own key/value already
    written at its position), positions `[B]` (slots <= position are visible). The same softmax as
    `openclaw_jax.models.attention.cached_attention` with L = 1, in float32.

    Written as broadcast products and sums over the cache as stored, with the query heads grouped
    under their kv head (`[B, 1, K, G, D]` against `[B, S, K, 1, D]`): no transpose or copy of the
    cache, and each dot product computed once. XLA:CPU runs these as YNNPACK element-wise and
    reduce fusions. A batched matmul per (row, kv head) would first transpose each layer's cache
    to `[B, K, S, D]`; the block-diagonal query used before (plain batched matmuls over
    `[B, S, K * D]`, K times the dot products) took 2.1x as long at 16 rows x 128 slots
    (`bench/decode_attention.py`; the engine's decode at 16 rows on the AVX-512 EPYC, A/B: 360 -> 411
    tok/s; `bench/decode.py`: 330 -> 421 tok/s, 1.41x -> 1.70-1.75x transformers).
    """
    b, n, d = q.shape
    s_len, kh = cache_k.shape[1], cache_k.shape[2]
    f32 = jnp.float32
    grouped = q.astype(f32).reshape(b, 1, kh, n // kh, d)                                   # [B, 1, K, G, D]
    scores = jnp.sum(grouped * cache_k.astype(f32)[:, :, :, None, :], axis=-1) * d ** -0.5  # [B, S, K, G]
    visible = jnp.arange(s_len, dtype=jnp.int32)[None, :] <= positions[:, None]            # [B, S]
    probs = jax.nn.softmax(jnp.where(visible[:, :, None, None], scores, -jnp.inf), axis=1)
    out = jnp.sum(probs[..., None] * cache_v.astype(f32)[:, :, :, None, :], axis=1)         # [B, K, G, D]
    return out.reshape(b, n, d).astype(q.dtype)


def _row_lora(x, lora, parts, dt):
    """Per-row LoRA deltas of x `[B, in]` for the projections `parts` ((target, out width), ...) side by
    side, as the fused matrices lay out their outputs: `(x A[b]) B[b]` with lora[target] = (A `[B, in, r]`,
    B `[B, r, out]`), each row's own adapter (`adapters.AdapterBank.layer_rows`); a target without an
    adapter adds zeros."""
    out = []
    for target, width in parts:
        if target in lora:
            a, b = lora[target]
            low = einsum("bi,bir->br", x, a, dt)
            out.append(einsum("br,bro->bo", low, b, dt))
        else:
            out.append(jnp.zeros((x.shape[0], width), dt))
    return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)


def write_cache_slots(cache, rows, positions, new):
    """cache `[B, S, K, D]` with row b's slot positions[b] set to new[b] (a slot past the end: nothing).

    A 16-bit cache is scattered as its bits (uint16): XLA:CPU has no bfloat16 scatter and would convert
    the whole cache to float32 and back around it, every layer of every step."""
    new = new.astype(cache.dtype)
    if cache.dtype.itemsize != 2:
        return cache.at[rows, positions].set(new, mode="drop")
    bits = jax.lax.bitcast_convert_type(cache, jnp.uint16)
    bits = bits.at[rows, positions].set(jax.lax.bitcast_convert_type(new, jnp.uint16), mode="drop")
    return jax.lax.bitcast_convert_type(bits, cache.dtype)


def decode_layer(cfg, layer, h, cos, sin, cache_k, cache_v, positions):
    """One decoder block for h `[B, H]` at `positions [B]` over this layer's cache `[B, S, K, D]`;
    returns (h, cache_k, cache_v) with each row's new key/value written at its position (a position
    past the cache end writes nothing). cos/sin `[B, 1, D]`. With `layer["lora"]` (per-row adapters,
    multi-adapter serving) each projection adds its row's unmerged LoRA delta (`_row_lora`)."""
    dt = jnp.dtype(cfg.dtype)
    N, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    b = h.shape[0]
    lora = layer.get("lora")
    x = _rms(h, layer["ln1"], cfg.rms_norm_eps, dt)
    qkv = contract(x, layer["wqkv"], 1, dt)
    if "bqkv" in layer:
        qkv = qkv + layer["bqkv"].astype(dt)
    if lora is not None:
        qkv = qkv + _row_lora(x, lora, (("q", N * D), ("k", K * D), ("v", K * D)), dt)
    q = qkv[:, :N * D].reshape(b, 1, N, D)
    k = qkv[:, N * D:(N + K) * D].reshape(b, 1, K, D)
    v = qkv[:, (N + K) * D:].reshape(b, K, D)
    if "q_norm" in layer:
        q = _rms(q, layer["q_norm"], cfg.rms_norm_eps, dt)
        k = _rms(k, layer["k_norm"], cfg.rms_norm_eps, dt)
    q, k = apply_rope(q, cos, sin)[:, 0], apply_rope(k, cos, sin)[:, 0]
    rows = jnp.arange(b)
    cache_k = write_cache_slots(cache_k, rows, positions, k)
    cache_v = write_cache_slots(cache_v, rows, positions, v)
    attn = decode_attention(q, cache_k, cache_v, positions).reshape(b, N * D)
    o = contract(attn, layer["wo"], 1, dt)
    if lora is not None:
        o = o + _row_lora(attn, lora, (("o", o.shape[-1]),), dt)
    h = h + o
    x = _rms(h, layer["ln2"], cfg.rms_norm_eps, dt)
    gu = contract(x, layer["wgu"], 1, dt)
    inter = gu.shape[-1] // 2
    if lora is not None:
        gu = gu + _row_lora(x, lora, (("gate", inter), ("up", inter)), dt)
    act = jax.nn.silu(gu[:, :inter]) * gu[:, inter:]
    down = contract(act.astype(dt), layer["wd"], 1, dt)
    if lora is not None:
        down = down + _row_lora(act, lora, (("down", down.shape[-1]),), dt)
    return h + down, cache_k, cache_v


def decode_step(cfg, weights, embed, norm, tokens, positions, cache):
    """One fused decode step: tokens / positions `[B]`, `cache` a KVCache of per-layer tuples of
    `[B, S, K, D]` arrays (the engine's running cache); returns (float32 logits `[B, V]`, the updated cache).
    `embed` / `norm` are the model's token embedding and final norm."""
    positions = positions.astype(jnp.int32)
    h = embed(tokens[:, None]).astype(jnp.dtype(cfg.dtype))[:, 0]
    cos, sin = rope_sin_cos(positions[:, None], cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.mrope_section)
    ks, vs = [], []
    for layer, ck, cv in zip(weights["layers"], cache.k, cache.v):
        h, ck, cv = decode_layer(cfg, layer, h, cos, sin, ck, cv, positions)
        ks.append(ck)
        vs.append(cv)
    return decode_head(cfg, weights["head"], norm(h[:, None])[:, 0]), type(cache)(tuple(ks), tuple(vs))


def decode_head(cfg, head, h):
    """float32 logits `[B, V]` of final-norm hidden states h `[B, H]` from the `[V, H]` LM head."""
    dt = jnp.dtype(cfg.dtype)
    return jnp.einsum("bh,vh->bv", h.astype(dt), head.astype(dt), preferred_element_type=jnp.float32)
