"""The step runner: everything one training step needs, built once, and the phases run in order.

`StepRunner` holds the step's settings, the batch spec, the optimizer and its shardings, the models
(the student split into trainable / frozen, the frozen teacher) and the jitted phases of `step.py`;
`StepRunner.step(state, packed)` runs them in their order (old pass, teacher pass, l_old at the
teacher's ids, reference pass, advantages, loss batch, train step) on one `TrainState` and returns
the new state with the step's outputs (metrics, k*, timings, serving weights). The loop (`loop.py`),
the planner (`plan.py`) and the benchmarks (`bench/`) all use it. It reads the config's `model`,
`loss` and `trainer` sections; what it must know of the samples' source (their temperature, the
most hint candidates) comes in as a `SampleSpec`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from openclaw_jax.models.lora import LoRAParam
from openclaw_jax.parallel import multihost
from openclaw_jax.samples import SampleSpec
from openclaw_jax.trainer import advantages as A
from openclaw_jax.trainer import fused_step as F
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.batcher import BatchSpec, PackedBatch, shape_ladder
from openclaw_jax.models.image_processing import ImageProcessorConfig

if TYPE_CHECKING:   # the type only: the config tree imports every section's package
    from openclaw_jax.config import ExperimentConfig


@jax.tree_util.register_dataclass
@dataclass
class TrainState:
    """What a step changes (and a checkpoint keeps): the trainable params, the optimizer state, the rng."""

    trainable: nnx.State
    opt_state: Any
    rng: jax.Array

    def as_dict(self) -> dict[str, Any]:
        """The checkpoint's tree (`{"trainable", "opt_state", "rng"}`, as checkpoints on disk hold it)."""
        return {"trainable": self.trainable, "opt_state": self.opt_state, "rng": self.rng}

    @classmethod
    def from_dict(cls, tree: dict[str, Any]) -> "TrainState":
        return cls(tree["trainable"], tree["opt_state"], tree["rng"])


@dataclass
class StepOutput:
    """One step's results: the new state, metrics (device scalars), k* per token `[B, T]` (the hint the
    loss chose), seconds per phase, the serving weights (when asked) and the reward baseline subtracted."""

    state: TrainState
    metrics: dict[str, jax.Array]
    k_star: jax.Array
    times: dict[str, float] = field(default_factory=dict)
    serving: nnx.State | None = None
    baseline: float | None = None


def step_settings(cfg: ExperimentConfig, samples: SampleSpec) -> S.StepSettings:
    """The static settings of the jitted phases: the loss, tau (the samples' temperature), chunking, dtype."""
    compute = cfg.model.dtype if cfg.model.dtype != cfg.model.param_dtype else None
    return S.StepSettings(loss=cfg.loss, temperature=samples.temperature, chunk_size=cfg.trainer.chunk_size,
                          compute_dtype=compute, micro_batch_size=cfg.trainer.micro_batch_size)


def batch_shards(samples_per_step: int, mesh: jax.sharding.Mesh) -> int:
    """Batch rows go over ("data", "fsdp") when the samples divide evenly over them (else 1: replicated);
    packed row counts are multiples of this."""
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    return n if samples_per_step % n == 0 else 1


def batch_spec(cfg: ExperimentConfig, samples: SampleSpec, *, row_multiple: int = 1, pad_id: int = 0,
               images: tuple[Any, int] | None = None) -> BatchSpec:
    """How the trainer batches samples (`row_multiple`: the batch shards; `images`: a QwenVL student's
    (ImageProcessorConfig, image token id))."""
    tcfg = cfg.trainer
    return BatchSpec(
        batch_size=tcfg.samples_per_step, max_candidates=samples.max_candidates,
        min_seq_bucket=tcfg.min_seq_bucket, max_seq_len=tcfg.max_seq_len,
        min_response_bucket=tcfg.min_response_bucket, rl_only_teacher=tcfg.rl_only_teacher,
        use_hints=cfg.loss.uses_hints, max_staleness=tcfg.max_staleness, staleness_mode=tcfg.staleness_mode,
        pad_id=pad_id, temperature=samples.temperature, packing=tcfg.packing, bucket_quantum=tcfg.bucket_quantum,
        micro_batch_size=tcfg.micro_batch_size, row_multiple=row_multiple, shared_prefix=tcfg.shared_prefix_teacher,
        shape_reuse_slack=tcfg.shape_reuse_slack, batch_prefix_min=tcfg.batch_prefix_min,
        reference=cfg.loss.kl_coef != 0, image_processor=images[0] if images else None,
        image_token_id=images[1] if images else None, holdout_every=cfg.gate.holdout)


