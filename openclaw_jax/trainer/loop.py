"""The trainer loop: wait for samples, run the step, sync weights, log, checkpoint.

`Trainer` holds the train state (`state.py`: one pytree, what a checkpoint keeps) and the step
(`train_step.py`: `state, metrics = train_step(state, batch)`); `Trainer.train_on(packed)` runs one
step and returns its host metrics; `Trainer.run(...)` is the asyncio loop over the sample store.
Weights reach the serving pool through the `WeightSync` it is given (train.py wraps the pool's push
in a background sync); the loop knows nothing of the pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

import jax
import numpy as np
from flax import nnx

from openclaw_jax.parallel import multihost
from openclaw_jax.samples import SampleSpec, SampleTail
from openclaw_jax.trainer.batch import PackedBatch
from openclaw_jax.trainer.checkpoint import Checkpointer
from openclaw_jax.trainer.input_pipeline import WindowPipeline
from openclaw_jax.trainer.metrics import MetricsWriter, person_stats
from openclaw_jax.trainer.state import TrainState, init_state, optimizer
from openclaw_jax.trainer.train_step import make_train_step, student_images

if TYPE_CHECKING:   # the type only: the config tree imports every section's package
    from openclaw_jax.config import ExperimentConfig

log = logging.getLogger(__name__)


class WeightSync(Protocol):
    """Hands new weights to the serving pool without blocking the trainer (pool/weight_sync.py's
    `BackgroundWeightSync` is one): `submit` returns at once, `flush` waits for the last push."""

    failures: int
    superseded: int
    last_duration_s: float | None

    def submit(self, graphdef: nnx.GraphDef, state: nnx.State, version: str) -> None: ...

    async def flush(self) -> None: ...


_WAIT, _TRAIN, _STOP = 0, 1, 2


def _agree_on_window(action: int, end: int) -> tuple[int, int]:
    """Process 0's (action, window end) for every process; a stop anywhere stops everyone."""
    if not multihost.is_multiprocess():
        return action, end
    rows = multihost.agree([action, end])
    if (rows[:, 0] == _STOP).any():
        return _STOP, 0
    return int(rows[0, 0]), int(rows[0, 1])


