"""The engine's pure jitted steps: prefill (with optional prompt log-probs), extend prefill over a
cached prefix, row insert, decode, and the prefix-cache pool's gather / store / grow.

The model's graphdef is bound with `functools.partial` by the engine; params arrive as an
`nnx.State`, so a weight swap never recompiles. Each bucketed shape compiles once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.inference import sampling as sampling_ops
from openclaw_jax.inference.decode_layers import FUSED, decode_step
from openclaw_jax.models.decoder import KVCache
from openclaw_jax.models.rope import rope_sin_cos
from openclaw_jax.parallel.sharding import constrain


def _sample_outputs(log_src_logits, temps, top_p, top_k, min_p, keys, steps, token_ids, n_top, k_ids):
    skeys = sampling_ops.step_keys(keys, steps)
    tokens, log_probs = sampling_ops.sample_tokens(log_src_logits, temps, top_p, top_k, min_p, skeys)
    out = {"tokens": tokens, "token_lp": sampling_ops.gather_logprobs(log_probs, tokens[:, None])[:, 0]}
    if n_top:
        out["top_vals"], out["top_ids"] = sampling_ops.top_logprobs(log_probs, n_top)
    if k_ids:
        out["ids_lp"] = sampling_ops.gather_logprobs(log_probs, token_ids)
    return out


def _prompt_outputs(model, hidden, input_ids, lengths, temps, top_p, top_k, min_p, keys, token_ids, *,
                    n_top: int, k_ids: int, want_input: bool):
    """First sampled token (at each row's last prompt token) and, optionally, prompt log-probs."""
    b, lp_len = input_ids.shape
    last = hidden[jnp.arange(b), lengths - 1]
    logits = model.logits(last)
    out = _sample_outputs(logits, temps, top_p, top_k, min_p, keys, jnp.zeros((b,), jnp.int32), token_ids,
                          n_top, k_ids)
    if want_input:
        # Prompt log-probs: position t predicts token t + 1.
        all_lp = sampling_ops.scaled_log_probs(model.logits(hidden), temps)
        nxt = jnp.concatenate([input_ids[:, 1:], jnp.zeros((b, 1), input_ids.dtype)], axis=1)
        out["in_lp"] = sampling_ops.gather_logprobs(all_lp, nxt[..., None])[..., 0]
        if n_top:
            out["in_top_vals"], out["in_top_ids"] = sampling_ops.top_logprobs(all_lp, n_top)
        if k_ids:
            out["in_ids_lp"] = sampling_ops.gather_logprobs(
                all_lp, jnp.broadcast_to(token_ids[:, None, :], (b, lp_len, token_ids.shape[-1])))
    return out


def _prefill_impl(graphdef, state, input_ids, lengths, temps, top_p, top_k, min_p, keys, token_ids, *,
                  n_top: int, k_ids: int, want_input: bool):
    model = nnx.merge(graphdef, state)
    b, lp_len = input_ids.shape
    # the prompt attends causally to itself: the full-forward attention (blockwise/fused), no [L, L] scores
    hidden, cache = model.prefill_hidden(input_ids, model.init_cache(b, lp_len))
    out = _prompt_outputs(model, hidden, input_ids, lengths, temps, top_p, top_k, min_p, keys, token_ids,
                          n_top=n_top, k_ids=k_ids, want_input=want_input)
    out["cache"] = cache
    return out


def _extend_impl(graphdef, state, cache, input_ids, starts, lengths, temps, top_p, top_k, min_p, keys, token_ids,
                 *, n_top: int, k_ids: int, want_input: bool):
    """Prefill of the tokens after a cached prefix ("extend"): row b's `input_ids` sit at positions
    starts[b].. and attend to cache slots < starts[b] (the prefix, gathered from the prefix cache)
    and causally to themselves; their k/v are written at those slots. Outputs as `_prefill_impl`,
    with prompt log-probs indexed from starts[b]."""
    model = nnx.merge(graphdef, state)
    ln = input_ids.shape[1]
    positions = starts[:, None] + jnp.arange(ln, dtype=jnp.int32)[None, :]
    hidden, cache = model.decode_hidden(input_ids, positions, cache)
    out = _prompt_outputs(model, hidden, input_ids, lengths, temps, top_p, top_k, min_p, keys, token_ids,
                          n_top=n_top, k_ids=k_ids, want_input=want_input)
    out["cache"] = cache
    return out


def _insert_impl(big, small, rows):
    """Copy prefill caches `[layers, b, Lp, ...]` into rows of the running cache, stacked or per layer
    (`_per_layer`; rows >= B are dropped)."""
    if _per_layer(big):
        def one(layers, src):
            # an extend prefill's cache (bucketed prefix + bucketed new tokens) may be longer than
            # the running cache; past the row's prompt it holds only padding, so it is cut to fit
            n = min(src.shape[2], layers[0].shape[1])
            return tuple(x.at[rows, :n].set(src[i, :, :n].astype(x.dtype), mode="drop") for i, x in enumerate(layers))
        return KVCache(one(big.k, small.k), one(big.v, small.v))
    lp_len = min(small.k.shape[2], big.k.shape[2])
    k = big.k.at[:, rows, :lp_len].set(small.k[:, :, :lp_len].astype(big.k.dtype), mode="drop")
    v = big.v.at[:, rows, :lp_len].set(small.v[:, :, :lp_len].astype(big.v.dtype), mode="drop")
    return type(big)(k, v)


def _decode_impl(graphdef, state, cache, tokens, positions, temps, top_p, top_k, min_p, keys, steps, token_ids,
                 *, n_top: int, k_ids: int):
    model = nnx.merge(graphdef, state)
    logits, cache = model.decode(tokens[:, None], positions[:, None], cache)
    out = _sample_outputs(logits[:, 0], temps, top_p, top_k, min_p, keys, steps, token_ids, n_top, k_ids)
    out["cache"] = cache
    return out


def split_layers(graphdef, state):
    """(graphdef of one block, a tuple of per-layer param states) from the model's stacked layers.

    The decode steps run the layers unrolled over these separate arrays: a `lax.scan` over the
    stacked `[layers, ...]` weights makes XLA:CPU copy every layer's weights out of the stack on
    every step (a dynamic-slice fusion before each dot), which at small batch costs about as much
    memory traffic as the matmuls themselves. Costs one extra copy of the layer weights in memory.
    """
    model = nnx.merge(graphdef, state)
    layer_graphdef, stacked = nnx.split(model.layers)
    n = model.cfg.num_layers
    return layer_graphdef, tuple(jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n))


