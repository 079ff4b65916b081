"""`python -m openclaw_jax.train --config configs/<x>.yaml [key=value ...]`

Starts, as the config says, the embedded JAX policy server (in this process, or as its own process
ahead of this one in CPU priority: `policy.mode=process`; or a client to an external SGLang pool), the
gateway with its judge and sample store, simulated users (optional), and the trainer, in this process
on one asyncio loop (jitted work runs in threads). Ctrl-C /
SIGTERM stops everything cleanly: users stop, the trainer finishes its step and checkpoints,
the gateway drains, servers close.

Layout of `run_dir`: `config.yaml` (the resolved config), `base_model/` (a random model's HF
dir), `samples/` (the store), `ckpt/` (orbax), `tb/` (TensorBoard), `export/step_N/` (HF
safetensors of the trained model), `weights/` (external pool and policy process sync), `policy.log`
(the policy process's log), `eval.jsonl`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
from aiohttp import web
from flax import nnx

from openclaw_jax.compile_cache import enable_compile_cache
from openclaw_jax.config import ExperimentConfig, PolicyConfig, load_experiment_config
from openclaw_jax.configlib import ConfigError, dump_yaml
from openclaw_jax.cpu_priority import lower_threads, lowered_executor
from openclaw_jax.envs.openclaw_connect import connect_command
from openclaw_jax.gateway.server import API_KEY_ENV, start_gateway, stop_gateway
from openclaw_jax.gateway.status import trainer_summary
from openclaw_jax.inference.engine import Engine
from openclaw_jax.inference.server import API_KEY_ENV as POLICY_API_KEY_ENV, InferenceServer
from openclaw_jax.inference.vision import VisionGenerator
from openclaw_jax.logs import configure_logging
from openclaw_jax.models.hub import save_checkpoint
from openclaw_jax.parallel.mesh import maybe_initialize_distributed
from openclaw_jax.pool.client import PoolClient
from openclaw_jax.pool.weight_sync import DiskWeightSync, InProcessWeightSync, worker_urls
from openclaw_jax.runs.base_model import BaseModel, build_trainer, load_base_model, process_local_copy
from openclaw_jax.runs.agentic import AgenticDriver, policy_images, warm_up
from openclaw_jax.runs.gate import LateJudge, start_gate
from openclaw_jax.runs.person_adapters import AdapterPublisher, engine_settings, server_flags
from openclaw_jax.runs.policy_process import PolicyProcess, engine_config, server_command
from openclaw_jax.runs.untrained import UntrainedLearner
from openclaw_jax.runs.users import env_runner
from openclaw_jax.serving.versions import versions_dir_for
from openclaw_jax.trainer.checkpoint import Checkpointer
from openclaw_jax.trainer.metrics import MetricsWriter
from openclaw_jax.trainer.people import ADAPTERS_DIR, PerPersonTrainer
from openclaw_jax.trainer.reset import reset_to_serving
from openclaw_jax.pool.weight_sync import BackgroundWeightSync

log = logging.getLogger("openclaw_jax.train")


# ----------------------------------------------------------------------------- progress


class Progress:
    """One console line, rewritten in place (a progress display, not logging)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.fields: dict[str, str] = {}

    def update(self, **fields: Any) -> None:
        for k, v in fields.items():
            self.fields[k] = f"{v:.4g}" if isinstance(v, float) else str(v)
        if self.enabled:
            line = "  ".join(f"{k} {v}" for k, v in self.fields.items())
            sys.stderr.write("\r\033[K" + line[:200])
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


# ----------------------------------------------------------------------------- the run


