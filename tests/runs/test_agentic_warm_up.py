"""The agentic SFT warm-up (`runs.agentic.warm_up`) hands RL the warmed-up policy as its student and
as its frozen teacher: the KL anchor (`loss.kl_coef`) and an OPD teacher then hold RL near the policy
it starts from, not near the model before the warm-up (which cannot do the task at all)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flax import nnx

from openclaw_jax.config import load_experiment_config
from openclaw_jax.runs.agentic import warm_up
from openclaw_jax.runs.base_model import load_base_model

ROOT = Path(__file__).resolve().parents[2]


def flat(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, k)): np.asarray(v.get_value(), np.float32)
            for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_warm_up_makes_the_warmed_up_model_the_frozen_teacher_too(tmp_path):
    cfg = load_experiment_config([str(ROOT / "configs/tiny_cpu.yaml")], [f"run_dir={tmp_path}",
                                  "agentic.enabled=true", "agentic.env=easy", "env.enabled=false",
                                  "agentic.warmup_steps=2", "agentic.warmup_examples=4",
                                  "agentic.warmup_batch_size=2", "agentic.warmup_lr=1e-2"])
    base = load_base_model(cfg)
    before = flat(base.teacher)
    warmed = warm_up(cfg, base, tmp_path)
    student, teacher = flat(warmed.model), flat(warmed.teacher)
    assert student.keys() == teacher.keys() == before.keys()
    assert max(np.abs(student[k] - before[k]).max() for k in student) > 1e-3   # the warm-up moved the weights
    for k in student:
        np.testing.assert_allclose(teacher[k], student[k], atol=1e-6, err_msg=k)
    # the cached warm-up (a resumed run) gives the same pair
    again = warm_up(cfg, load_base_model(cfg), tmp_path)
    for k, v in flat(again.teacher).items():
        np.testing.assert_allclose(v, student[k], atol=1e-6, err_msg=k)
