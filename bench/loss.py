"""Benchmark the hybrid loss: dense API vs the chunked path vs one memory pass.

    python bench/loss.py                       # B=8 T=256 V=32768 and B=8 T=64 V=151936
    python bench/loss.py --shapes 8x256x32768 --hidden 64 --chunks 8,16,32

For each shape it reports forward+backward wall time (best of ``--repeats`` after one
warm-up, to see through other processes sharing the machine) and XLA's compiled peak-memory estimate (arguments + outputs + temporaries -
aliased) for:

* ``rw pass``       ``x + 1`` over a ``[B*T, V]`` float32 array, in place (one read + one
                    write): the floor for anything that touches every logit once; the
                    fresh-output variant also pays for allocating (page-faulting) the result;
* ``dense api``     ``value_and_grad(hybrid_loss)`` w.r.t. given logits ``[B,T,V]`` (the
                    logits themselves are an input: their production is not timed);
* ``dense+head``    the same, but starting from ``hidden @ lm_head`` (grads to both) -- the
                    like-for-like comparison with the chunked path;
* ``lm-head only``  fwd+bwd of ``sum(c * (hidden @ lm_head))``: the matmul cost every path pays;
* ``chunked matmuls only``  the chunked path's four matmuls (fwd, recompute, d hidden,
                    d lm_head) in the same scan, no softmax: its matmul floor;
* ``chunked(c)``    ``value_and_grad(chunked_hybrid_loss)`` w.r.t. hidden and lm_head, c
                    positions per chunk.

``x rw`` is time / rw-pass time.
"""

from __future__ import annotations

import argparse
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from openclaw_jax.losses import HybridBatch, LossConfig, chunked_hybrid_loss, hybrid_loss

log = logging.getLogger("bench.loss")


def synthetic_batch(B: int, T: int, K: int, C: int, V: int, seed: int = 0) -> HybridBatch:
    rng = np.random.default_rng(seed)

    def ids(*shape):
        return jnp.asarray(rng.integers(0, V, shape), jnp.int32)

    def logprobs(*shape):
        return jnp.asarray(-rng.random(shape) * 8.0, jnp.float32)

    return HybridBatch(
        response_ids=ids(B, T), response_mask=jnp.asarray(rng.random((B, T)) < 0.9, jnp.float32),
        old_logprobs=logprobs(B, T), advantages=jnp.asarray(rng.choice([-1.0, 1.0], (B, 1)) * np.ones((1, T)), jnp.float32),
        student_topk_ids=ids(B, T, K), student_topk_logprobs=logprobs(B, T, K),
        teacher_topk_ids=ids(B, C, T, K), teacher_topk_logprobs=logprobs(B, C, T, K),
        teacher_logprobs_at_student_ids=logprobs(B, C, T, K), old_logprobs_at_teacher_ids=logprobs(B, C, T, K),
        candidate_mask=jnp.ones((B, C), jnp.float32), sample_mask=jnp.ones((B,), jnp.float32),
    )


