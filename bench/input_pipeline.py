"""Host time per step of the trainer's input path: the hand-written batcher vs the grain pipeline.

Writes a synthetic store of OpenClaw-sized samples (a ~2.3 k-token system prompt common to every
turn, the session so far, the person's message, up to three hints placed before it, a response)
and times, per window of `--window` samples (one step), reading + parsing + filtering + packing:

- `batcher`: `SampleBatcher.batches(start, end, ...)` (trainer/batcher.py, the loop's path today);
- `grain`: `WindowPipeline.batch(start, end, version)` (trainer/input_pipeline.py), the same work as
  grain transformations, nothing overlapped;
- `grain+prefetch`: the same while the next window is prefetched on a host thread and a stand-in
  device step (`--step-ms` of GIL-free waiting) runs: the host time the loop is blocked per step
  (taking the prefetched batch + starting the next prefetch).

    python bench/input_pipeline.py [--window 64] [--windows 8] [--step-ms 200] [--parse-threads 0] [--json]

Prints a table of milliseconds per step (mean, median) and each path's ratio to `batcher`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np

VOCAB = 49_152


def openclaw_like_samples(n: int, seed: int = 0):
    """`n` samples shaped like the OpenClaw run's (configs/openclaw_cpu.yaml): one system prompt for all."""
    from openclaw_jax.samples import Sample

    rng = np.random.default_rng(seed)
    system = [int(x) for x in rng.integers(1, VOCAB, 2300)]

    def ids(k):
        return [int(x) for x in rng.integers(1, VOCAB, int(k))]

    out = []
    for i in range(n):
        prompt = system + ids(rng.integers(0, 1500)) + ids(rng.integers(20, 60))
        response = ids(rng.integers(20, 300))
        kind = ["opd+rl", "rl", "opd+rl", "opd"][i % 4]
        n_hints = 0 if kind == "rl" else int(rng.integers(1, 4))
        hint_prompts = [prompt[:-30] + ids(rng.integers(20, 60)) + prompt[-30:] for _ in range(n_hints)]
        reward = 0.0 if kind == "opd" else float(rng.choice([-1.0, 1.0]))
        out.append(Sample(session_id=f"s{i % 16}", turn_index=i // 16, kind=kind, reward=reward, prompt_ids=prompt,
                          response_ids=response, rollout_logprobs=[float(x) for x in -rng.random(len(response))],
                          hints=[f"hint {j}" for j in range(n_hints)], hint_prompt_ids=hint_prompts,
                          weight_version=str(i // 64), temperature=1.0))
    return out


def spec_for(window: int):
    from openclaw_jax.trainer.batch import BatchSpec

    return BatchSpec(samples_per_step=window, max_candidates=3, min_seq_bucket=64, min_response_bucket=32,
                     max_seq_len=8192, packing=True, shared_prefix_teacher=True, batch_prefix_min=256,
                     bucket_quantum=512, temperature=1.0, max_staleness=4)


def run(window: int, windows: int, step_ms: float, parse_threads: int) -> dict:
    from openclaw_jax.samples import SampleStore
    from openclaw_jax.trainer.batcher import SampleBatcher
    from openclaw_jax.trainer.input_pipeline import WindowPipeline

    spec = spec_for(window)
    spans = [(k * window, (k + 1) * window, k) for k in range(windows)]
    with tempfile.TemporaryDirectory() as tmp:
        with SampleStore(tmp) as store:
            for s in openclaw_like_samples(window * windows):
                store.append(s)
        times: dict[str, list[float]] = {"batcher": [], "grain": [], "grain+prefetch": []}
        batcher = SampleBatcher(tmp, spec)
        for start, end, version in spans:
            t = time.perf_counter()
            next(iter(batcher.batches(start, end, current_version=version)), None)
            times["batcher"].append(time.perf_counter() - t)
        batcher.close()
        with WindowPipeline(tmp, spec, parse_threads=parse_threads) as pipeline:
            for start, end, version in spans:
                t = time.perf_counter()
                pipeline.batch(start, end, version)
                times["grain"].append(time.perf_counter() - t)
        with WindowPipeline(tmp, spec, parse_threads=parse_threads) as pipeline:
            for k, (start, end, version) in enumerate(spans):
                t = time.perf_counter()
                pipeline.batch(start, end, version)
                if k + 1 < len(spans):
                    pipeline.prefetch(*spans[k + 1])
                times["grain+prefetch"].append(time.perf_counter() - t)
                time.sleep(step_ms / 1000)   # the device step (XLA releases the GIL)
    base = statistics.mean(times["batcher"][1:] or times["batcher"])
    rows = []
    for name, ts in times.items():
        steady = ts[1:] or ts   # the first window of a prefetching loop has nothing prefetched
        rows.append({"path": name, "ms_mean": 1e3 * statistics.mean(steady), "ms_median": 1e3 * statistics.median(steady),
                     "ratio_to_batcher": statistics.mean(steady) / base})
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in openclaw_like_samples(window))
    return {"window": window, "windows": windows, "step_ms": step_ms, "parse_threads": parse_threads,
            "tokens_per_window": tokens, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=int, default=64, help="samples per step (default 64)")
    ap.add_argument("--windows", type=int, default=8, help="steps to time (default 8; the first is not counted)")
    ap.add_argument("--step-ms", type=float, default=200.0, help="stand-in device step in ms (default 200)")
    ap.add_argument("--parse-threads", type=int, default=0, help="grain read threads for parsing (default 0)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args()
    out = run(args.window, args.windows, args.step_ms, args.parse_threads)
    if args.json:
        print(json.dumps(out))
        return
    print(f"window {out['window']} samples (~{out['tokens_per_window'] / out['window']:.0f} tokens each), "
          f"{out['windows']} steps (first not counted), stand-in device step {out['step_ms']:.0f} ms, "
          f"parse threads {out['parse_threads']}")
    print(f"{'path':16s} {'ms/step mean':>13s} {'median':>9s} {'x batcher':>10s}")
    for r in out["rows"]:
        print(f"{r['path']:16s} {r['ms_mean']:13.1f} {r['ms_median']:9.1f} {r['ratio_to_batcher']:10.2f}")


if __name__ == "__main__":
    main()