class Trainer:
    """The train state, the step over it, and the loop."""

    def __init__(self, cfg: ExperimentConfig, student: nnx.Module, teacher: nnx.Module,
                 mesh: jax.sharding.Mesh, *, samples: SampleSpec, pad_id: int = 0):
        self.cfg = cfg
        images = student_images(student)
        opt = optimizer(cfg)   # (optax transformation, schedule): the state holds its state, the step updates with it
        self.state: TrainState = init_state(cfg, student, teacher, mesh, opt[0])
        self.train_step = make_train_step(cfg, samples, self.state, mesh, opt, pad_id=pad_id, images=images)
        # (step, first offset, end offset) trained since the last checkpoint; written to the
        # run's `steps.jsonl` when a checkpoint makes them durable.
        self._uncommitted_windows: list[tuple[int, int, int]] = []
        # k* per trained token and the hints of the last step, for TensorBoard
        self._last_k_star = np.zeros((0,), np.int32)
        self._last_hints: list[str] = []
        self._shapes_seen: set[tuple] = set()   # phase shapes trained on (`PackedBatch.phase_keys`): each compiles once
        self._serving_state: nnx.State | None = None   # the serving weights the last `train_on(serve=True)` wrote
        ladder = self.train_step.shape_ladder
        log.info("compiled step shapes: at most %d (student %d: rows %s x lengths %s x responses %s; teacher %d)",
                 ladder.bound, ladder.student_shapes, list(ladder.student_rows), list(ladder.student_lengths),
                 list(ladder.response), ladder.teacher_shapes)

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def sample_offset(self) -> int:
        return self.state.sample_offset

    @property
    def weight_version(self) -> str:
        return self.state.weight_version

    def serving_model(self, dtype: str | None = "compute") -> nnx.Module:
        """The current student as a plain model (LoRA merged) for serving and export: `dtype` "compute"
        (model.dtype: what serving and weight sync get), "master" (model.param_dtype: checkpoints and
        exports) or a dtype name. LoRA is merged in the master dtype before any cast."""
        return self.train_step.serving_model(self.state, dtype)

    def serving_graphdef(self) -> nnx.GraphDef:
        """The graphdef of `serving_model()` (traced once, abstractly: no weights are computed)."""
        return self.train_step.serving_graphdef(self.state)

    def take_serving_weights(self) -> tuple[nnx.GraphDef, nnx.State]:
        """The serving model (as `serving_model()`) the last `train_on(..., serve=True)` produced inside
        its jitted step: arrays of their own that later (donating) steps leave alone. Taken once."""
        if self._serving_state is None:
            raise RuntimeError("no serving weights: call train_on(packed, serve=True) before taking them")
        state, self._serving_state = self._serving_state, None
        return self.serving_graphdef(), state

    # ------------------------------------------------------------------ one step

    def train_on(self, packed: PackedBatch, *, serve: bool = False) -> dict[str, float]:
        """One optimizer step on `packed`; returns host metrics (the metric names of docs/design.md §6 plus step extras).

        `serve`: the step also writes the updated weights for serving (`take_serving_weights`)."""
        if serve:
            self.state, metrics, self._serving_state = self.train_step.with_serving_weights(self.state, packed)
        else:
            self.state, metrics = self.train_step(self.state, packed)
        k_star = metrics.pop("sel_k_star")
        metrics.update(self._batch_stats(packed))
        mask = packed.student["response_mask"]
        tokens = float(mask.sum() + sum(len(s.prompt_ids) for s in packed.samples))
        metrics["tokens_per_s"] = tokens / max(metrics["time/step"], 1e-9)
        metrics.update(self._sample_stats(packed))
        self._last_k_star = k_star[np.asarray(mask) > 0]
        self._last_hints = [h for s in packed.samples for h in s.hints]
        return metrics

    @staticmethod
    def _sample_stats(packed: PackedBatch) -> dict[str, float]:
        n_real = len(packed.samples)
        out = {"rollout/prm_eval_score": float(np.mean([s.eval_score for s in packed.samples])),
               "rollout/reward": float(np.mean([s.reward for s in packed.samples]))}
        for kind in ("opd+rl", "opd", "rl"):  # TensorBoard tags cannot hold "+"
            out[f"samples/{kind.replace('+', '_')}"] = float(packed.kinds.get(kind, 0))
        out["samples/per_step"] = float(n_real)
        out["staleness/mean"] = float(packed.staleness.mean()) if n_real else 0.0
        out["staleness/max"] = float(packed.staleness.max()) if n_real else 0.0
        out.update(person_stats(packed.samples))
        return out

    def _batch_stats(self, packed: PackedBatch) -> dict[str, float]:
        """Padding (padded / total token slots of the model inputs) and the compiled-shape count."""
        for key in packed.phase_keys():
            if key is not None and key not in self._shapes_seen:
                self._shapes_seen.add(key)
                log.info("new %s shape %s, responses %d: %d step shapes compiled so far (at most %d)", key[0],
                         key[1], key[-1], len(self._shapes_seen), self.train_step.shape_ladder.bound)
        return {"batch/padding_fraction": packed.padding_fraction(),
                "batch/student_padding_fraction": packed.padding_fraction("student"),
                "batch/teacher_padding_fraction": packed.padding_fraction("teacher"),
                "batch/student_rows": float(packed.student["input_ids"].shape[0]),
                "batch/compiled_shapes": float(len(self._shapes_seen))}

    # ------------------------------------------------------------------ the loop

    async def run(self, store_dir: str, *, checkpointer: Checkpointer | None, writer: MetricsWriter | None,
                  weight_sync: WeightSync | None, stop: asyncio.Event,
                  on_step: Callable[[int, dict[str, float]], Awaitable[None] | None] | None = None,
                  progress: Callable[[str], None] | None = None) -> None:
        """Train until `trainer.max_steps` or `stop`: wait for samples, step, sync, log, checkpoint.

        With several processes, process 0 decides each window (it sees the store first: its gateway
        writes it) and every process trains on the same window; a stop on any process stops all.
        """
        store = await self._open_store(store_dir, stop)
        if store is None:
            return
        # one reader for the run (each step reads only its window); the next window is parsed and packed
        # on a host thread while the device runs the step
        pipeline = WindowPipeline(store, self.train_step.spec)
        if weight_sync is not None:
            self.serving_graphdef()  # traced now, so that no hand-off waits for it
        last_arrival = time.monotonic()
        try:
            while True:
                available = store.refresh()
                action, end = await self._next_window(available, last_arrival, stop, progress)
                if action == _STOP:
                    break
                if action == _WAIT:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=0.25)
                    except asyncio.TimeoutError:
                        pass
                    continue
                last_arrival = time.monotonic()
                start = self.sample_offset
                if available < end:  # another process decided: its fsynced records reach us shortly
                    await self._wait_for_records(store, end)
                t = time.perf_counter()
                packed = await asyncio.to_thread(pipeline.batch, start, end, self._sample_version(self.step))
                input_wait = time.perf_counter() - t
                if packed is None:  # every sample of the window was dropped (stale or too long)
                    self._uncommitted_windows.append((self.step, start, end))
                    self.state = self.state.replace(sample_offset=end)
                    continue
                self._prefetch_next(pipeline, store, end)
                sync_now = weight_sync is not None and (self.step + 1) % self.cfg.trainer.sync_every == 0
                metrics = await asyncio.to_thread(self.train_on, packed, serve=sync_now)
                self.state = self.state.replace(sample_offset=end)
                self._uncommitted_windows.append((self.step, start, end))
                metrics["time/input_wait"] = input_wait
                metrics.update({f"samples/dropped_{k}": float(pipeline.dropped[k])
                                for k in ("stale", "temperature", "hint_only", "held_out")})
                metrics["samples/waiting"] = float(max(available - self.sample_offset, 0))
                await self._after_step(metrics, weight_sync, sync_now, writer, checkpointer, on_step)
        finally:
            pipeline.close()
            store.close()
            if weight_sync is not None:  # the pool ends on the newest weights
                await weight_sync.flush()

    def _prefetch_next(self, pipeline: WindowPipeline, store: SampleTail, end: int) -> None:
        """Start parsing and packing the window after `[.., end)` (the one the next step trains on, at
        the next weight version) if its records are already in the store and there is a next step."""
        n = self.cfg.trainer.samples_per_step
        if self.step + 1 < self.cfg.trainer.max_steps and len(store) >= end + n:
            pipeline.prefetch(end, end + n, self._sample_version(self.step + 1))

    async def _next_window(self, available: int, last_arrival: float, stop: asyncio.Event,
                           progress: Callable[[str], None] | None) -> tuple[int, int]:
        """(action, window end) agreed by every process: train on the next `samples_per_step`
        samples, wait for more, or stop (max steps, `stop`, or no sample for `wait_timeout_s`)."""
        tcfg = self.cfg.trainer
        waiting = available - self.sample_offset
        if progress is not None:
            progress(f"step {self.step}/{tcfg.max_steps}  samples waiting {waiting}")
        action, end = _WAIT, 0
        if self.step >= tcfg.max_steps or stop.is_set():
            action = _STOP
        elif waiting >= tcfg.samples_per_step:
            action, end = _TRAIN, self.sample_offset + tcfg.samples_per_step
        elif tcfg.wait_timeout_s and time.monotonic() - last_arrival > tcfg.wait_timeout_s:
            log.warning("no new samples for %.0f s; stopping", tcfg.wait_timeout_s)
            action = _STOP
        return await asyncio.to_thread(_agree_on_window, action, end)

    async def _after_step(self, metrics: dict[str, float], weight_sync: WeightSync | None, sync_now: bool,
                          writer: MetricsWriter | None, checkpointer: Checkpointer | None,
                          on_step: Callable[[int, dict[str, float]], Awaitable[None] | None] | None) -> None:
        """Hand the new weights to the pool, log, checkpoint, call `on_step`."""
        tcfg = self.cfg.trainer
        if sync_now:
            # Only the hand-off blocks the trainer. The step itself wrote the serving weights (arrays the
            # next, donating step leaves alone): one process hands them over as they are; several gather
            # them to the host first (a collective, at the same step on all).
            t = time.perf_counter()
            graphdef, state = self.take_serving_weights()
            if multihost.is_multiprocess():
                state = await asyncio.to_thread(multihost.tree_to_host, state)
            weight_sync.submit(graphdef, state, self.weight_version)
            metrics["time/weight_sync_blocking"] = time.perf_counter() - t
        if weight_sync is not None:
            if weight_sync.last_duration_s is not None:
                metrics["time/weight_sync"] = weight_sync.last_duration_s
            metrics["weight_sync/failures"] = float(weight_sync.failures)
            metrics["weight_sync/superseded"] = float(weight_sync.superseded)
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
            checkpointer.save(self.step, *self._checkpoint_items())

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
        restored = self._restore_state(checkpointer)
        if restored:
            log.info("resumed at step %d, sample offset %d", self.step, self.sample_offset)
        self._reconcile_step_log(checkpointer)
        return restored

    # ------------------------------------------------------------------ what a mode of training changes
    # (trainer/people.py's per-person trainer overrides these three)

    def _sample_version(self, step: int) -> int | None:
        """The weight version a window trained at `step` counts its samples' staleness from (None: none)."""
        return step

    def _checkpoint_items(self) -> tuple[dict, dict]:
        """(array tree, JSON metadata) a checkpoint of the current state holds."""
        return self.state.checkpoint_items()

    def _restore_state(self, checkpointer: Checkpointer) -> bool:
        """Load the latest checkpoint into the state; False when there is none."""
        meta = checkpointer.metadata()
        if meta is not None and meta.get("personalize", "shared") != "shared":
            raise ValueError(f"the checkpoint in {checkpointer.directory} (step {meta.get('step')}) holds an adapter per "
                             f"person (trainer.personalize={meta['personalize']}): continue it with that setting, or "
                             "start a shared run in a new run_dir")
        restored = checkpointer.restore(self.state.checkpoint_items()[0])
        if restored is not None:
            self.state = self.state.from_checkpoint(*restored)
        return restored is not None
