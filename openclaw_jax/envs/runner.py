"""Simulated users as a background traffic source for a training run.

`EnvRunner.drive(stop)` keeps simulated users talking to the gateway until `stop` is set, with
back-pressure: while more than `backlog` samples wait for the trainer, no new sessions start
(otherwise a slow trainer would only accumulate stale samples). Every session is recorded in order
with the person's verdict (`envs.sessions.SessionLog`: sessions to a stable effect); with
`env.memory: user_md` the person's corrections are kept as notes in OpenClaw's USER.md before each
round (`envs.memory`). `preference_score()` measures the persona's preference on held-out questions
through the same gateway (side turns, greedy).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Callable

from openclaw_jax.envs.config import EnvConfig, person_of
from openclaw_jax.envs.memory import CorrectionNotes
from openclaw_jax.envs.openclaw_agent import AGENT_MODEL, OpenClawAgent, OpenClawDaemon
from openclaw_jax.envs.personas import Persona, persona_from_spec
from openclaw_jax.envs.questions import heldout_questions, train_questions
from openclaw_jax.envs.sessions import HouseholdSessions, SessionLog
from openclaw_jax.envs.simulated_user import PreferenceScore, SimulatedUser, SimulatedUserConfig, preference_score
from openclaw_jax.samples import SampleStore
from openclaw_jax.samples.person import person_tag

log = logging.getLogger(__name__)


# Held-out sessions start with this; through OpenClaw the plugin counts them as side turns
# (`sideSessionPrefixes`), directly they are sent as side turns.
HELDOUT_PREFIX = "heldout"


@dataclasses.dataclass
class SimulatedPerson:
    """One simulated person of a run: who they are to the gateway ("": nobody named, the gateway's default
    person), what they want, their sessions in order, and where their held-out answers are recorded."""

    person_id: str
    persona: Persona
    user: SimulatedUser
    sessions: SessionLog
    record_dir: Path | None


class EnvRunner:
    """Simulated users on a gateway; with `env.client: openclaw`, through a real OpenClaw gateway
    (`OpenClawDaemon`, started here, stopped by `close`).

    Besides its `env:` section it takes what it needs of the rest of the run explicitly: the
    sampling `temperature` (the gateway's), `backlog` (samples waiting for the trainer before no new
    session starts), the gateway's `served_model_name` and `min_main_turn_tokens` (what OpenClaw is
    told, and what a plain closing turn must ask for), `openclaw_dir` (OpenClaw's state) and
    `policy_batch_size` (the held-out evaluation's default concurrency). Optional: `record_dir`, where
    `sessions.jsonl` (the person's sessions in order) and `heldout/step_<N>.jsonl` (each held-out answer
    with its verdict) are written, `writer` (TensorBoard) and `step_fn` (the trainer's step, recorded
    with each session)."""

    def __init__(self, env: EnvConfig, gateway_url: str, *, store_dir: str, api_key: str | None,
                 offset_fn: Callable[[], int], backlog: int, temperature: float, served_model_name: str,
                 min_main_turn_tokens: int, openclaw_dir: str, policy_batch_size: int,
                 record_dir: str | None = None, writer: Any = None, step_fn: Callable[[], int] | None = None):
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
        self.notes = (CorrectionNotes(store_dir, self.daemon.agent.workspace, env.memory_max_notes)
                      if env.memory == "user_md" and self.daemon is not None else None)
        self.record_dir = Path(record_dir) if record_dir else None
        self.step_fn = step_fn
        self.model = model
        self.heldout = heldout_questions(env.questions, env.heldout_questions, seed=env.seed)
        self.store_dir = store_dir
        self.offset_fn = offset_fn
        self.backlog = backlog
        user_config = SimulatedUserConfig(turns_per_session=env.turns_per_session, concurrency=env.concurrency,
                                          max_tokens=env.max_tokens, temperature=temperature,
                                          seed=env.seed, model=model, agent_keeps_history=self.daemon is not None,
                                          close_by_endpoint=self.daemon is None,
                                          timeout_s=env.request_timeout_s,
                                          # Through OpenClaw the closing request is a plain main turn (no
                                          # X-Session-Done), so it must ask for what the gateway serves one.
                                          close_max_tokens=min_main_turn_tokens if self.daemon else 1)
        self.people = [self._person(person_id, spec, user_config, writer)
                       for person_id, spec in [person_of(e) for e in env.people] or [("", env.persona)]]
        self.sessions = (HouseholdSessions({p.person_id: p.sessions for p in self.people}) if env.people
                         else self.people[0].sessions)

    def _person(self, person_id: str, spec: str, user_config: SimulatedUserConfig, writer: Any) -> "SimulatedPerson":
        """One simulated person (`person_id` "": the one person of `env.persona`, who names nobody). A
        household's people record under `<record_dir>/people/<person>/` and log under `people/<person>/`."""
        persona = persona_from_spec(spec)
        record_dir = self.record_dir
        if person_id and record_dir is not None:
            record_dir = record_dir / "people" / person_id
        sessions = SessionLog(record_dir / "sessions.jsonl" if record_dir else None, writer=writer,
                              tag_prefix=f"people/{person_tag(person_id)}/" if person_id else "")
        # every person asks the same questions in the same order: their answers differ only by what they want
        user = SimulatedUser(persona, train_questions(self.env.questions, seed=self.env.seed), base_url=self.base_url,
                             api_key=self.api_key, config=dataclasses.replace(user_config, person_id=person_id),
                             session_prefix=f"sim-{person_id or persona.name}-{uuid.uuid4().hex[:8]}")
        return SimulatedPerson(person_id, persona, user, sessions, record_dir)

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
        pause = 0.0   # after a round in which no session got an answer: the gateway or agent is down
        try:
            while not stop.is_set():
                if self._waiting(store) >= self.backlog:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=0.25)
                    except asyncio.TimeoutError:
                        pass
                    continue
                try:
                    if self.notes is not None:  # the next sessions start with the newest notes
                        await asyncio.to_thread(self.notes.refresh)
                    step = self.step_fn() if self.step_fn is not None else None
                    before = [len(p.user.results) for p in self.people]
                    # a household's people talk at once, `env.concurrency` sessions each
                    rounds = await asyncio.gather(*(p.user.run(self.env.concurrency) for p in self.people))
                    for person, start, stats in zip(self.people, before, rounds):
                        person.sessions.add(person.user.results[start:], step=step)
                        log.debug("simulated sessions of %r: %s", person.person_id, stats.metrics())
                    # back off (1 s, doubling to 60 s) while whole rounds fail, instead of spinning
                    failed = all(stats.failed_sessions == stats.sessions for stats in rounds)
                    pause = min(max(2 * pause, 1.0), 60.0) if failed else 0.0
                    if pause:
                        log.warning("no session of the round got an answer; next round in %.0f s", pause)
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(stop.wait(), timeout=pause)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a failed round is logged; the run goes on
                    log.exception("simulated user round failed")
                    await asyncio.sleep(1.0)
        finally:
            store.close()

    async def heldout_eval(self, *, writer: Any = None, step: int | None = None) -> dict[str, Any]:
        """Greedy held-out first answers graded two ways: `preference_score`, the fraction that
        satisfy the persona, and `accuracy`, the fraction whose final number is
        the question's answer (NaN when the questions carry no numeric answers).

        Logged as `eval/preference_score`, `eval/accuracy` and the mean rubric grade as
        `eval/mean_rubric_score`. A household's people are asked one after the other, each as
        themselves (their own adapter answers them) and graded by their own persona: the record then holds
        the mean over people and `people`, each person's numbers (logged as
        `people/<person>/eval/...`).
        """
        graded = {}
        for person in self.people:
            record = await self._heldout_eval_of(person, step)
            graded[person.person_id] = record
            if writer is not None and step is not None:
                prefix = f"people/{person_tag(person.person_id)}/" if person.person_id else ""
                writer.scalars(step, {f"{prefix}eval/{k}": v for k, v in record.items() if v == v})
        if not self.env.people:
            result = graded[""]
        else:
            result = {k: sum(r[k] for r in graded.values()) / len(graded) for k in next(iter(graded.values()))}
            if writer is not None and step is not None:
                writer.scalars(step, {f"eval/{k}": v for k, v in result.items() if v == v})
            result["people"] = graded
        if writer is not None and step is not None:
            writer.flush()
        return result

    async def _heldout_eval_of(self, person: "SimulatedPerson", step: int | None) -> dict[str, float]:
        # By default as many held-out questions in flight as the policy batches at once: greedy decoding
        # on CPU is memory-bound, so a full batch costs about as much as one sequence. OpenClaw's
        # 2.5 k-token prompts make prefill the cost instead (env.eval_concurrency).
        env = self.env
        result = await preference_score(self.base_url, person.persona, self.heldout, max_tokens=env.max_tokens,
                                        api_key=self.api_key, timeout_s=env.request_timeout_s,
                                        person_id=person.person_id,
                                        concurrency=env.eval_concurrency or max(4, self.policy_batch_size),
                                        model=self.model, agent_keeps_history=self.daemon is not None,
                                        session_prefix=f"{HELDOUT_PREFIX}-{uuid.uuid4().hex[:8]}")
        if person.record_dir is not None and step is not None:
            write_heldout_answers(result, person.record_dir / "heldout" / f"step_{step}.jsonl")
        return {"preference_score": float(result.score), "accuracy": float(result.accuracy),
                "mean_rubric_score": float(result.mean_score)}

    async def preference_score(self, *, writer: Any = None, step: int | None = None) -> float:
        """The held-out preference score alone (see `heldout_eval`)."""
        return (await self.heldout_eval(writer=writer, step=step))["preference_score"]

    async def close(self) -> None:
        for person in self.people:
            await person.user.close()
        if self.notes is not None:
            self.notes.close()
        if self.daemon is not None:
            await asyncio.to_thread(self.daemon.stop)


def write_heldout_answers(result: PreferenceScore, path: Path) -> None:
    """Each held-out answer with the persona's verdict, one JSON line per question."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"question": a.question.text, "reference": a.question.answer, "answer": a.text,
                         "finish_reason": a.finish_reason, "satisfied": v.satisfied, "correct": c,
                         "violations": v.violations})
             for a, v, c in zip(result.answers, result.verdicts, result.correct)]
    path.write_text("".join(line + "\n" for line in lines))