def _per_layer(cache) -> bool:
    """Whether `cache` is the fused decode's running cache: `KVCache` of per-layer tuples of `[B, S, K, D]`
    arrays (`zeros_cache_jit(..., per_layer=True)`; slicing layer i out of a stacked cache inside the
    decode loop copies it, every layer and every step), rather than stacked `[layers, B, S, K, D]`."""
    return isinstance(cache.k, tuple)


def _decode_logits(model, layer_graphdef, layer_states, tokens, positions, cache):
    """`model.decode(tokens[:, None], positions[:, None], cache)` with the layers unrolled over
    separate per-layer weights (see `split_layers`; the same ops layer by layer). The fused decode
    weights run `decode_layers.decode_step` instead."""
    if layer_states is None:
        logits, cache = model.decode(tokens[:, None], positions[:, None], cache)
        return logits[:, 0], cache
    cfg = model.cfg
    positions = positions[:, None].astype(jnp.int32)
    h = constrain(model.embed(tokens[:, None]).astype(jnp.dtype(cfg.dtype)), ("batch", "seq", "act_embed"), cfg.family)
    cos, sin = rope_sin_cos(positions, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.mrope_section)
    cache_axes = ("cache_layers", "batch", "cache_seq", "act_kv_heads", "act_head_dim")
    ck = constrain(cache.k, cache_axes, cfg.family)
    cv = constrain(cache.v, cache_axes, cfg.family)
    new_k, new_v = [], []
    for i, layer_state in enumerate(layer_states):
        block = nnx.merge(layer_graphdef, layer_state)
        h, k, v = block(h, cos, sin, None, ck[i], cv[i], positions)
        new_k.append(k)
        new_v.append(v)
    new_k = jnp.stack(new_k).astype(ck.dtype)
    new_v = jnp.stack(new_v).astype(cv.dtype)
    rows = jnp.broadcast_to(jnp.arange(h.shape[0])[:, None], positions.shape)
    ck = ck.at[:, rows, positions].set(new_k, mode="drop")
    cv = cv.at[:, rows, positions].set(new_v, mode="drop")
    cache = KVCache(constrain(ck, cache_axes, cfg.family), constrain(cv, cache_axes, cfg.family))
    return model.logits(model.norm(h))[:, 0], cache