def optimizer_shardings(tx, trainable: Any, mesh: jax.sharding.Mesh) -> Any:
    """Shardings of `tx.init(trainable)`: every moment leaf like the param it mirrors (matched by
    key-path suffix and shape), scalars (counts) replicated. Without this the init's outputs,
    which do not depend on the params' values, may come out replicated on every device."""
    by_path = {tuple(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(trainable)}
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(path, leaf):
        path = tuple(path)
        for k in range(len(path)):
            param = by_path.get(path[k:])
            if param is not None and tuple(param.shape) == tuple(leaf.shape):
                return param.sharding
        return replicated

    abstract = jax.eval_shape(tx.init, trainable)
    return jax.tree_util.tree_map_with_path(pick, abstract)


def trained_params(student: nnx.Module, cfg: ExperimentConfig) -> Any:
    """The NNX filter of the params the trainer updates: the LoRA adapters or every param, less the
    modules `trainer.freeze` names (each must be a top-level module of `student`)."""
    trained = LoRAParam if cfg.model.lora.enabled else nnx.Param
    if not cfg.trainer.freeze:
        return trained
    modules = [name for name, value in vars(student).items() if isinstance(value, nnx.Module)]
    unknown = [name for name in cfg.trainer.freeze if name not in modules]
    if unknown:
        raise ValueError(f"trainer.freeze={list(cfg.trainer.freeze)}: {unknown} is not a top-level module of the "
                         f"{type(student).__name__} student; its modules are {modules}")
    return nnx.All(trained, *(nnx.Not(nnx.PathContains(name)) for name in cfg.trainer.freeze))


def jit_phases(settings: S.StepSettings, tx, schedule, trainable_shardings, opt_shardings, *, merge_lora: bool,
               importance_cap: float, importance: bool = False) -> dict[str, Callable]:
    """The jitted phases of one step (the planner lowers these same objects)."""
    train = functools.partial(S.train_step, settings=settings, optimizer=tx, lr_schedule=schedule)
    serving = functools.partial(S.train_step_serving, settings=settings, optimizer=tx, lr_schedule=schedule,
                                merge_lora=merge_lora, serving_dtype=settings.compute_dtype)
    fused = functools.partial(F.fused_train_step, settings=settings, optimizer=tx, lr_schedule=schedule,
                              importance_cap=importance_cap if importance else None, merge_lora=merge_lora)
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
        "importance": jax.jit(functools.partial(A.importance_weighted, cap=importance_cap)),
        "train_step": jax.jit(train, donate_argnums=(1, 3),
                              out_shardings=(trainable_shardings, opt_shardings, None, None)),
        # the same step, also emitting the serving weights (compute dtype, LoRA merged) for a weight sync
        "train_step_serving": jax.jit(serving, donate_argnums=(1, 3),
                                      out_shardings=(trainable_shardings, opt_shardings, None, None, None)),
    }


