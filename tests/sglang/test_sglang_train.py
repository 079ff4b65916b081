"""`python -m openclaw_jax.train --config configs/tiny_sglang_cpu.yaml` against two real SGLang workers.

The run's policy pool is the session's two SGLang workers (policy.mode=external); after 3 steps
both workers serve weight version 3, loaded from the run's HF exports.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

from openclaw_jax.samples import SampleStore
from tests.helpers.sglang_workers import REPO

pytestmark = pytest.mark.sglang


def test_train_three_steps_on_sglang_workers(sglang_workers, sglang_model_dir, tmp_path):
    a, b = sglang_workers
    for w in (a, b):  # the run starts from the weights the workers serve, as version 0
        r = requests.post(w.url + "/update_weights_from_disk",
                          json={"model_path": str(sglang_model_dir), "weight_version": "0"}, timeout=300)
        assert r.status_code == 200 and r.json()["success"], r.text
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", str(REPO / "configs" / "tiny_sglang_cpu.yaml"),
           f"run_dir={run_dir}", f"model.path={sglang_model_dir}", f"policy.urls=[{a.url}, {b.url}]",
           "trainer.max_steps=3", "progress=false", "env.heldout_questions=2"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"run failed:\n{proc.stderr[-6000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["end_step"] == 3
    # weight versions advanced on both SGLang workers, loaded from the run's exports
    assert [requests.get(w.url + "/get_model_info", timeout=30).json()["weight_version"] for w in (a, b)] == ["3", "3"]
    # the newest two exports are kept; step 2's push may be superseded by step 3 before it starts
    # (the background sync says so in the log), and then it is never exported
    step2_superseded = "version 2 superseded by 3" in proc.stderr
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == \
        (["step_1", "step_3"] if step2_superseded else ["step_2", "step_3"])
    assert "weights pushed to 2 worker(s): weight_version=3" in proc.stderr
    with SampleStore(run_dir / "samples", readonly=True) as store:
        samples = store.read(0)
    assert len(samples) >= 12
    versions = [int(s.weight_version) for s in samples]  # SGLang's weight_version of each rollout
    assert set(versions) <= {0, 1, 2, 3} and versions[0] == 0