def _decode_loop_impl(graphdef, layer_graphdef, state, layer_states, cache, tokens, positions, temps, top_p, top_k,
                      min_p, keys, steps, token_ids, stop_ids, remaining, limits, n_steps, stop_on_finish, *,
                      n_top: int, k_ids: int, max_steps: int):
    """Up to `n_steps` (<= static `max_steps`) decode steps in one call, without a host round trip.

    Each step is exactly `_decode_impl` (same model call, same per-row key `fold_in(key, step)`),
    fed its own sampled token. A row stops on device once it would finish on the host without a
    tokenizer (SGLang's order: `remaining` new tokens reached, its next slot at `limits`, a token in
    its `stop_ids` row, -1 padded); stopped rows (and empty rows: remaining <= 0) write past the
    cache end, which the decoder drops. The loop ends after `n_steps`, when every row stopped, or,
    with `stop_on_finish`, as soon as one row stopped (its slot can take a waiting request).
    Returns the per-step outputs `[max_steps, B, ...]` (only the first `n_run` steps are
    meaningful), `n_run` and the cache. `layer_states` (from `split_layers`, with `layer_graphdef`)
    run the layers unrolled; with `layer_graphdef == decode_layers.FUSED` they are
    `decode_layers.fuse_layers`' fused weights (and the [V, H] LM head) and `cache` is per layer
    (`_per_layer`); None runs the model's layer scan.
    """
    model = nnx.merge(graphdef, state)
    b = tokens.shape[0]
    cache_len = cache.k[0].shape[1] if _per_layer(cache) else cache.k.shape[2]
    done0 = remaining <= 0
    bufs = {"tokens": jnp.zeros((max_steps, b), jnp.int32), "token_lp": jnp.zeros((max_steps, b), jnp.float32)}
    if n_top:
        bufs["top_vals"] = jnp.zeros((max_steps, b, n_top), jnp.float32)
        bufs["top_ids"] = jnp.zeros((max_steps, b, n_top), jnp.int32)
    if k_ids:
        bufs["ids_lp"] = jnp.zeros((max_steps, b, token_ids.shape[-1]), jnp.float32)

    def cond(carry):
        i, _, _, done, _, _ = carry
        some_finished = jnp.any(done & ~done0)
        return (i < n_steps) & ~jnp.all(done) & ~(stop_on_finish & some_finished)

    fused = layer_graphdef == FUSED

    def body(carry):
        i, tok, pos, done, cache, bufs = carry
        write = jnp.where(done, cache_len, pos)
        if fused:
            logits, cache = decode_step(model.cfg, layer_states, model.embed, model.norm, tok, write, cache)
        else:
            logits, cache = _decode_logits(model, layer_graphdef, layer_states, tok, write, cache)
        out = _sample_outputs(logits, temps, top_p, top_k, min_p, keys, steps + i, token_ids, n_top, k_ids)
        bufs = {name: buf.at[i].set(out[name].astype(buf.dtype)) for name, buf in bufs.items()}
        new = out["tokens"]
        pos = pos + 1
        finished = (remaining <= i + 1) | (pos >= limits) | jnp.any(new[:, None] == stop_ids, axis=-1)
        return i + 1, jnp.where(done, tok, new), pos, done | finished, cache, bufs

    n_run, _, _, _, cache, bufs = jax.lax.while_loop(
        cond, body, (jnp.int32(0), tokens, positions, done0, cache, bufs))
    bufs["n_run"] = n_run
    bufs["cache"] = cache
    return bufs


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def zeros_cache_jit(shape, dtype_name, per_layer=False):
    # Made by a jitted function so the cache is placed like every other step output (a host-made
    # array would give the steps a different argument signature and cost a recompilation).
    # per_layer: the fused decode's running cache (`_per_layer`; shape [layers, ...], one array per layer)
    if per_layer:
        def layers():
            return tuple(jnp.zeros(shape[1:], jnp.dtype(dtype_name)) for _ in range(shape[0]))
        return KVCache(layers(), layers())
    zeros = jnp.zeros(shape, jnp.dtype(dtype_name))
    return KVCache(zeros, zeros)


