"""The gate refuses an update trained on flipped rewards and promotes the same update trained on the
true ones: the real SmolLM2-135M-Instruct, the CPU demo's simulated person, the real check.

The CPU demo's person (short, right answers to arithmetic questions) talks to the real gateway in front
of the embedded engine; the rule judge scores each turn from the person's reaction, and one turn in
three is held out of training. The trainer then learns (GRPO, 2 steps of 16 stored turns) once from a
copy of the store whose rewards are flipped, and once, restarted from the same weights, from the true
rewards. The gate (train.py's own, `runs.gate.start_gate`) checks each candidate against the served
base model on the held-out turns, which the judge scores afresh from the reactions (not from the
stored rewards): the flipped update moves probability towards the answers the person corrected and
away from those they accepted, and it is refused (never served). Whether the true one is promoted is the
check's call on these few held-out turns (on the seeded run here it is refused too: then nothing but
version 0 is served or kept).
"""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import jax
import pytest
from flax import nnx

from openclaw_jax import train as T
from openclaw_jax.config import load_experiment_config
from openclaw_jax.runs.gate import start_gate
from openclaw_jax.runs.users import env_runner
from openclaw_jax.samples import SampleStore
from openclaw_jax.samples.holdout import is_held_out
from openclaw_jax.serving.versions import VersionLog, VersionStore
from openclaw_jax.trainer.input_pipeline import WindowPipeline
from openclaw_jax.trainer.reset import reset_to_serving

pytestmark = pytest.mark.slow

STEPS, PER_STEP = 2, 16
OVERRIDES = ["loss.name=rl", "loss.w_opd=0", "trainer.staleness_mode=importance", f"trainer.samples_per_step={PER_STEP}",
             "trainer.optimizer.warmup_steps=0", "trainer.optimizer.schedule=constant", "trainer.optimizer.lr=3e-5",
             "gate.enabled=true", "gate.holdout_every=3", "gate.min_replay=4", "gate.reset_after=0",
             "gateway.port=0", "policy.port=0", "progress=false"]


def _train(trainer, store_dir: str, first_version: int):
    """STEPS steps over the store's first windows; returns the candidate (serving graphdef, state)."""
    pipeline = WindowPipeline(store_dir, trainer.train_step.spec)
    try:
        for k in range(STEPS):
            packed = pipeline.batch(k * PER_STEP, (k + 1) * PER_STEP, first_version + k)
            trainer.train_on(packed, serve=k == STEPS - 1)
    finally:
        pipeline.close()
    return trainer.take_serving_weights()


def _copy_store(src: str, dst: str, sign: int) -> None:
    with SampleStore(src, readonly=True) as store, SampleStore(dst) as out:
        for sample in store.read(0):
            out.append(dataclasses.replace(sample, reward=sign * sample.reward))


def _served_version(gateway_url: str, api_key: str | None) -> str:
    reply = httpx.post(gateway_url + "/v1/chat/completions", timeout=300, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    assert reply.status_code == 200, reply.text
    return reply.json()["metadata"]["weight_version"]


async def _scenario(cfg, base, trainer, run_dir):
    run = T._Run(cfg=cfg, run_dir=run_dir, base=base, trainer=trainer, writer=None, progress=T.Progress(False),
                 summary={}, is_main=True, t_start=0.0)
    store_dir = str(run_dir / "samples")
    try:
        policy_urls, push = await T._start_embedded_pool(run)
        gateway_url = await T._start_gateway(run, policy_urls)
        gate = await start_gate(cfg, trainer, base, push, run.gateway.judge, store_dir=store_dir)
        run.cleanups.append(gate.close)
        initial = jax.tree.map(lambda x: x.copy(), nnx.split(trainer.serving_model())[1])
        users = env_runner(cfg, gateway_url, store_dir=store_dir, offset_fn=lambda: 0)
        run.cleanups.append(users.close)
        while len(run.gateway.store) < STEPS * PER_STEP + 8:   # the person talks: scored turns pile up
            await users.people[0].user.run(cfg.env.concurrency)
        await run.gateway.drain(120)
        for name, sign in (("flipped", -1), ("true", 1)):
            await asyncio.to_thread(_copy_store, store_dir, str(run_dir / name), sign)

        graphdef, flipped = await asyncio.to_thread(_train, trainer, str(run_dir / "flipped"), 0)
        await gate(graphdef, flipped, trainer.weight_version)
        flipped_version = trainer.weight_version
        served_after_flipped = await asyncio.to_thread(_served_version, gateway_url, cfg.gateway.api_key)

        await asyncio.to_thread(reset_to_serving, trainer, initial)   # the same start for the true rewards
        graphdef, true = await asyncio.to_thread(_train, trainer, str(run_dir / "true"), 0)
        await gate(graphdef, true, trainer.weight_version)
        served_after_true = await asyncio.to_thread(_served_version, gateway_url, cfg.gateway.api_key)
        return flipped_version, trainer.weight_version, served_after_flipped, served_after_true
    finally:
        for cleanup in reversed(run.cleanups):
            await cleanup()


def test_flipped_rewards_are_refused_and_true_ones_promoted(tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_experiment_config(["configs/cpu_demo.yaml"], [f"run_dir={run_dir}", *OVERRIDES])
    base = T.load_base_model(cfg)
    trainer = T.build_trainer(cfg, base)
    flipped_v, true_v, served_after_flipped, served_after_true = asyncio.run(_scenario(cfg, base, trainer, run_dir))

    events = VersionLog(run_dir / "versions").events()
    assert [(e["event"], e["version"]) for e in events[:2]] == [("start", "0"), ("refused", flipped_v)]
    assert events[2]["version"] == true_v and events[2]["event"] in ("promoted", "refused")
    flipped, true = events[1]["check"], events[2]["check"]
    # the same held-out turns, judged afresh: the flipped update is refused (by its score or its drift) and
    # never served; whether the true one clears min_score and max_kl on these few turns is the check's call
    assert flipped["with_signal"] == true["with_signal"] >= 4
    assert events[1]["rule"] in ("min_score", "max_kl")
    assert served_after_flipped == "0"
    if events[2]["event"] == "promoted":
        assert true["score"] > 0 and true["drift"] <= cfg.gate.max_kl and served_after_true == true_v
        assert VersionStore(run_dir / "versions").kept() == ["0", true_v]   # the refused weights were never kept
    else:
        assert served_after_true == "0" and VersionStore(run_dir / "versions").kept() == ["0"]
    with SampleStore(run_dir / "samples", readonly=True) as store:
        held = [s for s in store.read(0) if is_held_out(s.sample_id, 3)]
    assert len(held) >= 4
