"""The train state: everything a training step reads and writes, as one pytree (docs/design.md §7).

`TrainState` holds the optimizer steps taken, the store offset of the next sample window, the
student's trained and frozen params, the frozen teacher, the optimizer state and the rng; the two
models' graphdefs are its static part. `train_step(state, batch) -> (state, metrics)`
(`train_step.py`) is the one function of it; `init_state` builds the first one from the models.

A checkpoint keeps what steps change: the trained params, the optimizer state and the rng as
arrays, the step and the sample offset as JSON metadata (`checkpoint_items`). The frozen params and
the teacher are the base model's own, read again from its files when a run starts, so they are not
written with every checkpoint (with LoRA they are nearly the whole model).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from openclaw_jax.models.lora import LoRAParam
from openclaw_jax.parallel import multihost
from openclaw_jax.trainer.step import cast_floating, make_optimizer

if TYPE_CHECKING:   # the type only: the config tree imports every section's package
    from openclaw_jax.config import ExperimentConfig

_STATIC = ("graphdef", "teacher_graphdef")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["step", "sample_offset", "trainable", "frozen", "teacher", "opt_state", "rng"],
                   meta_fields=list(_STATIC))
@dataclasses.dataclass(frozen=True)
class TrainState:
    """One training run's state (module doc). `step` is also the version of the weights it holds
    (`weight_version`); `sample_offset` the store offset the next window starts at. Concrete arrays
    on the trainer's mesh, or `jax.ShapeDtypeStruct`s with shardings (the planner's abstract state)."""

    step: int
    sample_offset: int
    trainable: nnx.State       # the trained params (LoRA adapters, or every param not frozen), master dtype
    frozen: nnx.State          # the student's other params
    teacher: nnx.State         # the frozen teacher (and the KL anchor's reference), compute dtype
    opt_state: Any
    rng: jax.Array
    graphdef: nnx.GraphDef
    teacher_graphdef: nnx.GraphDef

    def replace(self, **changes: Any) -> "TrainState":
        return dataclasses.replace(self, **changes)

    @property
    def weight_version(self) -> str:
        """The version name of the weights this state holds (what the pool serves after a sync)."""
        return str(self.step)

    @property
    def student(self) -> tuple[nnx.State, nnx.State]:
        """The student's states as `nnx.merge(state.graphdef, *state.student)` takes them."""
        return self.trainable, self.frozen

    def checkpoint_items(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(array tree, JSON metadata) of a checkpoint: `{"trainable", "opt_state", "rng"}` and `{"step",
        "sample_offset", "weight_version"}`, the layout checkpoints on disk have."""
        tree = {"trainable": self.trainable, "opt_state": self.opt_state, "rng": self.rng}
        return tree, {"step": self.step, "sample_offset": self.sample_offset, "weight_version": self.weight_version}

    def from_checkpoint(self, tree: dict[str, Any], meta: dict[str, Any]) -> "TrainState":
        """This state with a checkpoint's arrays and metadata (as `checkpoint_items` wrote them)."""
        return self.replace(trainable=tree["trainable"], opt_state=tree["opt_state"], rng=tree["rng"],
                            step=int(meta["step"]), sample_offset=int(meta["sample_offset"]))


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


def optimizer(cfg: ExperimentConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax optimizer and learning-rate schedule of `trainer.optimizer` (the cosine decay, when
    asked, reaches its floor at `trainer.max_steps`)."""
    opt = cfg.trainer.optimizer
    return make_optimizer(opt.lr, warmup_steps=opt.warmup_steps, weight_decay=opt.weight_decay, b1=opt.b1, b2=opt.b2,
                          eps=opt.eps, grad_clip=opt.grad_clip, final_lr_ratio=opt.final_lr_ratio,
                          decay_steps=cfg.trainer.max_steps if opt.schedule == "cosine" else 0)


def optimizer_shardings(tx: optax.GradientTransformation, trainable: Any, mesh: jax.sharding.Mesh) -> Any:
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


def init_optimizer_state(tx: optax.GradientTransformation, trainable: nnx.State, mesh: jax.sharding.Mesh) -> Any:
    """A fresh optimizer state for `trainable`, placed like it (`optimizer_shardings`)."""
    with jax.set_mesh(mesh):
        return jax.jit(tx.init, out_shardings=optimizer_shardings(tx, trainable, mesh))(trainable)


def init_state(cfg: ExperimentConfig, student: nnx.Module, teacher: nnx.Module, mesh: jax.sharding.Mesh,
               tx: optax.GradientTransformation) -> TrainState:
    """The first state: the student split into trained and frozen params (`trained_params`), the
    teacher cast to the compute dtype (`model.dtype`: it only runs there, so it is held there, half
    the bytes in bfloat16), a fresh state of the optimizer `tx` (`optimizer(cfg)`, the one the step
    then updates with) and the rng of `seed`, all on `mesh`; step 0, sample offset 0. The models'
    buffers become the state's (the step donates them)."""
    graphdef, trainable, frozen = nnx.split(student, trained_params(student, cfg), ...)
    teacher_graphdef, teacher_state = nnx.split(teacher)
    teacher_state = jax.jit(functools.partial(cast_floating, dtype=cfg.model.dtype))(teacher_state)
    # on the mesh like every checkpointed leaf (orbax saves only global arrays from several processes)
    rng = multihost.place(np.asarray(jax.random.key_data(jax.random.key(cfg.seed))),
                          NamedSharding(mesh, PartitionSpec()))
    return TrainState(step=0, sample_offset=0, trainable=trainable, frozen=frozen, teacher=teacher_state,
                      opt_state=init_optimizer_state(tx, trainable, mesh), rng=rng,
                      graphdef=graphdef, teacher_graphdef=teacher_graphdef)
