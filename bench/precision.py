"""How much bfloat16 changes greedy answers: ours and HF transformers, each against itself in float32.

The packaged SmolLM2-135M-Instruct, `bench/decode.py`'s chat-templated questions, N greedy tokens per question
(EOS ignored). Ours: the embedded engine with `model.dtype = param_dtype = bfloat16` (matmuls with float32
accumulation, bfloat16 K/V cache, float32 norms, softmax and sampler) against the same engine in float32.
Transformers: the same state dict in `torch.bfloat16` against `torch.float32`, one question at a time (no
padding). For scale, ours against transformers with both in float32.

Greedy text drifts apart at the first near-tie that a change of rounding flips, so each comparison reports the
rows whose N tokens are identical and the mean number of tokens before the first difference.

    python bench/precision.py [--new-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging

import numpy as np
from decode import QUESTIONS
from references import transformers_model

logger = logging.getLogger("bench.precision")


def agreement(a: list[list[int]], b: list[list[int]], n: int) -> dict[str, float]:
    """Rows with identical tokens, and the mean index of the first difference (n when none)."""
    firsts = [next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), n) for r, s in zip(a, b)]
    return {"identical_rows": sum(f == n for f in firsts), "rows": len(firsts),
            "mean_tokens_before_difference": round(float(np.mean(firsts)), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    n = args.new_tokens

    import torch

    from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
    from openclaw_jax.models.hub import load_pretrained

    outputs: dict[tuple[str, str], list[list[int]]] = {}
    for dtype in ("float32", "bfloat16"):
        pre = load_pretrained("smollm2", dtype=dtype, param_dtype=dtype)
        prompts = [pre.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
                   for q in QUESTIONS]
        engine = Engine(pre.model, pre.tokenizer, context_length=pre.config.max_position_embeddings,
                        config=EngineConfig(max_batch_size=16, batch_wait_s=0.0))
        try:
            specs = [spec_for(p, max_new_tokens=n, temperature=0, ignore_eos=True) for p in prompts]
            done = engine.generate_sync(specs)
        finally:
            engine.shutdown()
        outputs[("ours", dtype)] = [list(o.output_ids) for o in done]
        model, hf_config = transformers_model(dtype)
        pad = int(hf_config.get("pad_token_id", 2))
        rows = []
        for p in prompts:
            with torch.inference_mode():
                # the mask given: without it `generate` takes every pad id for padding, and SmolLM2's pad id is
                # <|im_end|>, which ends each turn inside the chat-templated prompt
                mask = torch.ones(1, len(p), dtype=torch.long)
                out = model.generate(input_ids=torch.tensor([p]), attention_mask=mask, max_new_tokens=n,
                                     do_sample=False, eos_token_id=None, pad_token_id=pad)
            rows.append(out[0, len(p):].tolist())
        outputs[("transformers", dtype)] = rows
        logger.warning("%s done", dtype)

    results = {
        "ours bfloat16 vs ours float32": agreement(outputs[("ours", "float32")], outputs[("ours", "bfloat16")], n),
        "transformers bfloat16 vs transformers float32": agreement(outputs[("transformers", "float32")],
                                                                   outputs[("transformers", "bfloat16")], n),
        "ours float32 vs transformers float32": agreement(outputs[("ours", "float32")],
                                                          outputs[("transformers", "float32")], n),
    }
    print(f"\nSmolLM2-135M-Instruct, {len(QUESTIONS)} questions, {n} greedy tokens each")
    for name, r in results.items():
        print(f"{name:>46}: {r['identical_rows']:>2} of {r['rows']} rows identical, "
              f"{r['mean_tokens_before_difference']:.1f} tokens before the first difference on average")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
