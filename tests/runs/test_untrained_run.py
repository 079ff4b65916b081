"""`trainer.enabled: false` (`runs/untrained.py`): the samples are consumed in the trainer's windows and
nothing else happens, so a memory baseline has a training run's sample budget and evaluation steps."""

from __future__ import annotations

import asyncio

from openclaw_jax.config import ExperimentConfig, TrainerConfig
from openclaw_jax.runs.untrained import UntrainedLearner
from openclaw_jax.samples import Sample, SampleStore


PEOPLE = ["alice", "bob@home"]


def _sample(i: int, reward: float) -> Sample:
    kind = "opd+rl" if reward < 0 else "rl"
    return Sample(session_id=f"s{i}", turn_index=0, kind=kind, reward=reward, prompt_ids=[1, 2], response_ids=[3],
                  rollout_logprobs=[-0.5], hints=["Please be brief."] if reward < 0 else [],
                  hint_prompt_ids=[[1, 2, 4]] if reward < 0 else [], eval_score=int(reward), person=PEOPLE[i % 2])


def test_windows_of_the_trainer_and_nothing_else(tmp_path):
    store_dir = tmp_path / "samples"
    cfg = ExperimentConfig(run_dir=str(tmp_path), trainer=TrainerConfig(enabled=False, max_steps=2, samples_per_step=3))
    model = object()
    learner = UntrainedLearner(cfg, model)
    assert learner.serving_model() is model and learner.weight_version == "0" and learner.restore(None) is False
    rewards = [-1, -1, 1, 1, 1, -1, -1]   # 7 samples: two windows of 3, one left over
    steps: list[tuple[int, dict]] = []

    async def play() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(learner.run(str(store_dir), checkpointer=None, writer=None, weight_sync=None,
                                               stop=stop, on_step=lambda step, m: steps.append((step, m))))
        await asyncio.sleep(0.3)   # no store yet: it waits
        with SampleStore(store_dir) as store:
            for i, r in enumerate(rewards):
                store.append(_sample(i, r))
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(play())
    assert [s for s, _ in steps] == [1, 2] and learner.step == 2 and learner.sample_offset == 6
    first, second = steps[0][1], steps[1][1]
    assert first["rollout/reward"] == -1 / 3 and second["rollout/reward"] == 1 / 3
    assert (first["samples/opd_rl"], first["samples/rl"]) == (2.0, 1.0)
    assert second["samples/waiting"] == 1.0 and first["weight_version"] == 0.0
    # per person: alice has samples 0, 2 (rewards -1, 1) in the first window, bob samples 1 (-1); in the
    # second, alice has 4 (1), bob 3, 5 (1, -1); bob's "@" is "_40" in a TensorBoard tag
    assert {k: v for k, v in first.items() if k.startswith("people/")} == {
        "people/alice/samples": 2.0, "people/alice/reward": 0.0, "people/alice/satisfied": 1.0,
        "people/alice/corrected": 1.0, "people/bob_40home/samples": 1.0, "people/bob_40home/reward": -1.0,
        "people/bob_40home/satisfied": 0.0, "people/bob_40home/corrected": 1.0}
    assert (second["people/alice/reward"], second["people/bob_40home/samples"]) == (1.0, 2.0)
