"""The stateful trainer: owns params, optimizer state and the jitted phases; trains on batches.

`Trainer.train_on(packed)` runs one step (docs/design.md §7) on a `PackedBatch` and returns its
metrics; `Trainer.run(...)` is the asyncio loop that waits for samples in the store, trains,
pushes weights to the serving pool, logs to TensorBoard and checkpoints. The pure functions
it calls live in `step.py`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from typing import Any, Awaitable, Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from openclaw_jax.config import ExperimentConfig
from openclaw_jax.samples import SampleTail
from openclaw_jax.losses import overlap_counts, select_hint
from openclaw_jax.models.lora import LoRAParam
from openclaw_jax.parallel import multihost
from openclaw_jax.pool.weight_sync import BackgroundWeightSync
from openclaw_jax.trainer import step as S
from openclaw_jax.trainer.advantages import apply_reward_baseline
from openclaw_jax.trainer.batcher import BatchSpec, PackedBatch, SampleBatcher, shape_ladder
from openclaw_jax.trainer.checkpoint import Checkpointer
from openclaw_jax.trainer.metrics import MetricsWriter

log = logging.getLogger(__name__)

# A weight push: (plain-model state, version) -> awaitable; see pool/weight_sync.py.
WeightPush = Callable[[nnx.GraphDef, nnx.State, str], Awaitable[None]]


_WAIT, _TRAIN, _STOP = 0, 1, 2


def _agree_on_window(action: int, end: int) -> tuple[int, int]:
    """Process 0's (action, window end) for every process; a stop anywhere stops everyone."""
    if not multihost.is_multiprocess():
        return action, end
    rows = multihost.agree([action, end])
    if (rows[:, 0] == _STOP).any():
        return _STOP, 0
    return int(rows[0, 0]), int(rows[0, 1])


def _k_star(student_ids, teacher_ids, candidate_mask, token_mask, mode):
    return select_hint(overlap_counts(student_ids, teacher_ids), candidate_mask, token_mask, mode)


def step_settings(cfg: ExperimentConfig) -> S.StepSettings:
    """The static settings of the jitted phases for an experiment config."""
    tcfg = cfg.trainer
    compute = cfg.model.dtype if cfg.model.dtype != cfg.model.param_dtype else None
    return S.StepSettings(loss_name=tcfg.method, loss=cfg.loss, temperature=tcfg.temperature, top_k=tcfg.top_k,
                          chunk_size=tcfg.chunk_size, compute_dtype=compute,
                          micro_batch_size=tcfg.micro_batch_size)


def make_optimizer(cfg: ExperimentConfig):
    opt = cfg.trainer.optimizer
    decay_steps = cfg.trainer.max_steps if opt.schedule == "cosine" else 0
    return S.make_optimizer(opt.lr, warmup_steps=opt.warmup_steps, weight_decay=opt.weight_decay, b1=opt.b1,
                            b2=opt.b2, eps=opt.eps, grad_clip=opt.grad_clip, decay_steps=decay_steps,
                            final_lr_ratio=opt.final_lr_ratio)


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


def jit_phases(cfg: ExperimentConfig, settings: S.StepSettings, tx, schedule, trainable_shardings,
               opt_shardings) -> dict[str, Callable]:
    """The jitted phases of one step, as the Trainer runs them (the planner lowers these same objects)."""
    return {
        "old_pass": jax.jit(functools.partial(S.old_pass, settings=settings)),
        "teacher_pass": jax.jit(functools.partial(S.teacher_pass, settings=settings)),
        "reference_pass": jax.jit(functools.partial(S.reference_pass, settings=settings)),
        "old_logprobs_at": jax.jit(functools.partial(S.old_logprobs_at, settings=settings)),
        "importance": jax.jit(functools.partial(S.importance_weights, cap=cfg.trainer.importance_cap)),
        "train_step": jax.jit(
            functools.partial(S.train_step, settings=settings, optimizer=tx, lr_schedule=schedule),
            donate_argnums=(1, 3), out_shardings=(trainable_shardings, opt_shardings, None)),
        # the same step, also emitting the serving weights (compute dtype, LoRA merged) for a weight sync
        "train_step_serving": jax.jit(
            functools.partial(S.train_step_serving, settings=settings, optimizer=tx, lr_schedule=schedule,
                              merge_lora=cfg.model.lora.enabled, serving_dtype=settings.compute_dtype),
            donate_argnums=(1, 3), out_shardings=(trainable_shardings, opt_shardings, None, None)),
        "k_star": jax.jit(functools.partial(_k_star, mode=cfg.loss.hint_selection)),
    }


