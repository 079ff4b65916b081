"""Decode throughput: our JAX engine vs HF transformers `generate` (PyTorch CPU) on SmolLM2-135M.

Both use the same dequantised float32 weights (the packaged GGUF via `load_pretrained("smollm2")`;
the PyTorch model is built from that same state dict) and the same chat-templated prompts, in one
process, greedy, exactly N new tokens (EOS ignored). Compilation and warm-up are excluded; each
number is the median of the timed repeats.

  * end-to-end tokens/s = batch * N / time(generate N tokens)   (prefill included)
  * decode tokens/s     = batch * (N - 1) / (time(N tokens) - time(1 token))   (prefill cancels out)

    python bench/decode.py [--new-tokens 64] [--repeats 3] [--batches 1 16]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

import numpy as np

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
]


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    n_new = args.new_tokens
    if n_new < 2:
        raise SystemExit("--new-tokens must be >= 2 (decode rate uses the N-token and 1-token runs)")

    import jax
    import torch
    import transformers

    from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
    from openclaw_jax.models.gguf import gguf_to_hf, smollm2_gguf_path
    from openclaw_jax.models.hub import load_pretrained

    pre = load_pretrained("smollm2", dtype="float32")
    tok = pre.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in QUESTIONS]
    max_batch = max(args.batches)
    if max_batch > len(prompts):
        raise SystemExit(f"at most {len(prompts)} prompts are defined; --batches {max_batch} is too large")

    # --- ours
    engine = Engine(pre.model, tok, context_length=pre.config.max_position_embeddings,
                    config=EngineConfig(max_batch_size=max_batch, min_prompt_bucket=16, min_cache_bucket=64,
                                        batch_wait_s=0.0))

    def ours(batch: int, n: int):
        specs = [spec_for(p, max_new_tokens=n, temperature=0, ignore_eos=True) for p in prompts[:batch]]
        return engine.generate_sync(specs)

    # --- transformers: same dequantised weights, eager PyTorch on CPU, left-padded batches
    hf_config, hf_state = gguf_to_hf(smollm2_gguf_path())
    config = transformers.AutoConfig.for_model(**{k: v for k, v in hf_config.items() if k != "architectures"})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in hf_state.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
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

    rows = []
    agreement = None
    for batch in args.batches:
        ours(batch, n_new), ours(batch, 1)  # compile + warm-up
        theirs(batch, 2)
        t_ours_n = median_time(lambda: ours(batch, n_new), args.repeats)
        t_ours_1 = median_time(lambda: ours(batch, 1), args.repeats)
        t_hf_n = median_time(lambda: theirs(batch, n_new), args.repeats)
        t_hf_1 = median_time(lambda: theirs(batch, 1), args.repeats)
        if batch == 1:
            a = ours(1, n_new)[0].output_ids
            b = theirs(1, n_new)[0].tolist()
            agreement = sum(x == y for x, y in zip(a, b)) / n_new
        rows.append(dict(batch=batch,
                         ours_e2e=batch * n_new / t_ours_n, hf_e2e=batch * n_new / t_hf_n,
                         ours_dec=batch * (n_new - 1) / max(t_ours_n - t_ours_1, 1e-9),
                         hf_dec=batch * (n_new - 1) / max(t_hf_n - t_hf_1, 1e-9)))
    engine.shutdown()

    print(f"\nSmolLM2-135M-Instruct greedy generation, float32, {n_new} new tokens per sequence, "
          f"{jax.devices()[0].platform} ({os.cpu_count()} cores, torch threads {torch.get_num_threads()}), "
          f"median of {args.repeats}")
    print(f"{'batch':>5} | {'decode tok/s ours':>17} {'transformers':>12} {'ratio':>6} | "
          f"{'end-to-end tok/s ours':>21} {'transformers':>12} {'ratio':>6}")
    for r in rows:
        print(f"{r['batch']:>5} | {r['ours_dec']:>17.1f} {r['hf_dec']:>12.1f} {r['ours_dec'] / r['hf_dec']:>5.2f}x | "
              f"{r['ours_e2e']:>21.1f} {r['hf_e2e']:>12.1f} {r['ours_e2e'] / r['hf_e2e']:>5.2f}x")
    if agreement is not None:
        print(f"greedy token agreement with transformers at batch 1: {agreement:.0%} of {n_new} tokens")
    print(f"(transformers {transformers.__version__}, torch {torch.__version__}, jax {jax.__version__})")


if __name__ == "__main__":
    main()
