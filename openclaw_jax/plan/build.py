"""The plan of one trainer step (the package doc): the trainer's abstract state and the batch, every phase
compiled for the visible devices, and the report of their memory and FLOPs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from openclaw_jax.models.config import ModelConfig
from openclaw_jax.plan.hlo import causal_attention_flops_per_token, hlo_loops_without_trip_count, hlo_matmul_flops
from openclaw_jax.plan.people import AdapterSize, people_report, serving_report
from openclaw_jax.samples import Sample

# JAX, and the package modules that import it, are imported inside the functions (the package doc).


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
    from openclaw_jax.trainer.batcher import pack   # imports JAX: after main's XLA_FLAGS

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
               images: tuple[int, int, int] = (1, 448, 336), people: int = 1,
               serving_memory: int | None = None) -> dict[str, Any]:
    """Compile every phase for the visible devices; the report as a dict (see `main`). `lengths`
    (prompt, response, hint, shared: `_openclaw_shapes`) plans the batch of samples of those lengths
    instead of the largest one the config allows. A vision-language model (Qwen2.5-VL config.json):
    every sample shows `images` = (count, width, height) images (screenshots), their patches in the
    student's and the teacher's rows (`trainer/vision_batch.py`), the vision tower in every pass.
    `trainer.personalize=per_person`: the step of one person with `people` people's adapters and optimizer
    states resident, and the "per_person" section (`people.py`; the engine on a device of `serving_memory`)."""
    # these import JAX: after main's XLA_FLAGS
    from openclaw_jax.models.matmul import matmuls_as_on
    from openclaw_jax.trainer.state import optimizer
    from openclaw_jax.trainer.train_step import make_train_step

    per_person = cfg.trainer.personalize == "per_person"
    opt = optimizer(cfg)
    mcfg, state, mesh = _abstract_state(cfg, hf_config, opt[0])
    train_step = make_train_step(cfg, cfg.sample_spec(), state, mesh, opt)
    vision = _vision_inputs(train_step.spec, hf_config, images, state.student)
    inputs, tinputs, T = _batch(train_step, vision, response_len or cfg.trainer.max_seq_len, lengths)
    resident = {"student_params": _tree_bytes(state.student), "optimizer_state": _tree_bytes(state.opt_state),
                "teacher_params": _tree_bytes(state.teacher), "batch": _tree_bytes(inputs) + _tree_bytes(tinputs)}
    adapter = _adapter_size(state) if per_person else None
    if per_person:   # beside the run's initial adapter (in `state`), each person's own adapter and optimizer state
        resident["people"] = people * adapter.device_bytes
    # shared: the step of a weight sync (the largest), the update that also writes the serving weights, one
    # more copy of the model in the compute dtype (LoRA merged), live until the hand-off; per person: no sync
    with matmuls_as_on("gpu"):  # this CPU compile stands in for the accelerators' (models/matmul.py)
        phases = train_step.compile(state, inputs, tinputs, serve=not per_person,
                                    image_grid=vision["grid"] if vision else ())
    report = _phase_report(phases, sum(resident.values()))
    plan = _plan_report(cfg, mcfg, train_step, report, resident, inputs, tinputs, state, lengths, T,
                        serving_bytes=0 if per_person else _tree_bytes(phases[-1].outputs[4]),
                        device_memory=device_memory)
    if vision:
        plan["vision"] = {"images_per_sample": images[0], "image_size": list(images[1:]),
                          "grid": [list(g) for g in vision["grid"]], "image_tokens_per_sample": vision["tokens"],
                          "vision_params": vision["params"]}
    if per_person:
        serving = serving_report(cfg, mcfg, trainer_peak=plan["peak_bytes"], device_memory=device_memory,
                                 serving_memory=device_memory if serving_memory is None else serving_memory)
        plan["per_person"] = {**people_report(cfg, adapter, people=people, peak_bytes=plan["peak_bytes"],
                                              device_memory=device_memory, engine_bytes=serving["total"]),
                              "serving": serving}
    return plan


def _batch(train_step, vision, T: int, lengths: dict[str, int] | None):
    """(student inputs, teacher inputs, response length) of the planned batch: abstract arrays with the
    batch's sharding, the largest batch the config allows or (`lengths`) the one `pack` makes."""
    import jax

    from openclaw_jax.trainer import step as S   # imports JAX: after main's XLA_FLAGS

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
    return inputs, tinputs, T


