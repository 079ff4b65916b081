"""`python -m openclaw_jax.eval.person`: a simulated person who knows only their OpenClaw agent.

The person talks to OpenClaw's own OpenAI-compatible endpoint (`openclaw gateway run` with
`gateway.http.endpoints.chatCompletions` on; model `openclaw/default`, the request's `user` naming the
conversation) and to nothing else: not the trainer, not our gateway, not the sample store. Whatever model
OpenClaw is connected to answers; whether it learns is what this measures.

The person, in order:

1. asks the held-out questions, each in its own conversation named `<heldout prefix>-...` (the plugin counts
   those as side turns: never trained on), and grades the first answers by their own rule (the persona):
   **preference** (the fraction that satisfy them) and **accuracy** (the fraction whose final number is right);
2. has `--sessions` conversations, `--concurrency` at a time (away `--pause-s` seconds between rounds): a question, the agent's answer, the person's
   reaction (thanks, or a correction and a retry, up to `--turns-per-session` answers); each session is
   recorded in order with whether it satisfied them (`sessions.jsonl`);
3. asks the held-out questions again after every `--eval-every` sessions and at the end.

Writes into `--out`: `sessions.jsonl`, `heldout/after_<N>_sessions.jsonl` (each held-out answer with its
verdict) and `person.json` (the evaluations, the sessions to a stable effect: the first of three satisfied
sessions in a row, the wall time).

Example (what `python -m openclaw_jax.eval.live_run` starts):
  python -m openclaw_jax.eval.person --agent-url http://127.0.0.1:18789/v1 --out runs/person \\
      --persona concise:max_chars=60,correct=true --sessions 36 --eval-every 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from openclaw_jax.envs.openclaw_agent import AGENT_MODEL
from openclaw_jax.envs.personas import Persona, persona_from_spec
from openclaw_jax.envs.questions import Question, heldout_questions, train_questions
from openclaw_jax.envs.runner import HELDOUT_PREFIX, write_heldout_answers   # sideSessionPrefixes holds the prefix
from openclaw_jax.envs.sessions import SessionLog, describe_stable
from openclaw_jax.envs.simulated_user import SimulatedUser, SimulatedUserConfig, preference_score
from openclaw_jax.logs import configure_logging

log = logging.getLogger("openclaw_jax.eval.person")



@dataclass(frozen=True)
class PersonConfig:
    agent_url: str
    out: Path
    agent_key: str = "none"
    persona: str = "concise:max_chars=60,correct=true"
    questions: str = "arithmetic"
    seed: int = 0
    sessions: int = 36
    eval_every: int = 12
    heldout: int = 24
    concurrency: int = 2
    eval_concurrency: int = 4
    turns_per_session: int = 2
    max_tokens: int = 64
    timeout_s: float = 900.0
    pause_s: float = 0.0
    heldout_prefix: str = HELDOUT_PREFIX

    def __post_init__(self) -> None:
        checks = {"sessions": self.sessions >= 1, "eval_every": self.eval_every >= 0, "heldout": self.heldout >= 1,
                  "concurrency": self.concurrency >= 1, "eval_concurrency": self.eval_concurrency >= 1,
                  "turns_per_session": self.turns_per_session >= 1, "max_tokens": self.max_tokens >= 1,
                  "timeout_s": self.timeout_s > 0, "pause_s": self.pause_s >= 0}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(", ".join(f"--{n.replace('_', '-')}={getattr(self, n)!r}" for n in bad)
                             + ": must be positive (--eval-every and --pause-s may be 0)")
        if not self.agent_url.startswith(("http://", "https://")):
            raise ValueError(f"--agent-url={self.agent_url!r} must be OpenClaw's endpoint, e.g. "
                             "http://127.0.0.1:18789/v1")

    def eval_points(self) -> list[int]:
        """After how many sessions the held-out questions are asked: 0, every `eval_every`, and the last."""
        points = [0, *range(self.eval_every, self.sessions, self.eval_every)] if self.eval_every else [0]
        return [*points, self.sessions]


class Person:
    """The person of `PersonConfig`, talking to one OpenClaw agent."""

    def __init__(self, cfg: PersonConfig):
        self.cfg = cfg
        self.persona: Persona = persona_from_spec(cfg.persona)
        self.heldout: list[Question] = heldout_questions(cfg.questions, cfg.heldout, seed=cfg.seed)
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.sessions = SessionLog(cfg.out / "sessions.jsonl")
        if self.sessions.count:
            raise ValueError(f"{cfg.out / 'sessions.jsonl'} already holds {self.sessions.count} sessions: "
                             "give a fresh --out")
        self.user = SimulatedUser(
            self.persona, train_questions(cfg.questions, seed=cfg.seed), base_url=cfg.agent_url,
            api_key=cfg.agent_key, session_prefix=f"person-{uuid.uuid4().hex[:8]}",
            config=SimulatedUserConfig(turns_per_session=cfg.turns_per_session, concurrency=cfg.concurrency,
                                       max_tokens=cfg.max_tokens, seed=cfg.seed, model=AGENT_MODEL,
                                       agent_keeps_history=True, close_by_endpoint=False,
                                       close_max_tokens=cfg.max_tokens, timeout_s=cfg.timeout_s))
        self.evaluations: list[dict[str, Any]] = []
        self.started = time.monotonic()

    async def evaluate(self) -> dict[str, Any]:
        cfg, done = self.cfg, self.sessions.count
        start, wall_clock = time.monotonic(), time.time()
        result = await preference_score(cfg.agent_url, self.persona, self.heldout, api_key=cfg.agent_key,
                                        timeout_s=cfg.timeout_s, model=AGENT_MODEL, max_tokens=cfg.max_tokens,
                                        concurrency=cfg.eval_concurrency, agent_keeps_history=True,
                                        session_prefix=f"{cfg.heldout_prefix}-{uuid.uuid4().hex[:8]}")
        write_heldout_answers(result, cfg.out / "heldout" / f"after_{done}_sessions.jsonl")
        record = {"after_sessions": done, "time": round(wall_clock, 3), "preference": result.score, "accuracy": result.accuracy,
                  "answered": sum(bool(a.text.strip()) for a in result.answers), "questions": result.n,
                  "wall_s": round(time.monotonic() - start, 1),
                  "at_s": round(time.monotonic() - self.started, 1)}
        self.evaluations.append(record)
        log.info("after %d sessions: held-out preference %.3f, accuracy %.3f (%d questions, %.0f s)", done,
                 record["preference"], record["accuracy"], result.n, record["wall_s"])
        return record

    async def run(self) -> dict[str, Any]:
        points = self.cfg.eval_points()
        try:
            await self.evaluate()
            for target in points[1:]:
                while self.sessions.count < target:
                    if self.sessions.count and self.cfg.pause_s:
                        await asyncio.sleep(self.cfg.pause_s)   # the person is away between conversations
                    before = len(self.user.results)
                    await self.user.run(min(self.cfg.concurrency, target - self.sessions.count))
                    records = self.sessions.add(self.user.results[before:])
                    log.info("sessions %s: %s", ", ".join(str(r["session"]) for r in records),
                             " ".join("satisfied" if r["satisfied"] else "corrected" for r in records))
                await self.evaluate()
        finally:
            await self.user.close()
        return self.write_summary()

    def write_summary(self) -> dict[str, Any]:
        first, count = self.sessions.sessions_to_stable, self.sessions.count
        summary = {"persona": self.cfg.persona, "questions": self.cfg.questions, "seed": self.cfg.seed,
                   **self.sessions.summary(), "sessions_to_stable_text": describe_stable(first, count),
                   "failed_sessions": sum(r.error is not None for r in self.user.results),
                   "evaluations": self.evaluations, "wall_s": round(time.monotonic() - self.started, 1)}
        path = self.cfg.out / "person.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, path)
        return summary


def _parser() -> argparse.ArgumentParser:
    d = PersonConfig(agent_url="http://x", out=Path("."))
    p = argparse.ArgumentParser(prog="python -m openclaw_jax.eval.person", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--agent-url", required=True, help="OpenClaw's OpenAI-compatible endpoint, e.g. "
                   "http://127.0.0.1:18789/v1 (its gateway daemon with the chat-completions endpoint on)")
    p.add_argument("--agent-key", default=os.environ.get("OPENCLAW_GATEWAY_TOKEN", "none"),
                   help="OpenClaw's gateway token (default $OPENCLAW_GATEWAY_TOKEN or none)")
    p.add_argument("--out", type=Path, required=True, help="a fresh directory for the record")
    p.add_argument("--persona", default=d.persona, help=f"the person's rule (default {d.persona})")
    p.add_argument("--questions", default=d.questions, help=f"question source (default {d.questions})")
    p.add_argument("--seed", type=int, default=d.seed, help="question order, held-out set, reactions")
    p.add_argument("--sessions", type=int, default=d.sessions, help=f"conversations to have (default {d.sessions})")
    p.add_argument("--eval-every", type=int, default=d.eval_every,
                   help=f"ask the held-out questions after every N sessions (default {d.eval_every}; 0: "
                        "only before and after)")
    p.add_argument("--heldout", type=int, default=d.heldout, help=f"held-out questions (default {d.heldout})")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="conversations at once")
    p.add_argument("--eval-concurrency", type=int, default=d.eval_concurrency, help="held-out questions at once")
    p.add_argument("--turns-per-session", type=int, default=d.turns_per_session,
                   help=f"most answers per conversation (default {d.turns_per_session}: one retry)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="asked of OpenClaw per answer")
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds per request to OpenClaw")
    p.add_argument("--pause-s", type=float, default=d.pause_s,
                   help="seconds the person is away between rounds of conversations (default 0: none)")
    p.add_argument("--heldout-prefix", default=d.heldout_prefix,
                   help="held-out conversations' name prefix: the plugin's sideSessionPrefixes must hold it")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging()
    try:
        cfg = PersonConfig(agent_url=args.agent_url, out=args.out, agent_key=args.agent_key, persona=args.persona,
                           questions=args.questions, seed=args.seed, sessions=args.sessions,
                           eval_every=args.eval_every, heldout=args.heldout, concurrency=args.concurrency,
                           eval_concurrency=args.eval_concurrency, turns_per_session=args.turns_per_session,
                           max_tokens=args.max_tokens, timeout_s=args.timeout, pause_s=args.pause_s,
                           heldout_prefix=args.heldout_prefix)
        person = Person(cfg)
    except ValueError as err:
        log.error("%s", err)
        return 2
    summary = asyncio.run(person.run())
    first, last = summary["evaluations"][0], summary["evaluations"][-1]
    log.info("held-out preference %.3f -> %.3f, accuracy %.3f -> %.3f; sessions to a stable effect: %s of %d",
             first["preference"], last["preference"], first["accuracy"], last["accuracy"],
             summary["sessions_to_stable_text"], summary["sessions"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
