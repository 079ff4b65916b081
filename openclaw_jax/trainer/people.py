"""Per-person adapters: `trainer.personalize=per_person` (docs/household.md, "Each person's adapter").

Each person has a LoRA adapter of their own, and its own optimizer state, on the one frozen base model.
The rule of a step: the window of `trainer.samples_per_step` new samples is read as in shared mode, then
grouped by person (`Sample.person`, in the order each person first appears in the window); every person
present gets one optimizer step of their own adapter on a batch of their own samples alone, packed apart
(so the reward baseline, the padding rows and the loss's normalisation are theirs alone). A person's step
is the shared mode's step (`train_step.py`) run on the state with that person's adapter and optimizer
state in place of the shared ones: nothing of another person is an input of it, which is what keeps
people apart (bit-exactly: tests/trainer/test_per_person.py).

Counting: the trainer's step (`weight_version`, `trainer.max_steps`, `checkpoint_every`) counts windows;
each adapter counts its own steps in its optimizer state, so the warm-up and the learning-rate schedule
run per person. A person's first adapter is the run's initial one (A random from `seed`, B zero: exactly
the base model) with a fresh optimizer state.

State: the trainer's one `TrainState` keeps the shared parts (the frozen base, the teacher, the rng, the
step and sample offset) and the initial adapter, which no step donates; `PersonAdapter`s, one per person,
sit beside it (a dict: a person's pytree is swapped into the state for their step). A checkpoint holds
`{"people": [{"trainable", "opt_state"} per person], "rng"}` with the people's ids, in the list's order, in
its metadata (a list, not a dict by id: person ids may hold `.`, which orbax's item paths do not keep apart).

Serving: `export_adapters` writes each person's adapter to a directory of its own (models/lora_files.py:
PEFT's layout); a live run writes the people of each step (`last_stepped`) where the engine reads them and
routes each person's turns to their own adapter (runs/person_adapters.py). No shared weights are pushed.

Samples' staleness: the base never changes (weight version 0) while the adapters move, so the
weight-version staleness filter (`trainer.max_staleness`) does not apply; a turn's rollout log-probs are
those of the adapter that served it (`Sample.adapter`, `adapter_steps`), so `trainer.staleness_mode:
importance` weights each token by its adapter's drift since.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import jax
import numpy as np
from flax import nnx

from openclaw_jax.models.lora_files import save_adapter
from openclaw_jax.parallel import multihost
from openclaw_jax.samples import Sample
from openclaw_jax.samples.person import person_tag
from openclaw_jax.trainer.batch import PackedBatch
from openclaw_jax.trainer.batcher import pack
from openclaw_jax.trainer.checkpoint import Checkpointer
from openclaw_jax.trainer.loop import Trainer
from openclaw_jax.trainer.state import init_optimizer_state

if TYPE_CHECKING:   # the type only: the config tree imports every section's package
    from openclaw_jax.config import ExperimentConfig

log = logging.getLogger(__name__)

ADAPTERS_DIR = "adapters"   # under an export directory: adapters/<person>/ (models/lora_files.py)
_PER_PERSON_METRICS = ("loss", "grad_norm", "lr")


@dataclasses.dataclass(frozen=True)
class PersonAdapter:
    """One person's trained state: their adapter (the LoRA params), its optimizer state, and the optimizer
    steps it has taken."""

    trainable: nnx.State
    opt_state: Any
    steps: int = 0


def group_by_person(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """The samples by person, people in the order they first appear, each person's samples in order."""
    groups: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[sample.person].append(sample)
    return dict(groups)


