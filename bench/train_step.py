"""Train-step throughput: the full hybrid step (old pass, teacher pass, chunked loss + AdamW)
for the tiny model and SmolLM2-135M, next to a plain PyTorch (HF transformers) SFT step —
forward, cross-entropy backward, AdamW — on the same model and tokens, in one process.

    python bench/train_step.py [--model tiny|smollm2|both] [--batch 4] [--prompt 128] [--response 128]
                               [--candidates 2] [--repeats 5] [--peak-tflops X]

Tokens/s counts prompt+response tokens of the student batch. MFU is printed when
`--peak-tflops` is given (e.g. 989 for an H100's dense bf16): model FLOPs = 6·N·tokens for the
trained pass + 2·N·tokens for the old pass + 2·N·tokens·C for the teacher pass.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import jax
import numpy as np

log = logging.getLogger("bench.train_step")


def _samples(rng, vocab, batch, prompt, response, candidates):
    from openclaw_jax.samples import Sample

    def ids(n):
        return [int(x) for x in rng.integers(1, vocab, n)]

    return [Sample(session_id="bench", turn_index=i, kind="opd+rl", reward=1.0 if i % 2 else -1.0,
                   prompt_ids=ids(prompt), response_ids=ids(response), rollout_logprobs=[-1.0] * response,
                   hints=[f"hint {c} for the bench" for c in range(candidates)],
                   hint_prompt_ids=[ids(prompt + 16 * (c + 1)) for c in range(candidates)])
            for i in range(batch)]


def _time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_model(name, args):
    import torch
    import transformers
    from flax import nnx

    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.models.config import ModelConfig
    from openclaw_jax.models.decoder import Decoder
    from openclaw_jax.models.weights import state_dict_from_model
    from openclaw_jax.parallel.mesh import make_mesh, shard_model
    from openclaw_jax.trainer.batcher import pack
    from openclaw_jax.trainer.loop import Trainer

    if name == "tiny":
        mcfg = ModelConfig(family="qwen3", vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True)
        student = Decoder(mcfg, rngs=nnx.Rngs(0))
    else:
        from openclaw_jax.models.hub import load_pretrained

        student = load_pretrained("smollm2").model
        mcfg = student.cfg
    teacher_graph, teacher_state = nnx.split(student)
    teacher = nnx.merge(teacher_graph, jax.tree.map(lambda x: x.copy(), teacher_state))
    mesh = make_mesh((1, -1, 1))
    cfg = load_experiment_config([], [f"trainer.rollout_batch_size={args.batch}", "trainer.top_k=4",
                                      "trainer.chunk_size=64", f"gateway.max_candidates={args.candidates}",
                                      "trainer.min_seq_bucket=64", "trainer.min_response_bucket=32",
                                      "trainer.max_seq_len=4096"])
    samples = _samples(np.random.default_rng(0), mcfg.vocab_size, args.batch, args.prompt, args.response,
                       args.candidates)
    trainer = Trainer(cfg, shard_model(student, mesh), shard_model(teacher, mesh), mesh)
    packed = pack(samples, trainer.spec)
    tokens = args.batch * (args.prompt + args.response)
    trainer.train_on(packed)  # compile
    phases = []

    def jax_step():
        phases.append(trainer.train_on(packed))

    t_jax = _time(jax_step, args.repeats)
    split = {k: statistics.median(p[f"time/{k}"] for p in phases) for k in ("old_pass", "teacher_pass", "train_step")}

    # PyTorch reference: the same weights as an HF model, one SFT step (fwd + CE bwd + AdamW).
    hf_cfg = transformers.AutoConfig.for_model(**{k: v for k, v in mcfg.to_hf_dict().items()
                                                  if k not in ("architectures",)})
    hf_cfg.torch_dtype = "float32"
    torch_model = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager")
    state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in state_dict_from_model(trainer.serving_model()).items()}
    torch_model.load_state_dict(state, strict=False)
    torch_model.train()
    opt = torch.optim.AdamW(torch_model.parameters(), lr=1e-5)
    ids = torch.from_numpy(packed.student["input_ids"].astype(np.int64))

    def torch_step():
        opt.zero_grad()
        out = torch_model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()

    torch_step()
    t_torch = _time(torch_step, args.repeats)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.trainable))
    row = {"model": name, "params_M": n_params / 1e6, "tokens": tokens, "jax_step_s": t_jax,
           "jax_tok_s": tokens / t_jax, "torch_sft_step_s": t_torch, "torch_tok_s": tokens / t_torch,
           "ratio": (tokens / t_jax) / (tokens / t_torch), **{f"{k}_s": v for k, v in split.items()}}
    if args.peak_tflops:
        flops = (6 + 2 + 2 * args.candidates) * n_params * tokens
        row["mfu"] = flops / t_jax / (args.peak_tflops * 1e12)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2", "both"], default="both")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    names = ["tiny", "smollm2"] if args.model == "both" else [args.model]
    rows = [bench_model(n, args) for n in names]
    print(f"device: {jax.devices()[0].device_kind} x{len(jax.devices())}; batch {args.batch} x "
          f"({args.prompt}+{args.response}) tokens, {args.candidates} teacher candidates, median of {args.repeats}")
    header = ["model", "params_M", "jax_tok_s", "torch_tok_s", "ratio", "jax_step_s", "old_pass_s",
              "teacher_pass_s", "train_step_s", "torch_sft_step_s"] + (["mfu"] if args.peak_tflops else [])
    print(" | ".join(f"{h:>14}" for h in header))
    for row in rows:
        print(" | ".join(f"{row[h]:>14.4g}" if isinstance(row[h], float) else f"{row[h]:>14}" for h in header))
    print("ratio = our full hybrid step (3 phases) tokens/s over a PyTorch SFT step's tokens/s "
          "(ours also runs the old pass and the teacher over every candidate).")


if __name__ == "__main__":
    main()
