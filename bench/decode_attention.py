"""Decode attention over a model's layers: `decode_layers.decode_attention` vs the block-diagonal form it replaced.

One query per row over each layer's `[B, S, K, D]` cache, SmolLM2-135M's heads (9 query heads over 3
kv heads of 64) and 30 layers, random float32 inputs, every row at a random position in the upper
half of the cache. The reference is the form the fused decode used before (the query laid
block-diagonally over the kv heads' columns, scores and values as two batched matmuls against the
cache seen as `[B, S, K * D]`), compiled as the fused decode loop then was (XLA:CPU's YNNPACK
fusions off); ours is compiled with XLA's default options, as `kernels.decode_loop_fused_jit` is.
Each time is the median of the repeats of one jitted call over all layers; outputs are compared.

    python bench/decode_attention.py [--shapes 16x128 16x512 1x2048 4x2048] [--repeats 20] [--json]

--json prints one line `{"ours_over_block_diagonal": {"16x128": r, ...}}` (speed ratios) after the table.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from references import median_time  # bench/references.py, beside this script

from openclaw_jax.inference.decode_layers import decode_attention

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 30
YNNPACK_OFF = {"xla_cpu_experimental_ynn_fusion_type": ""}


def block_diagonal_attention(q, cache_k, cache_v, positions):
    """The reference: the fused decode's attention before the element-wise form."""
    b, n, d = q.shape
    s_len, kh = cache_k.shape[1], cache_k.shape[2]
    owner = jnp.arange(n) // (n // kh)
    block = (owner[:, None] == jnp.arange(kh)[None, :]).astype(jnp.float32)              # [N, K]
    q_wide = (q[:, :, None, :] * block[None, :, :, None]).reshape(b, n, kh * d)
    keys, values = cache_k.reshape(b, s_len, kh * d), cache_v.reshape(b, s_len, kh * d)
    scores = jnp.einsum("bnc,bsc->bns", q_wide, keys, preferred_element_type=jnp.float32) * d ** -0.5
    visible = jnp.arange(s_len, dtype=jnp.int32)[None, :] <= positions[:, None]
    probs = jax.nn.softmax(jnp.where(visible[:, None, :], scores, -jnp.inf), axis=-1)
    wide = jnp.einsum("bns,bsc->bnc", probs, values, preferred_element_type=jnp.float32)
    return jnp.sum(wide.reshape(b, n, kh, d) * block[None, :, :, None], axis=2)


def every_layer(attention):
    return lambda q, ks, vs, positions: [attention(q[i], ks[i], vs[i], positions) for i in range(len(ks))]


def median_ms(fn, args, repeats):
    jax.block_until_ready(fn(*args))  # compile + warm-up
    return 1000 * median_time(lambda: jax.block_until_ready(fn(*args)), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["16x128", "16x512", "1x2048", "4x2048"],
                        help="ROWSxSLOTS: rows decoding together x cache slots")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="also print the speed ratios as one JSON line")
    args = parser.parse_args()
    ours = jax.jit(every_layer(decode_attention))
    reference = jax.jit(every_layer(block_diagonal_attention), compiler_options=YNNPACK_OFF)
    rng = np.random.default_rng(0)
    rows_out = []
    for shape in args.shapes:
        try:
            rows, slots = (int(x) for x in shape.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes {shape!r}: expected ROWSxSLOTS, e.g. 16x128") from None
        q = jnp.asarray(rng.standard_normal((LAYERS, rows, HEADS, HEAD_DIM), np.float32))
        ks = [jnp.asarray(rng.standard_normal((rows, slots, KV_HEADS, HEAD_DIM), np.float32)) for _ in range(LAYERS)]
        vs = [jnp.asarray(rng.standard_normal((rows, slots, KV_HEADS, HEAD_DIM), np.float32)) for _ in range(LAYERS)]
        positions = jnp.asarray(rng.integers(slots // 2, slots, rows).astype(np.int32))
        inputs = (q, ks, vs, positions)
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(ours(*inputs), reference(*inputs)))
        t_ref, t_ours = median_ms(reference, inputs, args.repeats), median_ms(ours, inputs, args.repeats)
        rows_out.append((shape, t_ref, t_ours, diff))
    load = os.getloadavg()[0]
    print(f"\ndecode attention over {LAYERS} layers ({HEADS} heads over {KV_HEADS} kv heads of {HEAD_DIM}), float32, "
          f"{jax.devices()[0].platform} ({os.cpu_count()} cores, load {load:.2f}), median of {args.repeats}")
    print(f"{'rows x slots':>12} | {'block-diagonal ms':>17} {'ours ms':>8} {'ratio':>6} | max |diff|")
    for shape, t_ref, t_ours, diff in rows_out:
        print(f"{shape:>12} | {t_ref:>17.2f} {t_ours:>8.2f} {t_ref / t_ours:>5.2f}x | {diff:.1e}")
    if args.json:
        print(json.dumps({"ours_over_block_diagonal": {s: round(r / o, 3) for s, r, o, _ in rows_out}}))


if __name__ == "__main__":
    main()
