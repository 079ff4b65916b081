"""One training step as a function of the train state: `state, metrics = train_step(state, batch)`.

`make_train_step(cfg, samples, state, mesh, optimizer)` builds it from the config's `model`, `loss`
and `trainer` sections, what the trainer must know of the samples' source (`SampleSpec`: their
temperature, the most hint candidates) and the optimizer whose state the train state holds
(`state.optimizer(cfg)`: the same object builds the state and the update). Inside, the phases of
docs/design.md §7 run in their order on a host batch (`PackedBatch`): the reward baseline (host),
the old pass, the teacher pass, l_old at the teacher's ids, the reference pass, the importance
weights (the advantages' last touch), the loss batch, then the gradient and the optax update
(`step.py`); with `trainer.fused_old_pass` phases 1-7 are one program (`fused_step.py`). Each phase is one jitted program, compiled once per shape of
its own inputs (the student phases per student shape, the teacher pass per teacher shape, so the
programs a run compiles add up rather than multiply, `ShapeLadder.bound`), timed on its own
(`time/<phase>`) and planned on its own (`plan/build.py`, through `TrainStep.compile`).

The loop (`loop.py`), the planner, the benchmarks and the tests all call this one step; `loss_batch`
gives what the loss sees (phases 1-6) for inspection.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from openclaw_jax.losses import HybridBatch
from openclaw_jax.models.image_processing import ImageProcessorConfig
from openclaw_jax.parallel import multihost
from openclaw_jax.samples import SampleSpec
from openclaw_jax.trainer import advantages as A
from openclaw_jax.trainer import fused_step as F
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batch import BatchSpec, PackedBatch
from openclaw_jax.trainer.batcher import shape_ladder
from openclaw_jax.trainer.state import TrainState

if TYPE_CHECKING:   # the type only: the config tree imports every section's package
    from openclaw_jax.config import ExperimentConfig

# the phases timed on their own (`time/<name>`); the rest of the step counts as `time/train_step`
TIMED_PASSES = ("old_pass", "teacher_pass", "reference_pass")


def step_settings(cfg: ExperimentConfig, samples: SampleSpec) -> S.StepSettings:
    """The static settings of the jitted phases: the loss, tau (the samples' temperature), chunking, dtypes."""
    return S.StepSettings(loss=cfg.loss, temperature=samples.temperature, chunk_size=cfg.trainer.chunk_size,
                          micro_batch_size=cfg.trainer.micro_batch_size, dtype=cfg.model.dtype,
                          param_dtype=cfg.model.param_dtype,
                          skip_without_signal=cfg.trainer.skip_steps_without_signal)


def batch_shards(samples_per_step: int, mesh: jax.sharding.Mesh) -> int:
    """Batch rows go over ("data", "fsdp") when the samples divide evenly over them (else 1: replicated);
    packed row counts are multiples of this."""
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    return n if samples_per_step % n == 0 else 1


def batch_spec(cfg: ExperimentConfig, samples: SampleSpec, *, row_multiple: int = 1, pad_id: int = 0,
               images: tuple[Any, int] | None = None) -> BatchSpec:
    """How the trainer batches samples: the `trainer` section's batching keys, the loss's `uses_hints`
    and `kl_coef`, the samples' temperature and most candidates, each under its config name
    (`row_multiple`: the batch shards; `images`: a QwenVL student's (ImageProcessorConfig, image token id))."""
    tcfg = cfg.trainer
    return BatchSpec(
        samples_per_step=tcfg.samples_per_step, max_candidates=samples.max_candidates,
        min_seq_bucket=tcfg.min_seq_bucket, max_seq_len=tcfg.max_seq_len,
        min_response_bucket=tcfg.min_response_bucket, rl_only_teacher=tcfg.rl_only_teacher,
        uses_hints=cfg.loss.uses_hints, max_staleness=tcfg.max_staleness, staleness_mode=tcfg.staleness_mode,
        pad_id=pad_id, temperature=samples.temperature, packing=tcfg.packing, bucket_quantum=tcfg.bucket_quantum,
        micro_batch_size=tcfg.micro_batch_size, row_multiple=row_multiple,
        shared_prefix_teacher=tcfg.shared_prefix_teacher,
        shape_reuse_slack=tcfg.shape_reuse_slack, batch_prefix_min=tcfg.batch_prefix_min,
        kl_coef=cfg.loss.kl_coef, image_processor=images[0] if images else None,
        image_token_id=images[1] if images else None, holdout_every=cfg.gate.holdout)


def student_images(student: nnx.Module) -> tuple[ImageProcessorConfig, int] | None:
    """A QwenVL student's (image processor, image token id): its samples' images go into the batches;
    None for a text decoder."""
    vl_cfg = getattr(student, "vl_cfg", None)
    if vl_cfg is None:
        return None
    return ImageProcessorConfig.for_vision(vl_cfg.vision), int(vl_cfg.image_token_id)


def _jit_phases(settings: S.StepSettings, tx, schedule, trainable_shardings, opt_shardings, *, merge_lora: bool,
                importance_cap: float | None) -> dict[str, Callable]:
    """The jitted phases of one step, by name (`TrainStep`'s own; the planner compiles these same objects)."""
    update = functools.partial(S.update_step, settings=settings, optimizer=tx, lr_schedule=schedule)
    serving = functools.partial(S.update_step_serving, settings=settings, optimizer=tx, lr_schedule=schedule,
                                merge_lora=merge_lora, serving_dtype=settings.compute_dtype)
    fused = functools.partial(F.fused_train_step, settings=settings, optimizer=tx, lr_schedule=schedule,
                              importance_cap=importance_cap, merge_lora=merge_lora)
    state_out = (trainable_shardings, opt_shardings, None, None)
    return {
        # trainer.fused_old_pass: the whole step as one program (fused_step.py); run_teacher and
        # folded_reference (args 8, 9) are static
        "fused_step": jax.jit(fused, static_argnums=(8, 9), donate_argnums=(1, 3), out_shardings=state_out),
        "fused_step_serving": jax.jit(functools.partial(fused, serve=True), static_argnums=(8, 9),
                                      donate_argnums=(1, 3), out_shardings=state_out + (None,)),
        "old_pass": jax.jit(functools.partial(S.old_pass, settings=settings)),
        "teacher_pass": jax.jit(functools.partial(S.teacher_pass, settings=settings)),
        "reference_pass": jax.jit(functools.partial(S.reference_pass, settings=settings)),
        "old_logprobs_at": jax.jit(functools.partial(S.old_logprobs_at, settings=settings)),
        "importance": jax.jit(functools.partial(A.importance_weighted, cap=importance_cap or 0.0)),
        "train_step": jax.jit(update, donate_argnums=(1, 3), out_shardings=state_out),
        # the same update, also emitting the serving weights (compute dtype, LoRA merged) for a weight sync
        "train_step_serving": jax.jit(serving, donate_argnums=(1, 3), out_shardings=state_out + (None,)),
    }


@dataclass(frozen=True)
class CompiledPhase:
    """One phase of the step compiled ahead of time (`TrainStep.compile`): its arguments (abstract),
    the lowered and compiled program and its outputs (abstract, with their shardings)."""

    name: str
    args: tuple
    lowered: Any
    compiled: Any
    outputs: Any


def abstract_outputs(lowered, compiled) -> Any:
    """A compiled program's outputs as `jax.ShapeDtypeStruct`s with their shardings."""
    return jax.tree.map(lambda info, s: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=s),
                        lowered.out_info, compiled.output_shardings)