class PerPersonTrainer(Trainer):
    """The trainer of `trainer.personalize=per_person` (module doc): `Trainer`'s loop, checkpoints and
    metrics, each window's step split into one step per person present."""

    def __init__(self, cfg: ExperimentConfig, student: nnx.Module, teacher: nnx.Module,
                 mesh: jax.sharding.Mesh, **kwargs: Any):
        if not cfg.model.lora.enabled:
            raise ValueError("trainer.personalize=per_person needs model.lora.enabled=true: each person's adapter "
                             "is a LoRA adapter on the frozen base")
        super().__init__(cfg, student, teacher, mesh, **kwargs)
        self.mesh = mesh
        self.adapters: dict[str, PersonAdapter] = {}
        self.last_stepped: list[str] = []   # the people the last step trained, in the window's order
        self._seen_shapes: dict[str, set] = {"student": set(), "teacher": set()}   # the person batches' shapes

    # ------------------------------------------------------------------ people

    def new_adapter(self) -> PersonAdapter:
        """A person's first adapter: a copy of the initial one (the base model exactly) and a fresh optimizer
        state, placed as the shared ones."""
        trainable = jax.tree.map(lambda x: x.copy(), self.state.trainable)
        return PersonAdapter(trainable, init_optimizer_state(self.train_step.tx, trainable, self.mesh))

    def adapter(self, person: str) -> PersonAdapter:
        """`person`'s adapter, created on their first step."""
        if person not in self.adapters:
            self.adapters[person] = self.new_adapter()
            log.info("person %r: a new adapter (rank %d on %s); %d people have one", person, self.cfg.model.lora.rank,
                     ",".join(self.cfg.model.lora.targets), len(self.adapters))
        return self.adapters[person]

    # ------------------------------------------------------------------ one step

    def train_on(self, packed: PackedBatch, *, serve: bool = False) -> dict[str, float]:
        """One step of each person of `packed`'s samples, on their own samples (module doc); returns the
        window's metrics: the loss's numbers as the mean over people weighted by their samples, times
        summed, and per person `people/<person>/{loss,grad_norm,lr,adapter_steps}`."""
        if serve:
            raise RuntimeError("trainer.personalize=per_person pushes no shared weights to the pool (each person's "
                               "adapter is served on its own: runs/person_adapters.py); call train_on(packed) without "
                               "serve")
        results, batches, k_stars = [], [], []
        for person, samples in group_by_person(packed.samples).items():
            batch = pack(samples, self.train_step.spec, current_version=None, seen=self._seen_shapes)
            own = self.adapter(person)
            state = self.state.replace(trainable=own.trainable, opt_state=own.opt_state)
            new, metrics = self.train_step(state, batch)   # donates this person's adapter and optimizer state
            self.adapters[person] = PersonAdapter(new.trainable, new.opt_state, own.steps + 1)
            k_stars.append(metrics.pop("sel_k_star")[np.asarray(batch.student["response_mask"]) > 0])
            results.append((person, len(samples), metrics))
            batches.append(batch)
        self.state = self.state.replace(step=self.state.step + 1)
        metrics = self._combine(results)
        metrics.update(self._window_batch_stats(batches))
        tokens = sum(float(b.student["response_mask"].sum() + sum(len(s.prompt_ids) for s in b.samples))
                     for b in batches)
        metrics["tokens_per_s"] = tokens / max(metrics["time/step"], 1e-9)
        metrics["people/stepped"] = float(len(results))
        metrics.update(self._sample_stats(packed))
        self._last_k_star = np.concatenate(k_stars) if k_stars else np.zeros((0,), np.int32)
        self._last_hints = [h for s in packed.samples for h in s.hints]
        self.last_stepped = [person for person, _, _ in results]
        return metrics

    def _combine(self, results: list[tuple[str, int, dict[str, float]]]) -> dict[str, float]:
        """The people's step metrics as one window's (`train_on`)."""
        total = sum(n for _, n, _ in results)
        out: dict[str, float] = {}
        for key in results[0][2]:
            values = [float(m[key]) for _, _, m in results if key in m]
            if key.startswith("time/"):
                out[key] = sum(values)
            else:
                out[key] = sum(float(m[key]) * n for _, n, m in results if key in m) / total
        for person, _, m in results:
            tag = f"people/{person_tag(person)}"
            out.update({f"{tag}/{key}": float(m[key]) for key in _PER_PERSON_METRICS if key in m})
            out[f"{tag}/adapter_steps"] = float(self.adapters[person].steps)
        return out

    def _window_batch_stats(self, batches: list[PackedBatch]) -> dict[str, float]:
        """`Trainer._batch_stats` over the people's batches: the padding fractions averaged, the rows summed."""
        stats = [self._batch_stats(b) for b in batches]
        out = {key: float(np.mean([s[key] for s in stats])) for key in stats[0]}
        out["batch/student_rows"] = float(sum(s["batch/student_rows"] for s in stats))
        out["batch/compiled_shapes"] = stats[-1]["batch/compiled_shapes"]
        return out

    # ------------------------------------------------------------------ checkpoints and exports

    def _sample_version(self, step: int) -> int | None:
        return None   # the served answers all come from the base (module doc)

    def _checkpoint_items(self) -> tuple[dict, dict]:
        people = sorted(self.adapters)
        tree = {"people": [{"trainable": self.adapters[p].trainable, "opt_state": self.adapters[p].opt_state}
                           for p in people], "rng": self.state.rng}
        meta = {"step": self.step, "sample_offset": self.sample_offset, "weight_version": self.weight_version,
                "personalize": "per_person", "people": people,
                "adapter_steps": {p: self.adapters[p].steps for p in people}}
        return tree, meta

    def _restore_state(self, checkpointer: Checkpointer) -> bool:
        meta = checkpointer.metadata()
        if meta is None:
            return False
        if meta.get("personalize") != "per_person":
            raise ValueError(f"the checkpoint in {checkpointer.directory} (step {meta.get('step')}) was written with "
                             "trainer.personalize=shared: it holds one adapter for everyone. Continue it with "
                             "trainer.personalize=shared, or start the per-person run in a new run_dir")
        people = list(meta["people"])
        shape = {"trainable": self.state.trainable, "opt_state": self.state.opt_state}
        tree, meta = checkpointer.restore({"people": [shape] * len(people), "rng": self.state.rng})
        steps = meta["adapter_steps"]
        self.adapters = {p: PersonAdapter(own["trainable"], own["opt_state"], int(steps[p]))
                         for p, own in zip(people, tree["people"])}
        self.state = self.state.replace(rng=tree["rng"], step=int(meta["step"]),
                                        sample_offset=int(meta["sample_offset"]))
        log.info("restored the adapters of %d people: %s", len(people),
                 ", ".join(f"{p} ({steps[p]} steps)" for p in people) or "none yet")
        return True

    def export_adapters(self, directory: str | Path, *, base_model: str, people: Sequence[str] | None = None) -> Path:
        """Each person's adapter (of `people`, default everyone's) to `directory/<person>/` (models/lora_files.py's
        layout, written atomically; a person id is a safe directory name: samples/person.py). Every process must
        call it (the adapters are gathered); process 0 writes."""
        directory = Path(directory)
        for person in sorted(self.adapters if people is None else people):
            own = self.adapters[person]
            trainable = multihost.tree_to_host(own.trainable)
            if jax.process_index() == 0:
                save_adapter(directory / person, trainable, self.cfg.model.lora, base_model=base_model,
                             extra={"person": person, "adapter_steps": own.steps, "trainer_step": self.step,
                                    "sample_offset": self.sample_offset})
        return directory