@dataclasses.dataclass
class _Run:
    """What the parts of one run share."""

    cfg: ExperimentConfig
    run_dir: Path
    base: BaseModel
    trainer: Any
    writer: Any
    progress: Progress
    summary: dict[str, Any]
    is_main: bool
    t_start: float
    cleanups: list[Any] = dataclasses.field(default_factory=list)
    pool_api_key: str | None = None   # the policy servers' bearer key (the embedded one's is made per run)
    gateway: Any = None   # the in-process gateway (process 0 of a conversation run)
    gate: Any = None      # the promotion gate between the trainer and the pool (serving/gate.py)
    sessions: Any = None   # the simulated person's SessionLog (conversation runs)
    adapters: AdapterPublisher | None = None   # per-person runs: serves each person's adapter as it trains

    def record_eval(self, record: dict[str, Any]) -> None:
        record["time_s"] = time.monotonic() - self.t_start
        with open(self.run_dir / "eval.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


async def _start_embedded_pool(r: _Run):
    """Process 0 serves the student with the JAX engine; returns (policy urls, weight push)."""
    # With several processes every one takes part in gathering the weights.
    serving = await asyncio.to_thread(process_local_copy, r.trainer.serving_model())
    policy_urls, sync = [], None
    if r.is_main:
        cfg, base = r.cfg, r.base
        # a Qwen2.5-VL policy: the engine serves its text decoder, the image path (inference/vision.py) the
        # whole model; weight pushes swap both under one version (`swap_served_weights`)
        vision = VisionGenerator(serving, weight_version=r.trainer.weight_version,
                                 max_batch=cfg.policy.max_batch_size) \
            if hasattr(serving, "vl_cfg") else None
        engine = Engine(serving.language_model if vision is not None else serving, base.tokenizer,
                        context_length=cfg.policy.context_length or None,
                        config=dataclasses.replace(engine_config(cfg.policy), **engine_settings(cfg, r.run_dir)),
                        weight_version=_served_version(r), seed=cfg.seed)
        # A fresh key per run (or policy.api_key / $OPENCLAW_POLICY_API_KEY when given), handed to the gateway and
        # the agentic driver: the control routes (pause, abort, flush, weight updates) stay closed to anything
        # else that reaches the port, even on loopback.
        r.pool_api_key = cfg.policy.api_key or os.environ.get(POLICY_API_KEY_ENV) or secrets.token_urlsafe(32)
        server = InferenceServer(engine, base.tokenizer, model_path=base.model_dir,
                                 served_model_name=Path(base.model_dir).name, vision=vision, api_key=r.pool_api_key,
                                 image_limits=cfg.gateway.image_limits,
                                 # a rollback serves kept weights again: the only files it may load over HTTP
                                 weight_dirs=[versions_dir_for(r.run_dir / "samples")])
        runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, cfg.policy.host, cfg.policy.port)
        await site.start()
        r.cleanups.append(runner.cleanup)
        policy_urls = [f"http://{cfg.policy.host}:{runner.addresses[0][1]}"]
        sync = InProcessWeightSync(engine, vision=vision)

    async def push(graphdef, state, version):
        # `state` is already detached from the trainer's buffers (Trainer.run hands over a copy)
        if sync is not None:
            await sync(graphdef, state, version)

    return policy_urls, push


def _served_version(r: _Run) -> str:
    """The weight version the pool starts serving: the trainer's, or "0" (the base) in a per-person run."""
    return "0" if r.cfg.trainer.personalize == "per_person" else r.trainer.weight_version


async def _start_policy_process(r: _Run, resumed: bool):
    """policy.mode=process: the JAX server as a child process at this process's priority, then this process's
    trainer lowered (`_lower_the_trainer`); returns (policy urls, weight push)."""
    if jax.process_count() > 1:
        raise ConfigError("policy.mode=process runs one policy server beside a single-process trainer; with "
                          f"{jax.process_count()} processes use policy.mode=embedded or external")
    # it starts on the base weights (version 0); a resumed run pushes its own below, as for external workers.
    # Its key: policy.api_key (or $OPENCLAW_POLICY_API_KEY) when given, else a fresh one per run as for the
    # embedded server; handed over in its environment, not its command line.
    key = r.cfg.policy.api_key or os.environ.get(POLICY_API_KEY_ENV) or secrets.token_urlsafe(32)
    weight_dir = Path(r.cfg.policy.weight_sync_dir or r.run_dir / "weights")
    weight_dir.mkdir(parents=True, exist_ok=True)
    versions_dir = versions_dir_for(r.run_dir / "samples")   # where a rollback's kept weights are
    versions_dir.mkdir(parents=True, exist_ok=True)
    command = server_command(r.cfg, r.base.model_dir, r.trainer.weight_version if not resumed else "0",
                             [weight_dir, versions_dir]) + server_flags(engine_settings(r.cfg, r.run_dir))
    server = PolicyProcess(command, r.run_dir / "policy.log", env={POLICY_API_KEY_ENV: key})
    url = await server.start()
    r.cleanups.append(server.stop)
    _lower_the_trainer(r.cfg.policy)
    return await _connect_external_pool(r, resumed, urls=[url], api_key=key)


