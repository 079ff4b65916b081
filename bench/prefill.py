"""Prefill throughput at OpenClaw's prompt sizes: our engine vs HF transformers and the real SGLang CPU server.

A person's turn through OpenClaw starts with a prefill of a ~2.3 k-token prompt; this times that step
alone: B prompts of L tokens each (cut from OpenClaw's recorded minimal-profile system prompt, each row
from a different offset so no two rows share a prefix), one new token (greedy), the packaged
SmolLM2-135M weights on every side in one dtype (--dtype: float32, or bfloat16 matmuls with float32
accumulation), in one process run:

  * ours: the embedded engine with its prefix cache off (`Engine.generate_sync`, all B prompts submitted
    together: the engine's own cold prefill, first token and bookkeeping);
  * transformers: one forward with `use_cache=True, logits_to_keep=1` (what `generate` runs as its
    prefill), PyTorch's default threads;
  * SGLang: `scripts/sglang_cpu.sh serve` with its radix cache off, one `/generate` of the B token-id
    prompts with max_new_tokens=1 (HTTP and its IPC included, as a client sees it); skipped with a note
    when its venv is missing (`bash scripts/sglang_cpu.sh setup`) or with --no-sglang;
  * the machine's own matmul rate: an XLA dot of each of a layer's weight matrices by B*L rows (in
    --dtype, as our layers run them: `openclaw_jax.models.matmul.contract`), timed in this process in the
    same rounds as the prefills (`XLA dot GFLOP/s`), and the fraction of it our prefill reaches (its model FLOPs per
    second over that rate; 1.0 = the whole prefill runs as fast as plain matmuls of the layer shapes);
  * PyTorch's matmul rate for the same shapes and rows (`torch.matmul`, its oneDNN / MKL kernels, PyTorch's
    threads: `torch mm GFLOP/s`), and the ceiling: the ours / transformers ratio a prefill would reach if all
    of its model FLOPs ran at the better of the two matmul rates (`ceiling`). A target above the ceiling
    needs matmuls faster than any this machine's libraries run in --dtype, not less overhead;
  * where our prefill's time goes: the share of it that the layers' matmuls (the dots above, times the layers)
    and their causal attention (`causal_forward_attention` alone on the layer's head shapes, times the layers)
    take when timed alone, in the same rounds as the prefills (their sum can pass 1: in the prefill XLA fuses
    element-wise work into them, and a part timed alone need not run at the speed it runs at inside the whole).

Model FLOPs count the layers' matmuls, causal attention (QK^T and PV over the visible keys, which also
run as matmuls) and the LM head of the last position. Compilation and warm-up are excluded; each number is the median of --repeats runs,
the implementations timed in turn within each round. The first greedy token of every row is compared across them.

    python bench/prefill.py [--shapes 1x2048 4x2048 1x4096 4x4096] [--repeats 3] [--dtype bfloat16] [--no-sglang]
                            [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import numpy as np
from references import (REPO, add_dtype_argument, add_sglang_arguments, interleaved_medians, isa_report,
                        served_model, start_sglang, transformers_model)

logger = logging.getLogger("bench.prefill")
PROMPT_SOURCE = REPO / "tests" / "fixtures" / "openclaw" / "minimal_system_prompt.txt"


def parse_shape(text: str) -> tuple[int, int]:
    try:
        rows, length = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes {text!r}: expected ROWSxTOKENS, e.g. 1x2048") from None
    if rows < 1 or length < 2:
        raise SystemExit(f"--shapes {text!r}: at least 1 row of 2 tokens")
    return rows, length


def prompts(tokenizer, rows: int, length: int) -> list[list[int]]:
    """`rows` prompts of `length` tokens from OpenClaw's system prompt (repeated as needed), each starting
    at a different offset."""
    ids = tokenizer.encode(PROMPT_SOURCE.read_text())
    reps = -(-(length + rows * 97) // len(ids))
    tiled = (ids * reps)
    return [tiled[r * 97:r * 97 + length] for r in range(rows)]


def layer_weight_shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of one layer's weight matrices: q, k, v, o, gate, up, down."""
    h, n, k, d, i = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    return [(h, n * d), (h, k * d), (h, k * d), (n * d, h), (h, i), (h, i), (i, h)]


def layer_matmul_flops(cfg) -> int:
    """FLOPs of one layer's weight matmuls (q, k, v, o, gate, up, down) per token."""
    return sum(2 * a * b for a, b in layer_weight_shapes(cfg))


def model_flops(cfg, rows: int, length: int) -> float:
    """Matmul FLOPs of one prefill: the layers' projections, causal attention, the last position's LM head."""
    attention = 4 * cfg.num_heads * cfg.head_dim * length * (length + 1) / 2  # per row: QK^T and PV over j <= i
    return rows * (cfg.num_layers * (length * layer_matmul_flops(cfg) + attention)
                   + 2 * cfg.hidden_size * cfg.vocab_size)