def batch_sharding(cfg: ExperimentConfig, mesh: jax.sharding.Mesh) -> NamedSharding:
    """Batch rows over ("data", "fsdp") when they divide evenly, else replicated."""
    n_batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
    even = cfg.trainer.rollout_batch_size % n_batch_shards == 0
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")) if even else PartitionSpec())


def batch_row_multiple(cfg: ExperimentConfig, mesh: jax.sharding.Mesh) -> int:
    """Packed row counts must split over the batch shards like the samples do (`batch_sharding`)."""
    n_batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
    return n_batch_shards if cfg.trainer.rollout_batch_size % n_batch_shards == 0 else 1


def batch_spec(cfg: ExperimentConfig, *, row_multiple: int = 1, pad_id: int = 0) -> BatchSpec:
    """How the trainer batches samples for an experiment config (`row_multiple`: the batch shards)."""
    tcfg = cfg.trainer
    return BatchSpec(
        batch_size=tcfg.rollout_batch_size, max_candidates=cfg.gateway.max_candidates,
        min_seq_bucket=tcfg.min_seq_bucket, max_seq_len=tcfg.max_seq_len,
        min_response_bucket=tcfg.min_response_bucket, rl_only_teacher=tcfg.rl_only_teacher,
        use_hints=tcfg.uses_hints,
        max_staleness=tcfg.max_staleness, staleness_mode=tcfg.staleness_mode, pad_id=pad_id,
        temperature=tcfg.temperature, packing=tcfg.packing, bucket_quantum=tcfg.bucket_quantum,
        micro_batch_size=tcfg.micro_batch_size, row_multiple=row_multiple,
        shared_prefix=tcfg.shared_prefix_teacher, shape_reuse_slack=tcfg.shape_reuse_slack,
        batch_prefix_min=tcfg.batch_prefix_min,
        reference=cfg.loss.kl_coef != 0)


