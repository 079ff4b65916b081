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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from openclaw_jax.configlib import ConfigError
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.samples import Sample

# JAX, and the package modules that import it, are imported inside the functions below: `main` first
# sets XLA_FLAGS (the simulated device count) and JAX_PLATFORMS, which JAX reads once, when it starts.

_REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "models"
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4}
PHASES = ("old_pass", "teacher_pass", "old_logprobs_at", "train_step")


def parse_bytes(text: str) -> int:
    """'80GiB', '80 GB', '1.5e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 80GiB, 40GB or 1e9")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def find_model_config(model_path: str, explicit: str | None = None) -> Path:
    """The config.json that describes `model_path` (see the module docstring for the search order)."""
    tried = []
    candidates = [Path(explicit)] if explicit else []
    candidates += [Path(model_path), _REPO_CONFIGS / Path(model_path).name.lower()]
    for c in candidates:
        path = c / "config.json" if c.suffix != ".json" else c
        tried.append(str(path))
        if path.is_file():
            return path
    raise FileNotFoundError(f"no config.json for model.path={model_path!r}; tried {tried}. Pass --model-config "
                            f"(an HF config.json or its directory)")


# ----------------------------------------------------------------------------- FLOPs from HLO

_COMP_RE = re.compile(r"^(?:ENTRY\s+)?%(\S+)\s+\((.*)\)\s+->\s+.*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s+=\s+(\(.*?\)|\S+?)(?:\{[^}]*\})?\s+([\w\-]+)\((.*)$")
_SHAPE_RE = re.compile(r"^[a-z0-9]+\[([0-9,]*)\]")


def _dims(shape: str) -> list[int] | None:
    m = _SHAPE_RE.match(shape)
    if not m:
        return None
    return [int(d) for d in m.group(1).split(",") if d]


def hlo_loops_without_trip_count(hlo_text: str) -> int:
    """While loops whose trip count XLA does not know (e.g. the blockwise attention's causal
    loops, whose bounds depend on the block index): `hlo_matmul_flops` counts their body once."""
    return sum(1 for line in hlo_text.splitlines()
               if re.search(r"\swhile\(", line) and "known_trip_count" not in line)


def hlo_matmul_flops(hlo_text: str) -> float:
    """Matmul FLOPs (2 x output elements x contracted size) of a compiled HLO module; while
    loops count `known_trip_count` times (once when unknown), fusions and calls once per execution."""
    comps: dict[str, list[str]] = {}
    params: dict[str, dict[str, list[int]]] = {}
    entry = None
    current = None
    for line in hlo_text.splitlines():
        m = _COMP_RE.match(line)
        if m:
            current = m.group(1)
            comps[current] = []
            params[current] = {}
            if line.startswith("ENTRY"):
                entry = current
            for p in re.finditer(r"(\S+?):\s+([a-z0-9]+\[[0-9,]*\])", m.group(2)):
                params[current][p.group(1)] = _dims(p.group(2)) or []
            continue
        if current is not None:
            if line.strip() == "}":
                current = None
            else:
                comps[current].append(line)
    memo: dict[str, float] = {}

    def flops(name: str) -> float:
        if name in memo:
            return memo[name]
        memo[name] = 0.0
        shapes = dict(params.get(name, {}))
        total = 0.0
        for line in comps.get(name, []):
            m = _INSTR_RE.match(line)
            if not m:
                continue
            var, shape, op, rest = m.groups()
            dims = _dims(shape)
            if dims is not None:
                shapes[var] = dims
            if op == "dot":
                operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
                lhs = shapes.get(operands[0]) if operands else None
                contract = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
                if lhs is not None and dims is not None and contract:
                    k = math.prod(lhs[int(i)] for i in contract.group(1).split(",") if i)
                    total += 2.0 * math.prod(dims) * k
            elif op == "while":
                body = re.search(r"body=%([\w.\-]+)", rest)
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
                if body:
                    total += (int(trip.group(1)) if trip else 1) * flops(body.group(1))
            elif op == "conditional":
                branches = re.findall(r"%([\w.\-]+)", rest.split("branch_computations=")[-1].split("}")[0])
                total += max((flops(b) for b in branches), default=0.0)
            else:
                for callee in re.findall(r"calls=%([\w.\-]+)", rest):
                    total += flops(callee)
        memo[name] = total
        return total

    return flops(entry) if entry else 0.0


# ----------------------------------------------------------------------------- the plan


def _nbytes(x) -> int:
    """Per-device bytes of an abstract array (its shard shape under its sharding)."""
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    return int(math.prod(shape)) * x.dtype.itemsize


def _tree_bytes(tree) -> int:
    import jax

    return sum(_nbytes(x) for x in jax.tree.leaves(tree))


def _abstract(state, shardings):
    """The nnx State with every value replaced by a ShapeDtypeStruct carrying its sharding."""
    import jax
    from flax import nnx

    def one(var, sharding):
        value = var.get_value()
        return var.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding))

    return jax.tree.map(one, state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _largest_shapes(spec, ladder, T: int) -> tuple[dict, dict]:
    """(student, teacher) {name: (shape, dtype)} of the largest batch the batcher makes (`shape_ladder`):
    every sequence max_seq_len long, packed one per row (the most rows of the ladder), or unpacked
    [B, L] / [B, C, L]; with a shared prefix one row per sample, the ladder's longest [B, C * L] (no
    prefix shared at all)."""
    B, C, L = spec.samples_per_step, spec.max_candidates, spec.max_seq_len
    i32, f32 = np.int32, np.float32

    def packed(r, lead, length=L):
        if not spec.packing and not spec.shares_prefix:
            return {}
        return {"positions": ((r, length), i32), "segment_ids": ((r, length), i32), "row": (lead, i32),
                "offset": (lead, i32)}

    rows = ladder.student_rows[-1] if spec.packing else B
    student = {"input_ids": ((rows, L), i32), "response_start": ((B,), i32), "response_ids": ((B, T), i32),
               "response_mask": ((B, T), f32), "advantages": ((B, T), f32), "rollout_logprobs": ((B, T), f32),
               "sample_mask": ((B,), f32), **packed(rows, (B,))}
    teacher = {"response_start": ((B, C), i32), "candidate_mask": ((B, C), f32)}
    if spec.shares_prefix:
        length = ladder.shared_lengths[-1]
        teacher.update(input_ids=((B, length), i32), prefix_len=((B,), i32), **packed(B, (B, C), length))
        if spec.reference:
            teacher.update(reference_offset=((B,), i32), reference_start=((B,), i32))
    else:
        rows_t = ladder.teacher_rows[-1]
        teacher.update(input_ids=((rows_t, L) if spec.packing else (B, C, L), i32), **packed(rows_t, (B, C)))
    return student, teacher


def _openclaw_shapes(spec, *, prompt: int, response: int, hint: int, shared: int = 0) -> tuple[dict, dict, int]:
    """(student, teacher, T): the arrays `pack` makes from `batch_size` samples of `prompt` tokens
    (the first `shared` of them common to every sample, e.g. OpenClaw's system prompt) and a
    `response`-token response, each with `max_candidates` hint prompts (`hint` tokens inserted
    before the prompt's last 3, as the judge appends a hint to the last user message)."""
    from openclaw_jax.trainer.batcher import pack   # imports JAX: after main's XLA_FLAGS (see the imports)

    if not (prompt > 3 and response > 0 and hint >= 0 and 0 <= shared <= prompt - 3):
        raise ValueError(f"--prompt-len={prompt} must be > 3, --response-len={response} > 0, --hint-len={hint} "
                         f">= 0 and --shared-len={shared} <= prompt - 3")
    rng = np.random.default_rng(0)
    system = [int(x) for x in rng.integers(1, 1000, shared)]
    samples = []
    for i in range(spec.samples_per_step):
        p = system + [int(x) for x in rng.integers(1, 1000, prompt - shared)]
        hints = [p[:-3] + [7 + c] * hint + p[-3:] for c in range(spec.max_candidates)]
        samples.append(Sample(session_id=f"plan{i}", turn_index=0, kind="opd+rl" if hints else "rl", reward=1.0,
                              prompt_ids=p, response_ids=[5] * response, rollout_logprobs=[-1.0] * response,
                              hints=[f"plan hint {c}" for c in range(len(hints))], hint_prompt_ids=hints))
    packed = pack(samples, spec)
    shapes = [{k: (v.shape, v.dtype) for k, v in part.items()} for part in (packed.student, packed.teacher)]
    return shapes[0], shapes[1], packed.student["response_ids"].shape[1]


def build_plan(cfg, hf_config: dict[str, Any], *, response_len: int | None = None,
               device_memory: int = 80 * 1024 ** 3, lengths: dict[str, int] | None = None,
               images: tuple[int, int, int] = (1, 448, 336)) -> dict[str, Any]:
    """Compile every phase for the visible devices; the report as a dict (see `main`). `lengths`
    (prompt, response, hint, shared: `_openclaw_shapes`) plans the batch of samples of those lengths
    instead of the largest one the config allows. A vision-language model (Qwen2.5-VL config.json):
    every sample shows `images` = (count, width, height) images (screenshots), their patches in the
    student's and the teacher's rows (`trainer/vision_batch.py`), the vision tower in every pass."""
    import jax

    # these import JAX: after main's XLA_FLAGS (see the imports)
    from openclaw_jax.trainer import step as S
    from openclaw_jax.trainer.state import optimizer
    from openclaw_jax.trainer.train_step import make_train_step

    opt = optimizer(cfg)
    mcfg, state, mesh = _abstract_state(cfg, hf_config, opt[0])
    train_step = make_train_step(cfg, cfg.sample_spec(), state, mesh, opt)
    vision = _vision_inputs(train_step.spec, hf_config, images, state.student)
    T = response_len or cfg.trainer.max_seq_len

    def arr(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=train_step.batch_sharding)

    spec, ladder = train_step.spec, train_step.shape_ladder
    if lengths is None:
        student_shapes, teacher_shapes = _largest_shapes(spec, ladder, T)
    else:  # the batch the batcher packs from B samples of these lengths (the same `pack`)
        student_shapes, teacher_shapes, T = _openclaw_shapes(spec, **lengths)
    if vision:
        student_shapes["pixel_values"] = ((spec.samples_per_step,) + vision["row_patches"], "float32")
        teacher_shapes["pixel_values"] = ((spec.samples_per_step, spec.max_candidates) + vision["row_patches"],
                                          "float32")
    inputs = S.StudentInputs(**{k: arr(shape, dtype) for k, (shape, dtype) in student_shapes.items()})
    tinputs = S.TeacherInputs(**{k: arr(shape, dtype) for k, (shape, dtype) in teacher_shapes.items()})
    resident = {"student_params": _tree_bytes(state.student), "optimizer_state": _tree_bytes(state.opt_state),
                "teacher_params": _tree_bytes(state.teacher), "batch": _tree_bytes(inputs) + _tree_bytes(tinputs)}
    # the step of a weight sync (the largest): the update that also writes the serving weights, one more
    # copy of the model in the compute dtype (LoRA merged), live until the hand-off
    phases = train_step.compile(state, inputs, tinputs, serve=True, image_grid=vision["grid"] if vision else ())
    report = _phase_report(phases, sum(resident.values()))
    plan = _plan_report(cfg, mcfg, train_step, report, resident, inputs, tinputs, state.trainable, lengths, T,
                        serving_bytes=_tree_bytes(phases[-1].outputs[4]), device_memory=device_memory)
    if vision:
        plan["vision"] = {"images_per_sample": images[0], "image_size": list(images[1:]),
                          "grid": [list(g) for g in vision["grid"]], "image_tokens_per_sample": vision["tokens"],
                          "vision_params": vision["params"]}
    return plan


def _vision_inputs(spec, hf_config: dict[str, Any], images: tuple[int, int, int], states) -> dict[str, Any] | None:
    """For a Qwen2.5-VL student: the images' grid, patches per row `(N_row, D)`, image tokens and the
    vision tower's parameter count (None for a text decoder)."""
    # qwen_vl imports JAX: after main's XLA_FLAGS (see the imports)
    from openclaw_jax.models.image_processing import ImageProcessorConfig, smart_resize
    from openclaw_jax.models.qwen_vl import QwenVLConfig, is_vl_config

    if not is_vl_config(hf_config):
        return None
    if spec.packing or spec.shares_prefix:
        raise ValueError("a vision-language model trains on unpacked batches: set trainer.packing=false and "
                         "trainer.shared_prefix_teacher=false")
    count, width, height = images
    proc = ImageProcessorConfig.for_vision(QwenVLConfig.from_hf_dict(hf_config).vision)
    h, w = smart_resize(height, width, proc.patch_size * proc.merge_size, proc.min_pixels, proc.max_pixels)
    grid = ((1, h // proc.patch_size, w // proc.patch_size),) * count
    patches = sum(t * gh * gw for t, gh, gw in grid)
    import jax
    import numpy as np

    params = sum(int(np.prod(x.shape)) for path, x in jax.tree_util.tree_leaves_with_path(states)
                 if "visual" in jax.tree_util.keystr(path[:3]))
    return {"grid": grid, "row_patches": (patches, 3 * proc.temporal_patch_size * proc.patch_size ** 2),
            "tokens": patches // proc.merge_size ** 2, "params": params}



def _abstract_state(cfg, hf_config: dict[str, Any], tx):
    """(model config, the trainer's `TrainState` of abstract, sharded arrays (no weights), the mesh): the
    state the planner compiles the trainer's step over."""
    import jax
    from flax import nnx

    # these import JAX: after main's XLA_FLAGS (see the imports)
    from openclaw_jax.models.decoder import Decoder
    from openclaw_jax.models.lora import add_lora
    from openclaw_jax.models.weights import apply_dtypes
    from openclaw_jax.parallel.mesh import make_mesh, state_shardings
    from openclaw_jax.models.qwen_vl import QwenVL, QwenVLConfig, apply_vl_dtypes, is_vl_config
    from openclaw_jax.trainer.state import TrainState, optimizer_shardings, trained_params

    vl = None
    if is_vl_config(hf_config):   # Qwen2.5-VL: the text decoder as below, the vision tower beside it
        vl = apply_vl_dtypes(QwenVLConfig.from_hf_dict(hf_config), cfg.model.dtype, cfg.model.param_dtype)
        mcfg = vl.text
    else:
        mcfg = apply_dtypes(ModelConfig.from_hf_dict(hf_config), cfg.model.dtype, cfg.model.param_dtype)
    mcfg = _with_model_options(mcfg.replace(remat=cfg.model.remat), cfg)
    mesh = make_mesh((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp))
    if vl is not None:
        vl = vl.replace(text=mcfg, vision=vl.vision.replace(remat=cfg.model.remat))

    def student():
        if vl is not None:
            return QwenVL(vl, rngs=nnx.Rngs(0), lora=cfg.model.lora if cfg.model.lora.enabled else None)
        model = Decoder(mcfg, rngs=nnx.Rngs(0))
        if cfg.model.lora.enabled:
            model = add_lora(model, cfg.model.lora, rngs=nnx.Rngs(1))
        return model

    model = nnx.eval_shape(student)
    graphdef, trainable, frozen = nnx.split(model, trained_params(model, cfg), ...)
    trainable = _abstract(trainable, state_shardings(trainable, mesh, mcfg.family))
    frozen = _abstract(frozen, state_shardings(frozen, mesh, mcfg.family))
    teacher_model = mcfg.replace(param_dtype=cfg.model.dtype)   # the teacher is held in the compute dtype
    if vl is not None:
        teacher_vl = apply_vl_dtypes(vl.replace(text=teacher_model), cfg.model.dtype, cfg.model.dtype)
        teacher_graphdef, teacher_state = nnx.split(nnx.eval_shape(lambda: QwenVL(teacher_vl, rngs=nnx.Rngs(0))))
    else:
        teacher_graphdef, teacher_state = nnx.split(nnx.eval_shape(lambda: Decoder(teacher_model,
                                                                                   rngs=nnx.Rngs(0))))
    teacher_state = _abstract(teacher_state, state_shardings(teacher_state, mesh, mcfg.family))
    opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                             jax.eval_shape(tx.init, trainable), optimizer_shardings(tx, trainable, mesh))
    rng = jax.ShapeDtypeStruct((2,), np.uint32, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return mcfg, TrainState(step=0, sample_offset=0, trainable=trainable, frozen=frozen, teacher=teacher_state,
                            opt_state=opt_state, rng=rng, graphdef=graphdef, teacher_graphdef=teacher_graphdef), mesh


def _phase_report(phases, live: int) -> dict[str, Any]:
    """Per compiled phase (`TrainStep.compile`, in run order): XLA's memory numbers and matmul FLOPs, and
    its peak: `live` (the bytes resident before the first phase) plus the outputs of the phases before
    it (donated buffers leave), its own outputs and temporaries."""
    report: dict[str, Any] = {}
    for phase in phases:
        mem = phase.compiled.memory_analysis()
        out_bytes = int(mem.output_size_in_bytes)
        peak = live + out_bytes + int(mem.temp_size_in_bytes) - int(mem.alias_size_in_bytes)
        # the fused step (trainer.fused_old_pass) is the update, with the passes it folds in
        key = "train_step" if phase.name.startswith(("train_step", "fused_step")) else phase.name
        text = phase.compiled.as_text()
        report[key] = {"argument_bytes": int(mem.argument_size_in_bytes), "output_bytes": out_bytes,
                       "temp_bytes": int(mem.temp_size_in_bytes), "alias_bytes": int(mem.alias_size_in_bytes),
                       "live_before_bytes": live, "peak_bytes": peak, "flops": hlo_matmul_flops(text),
                       "loops_without_trip_count": hlo_loops_without_trip_count(text)}
        # the update donates its trained params and optimizer state (args 1 and 3)
        donated = _tree_bytes(phase.args[1]) + _tree_bytes(phase.args[3]) if key == "train_step" else 0
        live += out_bytes - donated
    return report


def _plan_report(cfg, mcfg, train_step, report, resident, inputs, tinputs, trainable, lengths, T, *, serving_bytes: int,
                 device_memory: int) -> dict[str, Any]:
    """The plan's dict from the compiled phases' numbers."""
    import jax

    tcfg, mesh = cfg.trainer, train_step.mesh
    B, C, L = tcfg.samples_per_step, train_step.spec.max_candidates, tcfg.max_seq_len
    n_dev = mesh.size
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(trainable))
    train_flops = report["train_step"]["flops"]
    seq = L if lengths is None else lengths["prompt"] + lengths["response"]   # a trained sequence's tokens
    trained_tokens = B * seq
    peak = max(p["peak_bytes"] for p in report.values())
    # Model FLOPs per token with attention (PaLM, appendix B): 6N + 12 * layers * heads * head_dim * L.
    model_flops_per_token = 6.0 * n_params + 12.0 * mcfg.num_layers * mcfg.num_heads * mcfg.head_dim * seq
    attention_estimate = causal_attention_flops_per_token(mcfg, seq) if report["train_step"][
        "loops_without_trip_count"] else 0.0
    return {
        "model": {"family": mcfg.family, "layers": mcfg.num_layers, "hidden": mcfg.hidden_size,
                  "vocab": mcfg.vocab_size, "dtype": mcfg.dtype, "param_dtype": mcfg.param_dtype,
                  "remat": mcfg.remat, "attention": _attention_label(mcfg)},
        "devices": n_dev, "mesh": dict(zip(mesh.axis_names, mesh.axis_sizes)),
        "batch": {"samples_per_step": B, "candidates": C, "seq_len": L, "response_len": T,
                  "micro_batch_size": tcfg.micro_batch_size, "top_k": cfg.loss.top_k, "chunk_size": tcfg.chunk_size,
                  "packing": bool(tcfg.packing), "student_shape": list(inputs.input_ids.shape),
                  "teacher_shape": list(tinputs.input_ids.shape), "compiled_shape_bound": train_step.shape_ladder.bound,
                  "shared_prefix": bool(train_step.spec.shares_prefix),
                  "lengths": lengths},
        "serving_bytes": int(serving_bytes),
        "trainable_params": int(n_params),
        "param_bytes": int(_tree_bytes(trainable)),
        "optimizer_bytes": int(resident["optimizer_state"]),
        "resident_bytes": resident,
        "peak_bytes": int(peak),
        "device_memory": int(device_memory),
        "fits": bool(peak <= device_memory),
        "flops_per_step": float(sum(p["flops"] for p in report.values()) * n_dev),
        "train_step_flops": float(train_flops * n_dev),
        "train_flops_per_token_over_6n": float(train_flops * n_dev / trained_tokens / (6.0 * n_params)),
        "train_flops_per_token_over_model_flops": float(train_flops * n_dev / trained_tokens / model_flops_per_token),
        # The blockwise kernel's causal loops have data-dependent trip counts (counted once above);
        # their FLOPs estimated from the shapes (see causal_attention_flops_per_token):
        "train_attention_flops_per_token_estimate": float(attention_estimate),
        "train_flops_per_token_over_6n_with_attention_estimate": float(
            (train_flops * n_dev / trained_tokens + attention_estimate) / (6.0 * n_params)),
        "phases": report,
    }


def causal_attention_flops_per_token(mcfg, seq_len: int) -> float:
    """Train-step FLOPs per token of the blockwise causal attention kernel (not in the HLO count).

    Per visited (query block, key block) pair and head: forward 2 matmuls (QK^T, PV), recomputed
    once more by the layer remat, backward 5 (QK^T again, dV, dP, dQ, dK): 9 matmuls of
    2 * block^2 * head_dim. A query visits about (seq_len + block) / 2 keys under the causal mask.
    """
    from openclaw_jax.models.attention import default_block_size   # imports JAX: see the imports

    block = getattr(mcfg, "attention_block_size", 0) or default_block_size()
    visited = (seq_len + min(block, seq_len)) / 2.0
    return 9 * 2.0 * visited * mcfg.head_dim * mcfg.num_heads * mcfg.num_layers


def _attention_label(mcfg) -> str:
    name = getattr(mcfg, "attention", "dense")
    if name == "auto":  # the fused kernel needs a GPU: this CPU compile runs the blockwise one
        return "auto (blockwise in this CPU compile; fused cuDNN on GPU)"
    return name


def _with_model_options(mcfg, cfg):
    """Model options the experiment config sets beyond dtypes/remat (e.g. the attention kind)."""
    attention = getattr(cfg.model, "attention", None)
    if attention is not None and hasattr(mcfg, "attention"):
        mcfg = mcfg.replace(attention=attention)
    return mcfg


GIB = 1024 ** 3
OPENCLAW_RESPONSE_LEN = 64   # --prompt-len without --response-len: OpenClaw replies are tens of tokens


def format_table(plan: dict[str, Any]) -> str:
    b = plan["batch"]
    lines = [
        f"model {plan['model']['family']} {plan['model']['layers']}L hidden {plan['model']['hidden']} "
        f"(params {plan['model']['param_dtype']}, compute {plan['model']['dtype']}, remat {plan['model']['remat']}, "
        f"attention {plan['model']['attention']}); {plan['devices']} devices {plan['mesh']}",
        f"batch {b['samples_per_step']} x {b['candidates']} candidates, seq {b['seq_len']}, response {b['response_len']}, "
        f"micro-batch {b['micro_batch_size'] or 'whole'}, top-K {b['top_k']}; "
        + (f"packed rows: student {b['student_shape']}, teacher {b['teacher_shape']}" if b["packing"] else
           f"unpacked: student {b['student_shape']}, teacher {b['teacher_shape']}")
        + (" (one per sample: its shared prompt prefix once, then its candidates)" if b["shared_prefix"] else "")
        + f"; at most {b['compiled_shape_bound']} compiled step shapes"
        + (f"; samples of {b['lengths']['prompt']} prompt ({b['lengths']['shared']} shared by all) + "
           f"{b['lengths']['response']} response tokens, hints of {b['lengths']['hint']}" if b["lengths"] else ""),
        f"trainable params {plan['trainable_params'] / 1e9:.3f} B: {plan['param_bytes'] / GIB:.2f} GiB/device; "
        f"optimizer {plan['optimizer_bytes'] / GIB:.2f} GiB/device; teacher "
        f"{plan['resident_bytes']['teacher_params'] / GIB:.2f} GiB/device; serving copy written by a sync step "
        f"{plan['serving_bytes'] / GIB:.2f} GiB/device",
        "",
        f"{'phase':<16}{'args GiB':>10}{'out GiB':>10}{'temp GiB':>10}{'live GiB':>10}{'peak GiB':>10}{'TFLOP/dev':>11}",
    ]
    for name, p in plan["phases"].items():
        lines.append(f"{name:<16}{p['argument_bytes'] / GIB:>10.2f}{p['output_bytes'] / GIB:>10.2f}"
                     f"{p['temp_bytes'] / GIB:>10.2f}{p['live_before_bytes'] / GIB:>10.2f}"
                     f"{p['peak_bytes'] / GIB:>10.2f}{p['flops'] / 1e12:>11.2f}")
    lines += [
        "",
        f"peak {plan['peak_bytes'] / GIB:.2f} GiB/device of {plan['device_memory'] / GIB:.1f} GiB: "
        f"{'fits' if plan['fits'] else 'DOES NOT FIT'}",
        f"FLOPs/step {plan['flops_per_step'] / 1e12:.1f} TFLOP (all devices); train step per trained token / "
        f"(6 x params) = {plan['train_flops_per_token_over_6n']:.2f}; / (6 x params + 12 x layers x heads x "
        f"head_dim x seq, attention included) = {plan['train_flops_per_token_over_model_flops']:.2f}",
        *([f"  the blockwise attention's causal loops (trip counts known only at run time) are counted once in "
           f"the HLO; with their estimated FLOPs the train step is "
           f"{plan['train_flops_per_token_over_6n_with_attention_estimate']:.2f} x 6N per token"]
          if plan["train_attention_flops_per_token_estimate"] else []),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openclaw_jax.plan",
        description="Ahead-of-time memory/FLOP plan of one trainer step on N simulated devices, from config.json "
                    "alone (no weights).",
        epilog="Example: python -m openclaw_jax.plan --config configs/qwen3_4b_gpu.yaml --devices 4 "
               "trainer.max_seq_len=4096")
    p.add_argument("--config", action="append", default=[], metavar="YAML", required=True,
                   help="experiment YAML (repeatable)")
    p.add_argument("--devices", type=int, required=True, help="number of devices the trainer's mesh spans")
    p.add_argument("--device-memory", type=parse_bytes, default=parse_bytes("80GiB"),
                   help="memory per device, e.g. 80GiB (default) or 141GB")
    p.add_argument("--model-config", default=None, help="HF config.json (or its directory); default: see above")
    p.add_argument("--response-len", type=int, default=None,
                   help="response bucket T (default: trainer.max_seq_len, the largest the batcher makes); with "
                        f"--prompt-len the response's tokens (default {OPENCLAW_RESPONSE_LEN})")
    p.add_argument("--prompt-len", type=int, default=None,
                   help="plan the batch of samples with prompts of this many tokens (e.g. 10534: OpenClaw's default "
                        "profile, 2500: its minimal one) as the batcher packs them, instead of the largest batch")
    p.add_argument("--shared-len", type=int, default=0,
                   help="with --prompt-len: tokens at the start of every prompt common to all samples (a system prompt)")
    p.add_argument("--hint-len", type=int, default=32,
                   help="with --prompt-len: tokens a hint adds to its candidate's prompt (default 32)")
    p.add_argument("--images", type=int, default=1,
                   help="a vision-language model: images (screenshots) per sample (default 1)")
    p.add_argument("--image-size", default="448x336", metavar="WxH",
                   help="a vision-language model: each image's size in pixels (default 448x336, the GUI env's screen)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    return p


def _device_flags(n: int) -> str:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    return " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)   # key=value overrides may come before or after options
    if args.devices < 1:
        print(f"--devices={args.devices} must be >= 1", file=sys.stderr)
        return 2
    want = _device_flags(args.devices)
    if "jax" in sys.modules and os.environ.get("XLA_FLAGS", "") != want:
        # The device count is fixed when JAX starts: plan in a fresh process.
        env = dict(os.environ, XLA_FLAGS=want, JAX_PLATFORMS="cpu")
        return subprocess.run([sys.executable, "-m", "openclaw_jax.plan"] + list(argv or sys.argv[1:]),
                              env=env).returncode
    os.environ["XLA_FLAGS"] = want
    os.environ["JAX_PLATFORMS"] = "cpu"
    from openclaw_jax.config import load_experiment_config   # imports JAX: only now that XLA_FLAGS is set

    try:
        cfg = load_experiment_config(args.config, args.overrides)
        path = find_model_config(cfg.model.path, args.model_config)
    except (ConfigError, FileNotFoundError) as err:
        print(f"plan error: {err}", file=sys.stderr)
        return 2
    import jax

    if jax.device_count() != args.devices:
        print(f"plan error: JAX sees {jax.device_count()} devices, not {args.devices}", file=sys.stderr)
        return 2
    lengths = None
    if args.prompt_len is not None:
        lengths = {"prompt": args.prompt_len, "response": args.response_len or OPENCLAW_RESPONSE_LEN,
                   "hint": args.hint_len, "shared": args.shared_len}
    try:
        width, _, height = args.image_size.lower().partition("x")
        plan = build_plan(cfg, json.loads(path.read_text()), response_len=args.response_len,
                          device_memory=args.device_memory, lengths=lengths,
                          images=(args.images, int(width), int(height)))
    except ValueError as err:  # lengths the config cannot batch (longer than trainer.max_seq_len, ...)
        print(f"plan error: {err}", file=sys.stderr)
        return 2
    plan["model_config"] = str(path)
    if args.json:
        print(json.dumps(plan))
    else:
        print(format_table(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
