"""BackgroundWeightSync: pushes run off the trainer's path, one at a time, newest wins, failures
are retried and then reported — with the real in-process engine as the pool where it matters."""

from __future__ import annotations

import asyncio
import time

import pytest
from flax import nnx

from openclaw_jax.pool.weight_sync import BackgroundWeightSync, InProcessWeightSync


class RecordingPush:
    """A pool that takes `delay` seconds per push and fails the first `fail` attempts."""

    def __init__(self, delay: float = 0.05, fail: int = 0):
        self.delay, self.fail = delay, fail
        self.attempts: list[str] = []
        self.pushed: list[str] = []
        self.concurrent = 0
        self.max_concurrent = 0

    async def __call__(self, graphdef, state, version):
        self.attempts.append(version)
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            await asyncio.sleep(self.delay)
            if self.fail > 0:
                self.fail -= 1
                raise ConnectionError("worker unreachable")
            self.pushed.append(version)
        finally:
            self.concurrent -= 1


def test_one_in_flight_and_the_newest_version_wins():
    async def main():
        push = RecordingPush(delay=0.05)
        sync = BackgroundWeightSync(push)
        t = time.perf_counter()
        sync.submit(None, None, "1")
        submit_time = time.perf_counter() - t
        await asyncio.sleep(0.01)         # version 1 is being pushed
        t = time.perf_counter()
        for v in range(2, 6):             # four more in quick succession
            sync.submit(None, None, str(v))
        submit_time += time.perf_counter() - t   # the submits alone (not the sleep's overshoot under load)
        await sync.flush()
        return push, sync, submit_time

    push, sync, submit_time = asyncio.run(main())
    assert submit_time < 0.025            # submitting never waits for a push (each takes 0.05 s)
    assert push.max_concurrent == 1
    assert push.pushed == ["1", "5"]      # 2, 3 and 4 were superseded while 1 was in flight
    assert sync.superseded == 3 and sync.completed == 2 and sync.last_version == "5"
    assert sync.last_duration_s >= 0.05


def test_failed_push_is_retried_then_reported(caplog):
    async def main(fail):
        push = RecordingPush(delay=0.0, fail=fail)
        sync = BackgroundWeightSync(push, retries=2, backoff_s=0.01)
        sync.submit(None, None, "7")
        await sync.flush()
        return push, sync

    push, sync = asyncio.run(main(2))     # fails twice, the third attempt goes through
    assert push.attempts == ["7", "7", "7"] and push.pushed == ["7"] and sync.failures == 0
    push, sync = asyncio.run(main(5))     # never goes through: reported, not silently skipped
    assert push.attempts == ["7"] * 3 and push.pushed == [] and sync.failures == 1
    assert any("failed after 3 attempts" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(300)
def test_real_engine_keeps_serving_while_syncs_run_in_the_background(tiny_qwen3_dir, tiny_qwen3_dir_b):
    """The trainer-side submit returns at once while the engine swaps; the engine ends on the newest."""
    from openclaw_jax.inference.engine import Engine, EngineConfig
    from openclaw_jax.inference.types import GenerationSpec, SamplingParams
    from openclaw_jax.models.tokenizer import load_tokenizer
    from openclaw_jax.models.weights import load_hf_checkpoint
    from tests.helpers.server_utils import TINY_ENGINE_KW

    model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    other, _ = load_hf_checkpoint(tiny_qwen3_dir_b)
    engine = Engine(model, load_tokenizer(tiny_qwen3_dir), context_length=128, seed=0,
                    config=EngineConfig(**TINY_ENGINE_KW))
    try:
        states = [nnx.split(m)[1] for m in (other, model, other)]

        async def main():
            spec = GenerationSpec(prompt_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=60, ignore_eos=True))
            generating = asyncio.create_task(engine.generate(spec))
            sync = BackgroundWeightSync(InProcessWeightSync(engine))
            t = time.perf_counter()
            for i, state in enumerate(states):
                sync.submit(None, state, f"v{i}")
            blocking = time.perf_counter() - t
            await sync.flush()
            return sync, blocking, await generating

        sync, blocking, out = asyncio.run(main())
        assert blocking < 0.05 and sync.failures == 0
        assert engine.weight_version == "v2" and sync.last_version == "v2"
        assert len(out.output_ids) == 60  # the request ran to its end through the swaps
    finally:
        engine.shutdown()
