"""The recompute of a hot prefix at a weight swap: one cold prefill against extends of N-token chunks.

At a swap the policy server recomputes each active session's cached prefix under the new weights
(`inference/weight_swap.refresh_prefixes`) while it serves, so a person's turn that arrives meanwhile shares the
CPU with it: the fewer seconds the recompute takes, the fewer turns meet it. This times the recompute of one
OpenClaw-shaped prefix (`--length` tokens cut from OpenClaw's recorded system prompt, as `bench/prefill.py`) by
the engine's own prefill and extend steps (SmolLM2-135M, float32, the live config's buckets) in chunks of
each `--chunks` size (`refresh_prefixes(chunk_tokens=...)`, the server's being `EngineConfig.prefix_refresh_chunk_tokens`; one at
or above the length: one cold prefill), every size compiled first, then timed in turn (`--repeats` rounds, medians). Reported: seconds, tokens/s, and each size's
time over the one-call recompute's.

    python bench/prefix_refresh.py [--length 4032] [--chunks 8192 2048 512] [--repeats 3] [--json]
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
from references import interleaved_medians  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4032, help="prefix tokens (whole 64-token blocks are kept)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[8192, 2048, 512],
                        help="chunk sizes in tokens; the first is the reference")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.length < 64 or min(args.chunks) < 64 or args.repeats < 1:
        raise SystemExit("--length and every --chunks must be >= 64 and --repeats >= 1")

    from openclaw_jax.inference import weight_swap
    from openclaw_jax.inference.engine import Engine, EngineConfig
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    # configs/live_cpu.yaml's policy buckets
    config = EngineConfig(max_batch_size=4, min_prompt_bucket=512, min_cache_bucket=4096, batch_wait_s=0.0)
    engine = Engine(pre.model, pre.tokenizer, context_length=8192, config=config)
    block = engine._prefix.block
    ids = prompts(pre.tokenizer, 1, args.length)[0]
    ids = ids[:len(ids) // block * block]

    def refresh(chunk: int):
        def run() -> int:
            fresh = weight_swap.new_prefix_cache(engine._prefix, config.prefix_cache_bytes, engine._kv_bytes_per_token)
            done = weight_swap.refresh_prefixes([ids], graphdef=engine._graphdef, state=engine._state, config=config,
                                                vocab_size=engine.vocab_size, fresh=fresh, generation=-1,
                                                chunk_tokens=chunk)
            assert done.tokens == len(ids) and fresh.contains(ids) == len(ids)
            return done.tokens
        return run

    try:
        runs = {chunk: refresh(chunk) for chunk in args.chunks}
        for run in runs.values():  # compile every shape first
            run()
        seconds = interleaved_medians({str(c): fn for c, fn in runs.items()}, args.repeats)
    finally:
        engine.shutdown()
    reference = seconds[str(args.chunks[0])]
    load = os.getloadavg()
    print(f"\nRecompute of a {len(ids)}-token prefix (SmolLM2-135M, float32), medians of {args.repeats}; "
          f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'chunk':>6} | {'seconds':>7} | {'tok/s':>6} | / chunk {args.chunks[0]}")
    for chunk in args.chunks:
        s = seconds[str(chunk)]
        print(f"{chunk:>6} | {s:>7.2f} | {len(ids) / s:>6.1f} | {s / reference:.2f}x")
    if args.json:
        print(json.dumps({"tokens": len(ids), "seconds": seconds,
                          "over_first": {c: round(s / reference, 3) for c, s in seconds.items()}}))


if __name__ == "__main__":
    main()
