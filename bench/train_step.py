"""Train-step throughput: the full hybrid step (old pass, teacher pass, chunked loss + AdamW)
for the tiny model or SmolLM2-135M, next to a plain PyTorch (HF transformers) SFT step --
forward, cross-entropy backward, AdamW -- on the same model and the same (unpadded) tokens, in
one process; plus a long-context case (one sample: a 2048-token prompt, a 256-token response and
3 hint candidates) where the teacher pass is compared with one student forward (the old pass)
over the same sample.

    python bench/train_step.py [--model tiny|smollm2] [--batch 4] [--prompt 128] [--response 128]
                               [--candidates 2] [--repeats 3] [--packing on|off] [--quantum 128]
                               [--shared-prefix on|off]
                               [--long-prompt 2048] [--long-response 256] [--long-candidates 3]
                               [--no-long | --only-long] [--peak-tflops X] [--json]
    python bench/train_step.py --openclaw [--model tiny|smollm2-shapes --layers N] [--batch 8]
                               [--oc-prompt 2500] [--oc-system 2300] [--oc-candidates 3] [--micro M]
                               [--kl-coef K] [--repeats 3] [--json]

`--openclaw` times OpenClaw-shaped steps instead (`--oc-prompt` 2500-token prompts whose first
`--oc-system` 2300 tokens are the same for every sample, 32-64-token responses, 1-3 hints per
sample, `--batch` samples), per phase, for four layouts of the same samples on one trainer in
interleaved rounds: `default` (as the trainer packs them: the batch's common prefix once per
packed row, the shared-prefix teacher or packed teacher rows, whichever has fewer slots),
`teacher_prefix_only` (each sample's candidates share their prompt; no batch prefix), `full`
(nothing shared) and `no_system_prompt` (the samples without their system prompt: the floor any
prefix sharing can approach), with per-round ratios to `full` (`oc_<layout>_over_full_<phase>`).

Times are medians over `--repeats` after one compile run. The long case runs its passes in
interleaved rounds (forward, teacher, other teacher layout) and reports the median of the per-round
teacher / forward ratios (`long_teacher_over_forward`), robust to a load that drifts between runs. Model FLOPs count real (unpadded)
tokens only: 6N per trained token (prompt+response), 2N per old-pass token and 2N per teacher
token per candidate (hint prompt + response); the SFT step is 6N per token.
`flop_rate_ratio` = (our model FLOPs / our step time) / (SFT FLOPs / SFT step time).
`padding_fraction` = padded / total token slots of the student and teacher inputs of the batch as
the trainer builds it; `padding_fraction_unpacked_pow2` is the same batch without packing and with
power-of-two buckets (the layout before packing). With `--json` one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import logging
import os
import statistics
import time

import jax
import numpy as np
from references import median_time  # bench/references.py, beside this script

log = logging.getLogger("bench.train_step")


def _samples(rng, vocab, batch, prompt, response, candidates):
    """Samples whose hint prompts are the prompt with 16·(c+1) hint tokens inserted before its last
    4 tokens (the hint goes at the end of the last user message, before the assistant header)."""
    from openclaw_jax.samples import Sample

    def ids(n):
        return [int(x) for x in rng.integers(1, vocab, n)]

    out = []
    for i in range(batch):
        p = ids(prompt)
        out.append(Sample(session_id="bench", turn_index=i, kind="opd+rl", reward=1.0 if i % 2 else -1.0,
                          prompt_ids=p, response_ids=ids(response), rollout_logprobs=[-1.0] * response,
                          hints=[f"hint {c} for the bench" for c in range(candidates)],
                          hint_prompt_ids=[p[:-4] + ids(16 * (c + 1)) + p[-4:] for c in range(candidates)]))
    return out


def _real_tokens(samples, spec):
    from openclaw_jax.trainer.batcher import teacher_prompts

    student = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    teacher = sum(len(p) + len(s.response_ids) for s in samples for p in teacher_prompts(s, spec))
    return student, teacher


def _long_context(trainer, vocab, args):
    """Median seconds of the teacher pass over `--long-candidates` candidates and of one student
    forward (the old pass) over the same single long sample."""
    import jax.numpy as jnp

    from openclaw_jax.trainer import step as S
    from openclaw_jax.trainer.batcher import pack

    sample = _samples(np.random.default_rng(1), vocab, 1, args.long_prompt, args.long_response,
                      args.long_candidates)
    spec = dataclasses.replace(trainer.train_step.spec, samples_per_step=1, max_candidates=args.long_candidates)
    out = {}
    state, settings = trainer.state, trainer.train_step.settings
    # the step's own phase functions, jitted with its settings, on this one sample alone
    old_pass = jax.jit(functools.partial(S.old_pass, settings=settings))
    teacher_pass = jax.jit(functools.partial(S.teacher_pass, settings=settings))
    with jax.set_mesh(trainer.train_step.mesh):
        packed = pack(sample, dataclasses.replace(spec, shared_prefix_teacher=False))
        inputs = S.StudentInputs(**{k: jnp.asarray(v) for k, v in packed.student.items()})
        holder = {}

        def forward():
            holder["old"] = jax.block_until_ready(old_pass(state.graphdef, state.student, inputs))

        forward()  # compile
        passes = {}
        # the teacher pass as configured first (the `long_teacher_pass_s` of the JSON), then the other layout
        for shared in (spec.shared_prefix_teacher, not spec.shared_prefix_teacher):
            layout = pack(sample, dataclasses.replace(spec, shared_prefix_teacher=shared))
            tinputs = S.TeacherInputs(**{k: jnp.asarray(v) for k, v in layout.teacher.items()})

            def teacher(tinputs=tinputs):
                jax.block_until_ready(teacher_pass(state.teacher_graphdef, state.teacher, tinputs, inputs.response_ids,
                                                   holder["old"].topk_ids))

            teacher()  # compile
            key = "long_teacher_pass_s" if shared == spec.shared_prefix_teacher else (
                "long_teacher_pass_shared_prefix_s" if shared else "long_teacher_pass_full_s")
            passes[key] = teacher
        # Interleaved rounds (forward, then each teacher layout): on a shared machine the load drifts
        # between runs, so the ratio is taken within each round and its median reported.
        times = {k: [] for k in ["long_forward_s", *passes]}
        for _ in range(args.repeats):
            for key, fn in [("long_forward_s", forward), *passes.items()]:
                start = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - start)
        out.update({k: statistics.median(v) for k, v in times.items()})
        out["long_teacher_over_forward_rounds"] = [t / f for t, f in zip(times["long_teacher_pass_s"],
                                                                          times["long_forward_s"])]
    out["long_teacher_over_forward"] = statistics.median(out["long_teacher_over_forward_rounds"])
    out["long_teacher_over_forward_of_medians"] = out["long_teacher_pass_s"] / out["long_forward_s"]
    out["long_shared_prefix"] = spec.shared_prefix_teacher
    return out


def _openclaw_samples(rng, vocab, args):
    """OpenClaw-shaped samples: one system prompt of `--oc-system` tokens common to every sample (OpenClaw
    sends the same one on every turn of every session), then `--oc-prompt - --oc-system` tokens of
    earlier turns and the user message of the sample's own; responses of 32-64 tokens; 1 to
    `--oc-candidates` hints of 16-40 tokens each, inserted before the prompt's last 3 tokens (the
    judge appends a hint to the last user message, before the assistant header)."""
    from openclaw_jax.samples import Sample

    def ids(n):
        return [int(x) for x in rng.integers(1, vocab, n)]

    system = ids(args.oc_system)
    out = []
    for i in range(args.batch):
        prompt = system + ids(args.oc_prompt - args.oc_system)
        r = int(rng.integers(32, 65))
        hints = [prompt[:-3] + ids(int(rng.integers(16, 41))) + prompt[-3:]
                 for _ in range(1 + i % args.oc_candidates)]
        out.append(Sample(session_id=f"oc{i % 3}", turn_index=i, kind="opd+rl", reward=1.0 if i % 2 else -1.0,
                          prompt_ids=prompt, response_ids=ids(r), rollout_logprobs=[-1.0] * r,
                          hints=[f"hint {c} for the bench" for c in range(len(hints))], hint_prompt_ids=hints))
    return out


def _openclaw_case(trainer, vocab, args):
    """Per-phase step times on OpenClaw-shaped samples, the teacher with and without the shared
    prefix in interleaved rounds (the same trainer, the same samples), and, as the bound on what a
    prefix shared across samples (the system prompt) could save, the step on the same samples with
    the system prompt cut off."""
    from openclaw_jax.trainer.batcher import pack

    samples = _openclaw_samples(np.random.default_rng(2), vocab, args)
    cut = [dataclasses.replace(s, prompt_ids=s.prompt_ids[args.oc_system:],
                               hint_prompt_ids=[h[args.oc_system:] for h in s.hint_prompt_ids]) for s in samples]
    spec = trainer.train_step.spec
    layouts = {"default": pack(samples, spec),   # as the trainer packs them (config defaults)
               "teacher_prefix_only": pack(samples, dataclasses.replace(spec, batch_prefix_min=0)),
               "full": pack(samples, dataclasses.replace(spec, shared_prefix_teacher=False, batch_prefix_min=0)),
               "no_system_prompt": pack(cut, dataclasses.replace(spec, batch_prefix_min=0))}
    phases = ["old_pass", "teacher_pass", "train_step"] + (["reference_pass"] if trainer.cfg.loss.kl_coef else [])
    times = {name: {k: [] for k in phases + ["step"]} for name in layouts}
    for name, packed in layouts.items():  # compile
        trainer.train_on(packed)
    for _ in range(args.repeats):   # interleaved: a load that drifts hits every layout alike
        for name, packed in layouts.items():
            m = trainer.train_on(packed)
            for k in phases + ["step"]:
                times[name][k].append(m.get(f"time/{k}", 0.0))   # no reference pass: folded into the teacher
    out = {"oc_samples": len(samples), "oc_prompt": args.oc_prompt, "oc_system": args.oc_system,
           "oc_candidates": [len(s.hint_prompt_ids) for s in samples],
           "oc_response": [len(s.response_ids) for s in samples],
           "oc_teacher_real_tokens": {k: p.real_tokens["teacher"] for k, p in layouts.items()},
           "oc_teacher_slots": {k: p.slots("teacher") for k, p in layouts.items()}}
    for name in layouts:
        for k, v in times[name].items():
            out[f"oc_{name}_{k}_s"] = statistics.median(v)
        out[f"oc_{name}_step_per_sample_s"] = out[f"oc_{name}_step_s"] / len(samples)
    out["oc_teacher_layout"] = {k: "per-sample rows" if "prefix_len" in p.teacher else "packed rows"
                                for k, p in layouts.items()}
    out["oc_student_shape"] = {k: list(p.student["input_ids"].shape) for k, p in layouts.items()}
    out["oc_teacher_shape"] = {k: list(p.teacher["input_ids"].shape) for k, p in layouts.items()}
    for name in ("default", "teacher_prefix_only", "no_system_prompt"):
        for k in phases + ["step"]:
            rounds = [a / b for a, b in zip(times[name][k], times["full"][k]) if b > 0]
            if rounds:
                out[f"oc_{name}_over_full_{k}"] = statistics.median(rounds)
    return out


def _torch_sft_step_s(mcfg, student, samples, repeats):
    """Median seconds of one PyTorch SFT step (fwd + CE bwd + AdamW) of the same weights as an HF
    model, on the samples' prompt+response tokens, unpadded (the bench's samples share one length)."""
    import torch
    import transformers

    from openclaw_jax.models.weights import state_dict_from_model

    hf_cfg = transformers.AutoConfig.for_model(**{k: v for k, v in mcfg.to_hf_dict().items()
                                                  if k not in ("architectures",)})
    hf_cfg.torch_dtype = "float32"
    torch_model = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager")
    state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in state_dict_from_model(student).items()}
    torch_model.load_state_dict(state, strict=False)
    torch_model.train()
    opt = torch.optim.AdamW(torch_model.parameters(), lr=1e-5)
    ids = torch.tensor([s.prompt_ids + s.response_ids for s in samples], dtype=torch.int64)

    def torch_step():
        opt.zero_grad()
        out = torch_model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()

    torch_step()
    return median_time(torch_step, repeats)


def bench_model(name, args):
    from flax import nnx

    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.models.config import ModelConfig
    from openclaw_jax.models.decoder import Decoder
    from openclaw_jax.parallel.mesh import make_mesh, shard_model
    from openclaw_jax.trainer.batcher import pack
    from openclaw_jax.trainer.loop import Trainer

    if name == "tiny":
        mcfg = ModelConfig(family="qwen3", vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True)
        student = Decoder(mcfg, rngs=nnx.Rngs(0))
    elif name == "smollm2-shapes":  # SmolLM2-135M's widths and vocabulary, random weights, --layers of its 30
        mcfg = ModelConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                           num_layers=args.layers, num_heads=9, num_kv_heads=3, head_dim=64, tie_word_embeddings=True,
                           rope_theta=100000.0, rms_norm_eps=1e-5)
        student = Decoder(mcfg, rngs=nnx.Rngs(0))
    else:
        from openclaw_jax.models.hub import load_pretrained

        student = load_pretrained("smollm2").model
        mcfg = student.cfg
    samples = _samples(np.random.default_rng(0), mcfg.vocab_size, args.batch, args.prompt, args.response,
                       args.candidates)
    # PyTorch reference first, freed before the JAX trainer is built (peak memory of one, not both)
    t_torch = None if args.only_long or args.openclaw else _torch_sft_step_s(mcfg, student, samples, args.repeats)
    gc.collect()
    teacher_graph, teacher_state = nnx.split(student)
    teacher = nnx.merge(teacher_graph, jax.tree.map(lambda x: x.copy(), teacher_state))
    mesh = make_mesh((1, -1, 1))
    cfg = load_experiment_config([], [f"trainer.samples_per_step={args.batch}", "loss.top_k=4",
                                      "trainer.chunk_size=64", f"gateway.max_candidates={args.candidates}",
                                      "trainer.min_seq_bucket=64", "trainer.min_response_bucket=32",
                                      f"trainer.packing={args.packing == 'on'}",
                                      f"trainer.bucket_quantum={args.quantum}",
                                      # the OpenClaw case packs each layout itself, from the defaults
                                      f"trainer.shared_prefix_teacher={args.shared_prefix == 'on' or args.openclaw}",
                                      f"trainer.micro_batch_size={args.micro}", f"loss.kl_coef={args.kl_coef}",
                                      f"trainer.max_seq_len={max(4096, args.oc_prompt + 256)}"])
    trainer = Trainer(cfg, shard_model(student, mesh), shard_model(teacher, mesh), mesh, samples=cfg.sample_spec())
    if args.openclaw:
        return {"model": name, "layers": mcfg.num_layers, "params_M": sum(
            int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.state.trainable)) / 1e6, "batch": args.batch,
            "micro_batch_size": args.micro, "kl_coef": args.kl_coef, **_openclaw_case(trainer, mcfg.vocab_size, args)}
    if args.only_long:
        return {"model": name, "shared_prefix_teacher": args.shared_prefix == "on", **_long_context(
            trainer, mcfg.vocab_size, args)}
    packed = pack(samples, trainer.train_step.spec)
    before = pack(samples, dataclasses.replace(trainer.train_step.spec, packing=False, bucket_quantum=0))
    student_tokens, teacher_tokens = _real_tokens(samples, trainer.train_step.spec)
    trainer.train_on(packed)  # compile
    phases = []

    def jax_step():
        phases.append(trainer.train_on(packed))

    t_jax = median_time(jax_step, args.repeats)
    split = {k: statistics.median(p[f"time/{k}"] for p in phases) for k in ("old_pass", "teacher_pass", "train_step")}

    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(trainer.state.trainable))
    our_flops = n_params * (6 * student_tokens + 2 * student_tokens + 2 * teacher_tokens)
    sft_flops = 6 * n_params * student_tokens
    row = {"model": name, "params_M": n_params / 1e6, "candidates": args.candidates, "batch": args.batch,
           "packing": args.packing == "on", "bucket_quantum": args.quantum,
           "shared_prefix_teacher": args.shared_prefix == "on",
           "student_tokens": student_tokens, "teacher_tokens": teacher_tokens,
           "step_s": t_jax, "sft_step_s": t_torch, "old_pass_s": split["old_pass"],
           "teacher_pass_s": split["teacher_pass"], "train_s": split["train_step"],
           "tokens_per_s": student_tokens / t_jax, "sft_tokens_per_s": student_tokens / t_torch,
           "flop_rate_ratio": (our_flops / t_jax) / (sft_flops / t_torch),
           "padding_fraction": packed.padding_fraction(),
           "padding_fraction_unpacked_pow2": before.padding_fraction(),
           "student_shape": list(packed.student["input_ids"].shape),
           "teacher_shape": list(packed.teacher["input_ids"].shape)}
    if args.peak_tflops:
        row["mfu"] = our_flops / t_jax / (args.peak_tflops * 1e12)
    if args.long:
        row.update(_long_context(trainer, mcfg.vocab_size, args))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2", "smollm2-shapes"], default="smollm2")
    parser.add_argument("--layers", type=int, default=30, help="smollm2-shapes: decoder layers (SmolLM2-135M has 30)")
    parser.add_argument("--openclaw", action="store_true",
                        help="the OpenClaw-shaped case only: per-phase times, shared prefix vs not (module doc)")
    parser.add_argument("--oc-prompt", type=int, default=2500, help="OpenClaw case: prompt tokens per sample")
    parser.add_argument("--oc-system", type=int, default=2300, help="OpenClaw case: system prompt tokens (all samples)")
    parser.add_argument("--oc-candidates", type=int, default=3, help="OpenClaw case: sample i has 1 + i mod N hints")
    parser.add_argument("--micro", type=int, default=0, help="trainer.micro_batch_size")
    parser.add_argument("--kl-coef", type=float, default=0.0, help="loss.kl_coef (non-zero: the reference pass runs)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--packing", choices=["on", "off"], default="on")
    parser.add_argument("--quantum", type=int, default=128, help="trainer.bucket_quantum (0: power-of-two buckets)")
    parser.add_argument("--shared-prefix", choices=["on", "off"], default="off",
                        help="trainer.shared_prefix_teacher (the long case times both teacher layouts anyway)")
    parser.add_argument("--long-prompt", type=int, default=2048)
    parser.add_argument("--long-response", type=int, default=256)
    parser.add_argument("--long-candidates", type=int, default=3)
    parser.add_argument("--no-long", dest="long", action="store_false", help="skip the long-context case")
    parser.add_argument("--only-long", action="store_true", help="only the long-context case (no step, no SFT)")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.openclaw:
        args.candidates = args.oc_candidates   # gateway.max_candidates
    row = bench_model(args.model, args)
    row["device"] = f"{jax.devices()[0].device_kind} x{len(jax.devices())}"
    row["load_average"] = list(os.getloadavg())
    row["repeats"] = args.repeats
    if args.json:
        print(json.dumps(row))
        return
    if args.openclaw:
        print(f"device: {row['device']} (a machine shared with other engineers; load average "
              f"{row['load_average']}); OpenClaw-shaped: {args.batch} samples of {args.oc_prompt}-token prompts "
              f"({args.oc_system} shared), median of {args.repeats}")
        for key, value in row.items():
            print(f"  {key:>40}: {value:.4g}" if isinstance(value, float) else f"  {key:>40}: {value}")
        return
    print(f"device: {row['device']}; batch {args.batch} x ({args.prompt}+{args.response}) tokens, {args.candidates} "
          f"teacher candidates, packing {args.packing}, bucket quantum {args.quantum}, median of {args.repeats}; "
          f"load average {row['load_average']}")
    for key, value in row.items():
        print(f"  {key:>32}: {value:.4g}" if isinstance(value, float) else f"  {key:>32}: {value}")


if __name__ == "__main__":
    main()