class Trainer:
    """Student (full or LoRA) + frozen teacher on one mesh, optax state, and the step phases."""

    def __init__(self, cfg: ExperimentConfig, student: nnx.Module, teacher: nnx.Module,
                 mesh: jax.sharding.Mesh, *, pad_id: int = 0):
        self.cfg = cfg
        self.mesh = mesh
        self.trainable_filter = LoRAParam if cfg.model.lora.enabled else nnx.Param
        self.graphdef, self.trainable, self.frozen = nnx.split(student, self.trainable_filter, ...)
        # The frozen teacher runs in the compute dtype only: hold it there (half the bytes in bf16).
        self.teacher_graphdef, teacher_state = nnx.split(teacher)
        self.teacher_state = jax.jit(functools.partial(S.cast_floating, dtype=cfg.model.dtype))(teacher_state)
        self.settings = step_settings(cfg)
        self.tx, self.schedule = make_optimizer(cfg)
        trainable_shardings = jax.tree.map(lambda x: x.sharding, self.trainable)
        opt_shardings = optimizer_shardings(self.tx, self.trainable, mesh)
        with jax.set_mesh(mesh):
            self.opt_state = jax.jit(self.tx.init, out_shardings=opt_shardings)(self.trainable)
        self.step = 0
        self.sample_offset = 0
        # (step, first offset, end offset) trained since the last checkpoint; written to the
        # run's `steps.jsonl` when a checkpoint makes them durable.
        self._uncommitted_windows: list[tuple[int, int, int]] = []
        # k* per trained token and the hints of the last step, for TensorBoard
        self._last_k_star = np.zeros((0,), np.int32)
        self._last_hints: list[str] = []
        # on the mesh like every checkpointed leaf (orbax saves only global arrays from several processes)
        self.rng = multihost.place(np.asarray(jax.random.key_data(jax.random.key(cfg.seed))),
                                   NamedSharding(mesh, PartitionSpec()))
        self.spec = batch_spec(cfg, row_multiple=batch_row_multiple(cfg, mesh), pad_id=pad_id)
        self._batch_sharding = batch_sharding(cfg, mesh)
        self._shapes_seen: set[tuple] = set()   # phase shapes trained on (`PackedBatch.phase_keys`): each compiles once
        self.shape_ladder = shape_ladder(self.spec)
        log.info("compiled step shapes: at most %d (student %d: rows %s x lengths %s x responses %s; teacher %d)",
                 self.shape_ladder.bound, self.shape_ladder.student_shapes, list(self.shape_ladder.student_rows),
                 list(self.shape_ladder.student_lengths), list(self.shape_ladder.response),
                 self.shape_ladder.teacher_shapes)
        phases = jit_phases(cfg, self.settings, self.tx, self.schedule, trainable_shardings, opt_shardings)
        self._old_pass = phases["old_pass"]
        self._teacher_pass = phases["teacher_pass"]
        self._reference_pass = phases["reference_pass"]
        self._old_at = phases["old_logprobs_at"]
        self._importance = phases["importance"]
        self._train_step = phases["train_step"]
        self._train_step_serving = phases["train_step_serving"]
        # the serving weights the last `train_on(..., serve=True)` wrote, and their graphdef
        self._serving_state: nnx.State | None = None
        self._serving_graphdef: nnx.GraphDef | None = None
        self._k_star = phases["k_star"]

    # ------------------------------------------------------------------ state

    def train_state(self) -> dict[str, Any]:
        return {"trainable": self.trainable, "opt_state": self.opt_state, "rng": self.rng}

    def load_train_state(self, state: dict[str, Any], meta: dict[str, Any]) -> None:
        self.trainable = state["trainable"]
        self.opt_state = state["opt_state"]
        self.rng = state["rng"]
        self.step = int(meta["step"])
        self.sample_offset = int(meta["sample_offset"])

    @property
    def weight_version(self) -> str:
        return str(self.step)

    def serving_model(self, dtype: str | None = "compute") -> nnx.Module:
        """The current student as a plain model (LoRA merged) for serving and export.

        `dtype`: "compute" (model.dtype: what serving and weight sync get), "master"
        (model.param_dtype: checkpoints/exports), or a dtype name. LoRA is merged in the master
        dtype before any cast. The params are new arrays whenever a cast happens.
        """
        model = nnx.merge(self.graphdef, self.trainable, self.frozen)
        if self.cfg.model.lora.enabled:
            from openclaw_jax.models.lora import merge_lora

            model = merge_lora(model)
        target = {"compute": self.cfg.model.dtype, "master": self.cfg.model.param_dtype}.get(dtype, dtype)
        if target is not None and target != self.cfg.model.param_dtype:
            graphdef, state = nnx.split(model)
            model = nnx.merge(graphdef, jax.jit(functools.partial(S.cast_floating, dtype=target))(state))
            model.cfg = model.cfg.replace(param_dtype=target)
        return model

    # ------------------------------------------------------------------ one step

    def _no_teacher(self, bc: tuple[int, int], btk: tuple[int, int, int]) -> S.TeacherPassOutput:
        """Zeros in the teacher pass's shapes, for a batch without any hint candidate."""
        (b, c), (_, t, k) = bc, btk
        zeros = self._put({"ids": np.zeros((b, c, t, k), np.int32), "lp": np.zeros((b, c, t, k), np.float32),
                           "tok": np.zeros((b, c, t), np.float32)})
        return S.TeacherPassOutput(zeros["ids"], zeros["lp"], zeros["lp"], zeros["tok"])

    def _put(self, arrays: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return {k: multihost.place(v, self._batch_sharding) for k, v in arrays.items()}

    def serving_graphdef(self) -> nnx.GraphDef:
        """The graphdef of `serving_model()` (traced once, abstractly: no weights are computed)."""
        if self._serving_graphdef is None:
            self._serving_graphdef = nnx.split(nnx.eval_shape(self.serving_model))[0]
        return self._serving_graphdef

    def take_serving_weights(self) -> tuple[nnx.GraphDef, nnx.State]:
        """The serving model (as `serving_model()`) the last `train_on(..., serve=True)` produced inside
        its jitted step: arrays of their own that later (donating) steps leave alone. Taken once."""
        if self._serving_state is None:
            raise RuntimeError("no serving weights: call train_on(packed, serve=True) before taking them")
        state, self._serving_state = self._serving_state, None
        return self.serving_graphdef(), state

    def train_on(self, packed: PackedBatch, *, serve: bool = False) -> dict[str, float]:
        """One optimizer step on `packed`; returns host metrics (the metric names of docs/design.md §6 plus step extras).

        `serve`: the step also writes the updated weights for serving (`take_serving_weights`)."""
        baseline = apply_reward_baseline(packed, self.cfg.trainer.reward_baseline)
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        with jax.set_mesh(self.mesh):
            inputs = S.StudentInputs(**self._put(packed.student))
            teacher_inputs = S.TeacherInputs(**self._put(packed.teacher))
            state = (self.trainable, self.frozen)
            old = jax.block_until_ready(self._old_pass(self.graphdef, state, inputs))
            times["old_pass"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            run_teacher = self.spec.use_hints and packed.has_teacher
            folded_reference = "reference_offset" in packed.teacher   # the teacher pass gives the reference
            if run_teacher:
                teach = jax.block_until_ready(self._teacher_pass(
                    self.teacher_graphdef, self.teacher_state, teacher_inputs, inputs.response_ids, old.topk_ids))
            else:  # `rl`, or no sample with a candidate (candidate_mask 0): the loss reads no teacher output
                teach = self._no_teacher(teacher_inputs.candidate_mask.shape, old.topk_ids.shape)
            times["teacher_pass"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            if run_teacher:
                old_at = self._old_at(self.graphdef, state, old.hidden, teach.topk_ids)
            else:
                old_at = teach.logprobs_at_student_ids
            weights = None
            if self.cfg.trainer.staleness_mode == "importance":
                weights = self._importance(old.old_logprobs, inputs.rollout_logprobs, inputs.response_mask)
            ref = None
            if self.cfg.loss.kl_coef != 0 and folded_reference:
                ref = teach.reference_logprobs
            elif self.cfg.loss.kl_coef != 0:  # the frozen base model (the teacher's weights) on the student's rows
                t3 = time.perf_counter()
                ref = jax.block_until_ready(self._reference_pass(self.teacher_graphdef, self.teacher_state, inputs))
                times["reference_pass"] = time.perf_counter() - t3
            batch = S.assemble_batch(inputs, teacher_inputs, old, teach, old_at, weights, ref)
            k_star = self._k_star(old.topk_ids, teach.topk_ids, teacher_inputs.candidate_mask,
                                  inputs.response_mask)
            if serve:
                self.trainable, self.opt_state, metrics, self._serving_state = self._train_step_serving(
                    self.graphdef, self.trainable, self.frozen, self.opt_state, inputs, batch)
            else:
                self.trainable, self.opt_state, metrics = self._train_step(
                    self.graphdef, self.trainable, self.frozen, self.opt_state, inputs, batch)
            metrics = multihost.tree_to_host(metrics)
            times["train_step"] = time.perf_counter() - t2
        self.step += 1
        total = time.perf_counter() - t0
        out = {k: float(v) for k, v in metrics.items()}
        out.update(self._batch_stats(packed))
        mask = packed.student["response_mask"]
        tokens = float(mask.sum() + sum(len(s.prompt_ids) for s in packed.samples))
        out.update({f"time/{k}": v for k, v in times.items()})
        out["time/step"] = total
        out["tokens_per_s"] = tokens / max(total, 1e-9)
        n_real = len(packed.samples)
        out["rollout/prm_eval_score"] = float(np.mean([s.eval_score for s in packed.samples]))
        out["rollout/reward"] = float(np.mean([s.reward for s in packed.samples]))
        if baseline is not None:
            out["rollout/reward_baseline"] = baseline
        for kind in ("opd+rl", "opd", "rl"):  # TensorBoard tags cannot hold "+"
            out[f"samples/{kind.replace('+', '_')}"] = float(packed.kinds.get(kind, 0))
        out["samples/per_step"] = float(n_real)
        out["staleness/mean"] = float(packed.staleness.mean()) if n_real else 0.0
        out["staleness/max"] = float(packed.staleness.max()) if n_real else 0.0
        self._last_k_star = multihost.to_host(k_star)[np.asarray(mask) > 0]
        self._last_hints = [h for s in packed.samples for h in s.hints]
        return out

    def _batch_stats(self, packed: PackedBatch) -> dict[str, float]:
        """Padding (padded / total token slots of the model inputs) and the compiled-shape count."""
        for key in packed.phase_keys():
            if key is not None and key not in self._shapes_seen:
                self._shapes_seen.add(key)
                log.info("new %s shape %s, responses %d: %d step shapes compiled so far (at most %d)", key[0],
                         key[1], key[-1], len(self._shapes_seen), self.shape_ladder.bound)
        return {"batch/padding_fraction": packed.padding_fraction(),
                "batch/student_padding_fraction": packed.padding_fraction("student"),
                "batch/teacher_padding_fraction": packed.padding_fraction("teacher"),
                "batch/student_rows": float(packed.student["input_ids"].shape[0]),
                "batch/compiled_shapes": float(len(self._shapes_seen))}

    # ------------------------------------------------------------------ the loop

    async def run(self, store_dir: str, *, checkpointer: Checkpointer | None, writer: MetricsWriter | None,
                  push_weights: WeightPush | None, stop: asyncio.Event,
                  on_step: Callable[[int, dict[str, float]], Awaitable[None] | None] | None = None,
                  progress: Callable[[str], None] | None = None) -> None:
        """Train until `trainer.max_steps` or `stop`: wait for samples, step, sync, log, checkpoint.

        With several processes, process 0 decides each window (it sees the store first: its gateway
        writes it) and every process trains on the same window; a stop on any process stops all.
        """
        tcfg = self.cfg.trainer
        store = await self._open_store(store_dir, stop)
        if store is None:
            return
        batcher = SampleBatcher(store, self.spec)  # one reader for the run: each step reads only its window
        syncer = BackgroundWeightSync(push_weights) if push_weights is not None else None
        if syncer is not None:
            self.serving_graphdef()  # traced now, so that no hand-off waits for it
        last_arrival = time.monotonic()
        try:
            while True:
                available = store.refresh()
                waiting = available - self.sample_offset
                if progress is not None:
                    progress(f"step {self.step}/{tcfg.max_steps}  samples waiting {waiting}")
                action, end = _WAIT, 0
                if self.step >= tcfg.max_steps or stop.is_set():
                    action = _STOP
                elif waiting >= tcfg.rollout_batch_size:
                    action, end = _TRAIN, self.sample_offset + tcfg.rollout_batch_size
                elif tcfg.wait_timeout_s and time.monotonic() - last_arrival > tcfg.wait_timeout_s:
                    log.warning("no new samples for %.0f s; stopping", tcfg.wait_timeout_s)
                    action = _STOP
                action, end = await asyncio.to_thread(_agree_on_window, action, end)
                if action == _STOP:
                    break
                if action == _WAIT:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=0.25)
                    except asyncio.TimeoutError:
                        pass
                    continue
                last_arrival = time.monotonic()
                start, stop_offset = self.sample_offset, end
                if available < stop_offset:  # another process decided: its fsynced records reach us shortly
                    await self._wait_for_records(store, stop_offset)
                packed = next(iter(batcher.batches(start, stop_offset, current_version=self.step)), None)
                if packed is None:  # every sample of the window was dropped (stale or too long)
                    self._uncommitted_windows.append((self.step, start, stop_offset))
                    self.sample_offset = stop_offset
                    continue
                sync_now = syncer is not None and (self.step + 1) % tcfg.sync_every == 0
                metrics = await asyncio.to_thread(self.train_on, packed, serve=sync_now)
                self.sample_offset = stop_offset
                self._uncommitted_windows.append((self.step, start, stop_offset))
                metrics["samples/dropped_stale"] = float(batcher.dropped["stale"])
                metrics["samples/dropped_temperature"] = float(batcher.dropped["temperature"])
                metrics["samples/dropped_hint_only"] = float(batcher.dropped["hint_only"])
                metrics["samples/waiting"] = float(max(available - self.sample_offset, 0))
                if sync_now:
                    # Only the hand-off blocks the trainer. The step itself wrote the serving weights
                    # (arrays the next, donating step leaves alone): one process hands them over as they
                    # are; several gather them to the host first (a collective, at the same step on all).
                    t = time.perf_counter()
                    graphdef, state = self.take_serving_weights()
                    if multihost.is_multiprocess():
                        state = await asyncio.to_thread(multihost.tree_to_host, state)
                    syncer.submit(graphdef, state, self.weight_version)
                    metrics["time/weight_sync_blocking"] = time.perf_counter() - t
                if syncer is not None:
                    if syncer.last_duration_s is not None:
                        metrics["time/weight_sync"] = syncer.last_duration_s
                    metrics["weight_sync/failures"] = float(syncer.failures)
                    metrics["weight_sync/superseded"] = float(syncer.superseded)
                metrics["weight_version"] = float(self.step)
                if writer is not None and self.step % tcfg.log_every == 0:
                    writer.scalars(self.step, metrics)
                    writer.histogram(self.step, "sel_k_star", self._last_k_star)
                    if self._last_hints:
                        writer.text(self.step, "hints", "\n\n".join(f"- {h}" for h in self._last_hints))
                    writer.flush()
                if checkpointer is not None and tcfg.checkpoint_every and self.step % tcfg.checkpoint_every == 0:
                    await asyncio.to_thread(self.save_checkpoint, checkpointer)
                if on_step is not None:
                    result = on_step(self.step, metrics)
                    if asyncio.iscoroutine(result):
                        await result
        finally:
            store.close()
            if syncer is not None:  # the pool ends on the newest weights
                await syncer.flush()

    async def _open_store(self, store_dir: str, stop: asyncio.Event) -> SampleTail | None:
        """The run's one reader of the store, from the sample offset on. Processes other than 0 may start before process 0's gateway has
        created it: they wait (up to `trainer.store_wait_s`) rather than fail."""
        deadline = time.monotonic() + self.cfg.trainer.store_wait_s
        while not os.path.isdir(store_dir):
            if time.monotonic() > deadline:
                raise FileNotFoundError(
                    f"sample store {store_dir!r} did not appear within trainer.store_wait_s="
                    f"{self.cfg.trainer.store_wait_s} s; process 0's gateway creates it: is process 0 running, and "
                    "is run_dir on a filesystem every process shares?")
            if stop.is_set():
                return None
            await asyncio.sleep(0.2)
        return SampleTail(store_dir, start=self.sample_offset)

    async def _wait_for_records(self, store: SampleTail, end: int) -> None:
        deadline = time.monotonic() + self.cfg.trainer.store_wait_s
        while store.refresh() < end:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"process {jax.process_index()}: process 0 trains on samples up to offset {end}, but only "
                    f"{len(store)} are visible here after {self.cfg.trainer.store_wait_s} s; run_dir must be on a "
                    "filesystem every process shares")
            await asyncio.sleep(0.05)

    @staticmethod
    def _step_log(checkpointer: Checkpointer):
        return checkpointer.directory.parent / "steps.jsonl"

    def save_checkpoint(self, checkpointer: Checkpointer) -> None:
        """Log the sample windows trained since the last checkpoint, then checkpoint (params,
        optimizer, rng, step, sample offset). A crash between the two leaves log entries past the
        checkpoint; `restore` drops them, so the log always describes the restored state."""
        if self._uncommitted_windows and jax.process_index() == 0:
            with open(self._step_log(checkpointer), "a") as f:
                for step, start, end in self._uncommitted_windows:
                    f.write(json.dumps({"step": step, "start_offset": start, "end_offset": end}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        self._uncommitted_windows = []
        if checkpointer.latest_step() != self.step:
            checkpointer.save(self.step, self.train_state(), {
                "step": self.step, "sample_offset": self.sample_offset, "weight_version": self.weight_version})

    def _reconcile_step_log(self, checkpointer: Checkpointer) -> None:
        """Keep only the logged windows of steps the restored state has trained (last entry per step)."""
        path = self._step_log(checkpointer)
        if jax.process_index() != 0 or not path.exists():
            return
        entries: dict[int, str] = {}
        for line in path.read_text().splitlines():
            try:
                step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line from a crash
            if step <= self.step:
                entries[step] = line
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(entries[k] + "\n" for k in sorted(entries)))
        os.replace(tmp, path)

    def restore(self, checkpointer: Checkpointer) -> bool:
        restored = checkpointer.restore(self.train_state())
        if restored is not None:
            state, meta = restored
            self.load_train_state(state, meta)
            log.info("resumed at step %d, sample offset %d", self.step, self.sample_offset)
        self._reconcile_step_log(checkpointer)
        return restored is not None