def _lower_the_trainer(policy: PolicyConfig) -> None:
    """Every thread of this process but the event loop's (the gateway answers turns on it; threads it starts,
    such as its request pools, keep its priority) to nice `policy.trainer_nice` (with `policy.trainer_idle`, the
    threads that run no Python, XLA's pools, to SCHED_IDLE), and the loop's default executor, which runs the
    trainer's steps, checkpoints and weight exports and the gate's replays, with threads that lower themselves
    to that nice value (`cpu_priority.py`)."""
    if not (policy.trainer_idle or policy.trainer_nice):
        return
    lowered = lower_threads(policy.trainer_nice, policy.trainer_idle, spare=[threading.get_native_id()])
    asyncio.get_running_loop().set_default_executor(lowered_executor(policy.trainer_nice, name="trainer"))
    log.info("the trainer's threads (%d now, and its executor's) at nice %d%s; the gateway's event loop and the "
             "policy server keep their priority", lowered, policy.trainer_nice,
             ", XLA's in SCHED_IDLE" if policy.trainer_idle else "")


async def _connect_external_pool(r: _Run, resumed: bool, urls: list[str] | None = None, api_key: str | None = None):
    """A client to external SGLang workers (`urls` and `api_key`, else the config's) and a disk weight push;
    returns (policy urls, weight push)."""
    cfg, base = r.cfg, r.base
    client = None
    r.pool_api_key = api_key or cfg.policy.api_key or os.environ.get(POLICY_API_KEY_ENV) or None
    if r.is_main:
        client = PoolClient(urls or worker_urls(cfg.policy.urls, cfg.policy.worker_urls),
                            request_timeout_s=cfg.policy.request_timeout_s, api_key=r.pool_api_key)
        await client.start()
        r.cleanups.append(client.close)
    push = DiskWeightSync(client, cfg.policy.weight_sync_dir or r.run_dir / "weights",
                          model_config=base.config.replace(param_dtype=cfg.model.dtype), extra_config=base.hf_config,
                          tokenizer_files_from=None if base.model_dir == "smollm2" else base.model_dir)
    if resumed and cfg.trainer.personalize == "shared":  # the workers serve the base; bring them to the resumed weights
        graphdef, state = nnx.split(r.trainer.serving_model())
        await push(graphdef, state, r.trainer.weight_version)
    return list(urls or cfg.policy.urls), push


async def _start_gateway(r: _Run, policy_urls: list[str]) -> str:
    """The OpenAI-compatible gateway (judge + sample store) in front of the pool; returns its URL."""
    # `rl` trains on rewards alone: the judge casts no hint votes (no wasted judge calls)
    gw_cfg = dataclasses.replace(r.cfg.gateway.with_environment(os.environ), policy_urls=tuple(policy_urls),
                                 store_dir=str(r.run_dir / "samples"), model=r.base.model_dir,
                                 worker_urls=r.cfg.gateway.worker_urls or tuple(r.cfg.policy.worker_urls),
                                 judge_hints=r.cfg.gateway.judge_hints and r.cfg.loss.uses_hints,
                                 policy_api_key=r.pool_api_key,
                                 # the run's seed: the same conversation holds out the same turns for the gate
                                 sample_id_seed=r.cfg.gateway.sample_id_seed if r.cfg.gateway.sample_id_seed is not
                                 None else r.cfg.seed)
    gateway, gw_runner, gateway_url = await start_gateway(gw_cfg, tokenizer=r.base.tokenizer)
    # on a stop, turns whose next state already arrived are judged and stored first (the next run trains them)
    r.cleanups.append(lambda: stop_gateway(gateway, gw_runner, grace_s=gw_cfg.shutdown_grace_s))
    r.gateway = gateway
    log.info("gateway: %s/v1 (OpenAI-compatible); status page: %s/", gateway_url, gateway_url)
    r.summary["gateway_url"] = gateway_url
    if not r.cfg.env.enabled:
        _announce_live(r, gateway_url, gw_cfg)
    return gateway_url


