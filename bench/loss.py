"""Benchmark the hybrid loss: dense API vs the chunked path vs upstream's PyTorch loss vs one memory pass.

    python bench/loss.py                       # B=8 T=256 V=32768 and B=8 T=64 V=151936
    python bench/loss.py --shapes 8x256x32768 --hidden 64 --chunks 8,16,32
    python bench/loss.py --json --shapes 8x256x32768   # one JSON line: dense_api_s (logits donated),
                                                       # dense_api_kept_s, chunked_s, upstream_s and the
                                                       # ratios dense_over_upstream, dense_kept_over_upstream,
                                                       # chunked_over_upstream (medians, same run)

For each shape it reports forward+backward wall time (median and best of ``--repeats`` after one
warm-up; the machine may be shared, so the load average is printed) and XLA's compiled
peak-memory estimate (arguments + outputs + temporaries - aliased) for:

* ``rw pass``       ``x + 1`` over a ``[B*T, V]`` float32 array, in place (one read + one
                    write): the floor for anything that touches every logit once; the
                    fresh-output variant also pays for allocating (page-faulting) the result,
                    as every path that returns a ``[B,T,V]`` gradient must;
* ``dense api``     ``value_and_grad(hybrid_loss)`` w.r.t. given logits ``[B,T,V]`` (the
                    logits themselves are an input: their production is not timed), jitted with
                    the logits donated, as a caller that is done with them does (a train step
                    backpropagates the gradient into the LM head and never reads the logits
                    again): the gradient is written into the logits' buffer. Each call gets a
                    fresh copy of the logits, made (and page-faulted) outside the timer, as the
                    model's LM head would make them;
* ``dense api, logits kept``  the same without donation: the gradient is a fresh
                    ``[B,T,V]`` buffer (~65k page faults at 256 MiB), as for a caller that still
                    needs the logits afterwards;
* ``upstream torch reference``  :class:`UpstreamTorchLoss`, OpenClaw-RL's top-K select loss
                    restated in PyTorch (below), forward + ``backward()`` from the same logits;
* ``dense+head``    the same, but starting from ``hidden @ lm_head`` (grads to both) -- the
                    like-for-like comparison with the chunked path;
* ``lm-head only``  fwd+bwd of ``sum(c * (hidden @ lm_head))``: the matmul cost every path pays;
* ``chunked matmuls only``  the chunked path's three matmuls (logits, d hidden, d lm_head:
                    the gradient is formed in the forward scan) in the same scan, no softmax:
                    its matmul floor;
* ``chunked(c)``    ``value_and_grad(chunked_hybrid_loss)`` w.r.t. hidden and lm_head, c
                    positions per chunk (it also pays the LM-head matmuls, which the
                    logits-based paths do not).

``x rw`` is median time / in-place rw-pass median.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
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


def measure(fn, args, repeats: int) -> tuple[float, float, int]:
    """Median and best-of-``repeats`` wall time after one warm-up, and peak bytes."""
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times)), min(times), peak_bytes(compiled)


def measure_rw_pass(x: jax.Array, repeats: int) -> tuple[float, float, int]:
    """``x + 1`` in place (donated): exactly one read and one write of every element."""
    compiled = jax.jit(lambda a: a + 1.0, donate_argnums=0).lower(x).compile()
    x = compiled(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x = jax.block_until_ready(compiled(x))
        times.append(time.perf_counter() - start)
    return float(np.median(times)), min(times), peak_bytes(compiled)


def chunked_matmuls_only(hidden, lm_head, chunk: int):
    """The three LM-head matmuls the chunked path performs per chunk (logits, d hidden, d lm_head)
    in the same scan layout, with no softmax work: the matmul floor of that path."""
    B, T, H = hidden.shape
    hc = jnp.swapaxes(hidden.reshape(B, T // chunk, chunk, H), 0, 1)

    def body(carry, h):
        acc, dw = carry
        z = jnp.dot(h, lm_head, preferred_element_type=jnp.float32)
        dh = jnp.dot(z, lm_head.T, preferred_element_type=jnp.float32)
        dw = dw + jnp.einsum("bch,bcv->hv", h, z)
        return (acc + jnp.sum(dh), dw), None

    (acc, dw), _ = jax.lax.scan(body, (jnp.zeros(()), jnp.zeros(lm_head.shape)), hc)
    return acc, dw


def measure_donated(fn, x, repeats: int) -> tuple[float, float, int]:
    """Like :func:`measure` for ``fn(x)`` jitted with ``x`` donated: every call consumes a fresh
    copy of ``x``, made before the timer starts."""
    compiled = jax.jit(fn, donate_argnums=0).lower(x).compile()
    times = []
    for i in range(repeats + 1):
        fresh = jax.block_until_ready(jnp.array(x, copy=True))
        start = time.perf_counter()
        jax.block_until_ready(compiled(fresh))
        if i:   # the first call is the warm-up
            times.append(time.perf_counter() - start)
        del fresh
    return float(np.median(times)), min(times), peak_bytes(compiled)


# ---------------------------------------------------------------------------------------------
# The upstream cost: a PyTorch re-statement of OpenClaw-RL's `openclaw-combine` top-K select loss
# (openclaw_topk_select_loss_function with hint_opd_loss._opd_one_sample, slime's
# get_log_probs_and_entropy / compute_policy_loss and Megatron's fused vocab-parallel cross
# entropy at tensor-parallel size 1), written from its maths and structure -- not copied -- so
# that it costs what upstream costs on CPU: a Python loop over samples, float32 [R, V] slices of
# one [1, B*T, V] logits tensor, a clone of each slice for the cross entropy (which works in
# place and saves its softmax), a hand-written autograd gather and global log-sum-exp for the
# OPD ratio (whose backward writes a fresh [R, V] softmax and a zero [R, V] scatter target per
# sample). With entropy_coef 0 (its launcher's value) upstream computes no entropy at all.
# Configuration as upstream's launcher: subset student, sequence_optimal, adv_diff_clip 1.
# Checked against the fetched upstream code (openclaw-combine/openclaw_topk_select_loss.py with
# hint_opd_loss.py, hint_opd_select_loss.py, slime's loss.py / ppo_utils.py / cp_utils.py and
# Megatron's fused_cross_entropy.py, Gen-Verse/OpenClaw-RL at ffdebf1, May 2026), run outside this
# repository on CPU at TP 1 (gloo group of one, stubs only for Megatron's parallel state), one
# process, interleaved rounds, 8x256x32768, 2 cores under load 8-11: the same loss, gradients
# equal (eager) or within 1.2e-10 (torch.compile); this reference's median CPU time is 0.95x the
# fetched code's eager and 0.91x with torch.compile on as upstream has it (Megatron's jit_fuser,
# slime's compute_policy_loss), wall 0.98x / 1.08x -- so it does not overstate upstream's cost.
# Upstream's launcher also samples at temperature 0.6, which costs it one more [R, V] division
# per sample and pass; the reference (like --temperature's default) runs at 1.
# ---------------------------------------------------------------------------------------------


def _torch():
    import torch
    return torch


def _megatron_cross_entropy_fn():
    """Megatron's ``fused_vocab_parallel_cross_entropy`` at TP size 1: in place on its input,
    saves the softmax, returns a bfloat16 gradient (as upstream's fused kernel does)."""
    torch = _torch()

    class _CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target):
            logits = logits.float()
            logits_max = torch.max(logits, dim=-1)[0]
            logits -= logits_max.unsqueeze(-1)
            arange = torch.arange(logits.size(0))
            predicted = logits[arange, target].clone()
            exp_logits = logits
            torch.exp(logits, out=exp_logits)
            sum_exp = exp_logits.sum(dim=-1)
            loss = torch.log(sum_exp) - predicted
            exp_logits.div_(sum_exp.unsqueeze(-1))
            ctx.save_for_backward(exp_logits, target)
            return loss

        @staticmethod
        def backward(ctx, grad_output):
            softmax, target = ctx.saved_tensors
            grad = softmax
            grad[torch.arange(grad.size(0)), target] -= 1.0
            grad.mul_(grad_output.unsqueeze(-1))
            return grad.to(torch.bfloat16), None

    return _CrossEntropy.apply


