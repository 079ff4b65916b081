"""Simulated users as a background traffic source for a training run.

`EnvRunner.drive(stop)` keeps simulated users talking to the gateway until `stop` is set, with
back-pressure: while more than `backlog` samples wait for the trainer, no new sessions start
(otherwise a slow trainer would only accumulate stale samples). `preference_score()` measures
the persona's preference on held-out questions through the same gateway (side turns, greedy).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any, Callable

from openclaw_jax.envs.config import EnvConfig
from openclaw_jax.envs.openclaw_agent import AGENT_MODEL, OpenClawAgent, OpenClawDaemon
from openclaw_jax.envs.personas import persona_from_spec
from openclaw_jax.envs.questions import heldout_questions, train_questions
from openclaw_jax.envs.simulated_user import SimulatedUser, SimulatedUserConfig, preference_score
from openclaw_jax.samples import SampleStore

log = logging.getLogger(__name__)


# Held-out sessions start with this; through OpenClaw the plugin counts them as side turns
# (`sideSessionPrefixes`), directly they are sent as side turns.
HELDOUT_PREFIX = "heldout"


class EnvRunner:
    """Simulated users on a gateway; with `env.client: openclaw`, through a real OpenClaw gateway
    (`OpenClawDaemon`, started here, stopped by `close`).

    Besides its `env:` section it takes what it needs of the rest of the run explicitly: the
    sampling `temperature` (the gateway's), `backlog` (samples waiting for the trainer before no new
    session starts), the gateway's `served_model_name` and `min_main_turn_tokens` (what OpenClaw is
    told, and what a plain closing turn must ask for), `openclaw_dir` (OpenClaw's state) and
    `policy_batch_size` (the held-out evaluation's default concurrency)."""

    def __init__(self, env: EnvConfig, gateway_url: str, *, store_dir: str, api_key: str | None,
                 offset_fn: Callable[[], int], backlog: int, temperature: float, served_model_name: str,
                 min_main_turn_tokens: int, openclaw_dir: str, policy_batch_size: int):
        self.env = env
        self.policy_batch_size = policy_batch_size
        self.base_url = gateway_url.rstrip("/") + "/v1"
        self.api_key = api_key
        self.daemon: OpenClawDaemon | None = None
        model = None
        if env.client == "openclaw":
            # OpenClaw calls our gateway; the person (and the held-out evaluation) calls OpenClaw.
            agent = OpenClawAgent(gateway_url, os.path.abspath(openclaw_dir),
                                  model_id=served_model_name, context_window=env.openclaw_context_window,
                                  max_tokens=env.max_tokens, api_key=api_key or "none",
                                  side_session_prefixes=(HELDOUT_PREFIX,))
            self.daemon = OpenClawDaemon(agent)
            self.base_url, self.api_key, model = self.daemon.base_url, "none", AGENT_MODEL
        self.model = model
        self.persona = persona_from_spec(env.persona)
        self.heldout = heldout_questions(env.questions, env.heldout_questions, seed=env.seed)
        self.store_dir = store_dir
        self.offset_fn = offset_fn
        self.backlog = backlog
        self.user = SimulatedUser(
            self.persona, train_questions(env.questions, seed=env.seed), base_url=self.base_url, api_key=self.api_key,
            config=SimulatedUserConfig(turns_per_session=env.turns_per_session, concurrency=env.concurrency,
                                       max_tokens=env.max_tokens, temperature=temperature,
                                       seed=env.seed, model=model, agent_keeps_history=self.daemon is not None,
                                       close_by_endpoint=self.daemon is None,
                                       timeout_s=env.request_timeout_s,
                                       # Through OpenClaw the closing request is a plain main turn (no
                                       # X-Session-Done), so it must ask for what the gateway serves one.
                                       close_max_tokens=min_main_turn_tokens if self.daemon else 1))

    async def start(self) -> "EnvRunner":
        """Start the OpenClaw gateway when the person talks through one (off the event loop: the
        gateway it calls runs on this loop)."""
        if self.daemon is not None:
            await asyncio.to_thread(self.daemon.start)
        return self

    def _waiting(self, store: SampleStore) -> int:
        return store.refresh() - self.offset_fn()

    async def drive(self, stop: asyncio.Event) -> None:
        """Run sessions in rounds of `env.concurrency` until `stop`; errors end a round, not the run."""
        store = SampleStore(self.store_dir, readonly=True)
        try:
            while not stop.is_set():
                if self._waiting(store) >= self.backlog:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=0.25)
                    except asyncio.TimeoutError:
                        pass
                    continue
                try:
                    stats = await self.user.run(self.env.concurrency)
                    log.debug("simulated sessions: %s", stats.metrics())
                except asyncio.CancelledError:
                    raise
                except Exception:  # a failed round is logged; the run goes on
                    log.exception("simulated user round failed")
                    await asyncio.sleep(1.0)
        finally:
            store.close()

    async def heldout_eval(self, *, writer: Any = None, step: int | None = None) -> dict[str, float]:
        """Greedy held-out first answers graded two ways: `preference_score`, the fraction that
        satisfy the persona, and `accuracy`, the fraction whose final number is
        the question's answer (NaN when the questions carry no numeric answers).

        Logged as `eval/preference_score`, `eval/accuracy` and the mean rubric grade as
        `eval/mean_rubric_score`.
        """
        # By default as many held-out questions in flight as the policy batches at once: greedy decoding
        # on CPU is memory-bound, so a full batch costs about as much as one sequence. OpenClaw's
        # 2.5 k-token prompts make prefill the cost instead (env.eval_concurrency).
        env = self.env
        result = await preference_score(self.base_url, self.persona, self.heldout, max_tokens=env.max_tokens,
                                        api_key=self.api_key, timeout_s=env.request_timeout_s,
                                        concurrency=env.eval_concurrency or max(4, self.policy_batch_size),
                                        model=self.model, agent_keeps_history=self.daemon is not None,
                                        session_prefix=f"{HELDOUT_PREFIX}-{uuid.uuid4().hex[:8]}")
        record = {"preference_score": float(result.score), "accuracy": float(result.accuracy),
                  "mean_rubric_score": float(result.mean_score)}
        if writer is not None and step is not None:
            writer.scalars(step, {f"eval/{k}": v for k, v in record.items() if v == v})
            writer.flush()
        return record

    async def preference_score(self, *, writer: Any = None, step: int | None = None) -> float:
        """The held-out preference score alone (see `heldout_eval`)."""
        return (await self.heldout_eval(writer=writer, step=step))["preference_score"]

    async def close(self) -> None:
        await self.user.close()
        if self.daemon is not None:
            await asyncio.to_thread(self.daemon.stop)
