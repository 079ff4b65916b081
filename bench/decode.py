"""Decode throughput: our JAX engine vs the real SGLang server (CPU) and HF transformers `generate` on SmolLM2-135M.

All three use the same dequantised weights (the packaged GGUF via `load_pretrained("smollm2")`;
the PyTorch model is built from that same state dict; SGLang loads them exported to an HF directory
with `save_hf_checkpoint`) and the same chat-templated prompts, greedy, exactly N new tokens (EOS
ignored). Ours and transformers run in this process; SGLang is `scripts/sglang_cpu.sh serve` (its
CPU venv, `bash scripts/sglang_cpu.sh setup`; skipped with a note when missing or with --no-sglang),
sent each batch as one `/generate` request of token ids (so its numbers include HTTP and its
tokenizer-manager / scheduler IPC, as a client sees them). Every side runs in --dtype (float32 by
default; bfloat16: bf16 weights and matmuls, ours with float32 accumulation, softmax and logits).
Compilation and warm-up are excluded;
each number is the median of the timed repeats, ours and transformers timed in turn within each round
(then SGLang), in one run.

  * end-to-end tokens/s = batch * N / time(generate N tokens)   (prefill included)
  * decode tokens/s     = batch * (N - 1) / (time(N tokens) - time(1 token))   (prefill cancels out)

    python bench/decode.py [--new-tokens 64] [--repeats 3] [--batches 1 16] [--dtype bfloat16] [--json] [--no-sglang]

An AVX-512 machine stands in for an AVX2-only one with both sides capped:
`XLA_FLAGS=--xla_cpu_max_isa=AVX2 ATEN_CPU_CAPABILITY=avx2 python bench/decode.py`; the table's header
states the ISA each side ran with (and the CPU).

--json prints one line `{"ours_over_sglang": {"1": r, "16": r}, "ours_over_transformers": {...}, "isa": {...}}`
(decode tokens/s ratios by batch, the ISA of each side) after the table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import numpy as np
from references import (add_dtype_argument, add_sglang_arguments, interleaved_medians, isa_report, served_model,
                        start_sglang, transformers_model)

logger = logging.getLogger("bench.decode")

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "How many legs does a spider have?",
    "Give me three tips for learning a new language quickly and effectively.",
    "What is 17 times 23?",
    "Summarise the plot of Romeo and Juliet.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and German.",
    "What are the main differences between Python lists and tuples?",
    "Suggest a name for a friendly robot.",
    "How do vaccines work?",
    "List the planets of the solar system in order from the sun.",
    "What should I cook for dinner tonight if I only have eggs, rice and spinach?",
    "Describe the colour green to someone who cannot see.",
    "What is the boiling point of water at sea level in Fahrenheit?",
    "Write a limerick about a cat who loves coffee.",
    "What causes the seasons on Earth?",
    "Name three famous painters from the Renaissance.",
    "How does a bicycle stay upright while moving?",
    "What is the difference between weather and climate?",
    "Give me a short motivational quote.",
    "Explain what a black hole is to a ten year old.",
    "What are the primary colours?",
    "How many minutes are there in a day?",
    "Recommend a good book for a long flight.",
    "What is the tallest mountain in the world?",
    "Why do cats purr?",
    "Write one sentence about autumn leaves.",
    "What is the square root of 144?",
    "How do I make a cup of green tea?",
    "What language is spoken in Brazil?",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--json", action="store_true", help="also print the decode ratios as one JSON line")
    add_dtype_argument(parser)
    add_sglang_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    n_new = args.new_tokens
    if n_new < 2:
        raise SystemExit("--new-tokens must be >= 2 (decode rate uses the N-token and 1-token runs)")

    import jax
    import torch
    import transformers

    from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    tok = pre.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in QUESTIONS]
    max_batch = max(args.batches)
    if max_batch > len(prompts):
        raise SystemExit(f"at most {len(prompts)} prompts are defined; --batches {max_batch} is too large")

    # --- SGLang: started first, it loads while the other two are set up
    server, sglang_note = start_sglang(args, pre, "decode", ["--dtype", args.dtype])

    # --- ours
    engine = Engine(served_model(pre, args.dtype), tok, context_length=pre.config.max_position_embeddings,
                    config=EngineConfig(max_batch_size=max_batch, min_prompt_bucket=16, min_cache_bucket=64,
                                        batch_wait_s=0.0))

    def ours(batch: int, n: int):
        specs = [spec_for(p, max_new_tokens=n, temperature=0, ignore_eos=True) for p in prompts[:batch]]
        return engine.generate_sync(specs)

    # --- transformers: same dequantised weights, eager PyTorch on CPU, left-padded batches
    model, hf_config = transformers_model(args.dtype)
    pad = int(hf_config.get("pad_token_id", 2))
    # Exactly N tokens on both sides: no EOS for HF either (min_new_tokens would instead mask EOS
    # out of the argmax, which changes the greedy path compared with ignore_eos).
    model.generation_config.eos_token_id = None

    def hf_inputs(batch: int):
        rows = prompts[:batch]
        width = max(len(r) for r in rows)
        ids = np.full((batch, width), pad, np.int64)
        mask = np.zeros((batch, width), np.int64)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = r
            mask[i, width - len(r):] = 1
        return torch.from_numpy(ids), torch.from_numpy(mask)

    def theirs(batch: int, n: int):
        ids, mask = hf_inputs(batch)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                                 pad_token_id=pad, eos_token_id=None)
        assert out.shape[1] == ids.shape[1] + n, out.shape
        return out[:, ids.shape[1]:]

    try:
        if server is not None:
            server.wait()
        rows, agreement = [], {}
        for batch in args.batches:
            ours(batch, n_new), ours(batch, 1)  # compile + warm-up
            theirs(batch, 2)
            row = dict(batch=batch)
            t = interleaved_medians({"ours_n": lambda: ours(batch, n_new), "ours_1": lambda: ours(batch, 1),
                                     "hf_n": lambda: theirs(batch, n_new), "hf_1": lambda: theirs(batch, 1)},
                                    args.repeats)
            t_ours_n, t_ours_1, t_hf_n, t_hf_1 = t["ours_n"], t["ours_1"], t["hf_n"], t["hf_1"]
            row.update(ours_e2e=batch * n_new / t_ours_n, hf_e2e=batch * n_new / t_hf_n,
                       ours_dec=batch * (n_new - 1) / max(t_ours_n - t_ours_1, 1e-9),
                       hf_dec=batch * (n_new - 1) / max(t_hf_n - t_hf_1, 1e-9))
            mine = [o.output_ids for o in ours(batch, n_new)]
            if server is not None:
                rows_ids = [list(p) for p in prompts[:batch]]
                server.generate(rows_ids, 2)  # warm-up
                t = interleaved_medians({"n": lambda: server.generate(rows_ids, n_new),
                                         "1": lambda: server.generate(rows_ids, 1)}, args.repeats)
                t_sg_n, t_sg_1 = t["n"], t["1"]
                row.update(sg_e2e=batch * n_new / t_sg_n, sg_dec=batch * (n_new - 1) / max(t_sg_n - t_sg_1, 1e-9))
                sg = [o["output_ids"] for o in server.generate(rows_ids, n_new)]
                agreement[("SGLang", batch)] = sum(a == b for a, b in zip(mine, sg))
            if batch == 1:
                hf = theirs(1, n_new)[0].tolist()
                agreement[("transformers", 1)] = int(mine[0] == hf)
                row["hf_token_match"] = sum(x == y for x, y in zip(mine[0], hf)) / n_new
            rows.append(row)
    finally:
        engine.shutdown()
        if server is not None:
            server.stop()

    load = os.getloadavg()
    isa = isa_report()
    print(f"\nSmolLM2-135M-Instruct greedy generation, {args.dtype}, {n_new} new tokens per sequence, "
          f"{jax.devices()[0].platform} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()}), "
          f"median of {args.repeats}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{isa['cpu']}: ours with XLA ISA {isa['xla_isa']}, transformers with ATen {isa['torch_isa']}")
    has_sg = server is not None
    sg_head = f" {'SGLang':>8} {'ratio':>6}" if has_sg else ""
    print(f"{'batch':>5} | {'decode tok/s ours':>17}{sg_head} {'transformers':>12} {'ratio':>6} | "
          f"{'end-to-end tok/s ours':>21}{sg_head} {'transformers':>12} {'ratio':>6}")
    for r in rows:
        sg_dec = f" {r['sg_dec']:>8.1f} {r['ours_dec'] / r['sg_dec']:>5.2f}x" if has_sg else ""
        sg_e2e = f" {r['sg_e2e']:>8.1f} {r['ours_e2e'] / r['sg_e2e']:>5.2f}x" if has_sg else ""
        print(f"{r['batch']:>5} | {r['ours_dec']:>17.1f}{sg_dec} {r['hf_dec']:>12.1f} {r['ours_dec'] / r['hf_dec']:>5.2f}x | "
              f"{r['ours_e2e']:>21.1f}{sg_e2e} {r['hf_e2e']:>12.1f} {r['ours_e2e'] / r['hf_e2e']:>5.2f}x")
    for (name, batch), same in sorted(agreement.items()):
        print(f"greedy tokens identical to {name} at batch {batch}: {same} of {batch} sequences")
    for r in rows:
        if "hf_token_match" in r:
            print(f"greedy token agreement with transformers at batch 1: {r['hf_token_match']:.0%} of {n_new} tokens")
    if sglang_note:
        print(sglang_note)
    print(f"(transformers {transformers.__version__}, torch {torch.__version__}, jax {jax.__version__})")
    if args.json:
        result = {"ours_over_transformers": {str(r["batch"]): round(r["ours_dec"] / r["hf_dec"], 3) for r in rows},
                  "isa": {"xla": isa["xla_isa"], "torch": isa["torch_isa"]}, "dtype": args.dtype}
        if has_sg:
            result = {"ours_over_sglang": {str(r["batch"]): round(r["ours_dec"] / r["sg_dec"], 3) for r in rows},
                      **result}
        print(json.dumps(result))


if __name__ == "__main__":
    main()
