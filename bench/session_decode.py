"""A reply at a long OpenClaw session: decode rate of one row whose prompt is thousands of tokens.

Every decode step attends over the running batch's whole cache (`inference/decode_layers.decode_attention`),
so its cost grows with the cache length, not only with the tokens in use. This times our engine's greedy
decode of one row after a prompt of each `--lengths` (cut from OpenClaw's recorded system prompt, as
`bench/prefill.py`), with the running cache bucketed in powers of two (`cache_bucket_steps=1`) and in four sizes
per octave past 4096 (`cache_bucket_steps=4`, the default), two engines on the same weights in one process,
and HF transformers on the same weights and tokens (its cache holds exactly the tokens so far), timed in turn.
Decode tok/s = (N - 1) / (time of N new tokens - time of 1), so the prefill cancels out. The two engines'
greedy tokens are compared (the cache length changes no value: slots past a row's position are masked).

    python bench/session_decode.py [--lengths 4400 6000] [--new-tokens 64] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill import prompts  # noqa: E402
from references import interleaved_medians, isa_report, transformers_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4400, 6000], help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-transformers", action="store_true", help="skip the transformers reference")
    parser.add_argument("--json", action="store_true", help="also print the rates as one JSON line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.new_tokens < 2 or min(args.lengths) < 2:
        raise SystemExit("--new-tokens and every --lengths must be >= 2")

    import jax
    import torch

    from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
    from openclaw_jax.inference.scheduler import cache_bucket
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    context = pre.config.max_position_embeddings
    if max(args.lengths) + args.new_tokens > context:
        raise SystemExit(f"--lengths {max(args.lengths)} + --new-tokens {args.new_tokens} exceeds the model's "
                         f"{context} tokens")
    # live mode's engine shape (configs/live_cpu.yaml: caches from 4096 slots, one prompt per prefill)
    base = dict(max_batch_size=1, min_prompt_bucket=512, min_cache_bucket=4096, max_prefill_rows=1, batch_wait_s=0.0)
    variants = {"pow2": 1, "fine": 4}
    engines = {name: Engine(pre.model, pre.tokenizer, context_length=context,
                            config=EngineConfig(cache_bucket_steps=steps, **base)) for name, steps in variants.items()}
    hf = None if args.no_transformers else transformers_model()[0]

    def ours(name: str, ids: list[int], n: int):
        spec = spec_for(ids, max_new_tokens=n, temperature=0, ignore_eos=True)
        return engines[name].generate_sync([spec])[0].output_ids

    def theirs(ids: list[int], n: int):
        with torch.inference_mode():
            out = hf.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=2)
        return out[0, len(ids):].tolist()

    rows = []
    n = args.new_tokens
    try:
        for length in args.lengths:
            ids = prompts(pre.tokenizer, 1, length)[0]
            fns = {}
            for name in variants:
                ours(name, ids, n), ours(name, ids, 1)   # compile and warm up
                fns[f"{name}_n"] = lambda name=name: ours(name, ids, n)
                fns[f"{name}_1"] = lambda name=name: ours(name, ids, 1)
            if hf is not None:
                theirs(ids, 2)
                fns["hf_n"], fns["hf_1"] = (lambda: theirs(ids, n)), (lambda: theirs(ids, 1))
            t = interleaved_medians(fns, args.repeats)
            timed = [*variants] + (["hf"] if hf is not None else [])
            rate = {key: (n - 1) / max(t[f"{key}_n"] - t[f"{key}_1"], 1e-9) for key in timed}
            same = ours("pow2", ids, n) == ours("fine", ids, n)
            row = {"prompt": length, "caches": {name: cache_bucket(length + n, engines[name].config) for name in variants},
                   "tok_s": {k: round(v, 2) for k, v in rate.items()}, "same_tokens": same}
            if hf is not None:
                row["hf_same_tokens"] = sum(a == b for a, b in zip(ours("fine", ids, n), theirs(ids, n)))
            rows.append(row)
    finally:
        for engine in engines.values():
            engine.shutdown()

    load = os.getloadavg()
    isa = isa_report()
    print(f"\nSmolLM2-135M-Instruct, one row, greedy, float32, {n} new tokens, median of {args.repeats}; "
          f"{jax.devices()[0].platform} ({os.cpu_count()} cores); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{isa['cpu']}: ours with XLA ISA {isa['xla_isa']}, transformers with ATen {isa['torch_isa']}")
    print(f"{'prompt':>6} | {'cache pow2':>10} {'tok/s':>6} | {'cache fine':>10} {'tok/s':>6} | {'fine/pow2':>9} | "
          f"{'transformers':>12} {'fine/HF':>7} | same tokens")
    for r in rows:
        tok, caches = r["tok_s"], r["caches"]
        hf_cols = f"{tok['hf']:>12.1f} {tok['fine'] / tok['hf']:>6.2f}x" if "hf" in tok else f"{'-':>12} {'-':>7}"
        print(f"{r['prompt']:>6} | {caches['pow2']:>10} {tok['pow2']:>6.1f} | {caches['fine']:>10} {tok['fine']:>6.1f} | "
              f"{tok['fine'] / tok['pow2']:>8.2f}x | {hf_cols} | {'yes' if r['same_tokens'] else 'NO'}"
              + (f" ({r['hf_same_tokens']}/{n} as transformers)" if "hf_same_tokens" in r else ""))
    if args.json:
        print(json.dumps({"rows": rows, "isa": {"xla": isa["xla_isa"], "torch": isa["torch_isa"]}}))


if __name__ == "__main__":
    main()
