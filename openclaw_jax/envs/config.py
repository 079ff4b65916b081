"""`env:` section of the experiment config: the simulated users of `openclaw_jax.envs`. Imports only the config
library and the person-id rule (`samples/person.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from openclaw_jax.configlib import ConfigError, require
from openclaw_jax.samples.person import check_person_id


@dataclass(frozen=True)
class EnvConfig:
    """Simulated users driving live sessions through the gateway (`openclaw_jax.envs`)."""

    enabled: bool = True
    persona: str = "student_prose"
    questions: str = "gsm"               # gsm (reasoning-gym) | arithmetic
    concurrency: int = 2                 # simulated users at once
    turns_per_session: int = 2
    max_tokens: int = 256
    seed: int = 0
    heldout_questions: int = 16
    eval_every: int = 5                  # trainer steps between held-out preference scores (0 = start/end only)
    eval_concurrency: int = 0            # held-out questions in flight (0 = the policy's batch size, at least 4)
    # no new session starts while this many trainer steps' worth of samples wait for the trainer: what is
    # generated beyond the trainer's last window is thrown away at the end, and every waiting step's worth
    # makes the samples one weight version staler
    backlog_steps: float = 2.0
    request_timeout_s: float = 300.0     # per request of a simulated user or the held-out evaluation
    # How the simulated person reaches the gateway: `openai` (the openai client, the whole history in
    # each request) or `openclaw` (through a real OpenClaw agent: `openclaw gateway run` from
    # `scripts/openclaw.sh setup`, our plugin tagging sessions; held-out answers go through it too).
    client: Literal["openai", "openclaw"] = "openai"
    openclaw_context_window: int = 8192  # the contextWindow OpenClaw is told the model has
    # Memory without training (needs client openclaw): `user_md` keeps the person's corrections (the judge's
    # accepted hints) as notes in OpenClaw's USER.md, which OpenClaw puts in front of the model in every
    # new session (envs/memory.py); at most `memory_max_notes` of them, the most often given first.
    memory: Literal["none", "user_md"] = "none"
    memory_max_notes: int = 6
    # A household: several simulated people at once, each `person_id=persona spec` (e.g.
    # "alice=concise:max_chars=60,correct=true"), in place of `persona`. Each person sends X-Person-Id, has
    # `concurrency` sessions of their own per round, and held-out scores and sessions of their own.
    people: tuple[str, ...] = ()

    def __post_init__(self):
        require(self.concurrency > 0, f"env.concurrency={self.concurrency} must be > 0")
        require(self.eval_concurrency >= 0, f"env.eval_concurrency={self.eval_concurrency} must be >= 0")
        require(self.backlog_steps > 0, f"env.backlog_steps={self.backlog_steps} must be > 0 (1: the next step's "
                                        "samples are generated while the trainer trains on the current ones)")
        require(self.request_timeout_s > 0, f"env.request_timeout_s={self.request_timeout_s} must be > 0")
        require(self.openclaw_context_window > 0,
                 f"env.openclaw_context_window={self.openclaw_context_window} must be > 0")
        require(self.turns_per_session > 0, f"env.turns_per_session={self.turns_per_session} must be > 0")
        require(self.max_tokens > 0, f"env.max_tokens={self.max_tokens} must be > 0")
        require(self.heldout_questions >= 0, f"env.heldout_questions={self.heldout_questions} must be >= 0")
        require(self.memory == "none" or self.client == "openclaw",
                f"env.memory={self.memory!r} is OpenClaw's own memory (its USER.md); set env.client=openclaw, or "
                "env.memory=none")
        require(self.memory_max_notes >= 1, f"env.memory_max_notes={self.memory_max_notes} must be >= 1")
        ids = [person_of(entry)[0] for entry in self.people]
        require(len(set(ids)) == len(ids), f"env.people={list(self.people)!r} names a person twice")
        require(not self.people or self.client == "openai",
                "env.people simulates several people through the gateway directly; through OpenClaw each person "
                "needs an agent of their own: set env.client=openai, or leave env.people empty")


def person_of(entry: str) -> tuple[str, str]:
    """(person id, persona spec) of an `env.people` entry `person_id=persona spec` (ConfigError naming the entry)."""
    person, eq, spec = entry.partition("=")
    require(bool(eq and spec.strip()), f"env.people entry {entry!r} must be person_id=persona spec, e.g. "
                                       "alice=concise:max_chars=60,correct=true")
    try:
        return check_person_id(person.strip(), f"the person id of env.people entry {entry!r}"), spec.strip()
    except ValueError as e:
        raise ConfigError(str(e)) from None
