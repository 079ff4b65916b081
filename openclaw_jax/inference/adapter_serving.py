"""The engine's multi-adapter serving (`AdapterServing`, a base of `engine.Engine`): each sequence runs
with its person's LoRA adapter (`GenerationSpec.lora_path`), rows of different people in one batch.

With `EngineConfig.lora_slots > 0` the engine keeps an `adapters.AdapterBank`. A request naming an
unknown adapter is refused at submit (ValueError: a 4xx at the server). At admission a sequence takes
its adapter's slot (loading it, evicting the least recently used idle adapter; it waits while every
slot is held by running rows) and keeps it until it leaves its row. Every prefill group and every decode
call runs the model with each row's adapter gathered from the bank, so the compiled steps are the same
whatever adapters are resident: prefill runs the model's LoRA form with per-row adapters
(`AdapterBank.row_state`), decode the fused decode layers with each row's adapter beside each fused
matrix (`AdapterBank.layer_rows`, `decode_layers.decode_layer`). `load_adapter` hands in or re-reads an
adapter between two engine steps: rows using it continue with the new values.

The prefix cache holds K/V of rows without an adapter only (an adapter changes every layer's K/V).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from openclaw_jax.inference.adapters import Adapter, AdapterBank, AdapterError
from openclaw_jax.inference.decode_layers import FUSED
from openclaw_jax.inference.scheduler import Batch, Seq
from openclaw_jax.inference.types import GenerationSpec


class AdapterServing:
    """Adapter slots of the engine's sequences (the engine's thread) and the params of each step."""

    _adapters: AdapterBank | None = None
    _row_params: tuple | None = None

    def _init_adapters(self, model_cfg: Any, graphdef: Any) -> Any:
        """Set up the bank when `lora_slots > 0`; returns the graphdef the engine's steps run."""
        cfg = self.config
        if not cfg.lora_slots:
            self._adapters = None
            return graphdef
        self._adapters = AdapterBank(model_cfg, slots=cfg.lora_slots, max_rank=cfg.lora_max_rank,
                                     targets=tuple(cfg.lora_targets), directory=cfg.lora_dir)
        return self._adapters.graphdef

    # -- public ----------------------------------------------------------------------------------
    def load_adapter(self, name: str, adapter: Adapter | None = None, timeout: float | None = 30.0) -> bool:
        """Hand in `adapter` under the person id `name`, or (None) read `lora_dir/<name>/` again; written
        into its slot between two engine steps when resident. Returns whether it was resident.
        AdapterError (a ValueError) when it does not fit the served model or cannot be read."""
        bank = self._require_bank(name)
        return self._call_in_engine(lambda: bank.put(name, adapter), timeout=timeout)

    def adapter_stats(self) -> dict[str, Any]:
        """Slots, rank, targets, the resident adapters (least recently used first), loads and evictions."""
        if self._adapters is None:
            return {"slots": 0}
        return self._call_in_engine(self._adapters.stats)

    # -- engine hooks ----------------------------------------------------------------------------
    def _require_bank(self, name: str) -> AdapterBank:
        if self._adapters is None:
            raise AdapterError(f"lora_path={name!r}: this engine serves no adapters; start it with lora_slots > 0 "
                               "(the server's --lora-slots)")
        return self._adapters

    def _check_adapter(self, spec: GenerationSpec) -> None:
        """At submit: AdapterError (a ValueError) for an adapter this engine cannot serve."""
        if spec.lora_path is not None:
            self._require_bank(spec.lora_path).check_name(spec.lora_path)

    def _adapter_ready(self, seq: Seq) -> bool:
        """Whether `seq` holds its adapter's slot now (taking it if free). False: it waits, or, when its
        adapter could not be loaded, it is finished with an abort and cancelled (dropped from the queue)."""
        name = seq.spec.lora_path
        if name is None or seq.adapter_slot:
            return True
        try:
            slot = self._adapters.acquire(name)
        except (AdapterError, OSError) as exc:  # e.g. its files were removed or broken after the request came
            self._finish(seq, {"type": "abort", "message": str(exc)})
            seq.handle.cancel()
            return False
        if slot is None:
            return False
        seq.adapter_slot = slot
        return True

    def _drop_adapter(self, seq: Seq) -> None:
        if self._adapters is not None and seq.adapter_slot:
            self._adapters.release(seq.adapter_slot)
            seq.adapter_slot = 0

    def _group_params(self, state: Any, group: list[Seq], rows: int) -> Any:
        """Prefiller hook: `state` with row i's adapter for group[i] (padding rows: none)."""
        slots = np.zeros((rows,), np.int32)
        slots[:len(group)] = [seq.adapter_slot for seq in group]
        return self._adapters.row_state(state, slots)

    def _decode_inputs(self, batch: Batch) -> tuple[Any, Any]:
        """(params, per-layer decode weights) of a decode call: the served ones, and with adapters on each
        row's adapter, in the fused decode layers (`decode_layers.decode_layer`) or, without them, in the
        model's params (kept while the rows' slots, the bank and the weights stay the same)."""
        if self._adapters is None:
            return self._state, self._layer_states
        slots = np.array([0 if seq is None else seq.adapter_slot for seq in batch.rows], np.int32)
        key = (slots.tobytes(), self._adapters.version)
        cached = self._row_params
        stale = cached is None or cached[0] != key
        if stale or cached[1] is not self._state or cached[2] is not self._layer_states:
            if self._layer_graphdef == FUSED:
                fused, per_layer = self._layer_states, self._adapters.layer_rows(slots)
                layers = tuple({**w, "lora": rows} for w, rows in zip(fused["layers"], per_layer))
                inputs = (self._state, {**fused, "layers": layers})
            else:
                inputs = (self._adapters.row_state(self._state, slots), None)
            cached = self._row_params = (key, self._state, self._layer_states, inputs)
        return cached[3]
