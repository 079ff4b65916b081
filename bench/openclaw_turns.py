"""A person's turn through the real OpenClaw against live mode: latency with training running and with it off.

One run, two phases, the same scripted conversation in each (a person asking, correcting and thanking;
`SCRIPT`), each phase a fresh live run (`python -m openclaw_jax.train --config CONFIG` with no simulated
users and no promotion gate: every step's weights are swapped in) and a fresh OpenClaw gateway daemon
(`openclaw gateway run`, Node kept warm) in front of it:

  * training off: the trainer waits for a step that never fills (trainer.samples_per_step above the
    conversation's turns), so serving has the machine to itself;
  * training on: a step every `--samples-per-step` scored turns, each step's weights swapped into the
    server while the conversation goes on; the phase continues past `--turns` until `--min-swaps` weight
    swaps happened between turns (at most `--max-turns`); in `policy.mode=process` the trainer's threads
    are at nice 19 (the gateway's event loop is not) and its XLA threads in SCHED_IDLE (`policy.trainer_idle`);
  * with `--compare-nice`, training on again with the trainer at nice 19 alone (`policy.trainer_idle=false`).

The person is the real `openai` client on OpenClaw's OpenAI-compatible endpoint, streaming, sending
only their newest message (`user` names the conversation; OpenClaw keeps the history and writes its
~2.3 k-token system prompt), and waiting `--think-s` seconds between turns as a person reads and types.
Per turn: time to the first content token and to the whole reply, and the prompt tokens the policy
reused from its prefix cache (`usage.prompt_tokens_details.cached_tokens`, from the engine through our
gateway and OpenClaw); the policy server's weight version before and after each turn tells which turns
came after a swap. A warm-up pass (training off, `--warmup-turns`) first fills the compilation cache the
phases share, so neither pays first-time compilations the other does not.

Reported: p50 / p95 of both times per phase over the turns every phase ran (training on may run longer, into
a longer session), their ratio (on / off), every turn after a swap with its
cached tokens, and whether any turn after the first prefilled the system prompt cold (reused fewer
tokens than the first turn's prompt less `WARM_SLACK`).

The run config is a flag (`--config`, default configs/live_cpu.yaml; `LIVE_OVERRIDES` keep another config
in live mode), `--policy-mode` its policy mode (default `process`: the policy server as its own process,
ahead of the trainer in CPU priority), `--set key=value` adds overrides. Needs OpenClaw
(`bash scripts/openclaw.sh setup`).

    python bench/openclaw_turns.py [--config configs/live_cpu.yaml] [--turns 36] [--min-swaps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("bench.openclaw_turns")

# what the bench sets on top of the run config (besides ports, run directory and compilation cache): live
# mode's essentials, so that another config (configs/openclaw_cpu.yaml, say) runs as live mode too
# The promotion gate is off: what is timed is serving while steps train and swap in, and a 24-turn conversation
# holds fewer held-out turns than a gate needs to check a version (live_cpu.yaml's refuses every one, so
# nothing would ever swap).
LIVE_OVERRIDES = ["env.enabled=false", "policy.prefix_cache_mb=1024", "trainer.max_steps=1000000", "progress=false",
                  "gate.enabled=false"]
# the person: questions, corrections (the rule judge reads them as -1 with a hint), thanks (+1), moving on
SCRIPT = [
    "What is 7 + 5?", "Thanks! And 12 times 3?", "No, that's wrong. 12 times 3 is 36. Can you fix that?",
    "Great. What is the capital of France?", "Thanks. Name three primary colours.",
    "Please keep your answers under 60 characters.", "What is 144 divided by 12?", "Perfect, thank you!",
    "Write a haiku about the sea.", "Make it shorter, please.", "What is 15 + 27?",
    "No, that's wrong. 15 + 27 should be 42. Can you fix that?", "Thanks. How many legs does a spider have?",
    "Correct, thanks! What is 9 squared?", "What is the boiling point of water in Celsius?",
    "Thanks! Suggest a name for a friendly robot.", "Shorter please, one word.", "What is 100 minus 37?",
    "That's right, thanks. What colour is the sky on a clear day?", "What is 8 times 7?",
    "No, that's wrong. 8 times 7 is 56. Please fix that.", "Thanks! What is 21 + 21?",
    "Great. Say goodbye in French.", "Thank you, that's all for now.", "What is 6 + 9?", "Thanks! And 6 times 9?",
    "What is 50 divided by 5?", "Thanks. What is 3 cubed?", "Name a planet with rings.", "Thanks, goodbye!",
]
GATEWAY_TURN = re.compile(r"streamed a main turn: \d+ prompt tokens \((\d+) cached\), first token after ([\d.]+) s, "
                          r"\d+ tokens in ([\d.]+) s")
# the policy server's own records (its log, `policy.log` in the run dir): each finished request's queue wait and
# prefill, the first call of each compiled shape, and the steps of a weight swap
POLICY_REQUEST = re.compile(r"request \S+: (\d+) prompt tokens \((\d+) cached\), queued ([\d.]+) s, "
                            r"prefill to first token ([\d.]+) s")
POLICY_EVENT = re.compile(r"(first call of this shape|weight update: |new weights: recomputing|weights swapped)")
WARM_SLACK = 256  # tokens: the first turn's prompt less a few partial blocks still holds the system prompt


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class LiveRun:
    """`python -m openclaw_jax.train` in live mode on fixed gateway and policy ports, its own process group."""

    def __init__(self, config: str, overrides: list[str], run_dir: Path, compile_cache: Path):
        self.gateway_port, self.policy_port = free_port(), free_port()
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.policy_url = f"http://127.0.0.1:{self.policy_port}"
        self.log_path = run_dir.parent / f"{run_dir.name}.log"
        self.policy_log = run_dir / "policy.log"
        cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", config, *LIVE_OVERRIDES,
               f"gateway.port={self.gateway_port}", f"policy.port={self.policy_port}", f"run_dir={run_dir}",
               f"compile_cache_dir={compile_cache}", *overrides]
        # the policy server's control key, chosen here so the bench can ask it for its weight version
        self.headers = {"Authorization": f"Bearer {secrets.token_urlsafe(24)}"}
        env = dict(os.environ, OPENCLAW_POLICY_API_KEY=self.headers["Authorization"].split()[1])
        logger.info("live run: %s", " ".join(cmd))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)

    def wait_ready(self, timeout_s: float = 900.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the live run exited {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_path.read_text(errors="replace")[-3000:])
            try:
                if requests.get(self.gateway_url + "/healthz", timeout=5).ok and self.version() is not None:
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"the live run was not ready within {timeout_s:.0f} s (log {self.log_path})")

    def version(self) -> str | None:
        try:
            return str(requests.get(self.policy_url + "/get_model_info", headers=self.headers,
                                    timeout=30).json()["weight_version"])
        except (requests.RequestException, ValueError, KeyError):
            return None

    def gateway_turns(self) -> list[dict]:
        """The gateway's own timing of each streamed main turn so far (its log): the policy side of a turn."""
        return [{"policy_ttft_s": float(m.group(2)), "policy_total_s": float(m.group(3)), "cached": int(m.group(1))}
                for m in GATEWAY_TURN.finditer(self.log_path.read_text(errors="replace"))]

    def policy_log_size(self) -> int:
        return self.policy_log.stat().st_size if self.policy_log.exists() else 0

    def policy_records(self, since: int) -> dict:
        """What the policy server logged after byte `since`: the requests it finished (prompt and cached tokens,
        queue wait, prefill to the first token) and its compilations and weight-swap steps, as lines."""
        if not self.policy_log.exists():
            return {"requests": [], "events": []}
        with open(self.policy_log, "rb") as f:
            f.seek(since)
            lines = f.read().decode(errors="replace").splitlines()
        requests_ = [{"prompt": int(m.group(1)), "cached": int(m.group(2)), "queued_s": float(m.group(3)),
                      "prefill_s": float(m.group(4))} for m in map(POLICY_REQUEST.search, lines) if m]
        return {"requests": requests_, "events": [line for line in lines if POLICY_EVENT.search(line)]}

    def samples(self) -> int:
        return int(requests.get(self.gateway_url + "/healthz", timeout=10).json()["store"]["samples"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(300)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def streamed_turn(client, conversation: str, text: str, max_tokens: int) -> dict:
    """One turn through OpenClaw: seconds to the first content token and to the end, usage, the reply, and
    `error` when OpenClaw ended the stream with one (the person saw an error instead of the whole reply)."""
    import openai

    from openclaw_jax.envs.openclaw_agent import AGENT_MODEL
    start = time.perf_counter()
    first, usage, parts, error = None, None, [], None
    stream = client.chat.completions.create(model=AGENT_MODEL, messages=[{"role": "user", "content": text}],
                                            user=conversation, stream=True, max_tokens=max_tokens,
                                            stream_options={"include_usage": True})
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter() - start
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
    except openai.APIError as err:
        # e.g. OpenClaw's "Assistant output cannot be represented as an append-only response stream", when
        # its final text of a cut-off reply differs from what it streamed
        error = str(err)
    total = time.perf_counter() - start
    details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
    return {"ttft_s": first if first is not None else total, "first_token": first is not None, "total_s": total,
            "reply": "".join(parts),
            "prompt_tokens": getattr(usage, "prompt_tokens", None), "error": error,
            "cached_tokens": int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0}


def run_phase(name: str, args, overrides: list[str], work: Path, turns: int, min_swaps: int) -> dict:
    """One live run + OpenClaw daemon, the scripted conversation; the per-turn records."""
    import openai

    from openclaw_jax.envs.openclaw_agent import OpenClawAgent, OpenClawDaemon

    run = LiveRun(args.config, overrides, work / name, work / "xla-cache")
    records: list[dict] = []
    try:
        run.wait_ready()
        agent = OpenClawAgent(run.gateway_url, work / f"{name}-openclaw", model_id="smollm2",
                              context_window=8192, max_tokens=args.max_tokens, timeout_s=900)
        with OpenClawDaemon(agent) as daemon:
            client = openai.OpenAI(base_url=daemon.base_url, api_key="none", timeout=900, max_retries=0)
            conversation = f"bench-{name}"
            version = run.version()
            for index in range(args.max_turns):
                swaps = sum(r["swapped_before"] for r in records)
                if index >= turns and swaps >= min_swaps:
                    break
                if index:
                    time.sleep(args.think_s)
                before, seen, log_at = run.version(), len(run.gateway_turns()), run.policy_log_size()
                turn = streamed_turn(client, conversation, SCRIPT[index % len(SCRIPT)], args.max_tokens)
                after, policy = run.version(), run.gateway_turns()[seen:]
                turn.update(turn=index + 1, version=before, swapped_before=before != version,
                            swapped_during=after != before, policy_log=run.policy_records(log_at),
                            **(policy[0] if policy else {}))
                version = after
                records.append(turn)
                logger.warning("%s turn %d: ttft %.2fs total %.2fs, %s of %s prompt tokens cached, version %s%s%s",
                               name, index + 1, turn["ttft_s"], turn["total_s"], turn["cached_tokens"],
                               turn["prompt_tokens"], before, " (after a swap)" if turn["swapped_before"] else "",
                               f"; OpenClaw's error: {turn['error']}" if turn["error"] else "")
        samples = run.samples()
    finally:
        run.stop()
        if not args.keep_runs:   # a phase writes GBs (a 1.6 GB checkpoint and exported weights every step)
            for heavy in ("ckpt", "weights", "versions", "export"):
                shutil.rmtree(work / name / heavy, ignore_errors=True)
    return {"turns": records, "samples": samples, "log": str(run.log_path)}


def policy_breakdown(record: dict) -> str:
    """Where a turn's time in the policy server went: its largest request's queue wait and prefill to the first
    token, and what the server logged meanwhile (first calls of a shape, weight-swap steps)."""
    log = record.get("policy_log") or {"requests": [], "events": []}
    parts = []
    if log["requests"]:
        req = max(log["requests"], key=lambda r: r["prompt"])
        parts.append(f"queued {req['queued_s']:.2f} s, prefill {req['prefill_s']:.2f} s for "
                     f"{req['prompt'] - req['cached']} new tokens over {req['cached']} cached")
        if len(log["requests"]) > 1:
            parts.append(f"{len(log['requests']) - 1} other request(s)")
    parts += [re.sub(r"^\S+ \S+ \S+ \S+: ", "", line) for line in log["events"]]  # without time, level, logger
    return "; ".join(parts) or "nothing in the policy's log"


def summarize(records: list[dict], compared: int) -> dict:
    """Percentiles over turns 2..`compared` (the turns every phase ran: the same conversation, the session as
    long); the first turn prefills the conversation's system prompt cold in every phase. A turn OpenClaw ended
    with an error has no whole reply (and no usage) to time, but when its text had begun to stream, the person
    saw its first token: it counts in the times to the first token."""
    measured = [r for r in records[1:compared] if not r["error"]]
    started = [r for r in records[1:compared] if r.get("first_token", r["ttft_s"] < r["total_s"])]

    def p50_p95(rows: list[dict], key: str) -> dict:
        return {"p50": round(percentile([r[key] for r in rows], 0.5), 3),
                "p95": round(percentile([r[key] for r in rows], 0.95), 3)}

    out = {"ttft_s": p50_p95(started, "ttft_s"), "total_s": p50_p95(measured, "total_s")}
    if all("policy_ttft_s" in r for r in started):
        out["policy_ttft_s"] = p50_p95(started, "policy_ttft_s")
    slow = percentile([r["ttft_s"] for r in started], 0.9)
    first_prompt = records[0]["prompt_tokens"] or 0
    cold = [r["turn"] for r in measured if r["cached_tokens"] < first_prompt - WARM_SLACK]  # usage: whole replies
    out.update(turns=len(records), compared=compared, errors=[r["turn"] for r in records if r["error"]],
               swaps=sum(r["swapped_before"] for r in records[:compared]), cold_turns=cold,
               after_swap=[{k: r[k] for k in ("turn", "version", "ttft_s", "cached_tokens", "prompt_tokens")}
                           for r in records[:compared] if r["swapped_before"]],
               # the slowest turns (at or above the phase's p90 time to first token) and every turn after a swap,
               # with where their time in the policy went
               slowest=[{"turn": r["turn"], "ttft_s": r["ttft_s"], "after_swap": r["swapped_before"],
                         "policy": policy_breakdown(r)} for r in started
                        if r["swapped_before"] or r["ttft_s"] >= slow])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "live_cpu.yaml"),
                        help="the live run's config (LIVE_OVERRIDES are applied on top)")
    parser.add_argument("--policy-mode", choices=["process", "embedded"], default="process",
                        help="policy.mode of both phases' runs (process: serving ahead of the trainer in CPU priority)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more overrides for both phases' live runs (repeatable)")
    # 36: with a step every 2 scored turns, training on sees its 3 swaps within them (the first step waits for
    # the turns it trains on, and OpenClaw may end a turn with an error that is not scored)
    parser.add_argument("--turns", type=int, default=36, help="turns per phase (at least; percentiles compare "
                        "the turns every phase ran)")
    parser.add_argument("--min-swaps", type=int, default=3, help="with training on, go on until this many swaps")
    parser.add_argument("--max-turns", type=int, default=48, help="with training on, at most this many turns")
    parser.add_argument("--samples-per-step", type=int, default=2, help="with training on: a step every N scored turns")
    parser.add_argument("--think-s", type=float, default=15.0, help="seconds between a reply and the next message")
    # 64: a 24-turn conversation of 128-token replies outgrows OpenClaw's prompt budget (its context window less
    # its reserve), and OpenClaw then spends minutes compacting the session on 2 cores
    parser.add_argument("--max-tokens", type=int, default=64, help="OpenClaw's maxTokens for the model")
    parser.add_argument("--warmup-turns", type=int, default=6, help="turns of the warm-up pass (0: none)")
    parser.add_argument("--work-dir", default=None,
                        help="run dirs, logs and OpenClaw state, new or empty (default: a temp dir)")
    parser.add_argument("--keep-runs", action="store_true",
                        help="keep each phase's checkpoints and weights (by default only logs and records are kept)")
    parser.add_argument("--compare-nice", action="store_true",
                        help="a third phase, training on with the trainer at nice 19 alone (policy.trainer_idle=false)")
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    parser.add_argument("--from-records", default=None, metavar="TURNS_JSON",
                        help="report a finished run's records (its work dir's turns.json) instead of running")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if args.turns < 2 or args.max_turns < args.turns:
        raise SystemExit(f"--turns={args.turns} must be >= 2 and --max-turns={args.max_turns} >= it")
    if args.from_records:
        records = Path(args.from_records)
        report(args, json.loads(records.read_text()), records.parent, None)
        return
    from openclaw_jax.envs.openclaw_agent import missing_install
    if missing_install():
        raise SystemExit("OpenClaw is not installed: " + "; ".join(missing_install()))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="openclaw_turns_"))
    # OpenClaw's state of an earlier run would continue its sessions: every phase must start a new conversation
    earlier = [p for name in ("warmup", "off", "on", "on-nice") for p in (work / name, work / f"{name}-openclaw")
               if p.exists()]
    if earlier:
        raise SystemExit(f"--work-dir {work} holds an earlier run ({earlier[0]}), whose OpenClaw sessions this run "
                         "would continue; give a new or empty directory")
    work.mkdir(parents=True, exist_ok=True)
    mode = [f"policy.mode={args.policy_mode}"]
    off = [*mode, f"trainer.samples_per_step={10 * args.max_turns}", *args.set]
    on = [*mode, f"trainer.samples_per_step={args.samples_per_step}", *args.set]
    started = time.time()
    if args.warmup_turns:
        run_phase("warmup", args, off, work, args.warmup_turns, 0)
    phases = {"off": run_phase("off", args, off, work, args.turns, 0),
              "on": run_phase("on", args, on, work, args.turns, args.min_swaps)}
    if args.compare_nice:
        phases["on-nice"] = run_phase("on-nice", args, [*on, "policy.trainer_idle=false"], work, args.turns,
                                      args.min_swaps)
    (work / "turns.json").write_text(json.dumps(phases, indent=1))
    report(args, phases, work, time.time() - started)


