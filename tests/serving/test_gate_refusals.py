"""What happens after refusals: the served version stays, and after `gate.reset_after` refusals in a
row the gate logs `reset` and hands the trainer the served weights once; candidates trained before the
reset are then ignored, and the count starts again. Real servers (tests/helpers/served_stack.py): the engine
keeps serving version 0 throughout."""

from __future__ import annotations

import numpy as np
from flax import nnx

from openclaw_jax.serving.config import GateConfig
from openclaw_jax.serving.versions import VersionLog, refusals_in_a_row
from tests.helpers.served_stack import Served, perturbed


def test_refusals_keep_the_served_version_then_reset(tiny_qwen3_dir, tmp_path):
    # min_score out of reach: every candidate fails on the evidence
    stack = Served(tiny_qwen3_dir, tmp_path, gate=GateConfig(enabled=True, min_replay=0, min_score=1e9, reset_after=2))
    try:
        gate = stack.gate
        stack.lt.run(gate(stack.graphdef, perturbed(stack.state0, 1), "1"))
        assert gate.take_reset() is None
        stack.lt.run(gate(stack.graphdef, perturbed(stack.state0, 2), "2"))
        events = VersionLog(stack.versions).events()
        assert [e["event"] for e in events] == ["start", "refused", "refused", "reset"]
        assert events[-1]["version"] == "0" and events[-1]["step"] == 2 and "2 refusals in a row" in events[-1]["reason"]
        reset = gate.take_reset()
        assert reset is not None and gate.take_reset() is None          # handed over once
        for (_, a), (_, b) in zip(nnx.to_flat_state(reset), nnx.to_flat_state(stack.state0)):
            np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))

        gate.reset_done(2)                                              # the trainer restarted after step 2
        stack.lt.run(gate(stack.graphdef, perturbed(stack.state0, 3), "2"))   # trained before the reset: ignored
        assert len(VersionLog(stack.versions).events()) == len(events)
        stack.lt.run(gate(stack.graphdef, perturbed(stack.state0, 4), "3"))
        events = VersionLog(stack.versions).events()
        assert events[-1]["event"] == "refused" and refusals_in_a_row(events) == 1
        assert gate.take_reset() is None
        assert stack.logprobs()[0] == "0" and stack.engine.weight_version == "0"   # never served a refused one
    finally:
        stack.close()
