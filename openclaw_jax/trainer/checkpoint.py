"""Orbax checkpoints of the trainer state plus the JSON metadata that makes resume exact.

A checkpoint holds the train state pytree (params or LoRA params, optimizer state, rng, step)
and a JSON record with the sample-store offset and weight version. Orbax writes each step to a
temporary directory and renames it when complete, so a SIGKILL mid-save leaves the previous
checkpoint as the latest one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves and restores (state pytree, metadata dict) pairs by step under `directory`."""

    def __init__(self, directory: str | Path, *, max_to_keep: int = 3):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(metadata)))
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()
        log.info("checkpoint saved: step %d -> %s", step, self.directory / str(step))

    def metadata(self, step: int | None = None) -> dict[str, Any] | None:
        """The JSON metadata of the checkpoint of `step` (default: the latest) alone; None if empty (what a
        restore needs to know before it can build the abstract state, e.g. whose adapters it holds)."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]] | None:
        """Restore onto `abstract_state` (arrays or ShapeDtypeStructs with shardings); None if empty."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        restored = self._manager.restore(step, args=args)
        log.info("checkpoint restored: step %d from %s", step, self.directory)
        return restored["state"], dict(restored["meta"])

    def close(self) -> None:
        self._manager.close()