def layer_dots(cfg, tokens: int, dtype: str):
    """A call of one layer's weight matmuls (q, k, v, o, gate, up, down) by `tokens` rows: plain XLA dots in
    `dtype` (float32 accumulation), compiled and run once."""
    import jax
    import jax.numpy as jnp

    from openclaw_jax.models.matmul import contract

    shapes = layer_weight_shapes(cfg)
    rng = np.random.default_rng(0)
    xs = [jnp.asarray(rng.standard_normal((tokens, a), np.float32), dtype) for a, _ in shapes]
    ws = [jnp.asarray(rng.standard_normal(s, np.float32) * 0.02, dtype) for s in shapes]
    dots = jax.jit(lambda xs, ws: [contract(x, w, 1, dtype) for x, w in zip(xs, ws)])
    jax.block_until_ready(dots(xs, ws))
    return lambda: jax.block_until_ready(dots(xs, ws))


def layer_torch_matmuls(cfg, tokens: int, dtype: str):
    """The same matmuls as `layer_dots`, by PyTorch (`torch.matmul`: its oneDNN / MKL kernels and threads)."""
    import torch

    shapes = layer_weight_shapes(cfg)
    gen = torch.Generator().manual_seed(0)
    torch_dtype = getattr(torch, dtype)
    xs = [torch.randn(tokens, a, generator=gen).to(torch_dtype) for a, _ in shapes]
    ws = [(torch.randn(*s, generator=gen) * 0.02).to(torch_dtype) for s in shapes]

    def run():
        with torch.inference_mode():
            return [torch.matmul(x, w) for x, w in zip(xs, ws)]
    run()
    return run


def layer_attention(cfg, rows: int, length: int, dtype: str):
    """A call of one layer's causal attention alone over `rows` x `length` tokens, in `dtype`: the kernel our
    prefill runs (`causal_forward_attention`, no padding mask), on random q / k / v of the layer's head shapes;
    compiled and run once."""
    import jax
    import jax.numpy as jnp

    from openclaw_jax.models.attention import causal_forward_attention

    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((rows, length, heads, cfg.head_dim), np.float32), dtype)
               for heads in (cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads))
    attend = jax.jit(causal_forward_attention)
    jax.block_until_ready(attend(q, k, v))
    return lambda: jax.block_until_ready(attend(q, k, v))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1x2048", "4x2048", "1x4096", "4x4096"],
                        help="ROWSxTOKENS prompts prefilled together (default: 1x2048 4x2048 1x4096 4x4096)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    add_dtype_argument(parser)
    add_sglang_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    shapes = [parse_shape(s) for s in args.shapes]

    import torch

    from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    cfg = pre.config
    most_rows, longest = max(r for r, _ in shapes), max(n for _, n in shapes)
    if longest >= cfg.max_position_embeddings:
        raise SystemExit(f"prompts of {longest} tokens do not fit the context ({cfg.max_position_embeddings})")

    pool = max(r * (n + 1) for r, n in shapes) + 256
    # --mem-fraction-static given: from a chunked-prefill size of thousands of tokens SGLang's own estimate of
    # activation memory exceeds a small machine's and it refuses to start; the pool is --max-total-tokens anyway
    server, sglang_note = start_sglang(args, pre, "prefill", [
        "--disable-radix-cache", "--max-total-tokens", str(pool), "--max-prefill-tokens", str(pool),
        "--chunked-prefill-size", str(pool), "--context-length", str(cfg.max_position_embeddings),
        "--mem-fraction-static", "0.8", "--dtype", args.dtype])

    # the float32 load above is what transformers and SGLang start from (SGLang's export is shared by dtypes)
    engine = Engine(served_model(pre, args.dtype), pre.tokenizer, context_length=cfg.max_position_embeddings,
                    config=EngineConfig(max_batch_size=most_rows, prefix_cache_bytes=0, batch_wait_s=0.02,
                                        max_prefill_tokens=max(16384, max(r * n for r, n in shapes))))
    hf_model, _ = transformers_model(args.dtype)

    def ours(rows_ids):
        outs = engine.generate_sync([spec_for(p, max_new_tokens=1, temperature=0, ignore_eos=True) for p in rows_ids])
        assert all(o.cached_tokens == 0 for o in outs)
        return [o.output_ids[0] for o in outs]

    def theirs(rows_ids):
        with torch.inference_mode():
            logits = hf_model(torch.tensor(rows_ids), use_cache=True, logits_to_keep=1).logits
        return logits[:, -1].argmax(-1).tolist()

    results = []
    try:
        if server is not None:
            server.wait()
        for rows, length in shapes:
            batch = prompts(pre.tokenizer, rows, length)
            firsts = {"ours": ours(batch), "transformers": theirs(batch)}  # compile + warm-up
            row = {"shape": f"{rows}x{length}", "tokens": rows * length, "gflop": model_flops(cfg, rows, length) / 1e9}
            fns = {"ours": lambda: ours(batch), "transformers": lambda: theirs(batch),
                   "dots": layer_dots(cfg, rows * length, args.dtype),
                   "torch_mm": layer_torch_matmuls(cfg, rows * length, args.dtype),
                   "attention": layer_attention(cfg, rows, length, args.dtype)}
            if server is not None:
                firsts["SGLang"] = [o["output_ids"][0] for o in server.generate(batch, 1)]
                fns["sglang"] = lambda: server.generate(batch, 1)
            row.update({f"{name}_s": t for name, t in interleaved_medians(fns, args.repeats).items()})
            dot_s = row["dots_s"]
            layer_gflop = rows * length * layer_matmul_flops(cfg) / 1e9
            row["matmul_gflops"] = layer_gflop / dot_s
            row["matmul_fraction"] = row["gflop"] / row["ours_s"] / row["matmul_gflops"]
            row["torch_matmul_gflops"] = layer_gflop / row["torch_mm_s"]
            # all of the prefill's model FLOPs at the better library's matmul rate, against transformers' time
            best = max(row["matmul_gflops"], row["torch_matmul_gflops"])
            row["ceiling_over_transformers"] = row["transformers_s"] / (row["gflop"] / best)
            # where our prefill's time goes: the layers' matmuls and their attention, each timed alone
            row["matmul_share"] = cfg.num_layers * dot_s / row["ours_s"]
            row["attention_share"] = cfg.num_layers * row["attention_s"] / row["ours_s"]
            row["same_first_tokens"] = {name: ids == firsts["ours"] for name, ids in firsts.items() if name != "ours"}
            results.append(row)
            logger.warning("%s done", row["shape"])
    finally:
        engine.shutdown()
        if server is not None:
            server.stop()

    report(results, args, has_sg=server is not None, sglang_note=sglang_note)