def _announce_live(r: _Run, gateway_url: str, gw_cfg) -> None:
    """Live mode (no simulated users): where the person's OpenClaw connects, and how the run continues."""
    command = connect_command(gateway_url, gw_cfg.served_model_name, gw_cfg.max_prompt_tokens,
                              gw_cfg.default_max_tokens, api_key_env=API_KEY_ENV if gw_cfg.api_key else None)
    log.info("live mode: no simulated users; your OpenClaw is the only client of %s/v1 (model %r)", gateway_url,
             gw_cfg.served_model_name)
    # the command on a record of its own: log records are one line each (control characters escaped)
    log.info("connect your OpenClaw once (keeps your other providers, plugins and settings; `disconnect` undoes "
             "it) with the command on the next line")
    log.info("%s", command)
    if gw_cfg.api_key:
        log.info("(--api-key: the gateway.api_key this run was given; put it in $%s first, or write it in place)",
                 API_KEY_ENV)
    log.info("several people on this gateway: each connects their own OpenClaw with that command and %s; the status "
             "page shows each person's numbers (docs/household.md)",
             "--api-key <their key of gateway.keys_file>" if gw_cfg.keys_file else "--person-id <their name>")
    gate = r.cfg.gate
    if r.cfg.trainer.personalize == "per_person":
        log.info("serving each person their own adapter once it has trained (the base model, version 0, until then): "
                 "trainer.personalize=per_person, %d adapters so far, at step %d, trained on samples [0, %d); Ctrl-C "
                 "saves and stops, the same command continues", len(r.trainer.adapters), r.trainer.step,
                 r.trainer.sample_offset)
        return
    served = r.gate.served_version if r.gate is not None else r.trainer.weight_version
    if gate.enabled:
        log.info("promotion gate on: a trained version serves only after it passes the check on your held-out turns "
                 "(1 scored turn in %d is held out; a promotion needs %d of them: about %d scored turns); what it "
                 "decided: %s/", gate.holdout_every, gate.min_replay, gate.holdout_every * gate.min_replay, gateway_url)
    trained = (f"trained on samples [0, {r.trainer.sample_offset})" if served == r.trainer.weight_version else
               f"the last one the gate promoted (the trainer is at step {r.trainer.step}, trained on samples "
               f"[0, {r.trainer.sample_offset}))")
    log.info("serving weight version %s, %s; Ctrl-C saves and stops, the same command continues", served, trained)


async def _start_agentic(r: _Run, policy_urls: list[str], stop: asyncio.Event):
    """Group rollouts of an environment feed the store; returns (evaluate, driver, drive task)."""
    trainer = r.trainer
    agentic = await AgenticDriver(r.cfg, policy_urls, r.base.tokenizer, store_dir=str(r.run_dir / "samples"),
                                  offset_fn=lambda: trainer.sample_offset,
                                  images=policy_images(r.base), pool_api_key=r.pool_api_key).start()
    r.cleanups.append(agentic.close)
    r.summary["heldout"] = []

    async def evaluate(step: int) -> float:
        record = await agentic.evaluate(step, r.writer)
        r.record_eval(record)
        r.summary["heldout"].append(record)
        r.progress.update(heldout=record["heldout_success"])
        log.info("held-out success at step %d: %.3f %s%s", step, record["heldout_success"], record["per_family"],
                 f"; sampled ({record['samples_per_task']} a task) {record['heldout_success_sampled']:.3f}"
                 if "heldout_success_sampled" in record else "")
        return record["heldout_success"]

    await evaluate(trainer.step)
    return evaluate, agentic, asyncio.create_task(agentic.drive(stop))