def _upstream_autograd_fns():
    """The OPD branch's autograd gather of raw logits and global log-sum-exp (TP size 1)."""
    torch = _torch()

    class _GatherRaw(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, idx):
            ctx.save_for_backward(idx)
            ctx.shape, ctx.dtype = logits.shape, logits.dtype
            return torch.gather(logits, -1, idx)

        @staticmethod
        def backward(ctx, grad_out):
            (idx,) = ctx.saved_tensors
            grad = torch.zeros(ctx.shape, dtype=ctx.dtype)
            grad.scatter_add_(-1, idx, grad_out.to(ctx.dtype))
            return grad, None

    class _GlobalLse(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits):
            f = logits.float()
            row_max = f.max(dim=-1, keepdim=True).values
            lse = row_max + (f - row_max).exp().sum(dim=-1, keepdim=True).clamp_min(1e-30).log()
            ctx.save_for_backward(logits, lse)
            return lse

        @staticmethod
        def backward(ctx, grad_out):
            logits, lse = ctx.saved_tensors
            return (grad_out * (logits.float() - lse).exp()).to(logits.dtype)

    return _GatherRaw.apply, _GlobalLse.apply


def _policy_loss(torch, ppo_kl, adv, eps, eps_high):
    ratio = (-ppo_kl).exp()
    l1 = -ratio * adv
    l2 = -ratio.clamp(1 - eps, 1 + eps_high) * adv
    return torch.maximum(l1, l2), torch.gt(l2, l1).float()


