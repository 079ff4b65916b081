"""The per-person plan (`trainer.personalize=per_person`): what one person's adapter costs on the trainer, on
disk and in the serving engine, and how many people and resident adapters fit.

Where a person's state lives (`trainer/people.py`): their adapter and its optimizer state stay on the
trainer's devices, sharded like the shared adapter, for as long as the run lasts (one `PersonAdapter` for each
person who has stepped; nothing of it is kept on the host). The trainer also keeps the run's initial adapter
and optimizer state (every new person's copy); a person's step donates only their own. So `people` people add
`people` x (adapter + optimizer state per device) to everything the step holds, and the trainer's devices
hold at most `max_people` (`max_people_beside_engine` where the serving engine shares the first device).

On disk, per person: their part of each checkpoint (adapter and optimizer state, float32; orbax compresses
them, so this is the most it takes) times `trainer.keep_checkpoints`, and their served adapter file (PEFT's
safetensors, float32) twice: the served version and the one before it (`runs/person_adapters.py`). Every
export (`trainer.export_every`) writes one more adapter file.

Serving (`inference/memory.py`): the engine's `policy.lora_slots` slots at `model.lora.rank` beside its
weights (the base in the compute dtype), its KV cache and prefix cache; how many slots fit on a device of
`serving_memory` alone, and on the trainer's first device beside the trainer's peak, where the embedded
engine runs (`policy.mode: embedded`; a `process` policy on the same GPUs shares it likewise).
"""

from __future__ import annotations

import dataclasses
from typing import Any

SERVED_VERSIONS = 2       # a person's served adapter directory and the one before it (runs/person_adapters.py)
ADAPTER_FILE_ITEMSIZE = 4  # adapter files hold float32 (models/lora_files.py)


@dataclasses.dataclass(frozen=True)
class AdapterSize:
    """One person's adapter and its optimizer state on the trainer: in all, and per device as sharded."""

    params: int
    param_dtype: str
    bytes: int
    bytes_per_device: int
    optimizer_bytes: int
    optimizer_bytes_per_device: int

    @property
    def device_bytes(self) -> int:
        """What one more person adds to each of the trainer's devices."""
        return self.bytes_per_device + self.optimizer_bytes_per_device


def people_report(cfg, adapter: AdapterSize, *, people: int, peak_bytes: int, device_memory: int,
                  engine_bytes: int) -> dict[str, Any]:
    """The trainer's and the disk's side of the per-person plan; `peak_bytes`: the step's peak per device with
    `people` people's states resident (module doc); `engine_bytes`: the serving engine's, where it shares the
    trainer's first device."""
    lora = cfg.model.lora
    without = peak_bytes - people * adapter.device_bytes

    def most(memory: int) -> int:
        return int(max(0, (memory - without) // adapter.device_bytes))

    checkpoint = adapter.bytes + adapter.optimizer_bytes
    adapter_file = adapter.params * ADAPTER_FILE_ITEMSIZE
    keep = cfg.trainer.keep_checkpoints
    return {
        "people": people,
        "lora": {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)},
        "adapter": {**dataclasses.asdict(adapter), "device_bytes_per_person": adapter.device_bytes},
        "trainer": {"states_on": "device", "peak_bytes_without_people": int(without), "peak_bytes": int(peak_bytes),
                    "max_people": most(device_memory), "max_people_beside_engine": most(device_memory - engine_bytes)},
        "disk": {"checkpoint_bytes_per_person": int(checkpoint), "checkpoints_kept": keep,
                 "adapter_file_bytes": int(adapter_file), "served_versions": SERVED_VERSIONS,
                 "bytes_per_person": int(keep * checkpoint + SERVED_VERSIONS * adapter_file)},
    }


def serving_report(cfg, mcfg, *, trainer_peak: int, device_memory: int, serving_memory: int) -> dict[str, Any]:
    """The engine's side of the per-person plan (module doc): its memory with the run's adapter slots, the
    slots that fit on a device of `serving_memory` alone and beside `trainer_peak` on one of `device_memory`."""
    # these import JAX: after main's XLA_FLAGS
    from openclaw_jax.inference.memory import serving_memory as engine_memory
    from openclaw_jax.runs.person_adapters import adapter_slots
    from openclaw_jax.runs.policy_process import engine_config

    config = dataclasses.replace(engine_config(cfg.policy), **adapter_slots(cfg))
    served = mcfg.replace(param_dtype=cfg.model.dtype)   # the frozen base, served in the compute dtype
    context = cfg.policy.context_length or served.max_position_embeddings
    longest = min(context, cfg.gateway.max_prompt_tokens + cfg.gateway.max_tokens_limit)
    memory = engine_memory(served, config, longest_sequence=longest)
    beside = device_memory - trainer_peak
    return {**memory.as_dict(), "param_dtype": served.param_dtype, "max_rank": config.lora_max_rank,
            "context_length": context, "memory": int(serving_memory), "fits": memory.total <= serving_memory,
            "max_slots": memory.slots_within(serving_memory),
            "beside_trainer": {"device_memory": int(device_memory), "trainer_peak_bytes": int(trainer_peak),
                               "fits": memory.total <= beside, "max_slots": memory.slots_within(beside)}}