async def _start_users(r: _Run, gateway_url: str, stop: asyncio.Event):
    """Simulated users talk to the gateway; returns (evaluate, drive task)."""
    trainer = r.trainer
    env = env_runner(r.cfg, gateway_url, store_dir=str(r.run_dir / "samples"), offset_fn=lambda: trainer.sample_offset,
                     writer=r.writer, step_fn=lambda: trainer.step)
    r.cleanups.append(env.close)
    await env.start()
    r.sessions = env.sessions

    async def evaluate(step: int) -> float:
        t = time.monotonic()
        graded = await env.heldout_eval(writer=r.writer, step=step)
        score, accuracy = graded["preference_score"], graded["accuracy"]
        r.progress.update(pref=score, acc=accuracy)
        # the person's sessions so far beside the held-out numbers: sessions to a stable effect (envs/sessions.py)
        record = {"step": step, "preference_score": score, "accuracy": accuracy if accuracy == accuracy else None,
                  "eval_s": round(time.monotonic() - t, 2), **env.sessions.summary()}
        if "people" in graded:   # a household (env.people): each person's held-out numbers beside their sessions
            record["people"] = {p: {**graded["people"][p], **record["people"][p]} for p in graded["people"]}
            for p, own in record["people"].items():
                log.info("held-out preference score of %s at step %d: %.3f, accuracy %.3f", p, step,
                         own["preference_score"], own["accuracy"])
        r.record_eval(record)
        r.summary["preference"].append(record)
        log.info("held-out preference score at step %d: %.3f, accuracy %.3f (%.1f s)", step, score, accuracy,
                 record["eval_s"])
        return score

    await evaluate(trainer.step)
    return evaluate, asyncio.create_task(env.drive(stop))


def _step_callback(r: _Run, evaluate, agentic):
    """What happens after each training step: progress, rollout logs, exports, periodic evaluation."""
    cfg, trainer = r.cfg, r.trainer

    async def on_step(step: int, metrics: dict[str, float]) -> None:
        r.progress.update(step=f"{step}/{cfg.trainer.max_steps}", loss=metrics.get("loss", float("nan")),
                          reward=metrics.get("rollout/reward", float("nan")),
                          waiting=int(metrics.get("samples/waiting", 0)))
        if agentic is not None:
            agentic.log_rollouts(step, r.writer)
        if r.adapters is not None:   # the people just trained are served their new adapters
            await r.adapters.publish(trainer.last_stepped)
        reset = r.gate.take_reset() if r.gate is not None else None
        if reset is not None:   # refusals in a row: train on from the served weights (serving/gate.py)
            await asyncio.to_thread(reset_to_serving, trainer, reset)
            r.gate.reset_done(step)
        if cfg.trainer.export_every and step % cfg.trainer.export_every == 0:
            await asyncio.to_thread(export, trainer, r.base, r.run_dir)
        eval_every = cfg.agentic.eval_every if cfg.agentic.enabled else cfg.env.eval_every
        if evaluate is not None and eval_every and step % eval_every == 0 \
                and step < cfg.trainer.max_steps:
            await evaluate(step)

    return on_step


async def _start_gate(r: _Run, push) -> None:
    """What is served, and logged, goes through the gate, which starts first: on a restart it brings the pool back
    to the version served before (kept weights), so the gateway's first answer comes from that one. Its judge is
    the gateway's (nothing is judged before the gateway runs). Per person no trained version is served: nothing to
    gate (the config keeps it off)."""
    if r.cfg.trainer.personalize == "shared":
        r.gate = await start_gate(r.cfg, r.trainer, r.base, push, LateJudge(lambda: r.gateway.judge),
                                  store_dir=str(r.run_dir / "samples"))
        r.cleanups.append(r.gate.close)


async def _start_adapter_serving(r: _Run, policy_urls: list[str]) -> None:
    """Per-person runs: each person's adapter is served to them (runs/person_adapters.py); a resumed run's
    adapters at once."""
    r.adapters = await AdapterPublisher(
        r.trainer, r.run_dir, base_model=r.base.model_dir,
        policy_urls=policy_urls if r.cfg.policy.mode == "external" else policy_urls[:1],
        api_key=r.pool_api_key, request_timeout_s=r.cfg.policy.request_timeout_s,
        on_served=r.gateway.serve_adapter if r.gateway is not None else None,
        by_path=r.cfg.policy.mode == "external").start()
    r.cleanups.append(r.adapters.close)
    await r.adapters.publish(list(r.trainer.adapters))


