"""A warm turn beside background XLA work, by the background's CPU priority: why the trainer runs in SCHED_IDLE.

On a laptop the trainer shares the cores with serving. This times what a person waits for on a warm
turn of a long OpenClaw session (the engine's prefix cache holds the first `--prefix` tokens; the turn
adds `--new` tokens and waits for 1 token), with our SmolLM2 engine and prefix cache, while a second
process runs XLA matmuls on every core (the kind of work a train step is), that process:

  * absent (the reference);
  * at the normal priority (a trainer that does not step back);
  * at nice 19 (`policy.trainer_idle=false`);
  * in SCHED_IDLE (`policy.trainer_idle=true`, the default; `openclaw_jax/cpu_priority.py`).

Between turns the engine sleeps `--think-s` (a person reading), when the background has the cores. Printed:
median and p90 of the turn's time and their ratio to the reference, and the background's matmuls per
second, a measure of what training gets (its ratio to the background at the normal priority).

    python bench/serving_priority.py [--prefix 3500] [--new 100] [--turns 16] [--think-s 0.5] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from prefill import prompts  # noqa: E402
from references import isa_report  # noqa: E402

# the background: XLA matmuls on every core, after its own compilation; it prints "ready", then on SIGTERM
# the matmuls it finished since and the seconds they took
BACKGROUND = """
import os, signal, sys, time
if sys.argv[1] == "idle":
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
elif sys.argv[1] == "nice":
    os.nice(19)
import jax, jax.numpy as jnp
step = jax.jit(lambda a: (a @ a) * 1e-3)
x = step(jnp.ones((1024, 1024), jnp.float32)).block_until_ready()
done, start = 0, time.perf_counter()
def report(*_):
    print(done, time.perf_counter() - start, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, report)
print("ready", flush=True)
while True:
    x = step(x).block_until_ready()
    done += 1
"""
SETTINGS = {"none": None, "normal": "normal", "nice 19": "nice", "SCHED_IDLE": "idle"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=int, default=3500, help="cached prompt tokens (OpenClaw's prompt + session)")
    parser.add_argument("--new", type=int, default=100, help="new prompt tokens per turn")
    parser.add_argument("--turns", type=int, default=16, help="timed turns per setting")
    parser.add_argument("--think-s", type=float, default=0.5, help="seconds between turns")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.prefix < 64 or args.new < 1 or args.turns < 2:
        raise SystemExit("--prefix must be >= 64, --new >= 1 and --turns >= 2")

    import jax

    from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    engine = Engine(pre.model, pre.tokenizer, context_length=pre.config.max_position_embeddings,
                    config=EngineConfig(max_batch_size=4, min_prompt_bucket=512, min_cache_bucket=4096,
                                        max_prefill_rows=1, batch_wait_s=0.0))
    base = prompts(pre.tokenizer, 1, args.prefix + args.new)[0]
    vocab = pre.config.vocab_size
    counter = iter(range(1, 1 << 30))

    def turn() -> float:
        # the cached prefix, then new tokens no earlier turn had (a fresh exchange of the session)
        k = next(counter)
        ids = base[:args.prefix] + [(t * 7 + k) % (vocab - 200) + 100 for t in base[args.prefix:]]
        start = time.perf_counter()
        engine.generate_sync([spec_for(ids, max_new_tokens=1, temperature=0)])
        return time.perf_counter() - start

    for _ in range(6):   # compile, and fill the prefix cache
        turn()
    results = {}
    try:
        for label, setting in SETTINGS.items():
            background = None
            if setting is not None:
                background = subprocess.Popen([sys.executable, "-c", BACKGROUND, setting], stdout=subprocess.PIPE,
                                              text=True)
                if background.stdout.readline().strip() != "ready":
                    raise RuntimeError("the background process did not start")
            times = []
            for _ in range(args.turns):
                time.sleep(args.think_s)
                times.append(turn())
            rate = None
            if background is not None:
                background.send_signal(signal.SIGTERM)
                done, seconds = background.stdout.readline().split()
                background.wait()
                rate = int(done) / float(seconds)
            times.sort()
            results[label] = {"median_s": statistics.median(times), "p90_s": times[int(0.9 * (len(times) - 1))],
                              "background_matmuls_s": rate}
    finally:
        engine.shutdown()

    ref = results["none"]
    load = os.getloadavg()
    isa = isa_report()
    print(f"\nA warm turn ({args.prefix} cached + {args.new} new tokens, 1 token out), SmolLM2-135M float32, "
          f"{args.turns} turns {args.think_s:g} s apart; {jax.devices()[0].platform} ({os.cpu_count()} cores, "
          f"{isa['cpu']}, XLA ISA {isa['xla_isa']}); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'background':>12} | {'median s':>8} {'/ none':>6} | {'p90 s':>6} {'/ none':>6} | background matmuls/s "
          f"(/ normal)")
    normal_rate = results["normal"]["background_matmuls_s"]
    for label, r in results.items():
        rate = r["background_matmuls_s"]
        rate_text = "-" if rate is None else f"{rate:.1f} ({rate / normal_rate:.2f})"
        print(f"{label:>12} | {r['median_s']:>8.3f} {r['median_s'] / ref['median_s']:>5.2f}x | {r['p90_s']:>6.3f} "
              f"{r['p90_s'] / ref['p90_s']:>5.2f}x | {rate_text}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