def peak_bytes(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def measure(fn, args, repeats: int) -> tuple[float, int]:
    """Best-of-``repeats`` wall time after one warm-up (robust to noisy neighbours) and peak bytes."""
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return min(times), peak_bytes(compiled)


def measure_rw_pass(x: jax.Array, repeats: int) -> tuple[float, int]:
    """``x + 1`` in place (donated): exactly one read and one write of every element."""
    compiled = jax.jit(lambda a: a + 1.0, donate_argnums=0).lower(x).compile()
    x = compiled(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x = jax.block_until_ready(compiled(x))
        times.append(time.perf_counter() - start)
    return min(times), peak_bytes(compiled)


def chunked_matmuls_only(hidden, lm_head, chunk: int):
    """The four LM-head matmuls the chunked path performs (forward, recompute, d hidden,
    d lm_head) in the same scan layout, with no softmax work: the matmul floor of that path."""
    B, T, H = hidden.shape
    hc = jnp.swapaxes(hidden.reshape(B, T // chunk, chunk, H), 0, 1)

    def body(carry, h):
        acc, dw = carry
        z = jnp.dot(h, lm_head, preferred_element_type=jnp.float32)
        # a different operand, so XLA cannot merge the "recompute" with the forward matmul
        z2 = jnp.dot(h * 0.5, lm_head, preferred_element_type=jnp.float32)
        dh = jnp.dot(z2, lm_head.T, preferred_element_type=jnp.float32)
        dw = dw + jnp.einsum("bch,bcv->hv", h, z2)
        return (acc + jnp.max(z) + jnp.sum(dh), dw), None

    (acc, dw), _ = jax.lax.scan(body, (jnp.zeros(()), jnp.zeros(lm_head.shape)), hc)
    return acc, dw


def bench_shape(B: int, T: int, V: int, K: int, C: int, H: int, chunks: list[int], repeats: int, tau: float):
    rng = np.random.default_rng(1)
    batch = synthetic_batch(B, T, K, C, V)
    cfg = LossConfig()
    hidden = jnp.asarray(rng.normal(size=(B, T, H)), jnp.float32)
    lm_head = jnp.asarray(rng.normal(size=(H, V)) / np.sqrt(H), jnp.float32)
    logits = jnp.einsum("bth,hv->btv", hidden, lm_head) / tau
    flat = logits.reshape(B * T, V)
    rows = []

    t_rw, m_rw = measure_rw_pass(jnp.array(flat), repeats)
    rows.append(("rw pass [B*T,V] f32 (in place)", t_rw, m_rw))
    rows.append(("rw pass, fresh output buffer", *measure(lambda x: x + 1.0, (flat,), repeats)))
    log.info("rw pass %.4fs", t_rw)

    dense = jax.value_and_grad(lambda z: hybrid_loss(z, batch, cfg), has_aux=True)
    rows.append(("dense api (from logits)", *measure(dense, (logits,), repeats)))
    log.info("dense done")

    def dense_head(h, w):
        return hybrid_loss(jnp.einsum("bth,hv->btv", h, w) / tau, batch, cfg)

    rows.append(("dense+head (from hidden)",
                 *measure(jax.value_and_grad(dense_head, argnums=(0, 1), has_aux=True), (hidden, lm_head), repeats)))
    cotangent = jnp.asarray(rng.normal(size=(B, T, V)) * 1e-3, jnp.float32)
    del logits, flat

    def head_only(h, w):
        return jnp.sum(cotangent * jnp.einsum("bth,hv->btv", h, w))

    rows.append(("lm-head matmuls only", *measure(jax.value_and_grad(head_only, argnums=(0, 1)), (hidden, lm_head),
                                                 repeats)))
    del cotangent
    for chunk in chunks:
        if T % chunk == 0:
            rows.append((f"chunked matmuls only (chunk={chunk})",
                         *measure(lambda h, w, c=chunk: chunked_matmuls_only(h, w, c), (hidden, lm_head), repeats)))

        def chunked(h, w, chunk=chunk):
            return chunked_hybrid_loss(h, w, batch, cfg, temperature=tau, chunk_size=chunk)

        rows.append((f"chunked (chunk={chunk}, {B * chunk} rows)",
                     *measure(jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True), (hidden, lm_head), repeats)))
        log.info("chunked %d done", chunk)

    title = f"B={B} T={T} V={V} K={K} C={C} H={H} on {jax.devices()[0].device_kind} x{jax.device_count()}"
    print(f"\n{title}")
    print(f"{'path':<34} {'fwd+bwd s':>10} {'x rw':>7} {'peak MiB':>10}")
    for name, t, mem in rows:
        print(f"{name:<34} {t:>10.4f} {t / t_rw:>7.1f} {mem / 2**20:>10.1f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="8x256x32768,8x64x151936", help="comma list of BxTxV")
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64, help="hidden size H of the synthetic LM head")
    parser.add_argument("--chunks", default="8,32", help="comma list of positions per chunk")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    chunks = [int(c) for c in args.chunks.split(",")]
    for shape in args.shapes.split(","):
        B, T, V = (int(x) for x in shape.lower().split("x"))
        bench_shape(B, T, V, args.topk, args.candidates, args.hidden, chunks, args.repeats, args.temperature)


if __name__ == "__main__":
    main()