# -- prefix-cache pool `[layers, slots, block, K, D]` (see prefix_cache.py) -------------------------

def _gather_prefix_impl(pool, tables, new_len):
    """Blocks `tables [b, nb]` of the pool laid out as a cache `[layers, b, nb * block + new_len, K, D]`
    (the tail zeros: room for the extend prefill's own tokens)."""
    def one(x):
        g = x[:, tables]
        layers, b, nb, block, heads, dim = g.shape
        g = g.reshape(layers, b, nb * block, heads, dim)
        return jnp.concatenate([g, jnp.zeros((layers, b, new_len, heads, dim), g.dtype)], axis=2)
    return KVCache(one(pool.k), one(pool.v))


def _store_blocks_impl(pool, cache, rows, src_blocks, slots):
    """pool[:, slots[j]] = block src_blocks[j] of row rows[j] of a prefill or running cache (stacked or
    per layer; slots past the end: dropped)."""
    block = pool.k.shape[2]
    tok = src_blocks[:, None] * block + jnp.arange(block, dtype=jnp.int32)[None, :]

    def one(p, c):
        blocks = jnp.stack([x[rows[:, None], tok] for x in c]) if isinstance(c, tuple) else c[:, rows[:, None], tok]
        return p.at[:, slots].set(blocks.astype(p.dtype), mode="drop")
    return KVCache(one(pool.k, cache.k), one(pool.v, cache.v))


def _grow_cache_impl(cache, rows, cache_len):
    """The running cache `[layers, B, Lc, K, D]` (or per layer) widened to `rows` x `cache_len` (zeros
    appended: new rows are empty, new slots are past every row's position)."""
    def one(x):
        if isinstance(x, tuple):
            return tuple(jnp.pad(layer, [(0, rows - layer.shape[0]), (0, cache_len - layer.shape[1])]
                                 + [(0, 0)] * (layer.ndim - 2)) for layer in x)
        pad = [(0, 0)] * x.ndim
        pad[1], pad[2] = (0, rows - x.shape[1]), (0, cache_len - x.shape[2])
        return jnp.pad(x, pad)
    return KVCache(one(cache.k), one(cache.v))


def _grow_pool_impl(pool, slots):
    def one(x):
        return jnp.concatenate([x, jnp.zeros((x.shape[0], slots - x.shape[1]) + x.shape[2:], x.dtype)], axis=1)
    return KVCache(one(pool.k), one(pool.v))


prefill_jit = jax.jit(_prefill_impl, static_argnums=(0,), static_argnames=("n_top", "k_ids", "want_input"))
extend_jit = jax.jit(_extend_impl, static_argnums=(0,), static_argnames=("n_top", "k_ids", "want_input"),
                     donate_argnums=(2,))
insert_jit = jax.jit(_insert_impl, donate_argnums=(0,))
decode_jit = jax.jit(_decode_impl, static_argnums=(0,), static_argnames=("n_top", "k_ids"), donate_argnums=(2,))
decode_loop_jit = jax.jit(_decode_loop_impl, static_argnums=(0, 1), static_argnames=("n_top", "k_ids", "max_steps"),
                          donate_argnums=(4,))
# The fused-layer decode loop (layer graphdef `decode_layers.FUSED`), its own jitted function so its
# compilations are counted apart. It used to be compiled with XLA:CPU's YNNPACK fusions off (on an older
# 2-core AVX2 CPU, XLA's own dots took 0.55-0.8x the CPU time of YNNPACK's). Its attention is now
# element-wise products and sums (`decode_layers.decode_attention`), which need YNNPACK's element-wise
# and reduce fusions: a 16-row step took 103 ms without them and 39 ms with XLA:CPU's defaults. The
# block-diagonal attention without YNNPACK took 43-44 ms (AVX-512 EPYC, 2 cores).
decode_loop_fused_jit = jax.jit(_decode_loop_impl, static_argnums=(0, 1),
                                static_argnames=("n_top", "k_ids", "max_steps"), donate_argnums=(4,))
gather_prefix_jit = jax.jit(_gather_prefix_impl, static_argnums=(2,))
store_blocks_jit = jax.jit(_store_blocks_impl, donate_argnums=(0,))
grow_pool_jit = jax.jit(_grow_pool_impl, static_argnums=(1,))
grow_cache_jit = jax.jit(_grow_cache_impl, static_argnums=(1, 2))
