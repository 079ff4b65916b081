"""A warm turn's prefill: the new tokens of a prompt whose prefix is cached ("extend"), ours against transformers.

Every turn of a session after the first re-sends the whole conversation; the prefix cache holds what came
before, so the turn's prefill computes only its new message, attending over the cached prefix. This times
that step for a prefix of P tokens and N new ones (both cut from OpenClaw's recorded system prompt, as
`bench/prefill.py`), SmolLM2-135M in float32, the implementations timed in turn (medians of --repeats):

  * ours: the engine's own steps, the prefix's blocks gathered from a block pool into a call's cache
    (`kernels.gather_prefix_jit`) and the extend prefill (`kernels.extend_jit`: new tokens' K/V written, first
    token sampled); its attention reads the cached prefix as leading key blocks of `causal_forward_attention`;
  * ours, blockwise: the same gather and layers with the attention of the segmented path (one segment):
    the blockwise kernel over [cached keys; new keys] with the cache slots masked, which every extend ran
    before; first token from its last hidden state;
  * transformers: one forward of the N tokens over a `DynamicCache` of the prefix (cropped back to P after
    each call), `logits_to_keep=1`, PyTorch's default threads.

Reported: new tokens per second of each, and ours over each other side; the first greedy token of the three
and the largest difference of our last-position log-probs from transformers'.

    python bench/extend.py [--prefixes 2048 4096] [--new 16 128 512] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import numpy as np
from prefill import prompts
from references import interleaved_medians, isa_report, transformers_model

logger = logging.getLogger("bench.extend")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, nargs="+", default=[2048, 4096],
                        help="cached prefix lengths in tokens (whole 64-token blocks)")
    parser.add_argument("--new", type=int, nargs="+", default=[16, 128, 512], help="new tokens per call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if min(args.prefixes) < 64 or any(p % 64 for p in args.prefixes) or min(args.new) < 1 or args.repeats < 1:
        raise SystemExit("--prefixes must be multiples of 64, --new >= 1, --repeats >= 1")

    import torch

    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    hf, _ = transformers_model("float32")
    results = []
    for prefix_len in args.prefixes:
        for new in args.new:
            ids = prompts(pre.tokenizer, 1, prefix_len + new)[0]
            sides = _sides(pre, hf, torch, ids, prefix_len)
            for fn in sides.values():  # compile, warm up
                fn()
            seconds = interleaved_medians(sides, args.repeats)
            firsts = {name: int(fn()[0]) for name, fn in sides.items()}
            lp_diff = float(np.max(np.abs(sides["ours"]()[1] - sides["transformers"]()[1])))
            row = {"prefix": prefix_len, "new": new, "seconds": seconds,
                   "tok_s": {name: new / s for name, s in seconds.items()},
                   "first_tokens": firsts, "max_abs_logprob_diff": lp_diff}
            results.append(row)
            logger.info("prefix %d + %d new: %s", prefix_len, new,
                        ", ".join(f"{k} {v:.3f} s" for k, v in seconds.items()))
    load = os.getloadavg()
    isa = isa_report()
    print(f"\nExtend prefill over a cached prefix, SmolLM2-135M float32, medians of {args.repeats}; {isa['cpu']}, "
          f"XLA ISA {isa['xla_isa']}, ATen {isa['torch_isa']}; {os.cpu_count()} cores; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("prefix |  new | ours tok/s | blockwise tok/s | HF tok/s | ours/blockwise | ours/HF | first tokens | "
          "max |dlogp| vs HF")
    for r in results:
        t = r["tok_s"]
        same = "same" if len(set(r["first_tokens"].values())) == 1 else f"differ {r['first_tokens']}"
        print(f"{r['prefix']:>6} | {r['new']:>4} | {t['ours']:>10.1f} | {t['ours_blockwise']:>15.1f} | "
              f"{t['transformers']:>8.1f} | {t['ours'] / t['ours_blockwise']:>13.2f}x | "
              f"{t['ours'] / t['transformers']:>6.2f}x | {same} | {r['max_abs_logprob_diff']:.1e}")
    if args.json:
        print(json.dumps({"isa": isa, "repeats": args.repeats, "results": results}))


def _sides(pre, hf, torch, ids: list[int], prefix_len: int) -> dict:
    """name -> a call that runs one extend of ids[prefix_len:] over the cached ids[:prefix_len] and returns
    (its greedy first token, last-position log-probs as float64 NumPy)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from transformers import DynamicCache

    from openclaw_jax.inference import kernels
    from openclaw_jax.inference.scheduler import EngineConfig, extend_bucket

    model = pre.model
    graphdef, state = nnx.split(model)
    new = len(ids) - prefix_len
    config = EngineConfig(min_prompt_bucket=512)  # the live config's prompt floor
    ln = extend_bucket(new, config)
    block = config.prefix_cache_block
    if prefix_len % block:
        raise SystemExit(f"--prefixes {prefix_len}: the prefix cache holds whole {block}-token blocks")
    # the prefix's K/V as a block pool [layers, blocks, block, K, D], from one cold prefill
    lengths = np.array([prefix_len], np.int32)
    sampling = (np.zeros(1, np.float32), np.ones(1, np.float32), np.zeros(1, np.int32), np.zeros(1, np.float32),
                jax.random.split(jax.random.key(0), 1), np.zeros((1, 0), np.int32))
    cold = kernels.prefill_jit(graphdef, state, np.array([ids[:prefix_len]], np.int32), lengths, *sampling,
                               n_top=0, k_ids=0, want_input=False)["cache"]
    pool = jax.tree.map(lambda x: x[:, 0, :prefix_len].reshape(x.shape[0], prefix_len // block, block,
                                                               *x.shape[3:]), cold)
    tables = np.arange(prefix_len // block, dtype=np.int32)[None, :]
    new_ids = np.zeros((1, ln), np.int32)
    new_ids[0, :new] = ids[prefix_len:]
    starts, new_lengths = np.array([prefix_len], np.int32), np.array([new], np.int32)
    positions = starts[:, None] + np.arange(ln, dtype=np.int32)[None, :]

    def ours():
        cache = kernels.gather_prefix_jit(pool, tables, ln)
        out = kernels.extend_jit(graphdef, state, cache, new_ids, starts, new_lengths, *sampling, n_top=0, k_ids=0,
                                 want_input=False)
        return int(out["tokens"][0]), our_logprobs

    def last_logprobs(segment_ids):
        @jax.jit
        def run(state, cache):
            m = nnx.merge(graphdef, state)
            hidden, _ = m.decode_hidden(jnp.asarray(new_ids), jnp.asarray(positions), cache, segment_ids)
            return jax.nn.log_softmax(m.logits(hidden[0, new - 1]).astype(jnp.float32))
        return lambda: np.asarray(run(state, kernels.gather_prefix_jit(pool, tables, ln)), np.float64)

    # the extend's own attention (no segments), for the log-prob comparison; the blockwise side is timed
    our_logprobs = last_logprobs(None)()
    blockwise_logprobs = last_logprobs(jnp.ones((1, ln), jnp.int32))

    def ours_blockwise():
        lp = blockwise_logprobs()
        return int(lp.argmax()), lp

    with torch.inference_mode():
        hf_cache = DynamicCache()
        hf(torch.tensor([ids[:prefix_len]]), past_key_values=hf_cache, use_cache=True, logits_to_keep=1)
    hf_new = torch.tensor([ids[prefix_len:]])

    def transformers():
        with torch.inference_mode():
            logits = hf(hf_new, past_key_values=hf_cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            hf_cache.crop(-len(ids[prefix_len:]))  # back to the prefix (this version takes the tokens to drop)
        lp = torch.log_softmax(logits.double(), -1).numpy()
        return int(lp.argmax()), lp

    return {"ours": ours, "ours_blockwise": ours_blockwise, "transformers": transformers}


if __name__ == "__main__":
    main()