def _weight_sync(r: _Run, push) -> BackgroundWeightSync | None:
    """How trained weights reach the pool (through the gate when there is one); None: they do not."""
    if r.cfg.trainer.personalize == "per_person":
        log.info("trainer.personalize=per_person: each person's adapter trains on their own samples and is served to "
                 "them after each of their steps from %s/<person>/; no shared weights are pushed; the adapters are "
                 "checkpointed in %s and exported to %s/export/step_N/%s/<person>/ (docs/household.md)",
                 r.adapters.directory if r.adapters else "-", r.run_dir / "ckpt", r.run_dir, ADAPTERS_DIR)
        return None
    return BackgroundWeightSync(r.gate or push) if push is not None else None


async def _prepare(cfg: ExperimentConfig, run_dir: Path, t_start: float) -> tuple[_Run, Any, bool]:
    """Base model (+ SFT warm-up), trainer, checkpoint restore, writers; returns (run, checkpointer, resumed)."""
    base = await asyncio.to_thread(load_base_model, cfg)
    if cfg.agentic.enabled and cfg.agentic.warmup_steps:  # SFT warm-up on demonstrations (cached in the run)
        base = await asyncio.to_thread(warm_up, cfg, base, run_dir)
    trainer = await asyncio.to_thread(build_trainer, cfg, base) if cfg.trainer.enabled \
        else UntrainedLearner(cfg, base.model)
    checkpointer = Checkpointer(run_dir / "ckpt", max_to_keep=cfg.trainer.keep_checkpoints)
    resumed = await asyncio.to_thread(trainer.restore, checkpointer)
    is_main = jax.process_index() == 0
    r = _Run(cfg=cfg, run_dir=run_dir, base=base, trainer=trainer,
             writer=MetricsWriter(run_dir / "tb", enabled=is_main), progress=Progress(cfg.progress and is_main),
             summary={"resumed": resumed, "start_step": trainer.step, "preference": []}, is_main=is_main,
             t_start=t_start)
    return r, checkpointer, resumed


def _stop_on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    # said at once: saving a checkpoint and the export can take a minute or more on a loaded CPU
    log.info("%s: stopping; the trainer finishes its step, checkpoints and exports first (the final evaluation "
             "is skipped)", sig.name)
    stop.set()