class StepRunner:
    """The student (full or LoRA) and the frozen teacher on one mesh, and the step over them."""

    def __init__(self, cfg: ExperimentConfig, samples: SampleSpec, mesh: jax.sharding.Mesh, graphdef: nnx.GraphDef,
                 trainable: nnx.State, frozen: nnx.State, teacher_graphdef: nnx.GraphDef, teacher_state: nnx.State,
                 *, pad_id: int = 0, images: tuple[Any, int] | None = None):
        """From split states, concrete or abstract (`jax.ShapeDtypeStruct`s with shardings: the planner);
        `from_models` splits the models."""
        tcfg, opt = cfg.trainer, cfg.trainer.optimizer
        self.mesh = mesh
        self.merge_lora = cfg.model.lora.enabled
        self.master_dtype, self.compute_dtype = cfg.model.param_dtype, cfg.model.dtype
        self.reward_baseline = tcfg.reward_baseline
        self.importance = tcfg.staleness_mode == "importance"
        self.graphdef, self.frozen = graphdef, frozen
        self.teacher_graphdef, self.teacher_state = teacher_graphdef, teacher_state
        self.settings = step_settings(cfg, samples)
        self.tx, self.schedule = S.make_optimizer(
            opt.lr, warmup_steps=opt.warmup_steps, weight_decay=opt.weight_decay, b1=opt.b1, b2=opt.b2, eps=opt.eps,
            grad_clip=opt.grad_clip, decay_steps=tcfg.max_steps if opt.schedule == "cosine" else 0,
            final_lr_ratio=opt.final_lr_ratio)
        self.trainable_shardings = jax.tree.map(lambda x: x.sharding, trainable)
        self.opt_shardings = optimizer_shardings(self.tx, trainable, mesh)
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
        self.phases = jit_phases(self.settings, self.tx, self.schedule, self.trainable_shardings, self.opt_shardings,
                                 merge_lora=self.merge_lora, importance_cap=tcfg.importance_cap,
                                 importance=self.importance)
        self._initial_trainable = trainable
        self._serving_graphdef: nnx.GraphDef | None = None
        self._importance_cap = tcfg.importance_cap
        self._image_phases: dict[tuple, dict[str, Callable]] = {}

    def phases_for(self, image_grid: tuple = ()) -> dict[str, Callable]:
        """The jitted phases for batches whose rows hold images of `image_grid` (static under jit: one set
        of phases per grid; `()`: text batches)."""
        if not image_grid:
            return self.phases
        if image_grid not in self._image_phases:
            self._image_phases[image_grid] = jit_phases(
                dataclasses.replace(self.settings, image_grid=image_grid), self.tx, self.schedule,
                self.trainable_shardings, self.opt_shardings, merge_lora=self.merge_lora,
                importance_cap=self._importance_cap)
        return self._image_phases[image_grid]

    @classmethod
    def from_models(cls, cfg: ExperimentConfig, samples: SampleSpec, student: nnx.Module, teacher: nnx.Module,
                    mesh: jax.sharding.Mesh, *, pad_id: int = 0) -> "StepRunner":
        """The runner over the student (its LoRA adapters or all params trained) and the frozen teacher,
        which runs in the compute dtype only: it is held there (half the bytes in bf16)."""
        graphdef, trainable, frozen = nnx.split(student, trained_params(student, cfg), ...)
        teacher_graphdef, teacher_state = nnx.split(teacher)
        teacher_state = jax.jit(functools.partial(S.cast_floating, dtype=cfg.model.dtype))(teacher_state)
        images = None
        vl_cfg = getattr(student, "vl_cfg", None)   # a QwenVL student: its samples' images go into the batches
        if vl_cfg is not None:

            images = (ImageProcessorConfig.for_vision(vl_cfg.vision), int(vl_cfg.image_token_id))
        return cls(cfg, samples, mesh, graphdef, trainable, frozen, teacher_graphdef, teacher_state, pad_id=pad_id,
                   images=images)

    def init_state(self, seed: int) -> TrainState:
        """The first state (once): the student's params, a fresh optimizer state, the rng of `seed` (all on
        the mesh)."""
        trainable, self._initial_trainable = self._initial_trainable, None
        with jax.set_mesh(self.mesh):
            opt_state = jax.jit(self.tx.init, out_shardings=self.opt_shardings)(trainable)
        # on the mesh like every checkpointed leaf (orbax saves only global arrays from several processes)
        rng = multihost.place(np.asarray(jax.random.key_data(jax.random.key(seed))),
                              NamedSharding(self.mesh, PartitionSpec()))
        return TrainState(trainable, opt_state, rng)

    # ------------------------------------------------------------------ serving weights

    def serving_model(self, state: TrainState, dtype: str | None = "compute") -> nnx.Module:
        """The student as a plain model (LoRA merged) for serving and export: `dtype` "compute"
        (model.dtype: what serving and weight sync get), "master" (model.param_dtype) or a dtype name."""
        target = {"compute": self.compute_dtype, "master": self.master_dtype}.get(dtype, dtype)
        return S.serving_model(self.graphdef, state.trainable, self.frozen, merge_lora=self.merge_lora, dtype=target)

    def serving_graphdef(self, state: TrainState) -> nnx.GraphDef:
        """The graphdef of `serving_model(state)` (traced once, abstractly: no weights are computed)."""
        if self._serving_graphdef is None:
            self._serving_graphdef = nnx.split(nnx.eval_shape(lambda: self.serving_model(state)))[0]
        return self._serving_graphdef

    # ------------------------------------------------------------------ one step

    def put(self, arrays: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Host arrays of a batch onto the mesh (rows over the batch shards)."""
        return {k: multihost.place(v, self.batch_sharding) for k, v in arrays.items()}

    def _no_teacher(self, bc: tuple[int, int], btk: tuple[int, int, int]) -> S.TeacherPassOutput:
        """Zeros in the teacher pass's shapes, for a batch without any hint candidate."""
        (b, c), (_, t, k) = bc, btk
        zeros = self.put({"ids": np.zeros((b, c, t, k), np.int32), "lp": np.zeros((b, c, t, k), np.float32),
                          "tok": np.zeros((b, c, t), np.float32)})
        return S.TeacherPassOutput(zeros["ids"], zeros["lp"], zeros["lp"], zeros["tok"])

    def run_phases(self, call: Callable[..., Any], trainable: nnx.State, opt_state: Any, inputs: S.StudentInputs,
                   teacher_inputs: S.TeacherInputs, *, run_teacher: bool, folded_reference: bool, serve: bool,
                   no_teacher: Callable[[], S.TeacherPassOutput] | None = None) -> tuple:
        """The phases in their order, each through `call(name, *args)` (the step runs the jitted phase and
        times it; the planner lowers and compiles it). Returns `call`'s results of the train step."""
        if self.fused:   # one program: the old pass is the train step's own forward (fused_step.py)
            return call("fused_step_serving" if serve else "fused_step", self.graphdef, trainable, self.frozen,
                        opt_state, inputs, self.teacher_graphdef, self.teacher_state, teacher_inputs, run_teacher,
                        folded_reference)
        student = (trainable, self.frozen)
        old = call("old_pass", self.graphdef, student, inputs)
        if run_teacher:
            teach = call("teacher_pass", self.teacher_graphdef, self.teacher_state, teacher_inputs,
                         inputs.response_ids, old.topk_ids)
            old_at = call("old_logprobs_at", self.graphdef, student, old.hidden, teach.topk_ids)
        else:  # `rl`, or no sample with a candidate (candidate_mask 0): the loss reads no teacher output
            teach = no_teacher()
            old_at = teach.logprobs_at_student_ids
        ref = None
        if self.settings.loss.kl_coef != 0:   # the KL anchor: the teacher pass placed it, or the reference pass
            ref = teach.reference_logprobs if folded_reference else call(
                "reference_pass", self.teacher_graphdef, self.teacher_state, inputs)
        advantages = None
        if self.importance:   # the advantages' last touch (trainer/advantages.py), where pi_old is known
            advantages = call("importance", inputs.advantages, old.old_logprobs, inputs.rollout_logprobs,
                              inputs.response_mask)
        batch = S.assemble_batch(inputs, teacher_inputs, old, teach, old_at, advantages, ref)
        args = (self.graphdef, trainable, self.frozen, opt_state, inputs, batch)
        return call("train_step_serving", *args) if serve else call("train_step", *args)

    def step(self, state: TrainState, packed: PackedBatch, *, serve: bool = False) -> StepOutput:
        """One optimizer step on `packed` (its advantages are finished here: the reward baseline, then the
        importance correction); `serve`: also the updated serving weights. `state` is donated."""
        baseline = A.apply_reward_baseline(packed, self.reward_baseline)
        times: dict[str, float] = {}
        phases = self.phases_for(packed.image_grid)

        def call(name, *args):   # the forward passes are timed on their own; the rest counts as the train step
            t = time.perf_counter()
            out = phases[name](*args)
            if name in ("old_pass", "teacher_pass", "reference_pass"):
                out = jax.block_until_ready(out)
                times[name] = time.perf_counter() - t
            return out

        t0 = time.perf_counter()
        with jax.set_mesh(self.mesh):
            inputs = S.StudentInputs(**self.put(packed.student))
            teacher_inputs = S.TeacherInputs(**self.put(packed.teacher))
            out = self.run_phases(
                call, state.trainable, state.opt_state, inputs, teacher_inputs, serve=serve,
                run_teacher=self.spec.use_hints and packed.has_teacher,
                folded_reference="reference_offset" in packed.teacher,
                no_teacher=lambda: self._no_teacher(teacher_inputs.candidate_mask.shape,
                                                    (len(packed.student["sample_mask"]),
                                                     packed.student["response_ids"].shape[1], self.settings.top_k)))
            trainable, opt_state, metrics, k_star = out[:4]
            times.setdefault("teacher_pass", 0.0)   # no candidate in the batch (or `rl`): no teacher pass ran
            metrics = multihost.tree_to_host(metrics)
            times["train_step"] = time.perf_counter() - t0 - sum(times.values())
        times["step"] = time.perf_counter() - t0
        return StepOutput(TrainState(trainable, opt_state, state.rng), metrics, k_star, times,
                          out[4] if serve else None, baseline)