def _masked_softmax(torch, values, mask):
    masked = torch.where(mask, values, values.new_full((), float("-inf")))
    row_max = masked.max(dim=-1, keepdim=True).values
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.where(mask, (masked - row_max).exp(), torch.zeros_like(masked))
    lse = row_max + e.sum(dim=-1, keepdim=True).clamp(min=1e-30).log()
    return torch.where(mask, (values - lse).exp(), torch.zeros_like(values))


class UpstreamTorchLoss:
    """``loss(logits [1, B*T, V] torch float32 leaf)`` -> scalar, upstream's per-sample structure.

    Batch tensors are converted once (upstream receives them as per-sample CPU lists)."""

    def __init__(self, batch: HybridBatch, cfg: LossConfig):
        torch = _torch()
        self.torch, self.cfg = torch, cfg
        self.ce = _megatron_cross_entropy_fn()
        self.gather_raw, self.global_lse = _upstream_autograd_fns()
        t = lambda x, dt: [torch.as_tensor(np.asarray(v), dtype=dt) for v in np.asarray(x)]   # noqa: E731
        self.tokens = t(batch.response_ids, torch.long)
        self.mask = t(batch.response_mask, torch.float32)
        self.old = t(batch.old_logprobs, torch.float32)
        self.adv = t(batch.advantages, torch.float32)
        self.s_idx = t(batch.student_topk_ids, torch.long)
        self.s_lp = t(batch.student_topk_logprobs, torch.float32)
        self.t_idx_native = t(batch.teacher_topk_ids, torch.long)        # [C, R, K] per sample
        self.t_lp_at_s = t(batch.teacher_logprobs_at_student_ids, torch.float32)
        self.lengths = [int(np.asarray(batch.response_ids).shape[1])] * int(np.asarray(batch.response_ids).shape[0])

    def _sum_of_sample_mean(self, per_sample):
        torch = self.torch
        return sum((x * m).sum() / torch.clamp_min(m.sum(), 1) for x, m in zip(per_sample, self.mask))

    def _slices(self, logits):
        flat, start = logits.view(-1, logits.size(-1)), 0
        for r in self.lengths:
            yield flat[start:start + r]
            start += r

    def __call__(self, logits):
        torch, cfg = self.torch, self.cfg
        eps, eps_high, clamp = cfg.eps_clip, cfg.eps_clip_high, cfg.kl_clamp
        diff_clip = cfg.adv_diff_clip if cfg.adv_diff_clip > 0 else None
        # get_log_probs_and_entropy(with_entropy=False): per sample, clone + fused cross entropy
        new_lp = [-self.ce(chunk.clone(), tok) for chunk, tok in zip(self._slices(logits), self.tokens)]
        grpo, opd = [], []
        for i, chunk in enumerate(self._slices(logits)):
            ppo_kl = self.old[i] - new_lp[i]
            if clamp is not None:
                ppo_kl = ppo_kl.clamp(-clamp, clamp)
            grpo.append(_policy_loss(torch, ppo_kl, self.adv[i], eps, eps_high)[0])
            s_idx, s_lp = self.s_idx[i], self.s_lp[i]
            # overlap O[c, t] and sequence_optimal k* (trained tokens), then the gather at k*
            eq = s_idx.unsqueeze(0).unsqueeze(-1) == self.t_idx_native[i].unsqueeze(-2)
            overlap = eq.any(dim=-1).sum(dim=-1)                                  # [C, R]
            k_star = int((overlap * (self.mask[i] > 0)).sum(dim=-1).argmax().item())
            k_per_token = torch.full((chunk.size(0),), k_star, dtype=torch.long)
            t_lp = torch.gather(self.t_lp_at_s[i], 0,
                                k_per_token.view(1, -1, 1).expand(1, -1, s_idx.size(-1))).squeeze(0)
            # _opd_one_sample (student subset: identical index sets, the all-True mask)
            sub_mask = torch.ones_like(s_idx, dtype=torch.bool)
            ell_cur = self.gather_raw(chunk, s_idx).float() - self.global_lse(chunk)
            w = _masked_softmax(torch, s_lp, sub_mask).detach()
            diff = (t_lp - s_lp).detach()
            if diff_clip is not None:
                diff = diff.clamp(-diff_clip, diff_clip)
            ppo_kl_v = s_lp - ell_cur
            if clamp is not None:
                ppo_kl_v = ppo_kl_v.clamp(-clamp, clamp)
            pg, _ = _policy_loss(torch, ppo_kl_v, (diff * w).detach(), eps, eps_high)
            opd.append((pg * sub_mask.float()).sum(dim=-1) * sub_mask.any(dim=-1).float())
        n = len(self.lengths)
        loss = (cfg.w_rl * self._sum_of_sample_mean(grpo) + cfg.w_opd * self._sum_of_sample_mean(opd)) / n
        if cfg.entropy_coef != 0:   # upstream reports entropy_loss 0 (and skips the pass) when entropy_coef is 0
            raise NotImplementedError("the upstream reference is written for entropy_coef = 0 (its launcher's value)")
        return loss