async def run(cfg: ExperimentConfig) -> dict[str, Any]:
    """Run the whole loop; returns a summary (steps, preference scores, wall time)."""
    t_start = time.monotonic()
    maybe_initialize_distributed()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        (run_dir / "config.yaml").write_text(dump_yaml(cfg))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, _stop_on_signal, sig, stop)

    r, checkpointer, resumed = await _prepare(cfg, run_dir, t_start)
    trainer, summary = r.trainer, r.summary
    env_tasks: list[asyncio.Task] = []
    try:
        # serving pool (process 0 talks to it; every process takes part in weight export)
        if cfg.policy.mode == "embedded":
            policy_urls, push = await _start_embedded_pool(r)
        elif cfg.policy.mode == "process":
            policy_urls, push = await _start_policy_process(r, resumed)
        else:
            policy_urls, push = await _connect_external_pool(r, resumed)
        log.info("policy pool: %s", policy_urls)

        # gateway (judge + sample store) and simulated users, or an agentic environment: process 0 only
        evaluate = agentic = None
        if r.is_main and cfg.agentic.enabled:
            evaluate, agentic, task = await _start_agentic(r, policy_urls, stop)
            env_tasks.append(task)
        elif r.is_main:
            await _start_gate(r, push)
            gateway_url = await _start_gateway(r, policy_urls)
            if cfg.env.enabled:
                evaluate, task = await _start_users(r, gateway_url, stop)
                env_tasks.append(task)
        if isinstance(trainer, PerPersonTrainer):
            await _start_adapter_serving(r, policy_urls)

        await trainer.run(str(run_dir / "samples"), checkpointer=checkpointer, writer=r.writer,
                          weight_sync=_weight_sync(r, push), stop=stop, on_step=_step_callback(r, evaluate, agentic),
                          progress=lambda text: r.progress.update(status=text))
        interrupted = stop.is_set()  # Ctrl-C / SIGTERM: checkpoint and export, skip the final evaluation
        summary["interrupted"] = interrupted
        stop.set()
        for task in env_tasks:
            task.cancel()
        await asyncio.gather(*env_tasks, return_exceptions=True)
        await asyncio.to_thread(trainer.save_checkpoint, checkpointer)
        if cfg.trainer.enabled:   # an untrained run serves the base model: nothing to export
            summary["export_dir"] = str(await asyncio.to_thread(export, trainer, r.base, run_dir))
        if evaluate is not None and trainer.step > summary["start_step"] and not interrupted:
            await evaluate(trainer.step)
    finally:
        r.progress.close()
        for task in env_tasks:   # after an error too: no session may outlive the clients the cleanups close
            task.cancel()
        await asyncio.gather(*env_tasks, return_exceptions=True)
        for cleanup in reversed(r.cleanups):
            with contextlib.suppress(Exception):
                await cleanup()
        r.writer.close()
        checkpointer.close()
    summary["end_step"] = trainer.step
    if r.gate is not None:
        events = r.gate.log.events()
        summary["served_version"] = r.gate.log.served_version(events)   # a rollback may have changed it
        summary["versions"] = trainer_summary(events)   # the run directory's gate decisions, as the status page counts
    summary["wall_time_s"] = time.monotonic() - t_start
    if r.sessions is not None:   # the person's sessions as they ended (envs/sessions.py)
        summary.update(r.sessions.summary())
    if jax.process_index() == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def export(trainer, base: BaseModel, run_dir: Path) -> Path:
    """HF safetensors (+ tokenizer files) of the current student under export/step_N; per person
    (`trainer.personalize=per_person`): each person's adapter under export/step_N/adapters/<person>/."""
    out = run_dir / "export" / f"step_{trainer.step}"
    if isinstance(trainer, PerPersonTrainer):
        return trainer.export_adapters(out / ADAPTERS_DIR, base_model=base.model_dir).parent
    if not out.exists():
        save_checkpoint(trainer.serving_model(trainer.cfg.trainer.export_dtype), None, out,
                        extra_config=base.hf_config)
        if hasattr(base.tokenizer, "save_pretrained"):
            base.tokenizer.save_pretrained(out)
    return out


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m openclaw_jax.train",
        description="Train a model from live conversations (hybrid GRPO + top-K OPD), serving it meanwhile.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  # live: your own OpenClaw is the user; serves on http://127.0.0.1:8000 and prints the command\n"
               "  # that connects OpenClaw (docs/live.md); Ctrl-C saves, the same command continues\n"
               "  python -m openclaw_jax.train --config configs/live_cpu.yaml\n"
               "  # a simulated person, the whole loop on a tiny random model in minutes\n"
               "  python -m openclaw_jax.train --config configs/tiny_cpu.yaml trainer.max_steps=5 run_dir=runs/try")
    parser.add_argument("--config", action="append", default=[], metavar="YAML",
                        help="YAML config file (repeatable; later files override earlier ones)")
    parser.add_argument("--gin-file", action="append", default=[], metavar="GIN",
                        help="gin file binding config fields, e.g. `TrainerConfig.max_steps = 10`")
    parser.add_argument("--gin", action="append", default=[], metavar="BINDING",
                        help="one gin binding, e.g. --gin 'loss.name = \"rl\"'")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. trainer.max_steps=10 loss.subset_mode=overlap")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_experiment_config(args.config, args.overrides, args.gin_file, args.gin)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(dump_yaml(cfg))
        return 0
    configure_logging(cfg.log_level)
    enable_compile_cache(cfg.compile_cache_dir)
    summary = asyncio.run(run(cfg))
    log.info("done: %s", json.dumps({k: v for k, v in summary.items() if k != "preference"}))
    for record in summary["preference"]:
        log.info("preference score at step %d: %.3f, accuracy %s", record["step"], record["preference_score"],
                 record.get("accuracy"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
