"""Attention kernels: forward+backward time and compiled temporary memory vs the dense reference.

One causal GQA attention layer (float32 by default), loss = sum(out * w), gradients w.r.t. q, k, v.
For each length it compiles the step ahead of time per implementation, reads the compiled
temporary bytes (`memory_analysis().temp_size_in_bytes`), then times the compiled step (median
of the repeats, warm-up excluded). Ratios are against dense at the same length, in this process.
Dense is skipped (and reported as such) above --dense-max tokens.

    python bench/attention.py [--lengths 512,1024,2048] [--heads 8] [--kv-heads 2] [--head-dim 64]
                              [--blocks 128,256,512] [--dtype float32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from openclaw_jax.models import attention as A


def _step(fn):
    def loss(q, k, v, w):
        return jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def measure(fn, args, repeats: int) -> tuple[int, float]:
    compiled = _step(fn).lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    if repeats <= 0:
        return temp, float("nan")
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return temp, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--blocks", default="128,256,512", help="block sizes of the blockwise kernel")
    parser.add_argument("--remat-block", type=int, default=256,
                        help="query block of the 'query blocks under jax.checkpoint' variant (0: skip it)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (0: memory only)")
    parser.add_argument("--dense-max", type=int, default=4096, help="skip dense above this length")
    args = parser.parse_args()

    dt = jnp.dtype(args.dtype)
    rng = np.random.default_rng(0)
    variants = [(f"blockwise b={b}", lambda q, k, v, b=b: A.blockwise_attention(q, k, v, block_q=b, block_k=b))
                for b in (int(x) for x in args.blocks.split(","))]
    if args.remat_block:
        variants.append((f"remat q-blocks b={args.remat_block}",
                         lambda q, k, v: A.remat_query_block_attention(q, k, v, block_q=args.remat_block)))
    print(f"\ncausal attention forward+backward, {args.dtype}, batch {args.batch}, {args.heads} heads / "
          f"{args.kv_heads} kv heads, head_dim {args.head_dim}, {jax.devices()[0].platform} "
          f"({os.cpu_count()} cores), median of {args.repeats}")
    print(f"{'L':>6} {'implementation':<24} {'temp MiB':>10} {'x dense':>8} {'ms':>9} {'x dense':>8}")
    for L in (int(x) for x in args.lengths.split(",")):
        shapes = [(args.batch, L, args.heads, args.head_dim), (args.batch, L, args.kv_heads, args.head_dim),
                  (args.batch, L, args.kv_heads, args.head_dim)]
        q, k, v = (jnp.asarray(rng.standard_normal(s), dt) for s in shapes)
        w = jnp.asarray(rng.standard_normal(shapes[0]), jnp.float32)
        if L <= args.dense_max:
            d_temp, d_time = measure(A.dense_attention, (q, k, v, w), args.repeats)
            print(f"{L:>6} {'dense':<24} {d_temp / 2**20:>10.1f} {1:>8.2f} {1000 * d_time:>9.1f} {1:>8.2f}")
        else:
            d_temp, d_time = float("nan"), float("nan")
            print(f"{L:>6} {'dense (skipped)':<24}")
        for name, fn in variants:
            temp, secs = measure(fn, (q, k, v, w), args.repeats)
            print(f"{L:>6} {name:<24} {temp / 2**20:>10.1f} {temp / d_temp:>8.3f} {1000 * secs:>9.1f} "
                  f"{secs / d_time:>8.2f}")


if __name__ == "__main__":
    main()
