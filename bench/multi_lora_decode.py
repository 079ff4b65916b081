"""Decode throughput with per-person LoRA adapters: a batch whose rows each use a different adapter against
the same batch without adapters, on SmolLM2-135M (the packaged GGUF, float32), in one process.

Three engines' numbers, timed in turn within each round (`references.interleaved_medians`):

  * `plain`     : the engine without adapter slots (`lora_slots=0`: the fused decode layers);
  * `no_adapter`: the engine with `--lora-slots` slots, every row without an adapter (slot 0);
  * `adapters`  : the same engine, each row with its own adapter (rank `--rank`, all seven projections).

decode tokens/s = batch * (N - 1) / (time(N tokens) - time(1 token)) (the prefill cancels out). Greedy,
exactly N new tokens, the same prompt in every row, the prefix cache off.

    python bench/multi_lora_decode.py [--batch 4] [--new-tokens 32] [--rank 16] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging

import numpy as np
from references import interleaved_medians, isa_report

logger = logging.getLogger("bench.multi_lora_decode")

TARGET_SHAPES = {"q": lambda c: ((c.hidden_size,), (c.num_heads, c.head_dim)),
                 "k": lambda c: ((c.hidden_size,), (c.num_kv_heads, c.head_dim)),
                 "v": lambda c: ((c.hidden_size,), (c.num_kv_heads, c.head_dim)),
                 "o": lambda c: ((c.num_heads, c.head_dim), (c.hidden_size,)),
                 "gate": lambda c: ((c.hidden_size,), (c.intermediate_size,)),
                 "up": lambda c: ((c.hidden_size,), (c.intermediate_size,)),
                 "down": lambda c: ((c.intermediate_size,), (c.hidden_size,))}


def random_adapter(cfg, seed: int, rank: int):
    from openclaw_jax.inference.adapters import Adapter

    rng = np.random.default_rng(seed)
    weights = {}
    for target, shapes in TARGET_SHAPES.items():
        inp, out = shapes(cfg)
        weights[target] = (rng.normal(0, 0.02, (cfg.num_layers,) + inp + (rank,)).astype(np.float32),
                           rng.normal(0, 0.02, (cfg.num_layers, rank) + out).astype(np.float32))
    return Adapter(rank=rank, alpha=2.0 * rank, weights=weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4, help="rows decoded together (one adapter each)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="also print the ratios as one JSON line")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    tok = pre.tokenizer
    cfg = pre.model.cfg
    prompt = tok.apply_chat_template([{"role": "user", "content": "Give me three tips for learning a language."}],
                                     add_generation_prompt=True)
    common = dict(max_batch_size=args.batch, min_batch_bucket=args.batch, prefix_cache_bytes=0, batch_wait_s=0.01)
    plain = Engine(pre.model, tok, context_length=2048, seed=0, config=EngineConfig(**common))
    lora = Engine(pre.model, tok, context_length=2048, seed=0,
                  config=EngineConfig(**common, lora_slots=args.batch, lora_max_rank=args.rank))
    people = [f"person{i}" for i in range(args.batch)]
    for i, name in enumerate(people):
        lora.load_adapter(name, random_adapter(cfg, i, args.rank))

    def run(engine, names, n):
        specs = [spec_for(prompt, max_new_tokens=n, temperature=0, ignore_eos=True, lora_path=name) for name in names]
        return engine.generate_sync(specs, timeout=1800)

    cases = {"plain": (plain, [None] * args.batch), "no_adapter": (lora, [None] * args.batch),
             "adapters": (lora, people)}
    fns = {}
    for case, (engine, names) in cases.items():
        for n in (args.new_tokens, 1):
            fns[f"{case}_{n}"] = lambda engine=engine, names=names, n=n: run(engine, names, n)
    for fn in fns.values():  # compile and warm up
        fn()
    t = interleaved_medians(fns, args.repeats)
    tps = {case: args.batch * (args.new_tokens - 1) / (t[f"{case}_{args.new_tokens}"] - t[f"{case}_1"])
           for case in cases}
    print(f"SmolLM2-135M float32, {args.batch} rows, {args.new_tokens} new tokens, adapters rank {args.rank} on all "
          f"7 projections; {isa_report()}")
    for case, value in tps.items():
        print(f"  {case:<11} {value:8.1f} decode tokens/s")
    ratios = {"adapters_over_no_adapter": tps["adapters"] / tps["no_adapter"],
              "adapters_over_plain": tps["adapters"] / tps["plain"]}
    print("  " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    if args.json:
        print(json.dumps({"tokens_per_s": tps, **ratios}))
    plain.shutdown()
    lora.shutdown()


if __name__ == "__main__":
    main()