def _adapter_size(state) -> AdapterSize:
    """One person's adapter and optimizer state: the shapes and shardings of the run's initial ones (every
    person's is a copy, placed alike: `PerPersonTrainer.new_adapter`)."""
    import jax

    def total(tree) -> int:
        return sum(int(math.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))

    leaves = jax.tree.leaves(state.trainable)
    return AdapterSize(params=sum(int(math.prod(x.shape)) for x in leaves), param_dtype=str(leaves[0].dtype),
                       bytes=total(state.trainable), bytes_per_device=_tree_bytes(state.trainable),
                       optimizer_bytes=total(state.opt_state), optimizer_bytes_per_device=_tree_bytes(state.opt_state))


def _vision_inputs(spec, hf_config: dict[str, Any], images: tuple[int, int, int], states) -> dict[str, Any] | None:
    """For a Qwen2.5-VL student: the images' grid, patches per row `(N_row, D)`, image tokens and the
    vision tower's parameter count (None for a text decoder)."""
    # qwen_vl imports JAX: after main's XLA_FLAGS
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

    # these import JAX: after main's XLA_FLAGS
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


def _plan_report(cfg, mcfg, train_step, report, resident, inputs, tinputs, state, lengths, T, *, serving_bytes: int,
                 device_memory: int) -> dict[str, Any]:
    """The plan's dict from the compiled phases' numbers. The FLOP ratios are over the model's params N (with
    LoRA, the trained params are the adapters, a small part of the work: every matmul still runs the base)."""
    import jax

    tcfg, mesh = cfg.trainer, train_step.mesh
    B, C, L = tcfg.samples_per_step, train_step.spec.max_candidates, tcfg.max_seq_len
    n_dev = mesh.size
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state.trainable))
    n_model = sum(math.prod(x.shape) for x in jax.tree.leaves(state.student)) if cfg.model.lora.enabled else n_params
    train_flops = report["train_step"]["flops"]
    seq = L if lengths is None else lengths["prompt"] + lengths["response"]   # a trained sequence's tokens
    trained_tokens = B * seq
    peak = max(p["peak_bytes"] for p in report.values())
    # Model FLOPs per token with attention (PaLM, appendix B): 6N + 12 * layers * heads * head_dim * L.
    model_flops_per_token = 6.0 * n_model + 12.0 * mcfg.num_layers * mcfg.num_heads * mcfg.head_dim * seq
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
        "model_params": int(n_model),
        "param_bytes": int(_tree_bytes(state.trainable)),
        "optimizer_bytes": int(resident["optimizer_state"]),
        "resident_bytes": resident,
        "peak_bytes": int(peak),
        "device_memory": int(device_memory),
        "fits": bool(peak <= device_memory),
        "flops_per_step": float(sum(p["flops"] for p in report.values()) * n_dev),
        "train_step_flops": float(train_flops * n_dev),
        "train_flops_per_token_over_6n": float(train_flops * n_dev / trained_tokens / (6.0 * n_model)),
        "train_flops_per_token_over_model_flops": float(train_flops * n_dev / trained_tokens / model_flops_per_token),
        # The blockwise kernel's causal loops have data-dependent trip counts (counted once above);
        # their FLOPs estimated from the shapes (see causal_attention_flops_per_token):
        "train_attention_flops_per_token_estimate": float(attention_estimate),
        "train_flops_per_token_over_6n_with_attention_estimate": float(
            (train_flops * n_dev / trained_tokens + attention_estimate) / (6.0 * n_model)),
        "phases": report,
    }


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
