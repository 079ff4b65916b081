"""`python -m openclaw_jax.plan --config configs/<x>.yaml [key=value ...] --devices N [--json] [--prompt-len P ...]`

Ahead-of-time memory and FLOP plan of one trainer step, from a model's `config.json` alone (no
weights, no tokenizer). The trainer's own step (`trainer.train_step.make_train_step`: the same
jitted phases the trainer runs, in the same order, through `TrainStep.compile`) is lowered with
abstract, sharded arguments (`jax.ShapeDtypeStruct`) at the largest bucket (`trainer.max_seq_len`)
and compiled for N simulated CPU devices, as the config sets them up (mesh, dtypes, remat,
micro-batches, attention). Per device and phase it reports XLA's argument, output and temporary bytes and the
phase's peak: everything the trainer holds at that point (student master params, optimizer
state, the teacher, the batch, earlier phases' outputs) plus the phase's outputs and temporaries
(minus donated buffers). FLOPs are the matmul FLOPs of the compiled per-device programs, loops
counted by their trip counts (XLA's own cost analysis counts a loop body once).

`--prompt-len P [--shared-len S] [--response-len R] [--hint-len H]` plans OpenClaw-shaped samples
instead (e.g. P = 10534, OpenClaw's default-profile prompt, or about 2500 with its minimal profile;
replies of tens of tokens): the batch `pack` makes from `samples_per_step` samples of those
lengths, each with `max_candidates` hint prompts, so the phases are those the trainer compiles for
them, the shared-prefix teacher layout included when it applies.

The CPU compiler stands in for the GPU one: buffer sizes are those of the partitioned program,
but fusion and scheduling differ, so treat the peak as an estimate with the headroom the
`--device-memory` default leaves (80 GiB per device, the plan must stay under it).

The model's config.json is found at `--model-config` (a file or directory), else in
`model.path`, else in `configs/models/<basename of model.path, lower case>/` (shipped for
Qwen3-4B and Qwen3-8B).

`trainer.personalize=per_person` (with `model.lora`) plans the per-person trainer and its serving: the step
as it runs for one person (the base frozen, one person's adapter and optimizer state trained, no weight
sync), with `--people N` people's adapters and optimizer states resident on the trainer's devices; what one
person's adapter costs (params, optimizer state, checkpoint and adapter file bytes) and how many people
fit; and the engine's adapter slots (`policy.lora_slots`) beside its weights and KV cache: how many fit on
a device of `--serving-memory` (default `--device-memory`), and beside the trainer's peak on its first
device, where the embedded engine runs.

Parts: `cli.py` (the command), `build.py` (the abstract state, the batch, the compiled phases and their
report), `people.py` (the per-person plan), `hlo.py` (FLOPs), `table.py` (the human table). JAX, and the
package modules that import it, are imported inside the functions: `main` first sets XLA_FLAGS (the
simulated device count) and JAX_PLATFORMS, which JAX reads once, when it starts.
"""