def report(args, phases: dict, work: Path, seconds: float | None) -> None:
    """The phases' summaries, their p95 ratios and the slowest turns' breakdown; with --json, one JSON line."""
    # training on runs on until it saw --min-swaps swaps, into a longer session (longer prompts, larger cache
    # buckets): only the turns all phases ran are compared
    compared = min(len(p["turns"]) for p in phases.values())
    summary = {name: summarize(p["turns"], compared) | {"samples": p["samples"]} for name, p in phases.items()}
    ratios = {name: summary[name]["ttft_s"]["p95"] / summary["off"]["ttft_s"]["p95"] for name in phases if name != "off"}
    load = os.getloadavg()
    took = f"{seconds:.0f} s" if seconds is not None else "from its records"
    print(f"\nTurns through OpenClaw ({Path(args.config).name}, policy.mode={args.policy_mode}), think time "
          f"{args.think_s:.0f} s, maxTokens {args.max_tokens}; {os.cpu_count()} cores, load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}; {took}; work dir {work}; turns 2-{compared} compared")
    print(f"{'training':>8} | {'turns':>5} {'swaps':>5} {'samples':>7} | {'TTFT p50':>8} {'p95':>6} | "
          f"{'reply p50':>9} {'p95':>6} | cold turns after the first | OpenClaw errors")
    for name, s in summary.items():
        print(f"{name:>8} | {s['turns']:>5} {s['swaps']:>5} {s['samples']:>7} | {s['ttft_s']['p50']:>8.2f} "
              f"{s['ttft_s']['p95']:>6.2f} | {s['total_s']['p50']:>9.2f} {s['total_s']['p95']:>6.2f} | "
              f"{s['cold_turns'] or 'none'} | {s['errors'] or 'none'}")
    for name, s in summary.items():
        if "policy_ttft_s" in s:
            print(f"training {name}: of the time to first token, the policy's own (gateway to first token) "
                  f"p50 {s['policy_ttft_s']['p50']:.2f} s, p95 {s['policy_ttft_s']['p95']:.2f} s; the rest is OpenClaw's")
    for name, ratio in ratios.items():
        trainer = ("nice 19" if name == "on-nice" else "nice 19, XLA's threads SCHED_IDLE") \
            if args.policy_mode == "process" else "in process"
        print(f"p95 time to first token, training {name} (trainer {trainer}) / off: {ratio:.2f}x (target <= 1.5x)")
        for r in summary[name]["after_swap"]:
            print(f"  after a swap: turn {r['turn']} (version {r['version']}): TTFT {r['ttft_s']:.2f} s, "
                  f"{r['cached_tokens']} of {r['prompt_tokens']} prompt tokens cached")
    for name, s in summary.items():
        print(f"training {name}: the slowest turns and those after a swap, in the policy server:")
        for r in s["slowest"]:
            print(f"  turn {r['turn']}{' (after a swap)' if r['after_swap'] else ''}: TTFT {r['ttft_s']:.2f} s; "
                  f"{r['policy']}")
    if args.json:
        print(json.dumps({f"ttft_p95_{name.replace('-', '_')}_over_off": round(r, 3) for name, r in ratios.items()}
                         | summary))


if __name__ == "__main__":
    main()
