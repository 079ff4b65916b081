"""Following the config from `train.build_trainer` through one training step enters each file of
`trainer/` at most twice (`scripts/trace_cfg_walk.py`: the config tree, and with the settings built
from it), and the walk reaches the files it must (the state, the step, the batcher, the phases)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_config_walk_enters_each_trainer_file_at_most_twice():
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, "scripts")
        import trace_cfg_walk as T
        out = {}
        for derived in (False, True):
            result = T.trace(derived=derived)
            out[str(derived)] = {"entered": result["entered"], "over": T.over_the_bar(result)}
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    walks = json.loads(proc.stdout.strip().splitlines()[-1])
    for derived, walk in walks.items():
        assert walk["over"] == {}, (derived, walk["entered"])
    entered = walks["True"]["entered"]
    assert {"openclaw_jax/trainer/state.py", "openclaw_jax/trainer/train_step.py", "openclaw_jax/trainer/batcher.py",
            "openclaw_jax/trainer/step.py"} <= set(entered), entered   # the walk went through one step
