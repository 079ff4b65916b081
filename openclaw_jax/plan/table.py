"""The plan as a table for people (`python -m openclaw_jax.plan` without `--json`)."""

from __future__ import annotations

from typing import Any

GIB = 1024 ** 3
MIB = 1024 ** 2


def format_table(plan: dict[str, Any]) -> str:
    b = plan["batch"]
    lines = [
        f"model {plan['model']['family']} {plan['model']['layers']}L hidden {plan['model']['hidden']} "
        f"(params {plan['model']['param_dtype']}, compute {plan['model']['dtype']}, remat {plan['model']['remat']}, "
        f"attention {plan['model']['attention']}); {plan['devices']} devices {plan['mesh']}",
        f"batch {b['samples_per_step']} x {b['candidates']} candidates, seq {b['seq_len']}, response {b['response_len']}, "
        f"micro-batch {b['micro_batch_size'] or 'whole'}, top-K {b['top_k']}; "
        + (f"packed rows: student {b['student_shape']}, teacher {b['teacher_shape']}" if b["packing"] else
           f"unpacked: student {b['student_shape']}, teacher {b['teacher_shape']}")
        + (" (one per sample: its shared prompt prefix once, then its candidates)" if b["shared_prefix"] else "")
        + f"; at most {b['compiled_shape_bound']} compiled step shapes"
        + (f"; samples of {b['lengths']['prompt']} prompt ({b['lengths']['shared']} shared by all) + "
           f"{b['lengths']['response']} response tokens, hints of {b['lengths']['hint']}" if b["lengths"] else ""),
        f"trainable params {plan['trainable_params'] / 1e9:.3f} B: {plan['param_bytes'] / GIB:.2f} GiB/device; "
        f"optimizer {plan['optimizer_bytes'] / GIB:.2f} GiB/device; teacher "
        f"{plan['resident_bytes']['teacher_params'] / GIB:.2f} GiB/device; "
        + ("no weight sync (each person's adapter is served on its own)" if "per_person" in plan else
           f"serving copy written by a sync step {plan['serving_bytes'] / GIB:.2f} GiB/device"),
        "",
        f"{'phase':<16}{'args GiB':>10}{'out GiB':>10}{'temp GiB':>10}{'live GiB':>10}{'peak GiB':>10}{'TFLOP/dev':>11}",
    ]
    for name, p in plan["phases"].items():
        lines.append(f"{name:<16}{p['argument_bytes'] / GIB:>10.2f}{p['output_bytes'] / GIB:>10.2f}"
                     f"{p['temp_bytes'] / GIB:>10.2f}{p['live_before_bytes'] / GIB:>10.2f}"
                     f"{p['peak_bytes'] / GIB:>10.2f}{p['flops'] / 1e12:>11.2f}")
    lines += [
        "",
        f"peak {plan['peak_bytes'] / GIB:.2f} GiB/device of {plan['device_memory'] / GIB:.1f} GiB: "
        f"{'fits' if plan['fits'] else 'DOES NOT FIT'}",
        f"FLOPs/step {plan['flops_per_step'] / 1e12:.1f} TFLOP (all devices); train step per trained token / "
        f"(6 x params) = {plan['train_flops_per_token_over_6n']:.2f}; / (6 x params + 12 x layers x heads x "
        f"head_dim x seq, attention included) = {plan['train_flops_per_token_over_model_flops']:.2f}",
        *([f"  the blockwise attention's causal loops (trip counts known only at run time) are counted once in "
           f"the HLO; with their estimated FLOPs the train step is "
           f"{plan['train_flops_per_token_over_6n_with_attention_estimate']:.2f} x 6N per token"]
          if plan["train_attention_flops_per_token_estimate"] else []),
    ]
    if "per_person" in plan:
        lines += ["", *_people_lines(plan["per_person"])]
    return "\n".join(lines)


def _size(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / 1024:.1f} KiB"


def _people_lines(pp: dict[str, Any]) -> list[str]:
    """The per-person plan (`people.py`) as lines of the table."""
    a, t, d, s = pp["adapter"], pp["trainer"], pp["disk"], pp["serving"]
    lora = f"rank {pp['lora']['rank']} on {','.join(pp['lora']['targets'])}"
    beside = s["beside_trainer"]
    return [
        f"per person: LoRA {lora} (alpha {pp['lora']['alpha']:g}); the base frozen, one person's adapter trained a step",
        f"  adapter     {a['params'] / 1e6:.2f} M params ({a['param_dtype']}): {_size(a['bytes'])}, "
        f"{_size(a['bytes_per_device'])}/device; optimizer state {_size(a['optimizer_bytes'])}, "
        f"{_size(a['optimizer_bytes_per_device'])}/device",
        f"  trainer     {pp['people']} people's adapters and optimizer states on the devices: peak "
        f"{t['peak_bytes'] / GIB:.2f} GiB/device ({t['peak_bytes_without_people'] / GIB:.2f} without them, "
        f"+{_size(a['device_bytes_per_person'])} a person); at most {t['max_people']} people fit, "
        f"{t['max_people_beside_engine']} with the serving engine on the first device (policy.mode=embedded)",
        f"  disk        a person's checkpoint part {_size(d['checkpoint_bytes_per_person'])} at most (x "
        f"{d['checkpoints_kept']} kept), adapter file {_size(d['adapter_file_bytes'])} (x {d['served_versions']} "
        f"served versions): {_size(d['bytes_per_person'])} a person, each export {_size(d['adapter_file_bytes'])} more",
        f"serving engine (one device; the base in {s['param_dtype']}, {s['slots']} adapter slots at rank "
        f"{s['max_rank']}, {_size(s['slot_bytes'])} a slot):",
        f"  weights {_size(s['weights'])} + decode copy {_size(s['decode_weights'])} + KV cache "
        f"{_size(s['kv_cache'])} (the larger of the batch budget and one sequence of up to {s['longest_sequence']} tokens alone) + "
        f"prefix cache "
        f"{_size(s['prefix_cache'])} + rows' gathered adapters {_size(s['row_adapters'])} + slots (and slot 0) "
        f"{_size(s['adapter_slots'])} = {s['total'] / GIB:.2f} GiB (activations not included)",
        f"  alone on a device of {s['memory'] / GIB:.1f} GiB: {'fits' if s['fits'] else 'DOES NOT FIT'}, at most "
        f"{s['max_slots']} adapter slots; beside the trainer's peak on its first device (policy.mode=embedded): "
        f"{'fits' if beside['fits'] else 'DOES NOT FIT'}, at most {beside['max_slots']} slots",
    ]
