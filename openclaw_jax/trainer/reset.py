"""Restart training from given serving weights (the promotion gate's reset after refusals in a row).

`reset_to_serving(trainer, serving)` makes the student compute what the plain serving model
``serving`` computes (the served version: compute dtype, LoRA merged) and gives it a fresh optimizer
state (moments and step count: the learning-rate schedule starts again). Every student param is
read from ``serving`` by its path and cast to the param's own dtype and placement: the student then
holds the served values exactly (what the master weights held beyond the compute dtype is gone). With LoRA the
served weights are merged, so they become the frozen base and the adapters restart as at init
(``lora_b`` zero, ``lora_a`` kept): base + A @ 0 is the served model. The frozen teacher is untouched.
Call it between steps (the loop's ``on_step``); no phase recompiles (same shapes, dtypes, shardings).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.trainer.state import init_optimizer_state


def _from_serving(state: nnx.State, served: dict[tuple, Any]) -> nnx.State:
    out = []
    for path, var in nnx.to_flat_state(state):
        path = tuple(path)
        value = var.get_value()
        if path in served:
            # a copy: the trainer donates its params to the next step, the caller keeps serving these
            new = jax.device_put(jnp.array(served[path].get_value(), value.dtype, copy=True), value.sharding)
        elif path[-1] == "lora_b":
            new = jnp.zeros_like(value)
        else:   # lora_a (kept) or anything the serving model has no counterpart for
            new = value
        out.append((path, var.replace(new)))
    return nnx.from_flat_state(out)


def reset_to_serving(trainer: Any, serving: nnx.State) -> None:
    """See the module docstring. ``trainer`` is a `trainer.loop.Trainer`."""
    state, step = trainer.state, trainer.train_step
    served = {tuple(path): var for path, var in nnx.to_flat_state(serving)}
    trainable = _from_serving(state.trainable, served)
    missing = [".".join(map(str, p)) for p, _ in nnx.to_flat_state(trainable)
               if tuple(p) not in served and p[-1] not in ("lora_a", "lora_b")]
    if missing:
        raise ValueError(f"the serving weights lack trained params {missing[:5]}: not this model's serving state")
    trainer.state = state.replace(trainable=trainable, frozen=_from_serving(state.frozen, served),
                                  opt_state=init_optimizer_state(step.tx, trainable, step.mesh))
