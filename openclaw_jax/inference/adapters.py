"""Many LoRA adapters served at once: the adapter format on disk and the engine's bank of resident adapters.

An *adapter* belongs to one person (its name is a person id, `openclaw_jax.samples.person`): low-rank
matrices A `[layers, *in, r]` and B `[layers, r, *out]` for some of the decoder's projections (q, k, v,
o, gate, up, down), so that a row served with it computes ``x W + (alpha / r) * (x A) B``, exactly the
projection of a `models/lora.py` LoRA model with these values, without merging them into W.

On disk, one directory per person under the engine's adapter directory (`EngineConfig.lora_dir`), in
PEFT's LoRA layout (what PEFT writes and SGLang's multi-LoRA serving reads; `read_adapter`)::

    <lora_dir>/<person>/adapter_config.json        "peft_type": "LORA", "r", "lora_alpha", "target_modules"
                                                   (HF names: q_proj, ..., down_proj)
    <lora_dir>/<person>/adapter_model.safetensors  base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}
                                                   .lora_A.weight [r, in_features], .lora_B.weight [out_features, r]

so that the HF weight of a projection becomes W + (lora_alpha / r) lora_B lora_A; in our layout A is
lora_A transposed (`[in, r]`, in flattened in C order as `models/weights.py` flattens the kernels) and B
is lora_B transposed.

The bank (`AdapterBank`) keeps `EngineConfig.lora_slots` adapters resident on the device, every target's
A and B stacked over slots `[layers, slots + 1, ...]` at one rank (`lora_max_rank`; a smaller adapter is
zero-padded, which adds exact zeros) with its scale folded into B. Slot 0 is all zeros: rows without an
adapter. A step gathers each row's slot (`row_state`: `[layers, rows, ...]`, one gather per target) and
runs the model with those per-row adapters (`models.decoder.Projection`); the shapes never depend on
which adapters are resident, so loading, updating or evicting one writes values into the stacked
arrays and recompiles nothing. When every slot is taken, the least recently used adapter that no
running row uses is evicted; one needed by a new request is read again from its directory (or the
arrays it was handed in as).
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.models.config import LoRAConfig, ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.samples.person import check_person_id

logger = logging.getLogger(__name__)

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
PEFT_PREFIX = "base_model.model.model.layers"   # PEFT's name of the decoder layers of an HF causal LM

# each target's projection in the decoder's (stacked) layers
TARGET_MODULES = {"q": ("layers", "self_attn", "q_proj"), "k": ("layers", "self_attn", "k_proj"),
                  "v": ("layers", "self_attn", "v_proj"), "o": ("layers", "self_attn", "o_proj"),
                  "gate": ("layers", "mlp", "gate_proj"), "up": ("layers", "mlp", "up_proj"),
                  "down": ("layers", "mlp", "down_proj")}


class AdapterError(ValueError):
    """An adapter is unknown, malformed, or does not fit the served model / bank (the caller's mistake)."""


@dataclass(frozen=True)
class Adapter:
    """One person's adapter on the host: `weights[target] = (A [L, *in, r], B [L, r, *out])`, float32 (in and
    out may also be flattened: `[L, in, r]`, `[L, r, out]`)."""

    rank: int
    alpha: float
    weights: Mapping[str, tuple[np.ndarray, np.ndarray]]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _peft_lora(config: Any, where: str) -> LoRAConfig:
    """Our LoRAConfig of PEFT's adapter_config.json; AdapterError for what this engine cannot serve as PEFT means it."""
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{where}: not a PEFT LoRA config (peft_type must be LORA)")
    for key, served in (("use_rslora", False), ("fan_in_fan_out", False), ("use_dora", False)):
        if bool(config.get(key, False)) != served:
            raise AdapterError(f"{where}: {key}={config.get(key)!r} is not served (only plain LoRA)")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise AdapterError(f"{where}: target_modules must be a list of module names, got {str(targets)[:80]!r}")
    try:
        return LoRAConfig(rank=config.get("r"), alpha=config.get("lora_alpha"), targets=tuple(targets))
    except ValueError as exc:
        raise AdapterError(f"{where}: {exc}") from None


def read_adapter(directory: str | os.PathLike, name: str) -> Adapter:
    """The adapter `<directory>/<name>/` in PEFT's layout (module docstring), as our `[layers, in, r]` /
    `[layers, r, out]` arrays (in and out flattened); AdapterError saying what is missing or wrong."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(directory) / check_person_id(name, "adapter name")
    try:
        lora = _peft_lora(json.loads((path / ADAPTER_CONFIG_FILE).read_text()), f"adapter {name!r}")
        tensors = load_file(str(path / ADAPTER_FILE))
    except FileNotFoundError as exc:
        raise AdapterError(f"adapter {name!r}: {exc.filename} does not exist") from None
    except (OSError, ValueError, SafetensorError) as exc:
        raise AdapterError(f"adapter {name!r} in {path} cannot be read: {exc}") from None
    weights = {}
    for target in lora.targets:
        module = ".".join(TARGET_MODULES[target][1:])
        a, b, i = [], [], 0
        while f"{PEFT_PREFIX}.{i}.{module}.lora_A.weight" in tensors:
            a.append(tensors[f"{PEFT_PREFIX}.{i}.{module}.lora_A.weight"].T)
            b.append(tensors[f"{PEFT_PREFIX}.{i}.{module}.lora_B.weight"].T)
            i += 1
        if not a:
            raise AdapterError(f"adapter {name!r}: {ADAPTER_FILE} has no {PEFT_PREFIX}.0.{module}.lora_A.weight "
                               f"for target {target!r}")
        weights[target] = (np.stack(a).astype(np.float32), np.stack(b).astype(np.float32))
    return Adapter(rank=lora.rank, alpha=float(lora.alpha), weights=weights)


@functools.partial(jax.jit, donate_argnums=(0,))
def _write_slot(bank, slot, values):
    # slot is traced: writing any slot reuses one compilation
    return jax.tree.map(lambda x, v: x.at[:, slot].set(v.astype(x.dtype)), bank, values)


@jax.jit
def _gather_rows(bank, slots):
    return jax.tree.map(lambda x: jnp.take(x, slots, axis=1), bank)


@jax.jit
def _gather_layer_rows(bank, slots):
    """Each layer's per-row adapters, flattened for the fused decode (`decode_layers.decode_layer`):
    a tuple over layers of {target: (A [B, in, r], B [B, r, out])}."""
    rows = len(slots)

    def flat(a, b):
        a, b = jnp.take(a, slots, axis=1), jnp.take(b, slots, axis=1)  # [L, B, *in, r], [L, B, r, *out]
        rank = a.shape[-1]
        return a.reshape(a.shape[0], rows, -1, rank), b.reshape(b.shape[0], rows, rank, -1)
    flat_bank = {t: flat(a, b) for t, (a, b) in bank.items()}
    layers = next(iter(flat_bank.values()))[0].shape[0]
    return tuple({t: (a[i], b[i]) for t, (a, b) in flat_bank.items()} for i in range(layers))


# the bank's jitted functions, counted with the engine's steps (`Engine.compile_counts`)
JITTED = {"adapter_write": _write_slot, "adapter_rows": _gather_rows, "adapter_layer_rows": _gather_layer_rows}


def lora_templates(cfg: ModelConfig, lora: LoRAConfig) -> tuple[nnx.GraphDef, dict[tuple[str, str], nnx.Variable]]:
    """(the graphdef of `cfg`'s LoRA model, {(target, "lora_a" | "lora_b"): its abstract variable}): one
    adapter's A `[L, *in, r]` and B `[L, r, *out]` of every target, in `cfg.param_dtype` (nothing allocated)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0), lora=lora)))
    flat = {tuple(p): v for p, v in nnx.to_flat_state(abstract)}
    return graphdef, {(t, part): flat[TARGET_MODULES[t] + (part,)] for t in lora.targets
                      for part in ("lora_a", "lora_b")}


def adapter_slot_bytes(cfg: ModelConfig, *, max_rank: int, targets: tuple[str, ...]) -> int:
    """Device memory of one slot of an `AdapterBank` serving `cfg` (every target's A and B at `max_rank`, in
    `cfg.param_dtype`), from the shapes alone."""
    _, templates = lora_templates(cfg, LoRAConfig(rank=max_rank, alpha=float(max_rank), targets=targets))
    return sum(int(np.prod(v.get_value().shape)) * jnp.dtype(v.get_value().dtype).itemsize
               for v in templates.values())


class AdapterBank:
    """The resident adapters of one engine (see the module docstring). Not thread-safe: the engine
    calls it from its own thread only."""

    def __init__(self, cfg: ModelConfig, *, slots: int, max_rank: int, targets: tuple[str, ...],
                 directory: str | None = None):
        self.cfg = cfg
        self.slots = slots
        self.lora = LoRAConfig(rank=max_rank, alpha=float(max_rank), targets=targets)  # scale 1: folded into B
        self.directory = directory
        self.graphdef, self._templates = lora_templates(cfg, self.lora)
        dt = jnp.dtype(cfg.param_dtype)

        def stacked(shape):  # [L, ...] -> [L, slots + 1, ...]
            return jnp.zeros(shape[:1] + (slots + 1,) + shape[1:], dt)
        self._bank = {t: (stacked(self._templates[t, "lora_a"].get_value().shape),
                          stacked(self._templates[t, "lora_b"].get_value().shape)) for t in self.lora.targets}
        self.resident: collections.OrderedDict[str, int] = collections.OrderedDict()  # LRU order, newest last
        self._pins: collections.Counter = collections.Counter()
        self._given: dict[str, Adapter] = {}  # adapters handed in as arrays (reloaded from here after eviction)
        self.version = 0  # bumped by every write: row states of an older version are stale
        self.loads = 0
        self.evictions = 0

    # -- names -----------------------------------------------------------------------------------
    def known(self, name: str) -> bool:
        if name in self._given or name in self.resident:
            return True
        return bool(self.directory) and (Path(self.directory) / name / ADAPTER_CONFIG_FILE).is_file()

    def check_name(self, name: str) -> None:
        """AdapterError unless `name` is a person id with an adapter here."""
        check_person_id(name, "lora_path")
        if not self.known(name):
            where = f"in {self.directory}" if self.directory else "(the engine has no lora_dir; load it first)"
            raise AdapterError(f"lora_path={name!r}: no adapter of that name {where}")

    # -- loading ---------------------------------------------------------------------------------
    def put(self, name: str, adapter: Adapter | None = None) -> bool:
        """Hand in `adapter` under `name` (None: read it from the directory again). A resident adapter is
        overwritten in its slot at once (rows using it continue with the new values); others load when
        a request needs them. Returns whether it was resident."""
        check_person_id(name, "adapter name")
        from_dir = adapter is None
        if from_dir:
            if not self.directory:
                raise AdapterError(f"adapter {name!r}: no arrays given and the engine has no lora_dir to read from")
            adapter = read_adapter(self.directory, name)
        values = self._padded(name, adapter)  # checked before anything changes
        if from_dir:
            self._given.pop(name, None)
        else:
            self._given[name] = adapter
        slot = self.resident.get(name)
        if slot is not None:
            self._write(slot, values)
        return slot is not None

    def _source(self, name: str) -> Adapter:
        if name in self._given:
            return self._given[name]
        if not self.directory:
            raise AdapterError(f"adapter {name!r} was not handed in and the engine has no lora_dir to read it from")
        return read_adapter(self.directory, name)

    def _padded(self, name: str, adapter: Adapter) -> dict:
        """The bank's slot values of `adapter`: every target at the bank's rank, scale folded into B."""
        unknown = sorted(set(adapter.weights) - set(self.lora.targets))
        if unknown:
            raise AdapterError(f"adapter {name!r} adapts {unknown}, which this engine's lora_targets "
                               f"{list(self.lora.targets)} do not include")
        if adapter.rank > self.lora.rank:
            raise AdapterError(f"adapter {name!r} has rank {adapter.rank} > lora_max_rank={self.lora.rank}; "
                               "raise lora_max_rank")
        out = {}
        for t in self.lora.targets:
            shape_a = self._templates[t, "lora_a"].get_value().shape
            shape_b = self._templates[t, "lora_b"].get_value().shape
            pad_a, pad_b = np.zeros(shape_a, np.float32), np.zeros(shape_b, np.float32)
            if t in adapter.weights:
                a, b = (np.asarray(x, np.float32) for x in adapter.weights[t])
                want_a, want_b = shape_a[:-1] + (adapter.rank,), shape_b[:1] + (adapter.rank,) + shape_b[2:]
                if (a.shape[:1] + a.shape[-1:], a.size, b.shape[:2], b.size) != \
                        (want_a[:1] + want_a[-1:], np.prod(want_a), want_b[:2], np.prod(want_b)):
                    raise AdapterError(f"adapter {name!r} target {t!r}: A {a.shape} / B {b.shape}, the served "
                                       f"model needs {want_a} / {want_b}")
                pad_a[..., :adapter.rank] = a.reshape(want_a)
                pad_b[:, :adapter.rank] = b.reshape(want_b) * np.float32(adapter.scale)
            out[t] = (pad_a, pad_b)
        return out

    def _write(self, slot: int, values: dict) -> None:
        self._bank = _write_slot(self._bank, np.int32(slot), values)
        self.version += 1

    # -- slots -----------------------------------------------------------------------------------
    def acquire(self, name: str | None) -> int | None:
        """The slot of `name` (0 for None), loaded if needed and pinned until `release`; None when every
        slot is held by running rows (the request waits)."""
        if name is None:
            return 0
        slot = self.resident.get(name)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            adapter = self._source(name)
            self._write(slot, self._padded(name, adapter))
            self.resident[name] = slot
            self.loads += 1
        self.resident.move_to_end(name)
        self._pins[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        if slot > 0 and self._pins[slot] > 0:
            self._pins[slot] -= 1

    def _free_slot(self) -> int | None:
        used = set(self.resident.values())
        for slot in range(1, self.slots + 1):
            if slot not in used:
                return slot
        for name, slot in self.resident.items():  # least recently used first
            if self._pins[slot] == 0:
                del self.resident[name]
                self.evictions += 1
                logger.info("adapter %r evicted from slot %d (least recently used)", name, slot)
                return slot
        return None

    # -- steps -----------------------------------------------------------------------------------
    def row_state(self, base: nnx.State, slots: np.ndarray) -> nnx.State:
        """The served model's params plus, for every target, row i's adapter (`slots[i]`, 0: none) as
        `[layers, rows, ...]` LoRA params of `self.graphdef`."""
        rows = _gather_rows(self._bank, jnp.asarray(slots, jnp.int32))
        flat = [(tuple(p), v) for p, v in nnx.to_flat_state(base)]
        for t, (a, b) in rows.items():
            flat.append((TARGET_MODULES[t] + ("lora_a",), self._templates[t, "lora_a"].replace(a)))
            flat.append((TARGET_MODULES[t] + ("lora_b",), self._templates[t, "lora_b"].replace(b)))
        return nnx.from_flat_state(flat)

    def layer_rows(self, slots: np.ndarray) -> tuple:
        """Row i's adapter (`slots[i]`) per layer, for the fused decode layers: a tuple over layers of
        {target: (A [rows, in, r], B [rows, r, out])}."""
        return _gather_layer_rows(self._bank, jnp.asarray(slots, jnp.int32))

    @property
    def slot_bytes(self) -> int:
        """Device memory of one slot (every target's A and B at the bank's rank)."""
        return sum(x.nbytes for pair in self._bank.values() for x in pair) // (self.slots + 1)

    def stats(self) -> dict[str, Any]:
        return {"slots": self.slots, "max_rank": self.lora.rank, "targets": list(self.lora.targets),
                "slot_bytes": self.slot_bytes, "resident": list(self.resident), "loads": self.loads,
                "evictions": self.evictions}

