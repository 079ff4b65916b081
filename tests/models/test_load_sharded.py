"""The one loader on 8 simulated devices: each tensor goes straight onto its shards.

Checks, on a (1, 4, 2) mesh: every param equals the checkpoint's tensor; every device holds
exactly its shard share of every param (param bytes / number of shards its sharding declares)
and, summed, far less than the model (nothing replicated that the rules shard); the HF tensors
are read lazily, each exactly once, and the host never holds much more than one tensor
(tracemalloc peak vs the largest tensor, the model being many times larger); student and teacher
come from the same files, the teacher in bfloat16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.xla_flags import env_without_device_count

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(r'''
    import os, json, sys, math, tracemalloc
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    import jax, numpy as np
    from flax import nnx
    from openclaw_jax.models.config import ModelConfig
    from openclaw_jax.models.decoder import Decoder
    from openclaw_jax.models import weights
    from openclaw_jax.models.hub import load_pretrained
    from openclaw_jax.parallel.mesh import make_mesh

    out_dir = sys.argv[1]
    cfg = ModelConfig(family="qwen3", vocab_size=512, hidden_size=256, intermediate_size=1024, num_layers=8,
                      num_heads=4, num_kv_heads=2, head_dim=64, qk_norm=True, tie_word_embeddings=False)
    weights.save_hf_checkpoint(Decoder(cfg, rngs=nnx.Rngs(0)), cfg, out_dir)
    source = weights.SafetensorsSource(__import__("pathlib").Path(out_dir))
    hf = {name: np.array(source.read(name)) for name in source.names()}
    largest = max(v.nbytes for v in hf.values())
    total = sum(v.nbytes for v in hf.values())

    reads = []
    original_read = weights.SafetensorsSource.read
    def counting_read(self, name):
        reads.append(name)
        return original_read(self, name)
    weights.SafetensorsSource.read = counting_read

    mesh = make_mesh((1, 4, 2))
    # warm the jitted placement helpers so tracemalloc measures the loading itself
    load_pretrained(out_dir, mesh=mesh, tokenizer=False)
    reads.clear()
    tracemalloc.start()
    pre = load_pretrained(out_dir, mesh=mesh, param_dtype="float32", dtype="bfloat16", teacher_dtype="bfloat16",
                          tokenizer=False)
    _, host_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    per_device = {d.id: 0 for d in jax.devices()}
    problems = []
    for path, var in nnx.to_flat_state(nnx.state(pre.model)):
        arr = var.get_value()
        spec = arr.sharding.spec
        n_shards = 1
        for entry in spec:
            for axis in (entry if isinstance(entry, tuple) else (entry,)):
                if axis is not None:
                    n_shards *= mesh.shape[axis]
        share = arr.nbytes // n_shards
        for shard in arr.addressable_shards:
            per_device[shard.device.id] += shard.data.nbytes
            if shard.data.nbytes != share:
                problems.append((".".join(map(str, path)), shard.device.id, shard.data.nbytes, share))
    expected_state = weights.state_dict_from_model(pre.model)
    max_err = max(float(np.max(np.abs(expected_state[k].astype(np.float32) - hf[k]))) for k in hf)
    teacher_state = weights.state_dict_from_model(pre.teacher)
    teacher_err = max(float(np.max(np.abs(teacher_state[k].astype(np.float32) - hf[k]))) for k in hf)
    teacher_dtypes = sorted({str(x.dtype) for x in jax.tree.leaves(nnx.state(pre.teacher))})
    student_dtypes = sorted({str(x.dtype) for x in jax.tree.leaves(nnx.state(pre.model))})
    json.dump({"per_device": per_device, "problems": problems, "total": total, "largest": largest,
               "host_peak": host_peak, "reads": reads, "names": sorted(hf), "max_err": max_err,
               "teacher_err": teacher_err, "teacher_dtypes": teacher_dtypes, "student_dtypes": student_dtypes,
               "compute": pre.config.dtype, "param": pre.config.param_dtype},
              open(sys.argv[2], "w"))
''')


def test_load_straight_to_shards_on_8_devices(tmp_path):
    out = tmp_path / "result.json"
    env = env_without_device_count()
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ckpt"), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["problems"] == []
    per_device = list(r["per_device"].values())
    assert len(per_device) == 8 and len(set(per_device)) == 1  # every device holds the same share
    # Sharded over fsdp=4 x tp=2 except norms (and whatever does not divide): ~1/8 of the model each.
    assert sum(per_device) < 1.6 * r["total"], (per_device, r["total"])
    assert r["max_err"] == 0.0
    assert r["teacher_err"] < 0.01 and r["teacher_dtypes"] == ["bfloat16"]
    assert r["student_dtypes"] == ["float32"] and (r["compute"], r["param"]) == ("bfloat16", "float32")
    # lazily, one tensor at a time: every HF tensor read once per model built (student, teacher)
    assert sorted(r["reads"]) == sorted(r["names"] * 2)
    assert r["total"] > 8 * r["largest"]
    # The traced peak is 2.1-2.7 tensors on an idle machine (the memory-mapped read, its converted copy,
    # the device slices) and reached 3.1 on a loaded CI run; loading the whole model at once would be 30+.
    assert r["host_peak"] < 4 * r["largest"], (r["host_peak"], r["largest"], r["total"])
