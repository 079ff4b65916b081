"""`python -m openclaw_jax.eval.live_run`: a measured live run, as a person would have it.

Three processes, each knowing only what a person's setup gives it:

1. **the live run**: `python -m openclaw_jax.train --config configs/live_cpu.yaml` (or `--config`), exactly as
   a person starts it, with its run directory under `--out`; it serves, scores, trains and gates;
2. **the person's OpenClaw**: the real `openclaw gateway run`, connected to the live run as the run's printed
   `connect` command connects it (our provider and plugin, the minimal profile below 16 k of context; the
   plugin counts conversations named `heldout-...` as side turns), with its OpenAI-compatible endpoint on;
3. **the person**: `python -m openclaw_jax.eval.person`, who talks to OpenClaw's endpoint only (it is given
   nothing but that URL): held-out questions before, sessions with reactions, held-out questions every few
   sessions and after.

When the person is done this reads what the live run's status page shows (`GET /v1/status`: versions promoted
and refused, trainer steps, the store), stops the run with Ctrl-C (SIGINT), and writes `report.json` and
`report.md` into `--out`: held-out preference and accuracy before and after with the weight version served
at each evaluation (from the run's versions log), versions promoted and refused, the sessions until the
person was satisfied three sessions in a row, and the wall time.

Example (docs/results/live.md):
  python -m openclaw_jax.eval.live_run --out runs/live_measure --sessions 36 --eval-every 12
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from openclaw_jax.envs.openclaw_agent import REPO, OpenClawAgent, OpenClawDaemon, OpenClawError, free_port
from openclaw_jax.eval.person import HELDOUT_PREFIX
from openclaw_jax.logs import configure_logging
from openclaw_jax.serving.versions import VersionLog

log = logging.getLogger("openclaw_jax.eval.live_run")

_CONNECT = re.compile(r"bash scripts/openclaw\.sh connect --gateway (\S+) --model-id (\S+) --context-window (\d+) "
                      r"--max-tokens (\d+)")
_READY = "Ctrl-C saves and stops, the same command continues"


class LiveProcess:
    """The live run as a person starts it: a `python -m openclaw_jax.train` child with its log in `out`."""

    def __init__(self, config: Path, out: Path, port: int, overrides: Sequence[str]):
        self.cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", str(config), f"run_dir={out / 'run'}",
                    f"gateway.port={port}", "progress=false", *overrides]
        self.log_path = out / "train.log"
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout_s: float) -> re.Match:
        """Start it and wait for its announcement; the printed `connect` command's fields."""
        log.info("starting the live run: %s", " ".join(self.cmd))
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout_s
        while _READY not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the live run exited {self.proc.returncode} before serving; "
                                   f"{self.log_path}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the live run did not announce itself in {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(1.0)
        match = _CONNECT.search(self.log())
        if match is None:
            raise RuntimeError(f"the live run printed no connect command; see {self.log_path}")
        return match

    def status(self, api_key: str | None) -> dict[str, Any]:
        request = urllib.request.Request(self.url + "/v1/status",
                                         headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())

    def stop(self, timeout_s: float = 600) -> int:
        """Ctrl-C, as the person at the terminal; the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def served_at(events: list[dict[str, Any]], when: float) -> str | None:
    """The weight version the versions log says was served at time `when` (events oldest first)."""
    served = None
    for event in events:
        if event["time"] > when:
            break
        served = event.get("served_version", served)
    return served


def build_report(person: dict[str, Any], status: dict[str, Any], status_time: float, events: list[dict[str, Any]],
                 wall_s: float, command: str) -> dict[str, Any]:
    """What the person measured beside what the status page showed at `status_time` (the versions decided by
    then: the run may decide another while it stops), and the version served at each evaluation."""
    events = [e for e in events if e["time"] <= status_time]
    evaluations = [{**e, "served_version": served_at(events, e["time"]),
                    "served_version_after": served_at(events, e["time"] + e["wall_s"])}
                   for e in person["evaluations"]]
    decided = [e for e in events if e["event"] in ("promoted", "refused")]
    return {
        "command": command, "wall_s": round(wall_s, 1), "status_time": status_time,
        "before": evaluations[0], "after": evaluations[-1], "evaluations": evaluations,
        "sessions": person["sessions"], "sessions_satisfied": person["sessions_satisfied"],
        "sessions_to_stable": person["sessions_to_stable"], "failed_sessions": person["failed_sessions"],
        "sessions_to_stable_text": person["sessions_to_stable_text"],
        "trainer": status["trainer"], "store": status["store"], "served_version": status["served_version"],
        "versions": [{k: e.get(k) for k in ("event", "version", "served_version", "reason", "rule", "check")}
                     for e in decided],
    }


def report_markdown(report: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {e['after_sessions']} | {e['served_version']}"
        + (f" -> {e['served_version_after']}" if e["served_version_after"] != e["served_version"] else "")
        + f" | {e['preference']:.3f} | {e['accuracy']:.3f} | {e['answered']}/{e['questions']} | {e['wall_s']:.0f} |"
        for e in report["evaluations"])
    decided = "\n".join(
        f"| {v['version']} | {v['event']} | {v.get('rule') or ''} | "
        + (f"{v['check']['score']:+.4f} | {v['check']['drift']:.4f} | {v['check']['with_signal']}"
           if v.get("check") else " | | ") + " |" for v in report["versions"])
    t = report["trainer"]
    return (f"`{report['command']}`\n\n"
            "| after sessions | version served | held-out preference | accuracy | answered | eval s |\n"
            "| --- | --- | --- | --- | --- | --- |\n" + rows + "\n\n"
            f"- Sessions: {report['sessions']} ({report['sessions_satisfied']} satisfied, "
            f"{report['failed_sessions']} failed); sessions to a stable effect (three satisfied in a row): "
            f"{report['sessions_to_stable_text']}.\n"
            f"- Trainer: {t['last_step']} steps, {t['candidates']} candidates, {t['promoted']} promoted, "
            f"{t['refused']} refused, {t['resets']} resets; served at the end: version {report['served_version']}.\n"
            f"- Store: {report['store']['samples']} scored turns, {report['store'].get('held_out')} held out "
            "for the gate.\n"
            f"- Wall time: {report['wall_s'] / 60:.1f} min.\n\n"
            "| version | decision | rule | score | drift | held-out turns |\n| --- | --- | --- | --- | --- | --- |\n"
            + decided + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openclaw_jax.eval.live_run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1] + "\nArguments after `--` are the live run's "
                                "config overrides (key=value).")
    p.add_argument("--out", type=Path, required=True, help="a fresh directory: run/, openclaw/, person/, reports")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "live_cpu.yaml",
                   help="the live run's config (default configs/live_cpu.yaml)")
    p.add_argument("--port", type=int, default=0, help="the gateway's port (default: a free one)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="the model's maxTokens in OpenClaw's provider entry (connect --max-tokens; default 64)")
    p.add_argument("--api-key", default=None, help="the gateway's key, when the config sets gateway.api_key")
    p.add_argument("--start-timeout", type=float, default=1800.0, help="seconds for the live run to start serving")
    for flag, default, what in (("--persona", "concise:max_chars=60,correct=true", "the person's rule"),
                                ("--questions", "arithmetic", "question source"), ("--seed", "0", "the person's seed"),
                                ("--sessions", "36", "conversations"), ("--eval-every", "12", "held-out every N"),
                                ("--heldout", "24", "held-out questions"), ("--concurrency", "2", "at once"),
                                ("--turns-per-session", "2", "answers per conversation"),
                                ("--pause-s", "0", "seconds away between rounds of conversations")):
        p.add_argument(flag, default=default, help=f"the person's {flag} ({what}; default {default})")
    p.add_argument("overrides", nargs="*", help="the live run's config overrides, after --")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging()
    out: Path = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        log.error("--out=%s is not empty: give a fresh directory", out)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m openclaw_jax.eval.live_run " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    live = LiveProcess(args.config, out, args.port or free_port(), args.overrides)
    daemon = None
    try:
        connect = live.start(args.start_timeout)
        agent = OpenClawAgent(connect.group(1), out / "openclaw", model_id=connect.group(2),
                              context_window=int(connect.group(3)), max_tokens=args.max_tokens,
                              api_key=args.api_key or "none", profile="minimal",
                              side_session_prefixes=(HELDOUT_PREFIX,))
        daemon = OpenClawDaemon(agent).start()
        person_cmd = [sys.executable, "-m", "openclaw_jax.eval.person", "--agent-url", daemon.base_url,
                      "--out", str(out / "person"), "--max-tokens", str(args.max_tokens),
                      *(x for flag in ("persona", "questions", "seed", "sessions", "eval_every", "heldout",
                                       "concurrency", "turns_per_session", "pause_s")
                        for x in (f"--{flag.replace('_', '-')}", str(getattr(args, flag))))]
        log.info("the person talks to OpenClaw at %s only: %s", daemon.base_url, " ".join(person_cmd))
        rc = subprocess.run(person_cmd, cwd=REPO).returncode
        if rc != 0:
            raise RuntimeError(f"the person exited {rc}")
        status, status_time = live.status(args.api_key), time.time()
    except (OpenClawError, RuntimeError) as err:
        log.error("%s", err)
        return 1
    finally:
        if daemon is not None:
            daemon.stop()
        rc = live.stop()
        log.info("the live run stopped (exit %d)", rc)
    person = json.loads((out / "person" / "person.json").read_text())
    events = VersionLog(out / "run" / "versions").events()
    report = build_report(person, status, status_time, events, time.monotonic() - started, command)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(report))
    sys.stdout.write(report_markdown(report))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