class TrainStep:
    """`train_step(state, batch) -> (state, metrics)`: one optimizer step (module doc). Built once
    (`make_train_step`); holds no state, only the settings, the batch spec, the optimizer and the
    jitted phases."""

    def __init__(self, cfg: ExperimentConfig, samples: SampleSpec, state: TrainState, mesh: jax.sharding.Mesh,
                 optimizer: tuple[optax.GradientTransformation, optax.Schedule], *, pad_id: int = 0,
                 images: tuple[ImageProcessorConfig, int] | None = None):
        tcfg = cfg.trainer
        self.mesh = mesh
        self.settings = step_settings(cfg, samples)
        self.merge_lora = cfg.model.lora.enabled
        self.reward_baseline = tcfg.reward_baseline
        self.importance_cap = tcfg.importance_cap if tcfg.staleness_mode == "importance" else None
        self.tx, self.schedule = optimizer
        shards = batch_shards(tcfg.samples_per_step, mesh)
        self.spec = batch_spec(cfg, samples, row_multiple=shards, pad_id=pad_id, images=images)
        self.batch_sharding = NamedSharding(mesh, PartitionSpec(("data", "fsdp")) if shards > 1 else PartitionSpec())
        self.shape_ladder = shape_ladder(self.spec)
        self.fused = tcfg.fused_old_pass
        if self.fused and (tcfg.micro_batch_size > 0 or images is not None):
            raise ValueError("trainer.fused_old_pass=true runs the step without micro-batches and without images: "
                             f"trainer.micro_batch_size={tcfg.micro_batch_size}"
                             f"{' and a vision-language student' if images is not None else ''}; set "
                             "trainer.fused_old_pass=false")
        self._shardings = (jax.tree.map(lambda x: x.sharding, state.trainable),
                           jax.tree.map(lambda x: x.sharding, state.opt_state))
        self._phases: dict[tuple, dict[str, Callable]] = {}
        self._serving_graphdef: nnx.GraphDef | None = None

    def _jitted(self, image_grid: tuple = ()) -> dict[str, Callable]:
        """The jitted phases for batches whose rows hold images of `image_grid` (static under jit: one set
        per grid; `()`: text batches)."""
        if image_grid not in self._phases:
            settings = dataclasses.replace(self.settings, image_grid=image_grid)
            self._phases[image_grid] = _jit_phases(settings, self.tx, self.schedule, *self._shardings,
                                                   merge_lora=self.merge_lora, importance_cap=self.importance_cap)
        return self._phases[image_grid]

    # ------------------------------------------------------------------ the step

    def __call__(self, state: TrainState, batch: PackedBatch) -> tuple[TrainState, dict[str, Any]]:
        """One optimizer step on `batch` (its advantages are finished here); `state`'s trained params and
        optimizer state are donated. Metrics: the loss's (docs/design.md §6), `grad_norm`, `lr`,
        `time/<phase>` seconds (`time/step` in all), `rollout/reward_baseline` when one was subtracted,
        and `sel_k_star`, the hint the loss chose per token `[B, T]` (a histogram)."""
        state, metrics, _ = self._step(state, batch, serve=False)
        return state, metrics

    def with_serving_weights(self, state: TrainState, batch: PackedBatch
                             ) -> tuple[TrainState, dict[str, Any], nnx.State]:
        """As a call, plus the updated weights for serving (`serving_model`'s state: compute dtype, LoRA
        merged), written by the update's own program into buffers later (donating) steps leave alone."""
        return self._step(state, batch, serve=True)

    def _step(self, state: TrainState, batch: PackedBatch, *, serve: bool):
        baseline = A.apply_reward_baseline(batch, self.reward_baseline)
        phases = self._jitted(batch.image_grid)
        times: dict[str, float] = {}

        def call(name, *args):   # the forward passes are timed on their own; the rest counts as the update
            t = time.perf_counter()
            out = phases[name](*args)
            if name in TIMED_PASSES:
                out = jax.block_until_ready(out)
                times[name] = time.perf_counter() - t
            return out

        t0 = time.perf_counter()
        with jax.set_mesh(self.mesh):
            inputs, teacher_inputs = self._device_inputs(batch)
            out = self._run(call, state, inputs, teacher_inputs, serve=serve, **self._layout(batch))
            trainable, opt_state, metrics, k_star = out[:4]
            metrics = {k: float(v) for k, v in multihost.tree_to_host(metrics).items()}
            metrics["sel_k_star"] = multihost.to_host(k_star)
            times.setdefault("teacher_pass", 0.0)   # no candidate in the batch (or `rl`): no teacher pass ran
            times["train_step"] = time.perf_counter() - t0 - sum(times.values())
        times["step"] = time.perf_counter() - t0
        metrics.update({f"time/{k}": v for k, v in times.items()})
        if baseline is not None:
            metrics["rollout/reward_baseline"] = baseline
        state = state.replace(step=state.step + 1, trainable=trainable, opt_state=opt_state)
        return state, metrics, (out[4] if serve else None)

    def loss_batch(self, state: TrainState, batch: PackedBatch) -> HybridBatch:
        """What the loss sees on `batch` (phases 1-6: the old pass, the teacher pass, the reference and the
        finished advantages), without updating anything (also with `trainer.fused_old_pass`: its phases
        then compile apart)."""
        A.apply_reward_baseline(batch, self.reward_baseline)
        phases = self._jitted(batch.image_grid)
        with jax.set_mesh(self.mesh):
            inputs, teacher_inputs = self._device_inputs(batch)
            return self._loss_batch(lambda name, *args: phases[name](*args), state, inputs, teacher_inputs,
                                    **self._layout(batch))

    def _device_inputs(self, batch: PackedBatch) -> tuple[S.StudentInputs, S.TeacherInputs]:
        """The batch's host arrays on the mesh (rows over the batch shards)."""
        put = functools.partial(multihost.place, sharding=self.batch_sharding)
        return (S.StudentInputs(**{k: put(v) for k, v in batch.student.items()}),
                S.TeacherInputs(**{k: put(v) for k, v in batch.teacher.items()}))

    def _layout(self, batch: PackedBatch) -> dict[str, Any]:
        """Which phases a batch runs (static): the teacher pass (a candidate exists), the reference folded
        into it (the shared-prefix rows place it), and the teacher outputs' shapes when none runs."""
        b, t = batch.student["response_ids"].shape
        return {"run_teacher": self.spec.uses_hints and batch.has_teacher,
                "folded_reference": "reference_offset" in batch.teacher,
                "no_teacher": (batch.teacher["candidate_mask"].shape, (b, t, self.settings.top_k))}

    def _loss_batch(self, call: Callable[..., Any], state: TrainState, inputs: S.StudentInputs,
                    teacher_inputs: S.TeacherInputs, *, run_teacher: bool, folded_reference: bool,
                    no_teacher: tuple | None) -> HybridBatch:
        """Phases 1-6, each through `call(name, *args)` (the step runs and times the jitted phase; the
        planner compiles it)."""
        old = call("old_pass", state.graphdef, state.student, inputs)
        if run_teacher:
            teach = call("teacher_pass", state.teacher_graphdef, state.teacher, teacher_inputs, inputs.response_ids,
                         old.topk_ids)
            old_at = call("old_logprobs_at", state.graphdef, state.student, old.hidden, teach.topk_ids)
        else:  # `rl`, or no sample with a candidate (candidate_mask 0): the loss reads no teacher output
            (b, c), (_, t, k) = no_teacher
            teach = jax.tree.map(functools.partial(multihost.place, sharding=self.batch_sharding),
                                 S.no_teacher_outputs(b, c, t, k))
            old_at = teach.logprobs_at_student_ids
        ref = None
        if self.settings.loss.kl_coef != 0:   # the KL anchor: the teacher pass placed it, or the reference pass
            ref = teach.reference_logprobs if folded_reference else call(
                "reference_pass", state.teacher_graphdef, state.teacher, inputs)
        advantages = None
        if self.importance_cap is not None:   # the advantages' last touch (advantages.py), where pi_old is known
            advantages = call("importance", inputs.advantages, old.old_logprobs, inputs.rollout_logprobs,
                              inputs.response_mask)
        return S.assemble_batch(inputs, teacher_inputs, old, teach, old_at, advantages, ref)

    def _run(self, call: Callable[..., Any], state: TrainState, inputs: S.StudentInputs,
             teacher_inputs: S.TeacherInputs, *, run_teacher: bool, folded_reference: bool, serve: bool,
             no_teacher: tuple | None = None) -> tuple:
        """Every phase in order through `call`; returns the update's results (new trained params, new
        optimizer state, metrics, k*, and with `serve` the serving weights)."""
        if self.fused:   # one program: the old pass is the update's own forward (fused_step.py)
            return call("fused_step_serving" if serve else "fused_step", state.graphdef, state.trainable,
                        state.frozen, state.opt_state, inputs, state.teacher_graphdef, state.teacher, teacher_inputs,
                        run_teacher, folded_reference)
        batch = self._loss_batch(call, state, inputs, teacher_inputs, run_teacher=run_teacher,
                                 folded_reference=folded_reference, no_teacher=no_teacher)
        return call("train_step_serving" if serve else "train_step", state.graphdef, state.trainable, state.frozen,
                    state.opt_state, inputs, batch)

    # ------------------------------------------------------------------ ahead of time

    def compile(self, state: TrainState, inputs: S.StudentInputs, teacher_inputs: S.TeacherInputs, *,
                serve: bool = True, image_grid: tuple = ()) -> list[CompiledPhase]:
        """Every phase of the step on a batch with hint candidates, lowered and compiled in order, from
        abstract arguments (`jax.ShapeDtypeStruct`s with shardings: `plan/build.py`); `serve`: the update that
        also writes the serving weights (the step of a weight sync, the largest)."""
        phases = self._jitted(image_grid)
        compiled: list[CompiledPhase] = []

        def call(name, *args):
            lowered = phases[name].lower(*args)
            program = lowered.compile()
            compiled.append(CompiledPhase(name, args, lowered, program, abstract_outputs(lowered, program)))
            return compiled[-1].outputs

        with jax.set_mesh(self.mesh):
            self._run(call, state, inputs, teacher_inputs, run_teacher=True, serve=serve,
                      folded_reference=teacher_inputs.reference_offset is not None)
        return compiled

    # ------------------------------------------------------------------ serving weights

    def serving_model(self, state: TrainState, dtype: str | None = "compute") -> nnx.Module:
        """The student of `state` as a plain model (LoRA merged, in the master dtype before any cast) for
        serving and export: `dtype` "compute" (model.dtype: what serving and weight sync get), "master"
        (model.param_dtype) or a dtype name."""
        named = {"compute": self.settings.dtype, "master": self.settings.param_dtype}
        return S.serving_model(state.graphdef, state.trainable, state.frozen, merge_lora=self.merge_lora,
                               dtype=named.get(dtype, dtype))

    def serving_graphdef(self, state: TrainState) -> nnx.GraphDef:
        """The graphdef of `serving_model(state)` (traced once, abstractly: no weights are computed)."""
        if self._serving_graphdef is None:
            self._serving_graphdef = nnx.split(nnx.eval_shape(lambda: self.serving_model(state)))[0]
        return self._serving_graphdef


def make_train_step(cfg: ExperimentConfig, samples: SampleSpec, state: TrainState, mesh: jax.sharding.Mesh,
                    optimizer: tuple[optax.GradientTransformation, optax.Schedule], *, pad_id: int = 0,
                    images: tuple[ImageProcessorConfig, int] | None = None) -> TrainStep:
    """The step over `state`'s models (concrete, or abstract for the planner: its shardings are what the
    update keeps), updating with `optimizer` (`state.optimizer(cfg)`: the (optax transformation, learning-
    rate schedule) whose state `state.opt_state` is); `images`: a QwenVL student's (`student_images`)."""
    return TrainStep(cfg, samples, state, mesh, optimizer, pad_id=pad_id, images=images)