def measure_upstream(batch: HybridBatch, cfg: LossConfig, logits_np: np.ndarray, repeats: int
                     ) -> tuple[float, float, float]:
    """(median, min) forward+backward seconds of :class:`UpstreamTorchLoss` and its loss value."""
    torch = _torch()
    ref = UpstreamTorchLoss(batch, cfg)
    B, T, V = logits_np.shape
    logits = torch.from_numpy(np.ascontiguousarray(logits_np).reshape(1, B * T, V)).requires_grad_(True)
    times, value = [], None
    for i in range(repeats + 1):
        logits.grad = None
        start = time.perf_counter()
        loss = ref(logits)
        loss.backward()
        if i:
            times.append(time.perf_counter() - start)
        value = float(loss.detach())
    return float(np.median(times)), float(min(times)), value


def bench_shape(B: int, T: int, V: int, K: int, C: int, H: int, chunks: list[int], repeats: int, tau: float,
                upstream: bool = True, table: bool = True) -> dict:
    rng = np.random.default_rng(1)
    batch = synthetic_batch(B, T, K, C, V)
    cfg = LossConfig()
    hidden = jnp.asarray(rng.normal(size=(B, T, H)), jnp.float32)
    lm_head = jnp.asarray(rng.normal(size=(H, V)) / np.sqrt(H), jnp.float32)
    logits = jnp.einsum("bth,hv->btv", hidden, lm_head) / tau
    flat = logits.reshape(B * T, V)
    rows = []

    t_rw = measure_rw_pass(jnp.array(flat), repeats)
    rows.append(("rw pass [B*T,V] f32 (in place)", *t_rw))
    rows.append(("rw pass, fresh output buffer", *measure(lambda x: x + 1.0, (flat,), repeats)))
    log.info("rw pass %.4fs", t_rw[0])

    dense = jax.value_and_grad(lambda z: hybrid_loss(z, batch, cfg), has_aux=True)
    rows.append(("dense api (logits donated)", *measure_donated(dense, logits, repeats)))
    result = {"dense_api_s": rows[-1][1]}
    rows.append(("dense api, logits kept", *measure(dense, (logits,), repeats)))
    result["dense_api_kept_s"] = rows[-1][1]
    dense_value = float(jax.jit(lambda z: hybrid_loss(z, batch, cfg)[0])(logits))
    log.info("dense done")
    if upstream:
        up_median, up_min, up_value = measure_upstream(batch, cfg, np.asarray(logits), repeats)
        rows.append(("upstream torch reference", up_median, up_min, 0))
        result["upstream_s"] = up_median
        log.info("upstream reference %.4fs (loss %.6f vs dense %.6f)", up_median, up_value, dense_value)
        result["upstream_loss"], result["dense_loss"] = up_value, dense_value

    def dense_head(h, w):
        return hybrid_loss(jnp.einsum("bth,hv->btv", h, w) / tau, batch, cfg)

    if table:
        rows.append(("dense+head (from hidden)", *measure(jax.value_and_grad(dense_head, argnums=(0, 1), has_aux=True),
                                                        (hidden, lm_head), repeats)))
    cotangent = jnp.asarray(rng.normal(size=(B, T, V)) * 1e-3, jnp.float32)
    del logits, flat

    def head_only(h, w):
        return jnp.sum(cotangent * jnp.einsum("bth,hv->btv", h, w))

    if table:
        rows.append(("lm-head matmuls only", *measure(jax.value_and_grad(head_only, argnums=(0, 1)), (hidden, lm_head),
                                                     repeats)))
    del cotangent
    for chunk in chunks:
        if table and T % chunk == 0:
            rows.append((f"chunked matmuls only (chunk={chunk})",
                         *measure(lambda h, w, c=chunk: chunked_matmuls_only(h, w, c), (hidden, lm_head), repeats)))

        def chunked(h, w, chunk=chunk):
            return chunked_hybrid_loss(h, w, batch, cfg, temperature=tau, chunk_size=chunk)

        rows.append((f"chunked (chunk={chunk}, {B * chunk} rows)",
                     *measure(jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True), (hidden, lm_head), repeats)))
        result.setdefault("chunked_s", rows[-1][1])
        result.setdefault("chunked_chunk", chunk)
        log.info("chunked %d done", chunk)

    if upstream:
        result["dense_over_upstream"] = result["upstream_s"] / result["dense_api_s"]
        result["dense_kept_over_upstream"] = result["upstream_s"] / result["dense_api_kept_s"]
        result["chunked_over_upstream"] = result["upstream_s"] / result["chunked_s"]
    title = f"B={B} T={T} V={V} K={K} C={C} H={H} on {jax.devices()[0].device_kind} x{jax.device_count()}"
    print(f"\n{title} (median / best of {repeats} after a warm-up; load average {os.getloadavg()[0]:.2f})")
    print(f"{'path':<34} {'median s':>10} {'best s':>10} {'x rw':>7} {'peak MiB':>10}")
    for name, med, best, mem in rows:
        print(f"{name:<34} {med:>10.4f} {best:>10.4f} {med / t_rw[0]:>7.1f} {mem / 2**20:>10.1f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="8x256x32768,8x64x151936", help="comma list of BxTxV")
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64, help="hidden size H of the synthetic LM head")
    parser.add_argument("--chunks", default="32,8", help="comma list of positions per chunk (the first is --json's)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--no-upstream", action="store_true", help="skip the PyTorch upstream reference")
    parser.add_argument("--thp", action="store_true",
                        help="re-run this process with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (malloc asks for transparent "
                             "huge pages): a fresh [B*T,V] buffer then costs ~500 page faults instead of ~65k, for the "
                             "JAX paths and the PyTorch reference alike")
    parser.add_argument("--json", action="store_true",
                        help="only the --json paths (rw, dense, upstream, first chunk); print one JSON line per "
                             "shape: dense_api_s, dense_api_kept_s, chunked_s, upstream_s and their ratios (medians)")
    args = parser.parse_args()
    if args.thp and "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", ""):
        env = dict(os.environ, GLIBC_TUNABLES=":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"),
                                                                      "glibc.malloc.hugetlb=1"])))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    chunks = [int(c) for c in args.chunks.split(",")]
    for shape in args.shapes.split(","):
        B, T, V = (int(x) for x in shape.lower().split("x"))
        result = bench_shape(B, T, V, args.topk, args.candidates, args.hidden, chunks[:1] if args.json else chunks,
                             args.repeats, args.temperature, upstream=not args.no_upstream, table=not args.json)
        if args.json:
            keys = ("dense_api_s", "dense_api_kept_s", "chunked_s", "upstream_s", "dense_over_upstream",
                    "dense_kept_over_upstream", "chunked_over_upstream")
            out = {k: round(result[k], 4) for k in keys if k in result}
            out.update(shape=shape, load_average=round(os.getloadavg()[0], 2),
                       thp="glibc.malloc.hugetlb" in os.environ.get("GLIBC_TUNABLES", ""))
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
