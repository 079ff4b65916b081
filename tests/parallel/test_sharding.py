"""Sharded student/teacher on 8 fake CPU devices equal the 1-device run; params sharded per the rules.

The multi-device part runs in a subprocess so XLA_FLAGS can create 8 host devices before JAX
starts, without affecting the 1-device pytest process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from openclaw_jax.parallel.mesh import MeshShapeError, resolve_mesh_shape
from openclaw_jax.parallel.sharding import logical_to_partition_spec, partition_rules
from jax.sharding import PartitionSpec as P

from tests.helpers.xla_flags import env_without_device_count

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(r'''
    import json, os, sys
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from openclaw_jax.models.config import ModelConfig
    from openclaw_jax.models.decoder import Decoder
    import tempfile
    from openclaw_jax.models.weights import (load_hf_checkpoint, model_from_state_dict, save_hf_checkpoint,
                                             state_dict_from_model)
    from openclaw_jax.parallel.mesh import make_mesh, shard_model

    assert jax.device_count() == 8, jax.devices()
    cfg = ModelConfig(family="qwen3", vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, rope_theta=10000.0)
    student = Decoder(cfg, rngs=nnx.Rngs(0))
    # randomise every param (norms around 1) so no shard is trivially equal to another
    flat = list(nnx.to_flat_state(nnx.state(student)))
    keys = jax.random.split(jax.random.key(1), len(flat))
    nnx.update(student, nnx.from_flat_state([
        (path, var.replace(0.2 * jax.random.normal(key, var.get_value().shape)
                           + (1.0 if path[-1] == "weight" else 0.0)))
        for key, (path, var) in zip(keys, flat)]))
    teacher_sd = {k: v * 0.9 for k, v in state_dict_from_model(student).items()}
    student_sd = state_dict_from_model(student)

    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 256, (4, 8)), jnp.int32)

    def loss_fn(student, teacher, ids):
        target = jax.lax.stop_gradient(jax.nn.softmax(teacher(ids), axis=-1))
        return -jnp.mean(jnp.sum(target * jax.nn.log_softmax(student(ids), axis=-1), axis=-1))

    @nnx.jit
    def step(student, teacher, ids):
        loss, grads = nnx.value_and_grad(loss_fn)(student, teacher, ids)
        return loss, grads, student(ids)

    def decode_all(model, ids):
        graphdef, st = nnx.split(model)
        @jax.jit
        def run(st, ids):
            m = nnx.merge(graphdef, st)
            cache = m.init_cache(ids.shape[0], 12)
            pos = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (ids.shape[0], 6))
            logits, cache = m.decode(ids[:, :6], pos, cache)
            step_logits, cache = m.decode(ids[:, 6:7], jnp.full((ids.shape[0], 1), 6, jnp.int32), cache)
            return jnp.concatenate([logits, step_logits], axis=1)
        return run(st, ids)

    ref_student = model_from_state_dict(cfg, student_sd)
    ref_teacher = model_from_state_dict(cfg, teacher_sd)
    ref_loss, ref_grads, ref_logits = step(ref_student, ref_teacher, ids)
    ref_decode = decode_all(ref_student, ids)
    ref_grads = {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(ref_grads)}

    ckpt_dir = tempfile.mkdtemp() + "/ckpt"
    save_hf_checkpoint(student, cfg, ckpt_dir, max_shard_bytes=20_000)
    out = {}
    for shape in [(2, 2, 2), (1, 2, 4)]:
        mesh = make_mesh(shape)
        # student loaded straight onto the mesh; teacher built on one device then moved by shard_model
        s = model_from_state_dict(cfg, student_sd, mesh=mesh)
        t = shard_model(model_from_state_dict(cfg, teacher_sd), mesh)
        with jax.set_mesh(mesh):
            loss, grads, logits = step(s, t, ids)
            dec = decode_all(s, ids)
        flat_s = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(s))}
        flat_t = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(t))}
        from_files, _ = load_hf_checkpoint(ckpt_dir, mesh=mesh)
        flat_f = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(from_files))}
        flat_g = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(grads)}
        out[str(shape)] = dict(
            specs={k: str(tuple(v.sharding.spec)) for k, v in flat_s.items()},
            file_load_equal=all(flat_f[k].sharding == v.sharding
                                and np.asarray(flat_f[k]).tobytes() == np.asarray(v).tobytes()
                                for k, v in flat_s.items()),
            teacher_specs_equal=all(flat_t[k].sharding == v.sharding for k, v in flat_s.items()),
            shard_shapes={k: list(v.addressable_shards[0].data.shape) for k, v in flat_s.items()},
            num_devices={k: len(v.sharding.device_set) for k, v in flat_s.items()},
            logits_err=float(np.abs(np.asarray(logits) - np.asarray(ref_logits)).max()),
            logits_spec=str(tuple(logits.sharding.spec)),
            loss_err=float(abs(float(loss) - float(ref_loss))),
            grad_err=max(float(np.abs(np.asarray(flat_g[k]) - ref_grads[k]).max()) for k in ref_grads),
            grad_scale=max(float(np.abs(ref_grads[k]).max()) for k in ref_grads),
            decode_err=float(np.abs(np.asarray(dec) - np.asarray(ref_decode)).max()),
            decode_vs_forward=float(np.abs(np.asarray(ref_decode) - np.asarray(ref_logits)[:, :7]).max()),
        )
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def sharded_results():
    env = dict(env_without_device_count(), PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(line[-1][len("RESULT "):])


# expected PartitionSpecs (as str(tuple(spec))) from the rules: vocab/heads/mlp over tp, the model
# dim over fsdp; kv heads (2) only split when tp divides them.
def _expected(tp):
    kv = "(None, 'fsdp', 'tp')" if 2 % tp == 0 else "(None, 'fsdp')"
    return {
        "embed_tokens": "('tp', 'fsdp')",
        "lm_head.kernel": "('fsdp', 'tp')",
        "norm.weight": "()",
        "layers.input_layernorm.weight": "()",
        "layers.self_attn.q_proj.kernel": "(None, 'fsdp', 'tp')",
        "layers.self_attn.k_proj.kernel": kv,
        "layers.self_attn.v_proj.kernel": kv,
        "layers.self_attn.o_proj.kernel": "(None, 'tp', None, 'fsdp')",
        "layers.self_attn.q_norm.weight": "()",
        "layers.mlp.gate_proj.kernel": "(None, 'fsdp', 'tp')",
        "layers.mlp.up_proj.kernel": "(None, 'fsdp', 'tp')",
        "layers.mlp.down_proj.kernel": "(None, 'tp', 'fsdp')",
    }


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 2, 4)])
def test_params_are_sharded_by_the_rules(sharded_results, shape):
    res = sharded_results[str(shape)]
    _, fsdp, tp = shape
    for name, spec in _expected(tp).items():
        assert res["specs"][name] == spec, (name, res["specs"][name], spec)
    # the shards really are smaller: q kernel [L=2, H=32, N=4, D=8]
    assert res["shard_shapes"]["layers.self_attn.q_proj.kernel"] == [2, 32 // fsdp, 4 // tp, 8]
    assert res["shard_shapes"]["embed_tokens"] == [256 // tp, 32 // fsdp]
    assert res["shard_shapes"]["layers.mlp.down_proj.kernel"] == [2, 64 // tp, 32 // fsdp]
    assert all(n == 8 for n in res["num_devices"].values())
    assert res["teacher_specs_equal"]
    # load_hf_checkpoint(dir, mesh=...) (sharded files) gives the same shards and the same bits
    assert res["file_load_equal"]


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 2, 4)])
def test_sharded_forward_grads_and_decode_equal_single_device(sharded_results, shape):
    res = sharded_results[str(shape)]
    assert res["logits_err"] <= 1e-5
    assert res["loss_err"] <= 1e-5
    assert res["grad_err"] <= 1e-5 * max(1.0, res["grad_scale"])
    assert res["decode_err"] <= 1e-5
    assert res["decode_vs_forward"] <= 1e-5
    # the activation constraint on the logits was applied (batch over data x fsdp, vocab over tp)
    data, fsdp, tp = shape
    batch = "('data', 'fsdp')" if data > 1 else "'fsdp'"
    assert res["logits_spec"] == f"({batch}, None, 'tp')"


def test_resolve_mesh_shape():
    assert resolve_mesh_shape((2, 2, 2), 8) == (2, 2, 2)
    assert resolve_mesh_shape((1, -1, 4), 8) == (1, 2, 4)
    assert resolve_mesh_shape({"tp": 2}, 2) == (1, 1, 2)
    assert resolve_mesh_shape({"fsdp": -1}, 8) == (1, 8, 1)
    with pytest.raises(MeshShapeError, match="needs 4 devices but 8"):
        resolve_mesh_shape((1, 2, 2), 8)
    with pytest.raises(MeshShapeError, match="does not divide"):
        resolve_mesh_shape((3, -1, 1), 8)
    with pytest.raises(MeshShapeError, match="at most one axis"):
        resolve_mesh_shape((-1, -1, 1), 8)
    with pytest.raises(MeshShapeError, match="unknown axes"):
        resolve_mesh_shape({"pp": 2}, 2)


def test_partition_spec_falls_back_to_replication_for_indivisible_dims():
    rules = partition_rules("qwen2")
    sizes = {"data": 1, "fsdp": 2, "tp": 4}
    assert logical_to_partition_spec(("layers", "embed", "kv_heads", "head_dim"), (2, 32, 2, 8), sizes, rules) \
        == P(None, "fsdp")
    assert logical_to_partition_spec(("vocab", "embed"), (256, 33), sizes, rules) == P("tp")
    # the batch rule uses both data and fsdp when they divide, the prefix that divides otherwise
    assert logical_to_partition_spec(("batch", "seq"), (4, 7), {"data": 2, "fsdp": 2, "tp": 2}, rules) \
        == P(("data", "fsdp"))
    assert logical_to_partition_spec(("batch", "seq"), (2, 7), {"data": 2, "fsdp": 2, "tp": 2}, rules) == P("data")


def test_maybe_initialize_distributed(monkeypatch):
    import jax

    from openclaw_jax.parallel import mesh as mesh_module

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(mesh_module, "_DISTRIBUTED_INITIALIZED", False)
    for var in ("JAX_NUM_PROCESSES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS",
                "JAX_PROCESS_ID"):
        monkeypatch.delenv(var, raising=False)
    assert mesh_module.maybe_initialize_distributed() is False and calls == []
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
        mesh_module.maybe_initialize_distributed()
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert mesh_module.maybe_initialize_distributed() is True
    assert calls == [dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1)]
    assert mesh_module.maybe_initialize_distributed() is True and len(calls) == 1  # idempotent
    # SLURM: let JAX auto-detect the cluster
    monkeypatch.setattr(mesh_module, "_DISTRIBUTED_INITIALIZED", False)
    for var in ("JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_ID"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert mesh_module.maybe_initialize_distributed() is True and calls[-1] == {}
