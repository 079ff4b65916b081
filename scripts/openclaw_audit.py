"""Audit an `env.client: openclaw` run: is every stored sample one of OpenClaw's own sessions, and did
no held-out (side) session train?

Reads the run's sample store and OpenClaw's own session table (`session_nodes` in
`<run_dir>/openclaw/agents/main/agent/openclaw-agent.sqlite`: OpenClaw's session key -> its session id)
and prints one JSON object:

    samples                  stored samples (what the trainer reads)
    sample_sessions          distinct session ids among them
    openclaw_sessions        sessions OpenClaw knows (person's and held-out)
    samples_in_openclaw      samples whose session id is one of OpenClaw's session ids
    heldout_sessions         OpenClaw sessions named `heldout-...` (the evaluation, tagged side)
    samples_from_heldout     samples whose session is one of those (must be 0)
    steps_trained_samples    samples the trainer consumed (the last step's end offset)

    python scripts/openclaw_audit.py runs/openclaw_cpu
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

from openclaw_jax.envs.runner import HELDOUT_PREFIX
from openclaw_jax.samples import SampleStore


def openclaw_sessions(run_dir: Path) -> dict[str, str]:
    """OpenClaw's session key -> session id, read-only from its agent database."""
    db = run_dir / "openclaw" / "agents" / "main" / "agent" / "openclaw-agent.sqlite"
    if not db.exists():
        raise SystemExit(f"{db} does not exist: is {run_dir} a run with env.client=openclaw?")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return dict(conn.execute("select session_key, current_session_id from session_nodes"))


def trained_offset(run_dir: Path) -> int:
    path = run_dir / "steps.jsonl"
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((int(rec.get("end_offset", 0)) for rec in lines), default=0)


def audit(run_dir: Path) -> dict[str, int]:
    sessions = openclaw_sessions(run_dir)
    with SampleStore(str(run_dir / "samples"), readonly=True) as store:
        samples = store.read(0)
    ids = set(sessions.values())
    heldout = {sid for key, sid in sessions.items() if key.rsplit(":", 1)[-1].startswith(HELDOUT_PREFIX)}
    return {
        "samples": len(samples),
        "sample_sessions": len({s.session_id for s in samples}),
        "openclaw_sessions": len(ids),
        "samples_in_openclaw": sum(s.session_id in ids for s in samples),
        "heldout_sessions": len(heldout),
        "samples_from_heldout": sum(s.session_id in heldout for s in samples),
        "steps_trained_samples": trained_offset(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory (run_dir of the config)")
    args = parser.parse_args(argv)
    json.dump(audit(args.run_dir), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