def report(results: list[dict], args, *, has_sg: bool, sglang_note: str | None) -> None:
    """The table (and with --json one JSON line) of `main`'s measured rows."""
    import jax
    import torch
    import transformers

    load, isa = os.getloadavg(), isa_report()
    print(f"\nSmolLM2-135M-Instruct prefill (cold, 1 new token), {args.dtype}, {isa['cpu']}, {os.cpu_count()} cores "
          f"(XLA ISA {isa['xla_isa']}, ATen {isa['torch_isa']}, torch threads {torch.get_num_threads()}), "
          f"median of {args.repeats}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    sg_head = f" {'SGLang':>8} {'ours/SGL':>8}" if has_sg else ""
    print(f"{'rows x tokens':>13} | {'tokens/s ours':>13} {'transformers':>12} {'ours/HF':>7}{sg_head} | "
          f"{'ours GFLOP/s':>12} {'XLA dot GFLOP/s':>15} {'fraction':>8} {'torch mm GFLOP/s':>16} {'ceiling':>7} | "
          f"time in: {'matmuls':>7} {'attention':>9} {'sum':>5}")
    for r in results:
        tps = {k: r["tokens"] / r[f"{k}_s"] for k in ("ours", "transformers", "sglang") if f"{k}_s" in r}
        sg = f" {tps['sglang']:>8.0f} {tps['ours'] / tps['sglang']:>7.2f}x" if has_sg else ""
        print(f"{r['shape']:>13} | {tps['ours']:>13.0f} {tps['transformers']:>12.0f} "
              f"{tps['ours'] / tps['transformers']:>6.2f}x{sg} | {r['gflop'] / r['ours_s']:>12.1f} "
              f"{r['matmul_gflops']:>15.1f} {r['matmul_fraction']:>8.2f} {r['torch_matmul_gflops']:>16.1f} "
              f"{r['ceiling_over_transformers']:>6.2f}x |          {r['matmul_share']:>7.2f} "
              f"{r['attention_share']:>9.2f} {r['matmul_share'] + r['attention_share']:>5.2f}")
    for r in results:
        for name, same in r["same_first_tokens"].items():
            if not same:
                print(f"{r['shape']}: first greedy tokens differ from {name}")
    if sglang_note:
        print(sglang_note)
    print(f"(transformers {transformers.__version__}, torch {torch.__version__}, jax {jax.__version__})")
    if args.json:
        out = {"isa": {"xla": isa["xla_isa"], "torch": isa["torch_isa"]}, "dtype": args.dtype,
               "ours_over_transformers": {r["shape"]: round(r["transformers_s"] / r["ours_s"], 3) for r in results},
               "fraction_of_matmul_rate": {r["shape"]: round(r["matmul_fraction"], 3) for r in results},
               "matmul_gflops": {r["shape"]: {"xla": round(r["matmul_gflops"], 1),
                                              "torch": round(r["torch_matmul_gflops"], 1)} for r in results},
               "ceiling_over_transformers": {r["shape"]: round(r["ceiling_over_transformers"], 3) for r in results},
               "time_shares": {r["shape"]: {"matmuls": round(r["matmul_share"], 3),
                                            "attention": round(r["attention_share"], 3)} for r in results},
               "ours_tokens_per_s": {r["shape"]: round(r["tokens"] / r["ours_s"], 1) for r in results}}
        if has_sg:
            out["ours_over_sglang"] = {r["shape"]: round(r["sglang_s"] / r["ours_s"], 3) for r in results}
        print(json.dumps(out))


if __name__ == "__main__":
    main()
