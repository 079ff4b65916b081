"""Forward-pass throughput: our JAX decoder vs HF transformers (PyTorch CPU) on SmolLM2-135M.

Both run the same dequantised float32 weights (the packaged GGUF via `load_pretrained("smollm2")`;
the PyTorch model is built from that same state dict), on the same token batch, in one process.
Warm-up (and JIT compilation) is excluded; the table reports the median of the timed repeats.

    python bench/forward.py [--batch 4] [--seq 128] [--repeats 10] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

logger = logging.getLogger("bench.forward")


def time_calls(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own choice, the core count)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch
    import transformers

    from openclaw_jax.models.gguf import gguf_to_hf, smollm2_gguf_path
    from openclaw_jax.models.hub import load_pretrained

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    pre = load_pretrained("smollm2", dtype="float32")
    cfg = pre.config
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)

    # --- ours: jit(forward) on the default JAX device
    graphdef, state = nnx.split(pre.model)

    @jax.jit
    def forward(state, ids):
        return nnx.merge(graphdef, state)(ids)

    ids = jnp.asarray(tokens)
    t0 = time.perf_counter()
    ours_logits = np.asarray(forward(state, ids))
    compile_s = time.perf_counter() - t0
    for _ in range(args.warmup):
        forward(state, ids).block_until_ready()
    jax_times = time_calls(lambda: forward(state, ids).block_until_ready(), args.repeats)

    # --- transformers: same dequantised weights, eager PyTorch on CPU
    hf_config, hf_state = gguf_to_hf(smollm2_gguf_path())
    config = transformers.AutoConfig.for_model(**{k: v for k, v in hf_config.items() if k != "architectures"})
    torch_model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in hf_state.items()},
                                                      strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    torch_model.tie_weights()
    torch_ids = torch.from_numpy(tokens.astype(np.int64))
    with torch.inference_mode():
        torch_logits = torch_model(torch_ids).logits.numpy()
        for _ in range(args.warmup):
            torch_model(torch_ids)
        torch_times = time_calls(lambda: torch_model(torch_ids), args.repeats)

    max_diff = float(np.abs(ours_logits - torch_logits).max())
    n_tokens = args.batch * args.seq
    jax_s, torch_s = statistics.median(jax_times), statistics.median(torch_times)
    rows = [("openclaw_jax (jax.jit)", jax_s), (f"transformers {transformers.__version__} (torch)", torch_s)]
    device = jax.devices()[0]
    print(f"\nSmolLM2-135M-Instruct forward, float32, batch {args.batch} x {args.seq} = {n_tokens} tokens, "
          f"{device.platform} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()}), "
          f"median of {args.repeats}")
    print(f"{'implementation':<36} {'ms/forward':>11} {'tokens/s':>10}")
    for name, seconds in rows:
        print(f"{name:<36} {1000 * seconds:>11.1f} {n_tokens / seconds:>10.0f}")
    print(f"ratio jax/torch tokens/s: {torch_s / jax_s:.2f}x   (jit compile {compile_s:.1f}s excluded; "
          f"max |logits diff| {max_diff:.2e})")


if __name__ == "__main__":
    main()
