"""Drive the real OpenClaw agent CLI against our gateway, one turn per `openclaw agent --local` process.

`OpenClawAgent` writes `<state_dir>/openclaw.json` (a provider `openclaw-jax` whose `baseUrl` is the
gateway's `/v1`, and our plugin `integrations/openclaw/`, which tags each request with OpenClaw's
session id and main/side turn type) and runs

    openclaw agent --local --session-id S -m TEXT --json

with OpenClaw's state isolated under `state_dir` (`OPENCLAW_STATE_DIR`, `OPENCLAW_CONFIG_PATH`,
`HOME`): the same state directory and session id continue the session (OpenClaw resends the whole
session each turn). Profiles: `minimal` (`tools.profile: "minimal"`, no skills, no bootstrap files:
a ~2.3 k-token system prompt for SmolLM2) and `default` (OpenClaw's own defaults: ~10.5 k tokens).

The install comes from `scripts/openclaw.sh setup` (<repo>/.openclaw, or `$OPENCLAW_JAX_DIR`). One
`--local` process costs 10-16 s of Node CPU (13-22 s wall on 2 cores) before the model answers.
`OpenClawDaemon` runs OpenClaw's own gateway daemon (`openclaw gateway run`, ~10 s and ~15 s CPU to
start) for the same state directory instead: turns then go through it (`openclaw agent` without
`--local`, ~3 s of CLI CPU and 7-10 s wall each), and it is what makes OpenClaw's housekeeping runs
(`system_event`: a heartbeat now) and session commands (`/new`, `/reset`) happen. `TurnResult`
reports the wall and CPU time of each CLI process.

CLI (what `scripts/openclaw.sh agent` runs; prints the turn as JSON):

    python -m openclaw_jax.envs.openclaw_agent --gateway http://127.0.0.1:8000 --session-id s1 \\
        --message "What is 2 + 3?" [--state DIR] [--max-tokens N] [--api-key K] [--profile minimal]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from openclaw_jax.samples.person import check_person_id

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
PROVIDER_ID = "openclaw-jax"  # fixed: the plugin registers its provider hook under this id
PLUGIN_ID = "openclaw-jax"
PLUGIN_DIR = REPO / "integrations" / "openclaw"
AGENT_MODEL = "openclaw/default"  # the `model` of a request to OpenClaw's OpenAI endpoint: the default agent
Profile = Literal["minimal", "default"]
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class OpenClawError(RuntimeError):
    """An OpenClaw turn that did not produce a result (missing install, crash, timeout, bad output)."""


def install_dir() -> Path:
    """The OpenClaw install: `$OPENCLAW_JAX_DIR`, else <repo>/.openclaw."""
    return Path(os.environ.get("OPENCLAW_JAX_DIR") or REPO / ".openclaw")


def node_bin(root: Path | None = None) -> Path:
    return (root or install_dir()) / "n24" / "bin" / "node"


def openclaw_bin(root: Path | None = None) -> Path:
    return (root or install_dir()) / "app" / "node_modules" / ".bin" / "openclaw"


def missing_install(root: Path | None = None) -> list[str]:
    """What is missing for a turn (empty when ready): paths with the command that makes them."""
    return [f"{p} (run: bash scripts/openclaw.sh setup)"
            for p in (node_bin(root), openclaw_bin(root)) if not p.exists()]


@dataclasses.dataclass(frozen=True)
class OpenClawAgentConfig:
    """One OpenClaw agent pointed at our gateway. Validated on construction."""

    gateway_url: str                 # the gateway's root, e.g. http://127.0.0.1:8000 (no /v1)
    state_dir: Path                  # OpenClaw's state; the same dir continues its sessions
    model_id: str = "smollm2"        # the model name the gateway serves
    context_window: int = 8192       # what OpenClaw is told the model holds (prompt + completion)
    max_tokens: int = 256            # OpenClaw's max_completion_tokens ceiling
    api_key: str = "none"            # the gateway's bearer key (OpenClaw requires a non-empty one)
    profile: Profile = "minimal"
    timeout_s: float = 600.0         # per turn, the whole `openclaw agent` process
    notify_session_done: bool = True  # the plugin POSTs session-done notices to the gateway
    # Sessions named with one of these (OpenClaw session key, or the `user` of a request to OpenClaw's
    # OpenAI endpoint) are side runs for the plugin: held-out evaluation that must never train.
    side_session_prefixes: tuple[str, ...] = ()
    # Whose turns these are (the plugin's personId, sent as X-Person-Id): "" names nobody (the gateway's
    # default person, or the person of a key of its keys file).
    person_id: str = ""

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.gateway_url):
            raise ValueError(f"gateway_url={self.gateway_url!r}: give the gateway's root URL, "
                             "e.g. http://127.0.0.1:8000")
        object.__setattr__(self, "gateway_url", self.gateway_url.rstrip("/").removesuffix("/v1"))
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        if self.profile not in ("minimal", "default"):
            raise ValueError(f"profile={self.profile!r}: use 'minimal' or 'default'")
        for name in ("context_window", "max_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1")
        if self.max_tokens >= self.context_window:
            raise ValueError(f"max_tokens={self.max_tokens} must be below context_window={self.context_window}")
        if not self.model_id or "/" in self.model_id:
            raise ValueError(f"model_id={self.model_id!r}: a non-empty model name without '/'")
        if not self.api_key:
            raise ValueError("api_key is empty: OpenClaw refuses a provider without a key; use any "
                             "non-empty string when the gateway has none")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be > 0")
        if self.person_id:
            check_person_id(self.person_id, "person_id")


def provider_block(gateway_url: str, model_id: str, api_key: str, context_window: int, max_tokens: int) -> dict:
    """`models.providers.openclaw-jax`: the gateway as an OpenAI-compatible provider with one model."""
    model = {"id": model_id, "name": model_id, "reasoning": False, "input": ["text"],
             "contextWindow": int(context_window), "maxTokens": int(max_tokens),
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}
    return {"baseUrl": f"{gateway_url}/v1", "apiKey": api_key, "api": "openai-completions", "models": [model]}


def plugin_entry(gateway_url: str, api_key: str, person_id: str = "", **config: Any) -> dict:
    """`plugins.entries.openclaw-jax`: enabled, its hooks allowed to see runs (without that every request goes
    out as side and nothing trains), session-done notices to `gateway_url` ("": none), the person whose
    turns these are (`personId`, when given)."""
    plugin_cfg: dict[str, Any] = {"gatewayUrl": gateway_url, **config}
    if api_key != "none":
        plugin_cfg["apiKey"] = api_key
    if person_id:
        plugin_cfg["personId"] = person_id
    return {"enabled": True, "hooks": {"allowConversationAccess": True}, "config": plugin_cfg}


def openclaw_config(cfg: OpenClawAgentConfig, plugin_dir: Path = PLUGIN_DIR,
                    daemon_port: int | None = None) -> dict[str, Any]:
    """The `openclaw.json` for `cfg`: the provider block and our plugin block (docs/openclaw.md's snippet), plus
    OpenClaw's own gateway daemon on 127.0.0.1:`daemon_port` (no auth: loopback only) when given, with
    its OpenAI-compatible endpoint on (`/v1/chat/completions`: each request one agent run, the
    request's `user` naming the OpenClaw session)."""
    provider = provider_block(cfg.gateway_url, cfg.model_id, cfg.api_key, cfg.context_window, cfg.max_tokens)
    defaults: dict[str, Any] = {"model": {"primary": f"{PROVIDER_ID}/{cfg.model_id}"}}
    out: dict[str, Any] = {"models": {"mode": "merge", "providers": {PROVIDER_ID: provider}},
                           "agents": {"defaults": defaults}}
    if cfg.profile == "minimal":
        defaults.update(skills=[], skipBootstrap=True)
        out["tools"] = {"profile": "minimal"}
    extra = {"sideSessionPrefixes": list(cfg.side_session_prefixes)} if cfg.side_session_prefixes else {}
    entry = plugin_entry(cfg.gateway_url if cfg.notify_session_done else "", cfg.api_key, cfg.person_id, **extra)
    out["plugins"] = {"allow": [PLUGIN_ID], "load": {"paths": [str(plugin_dir)]}, "entries": {PLUGIN_ID: entry}}
    if daemon_port is not None:
        out["gateway"] = {"mode": "local", "port": int(daemon_port), "bind": "loopback", "auth": {"mode": "none"},
                          "http": {"endpoints": {"chatCompletions": {"enabled": True}}}}
    return out


@dataclasses.dataclass(frozen=True)
class TurnResult:
    """One `openclaw agent --json` turn as OpenClaw reported it."""

    session_id: str
    message: str
    text: str                 # the visible reply (payload texts joined)
    stop_reason: str | None   # OpenClaw's meta.stopReason: stop, length, toolUse, error, ...
    result: dict[str, Any]    # OpenClaw's whole --json object
    wall_s: float
    cpu_s: float              # user + system CPU of the OpenClaw process tree (Node)

    @property
    def ok(self) -> bool:
        return self.stop_reason not in ("error", None) and not self.result.get("meta", {}).get("aborted")


def _has_result(stdout: str) -> bool:
    """Whether `stdout` already holds OpenClaw's whole `--json` turn object."""
    try:
        parse_result(stdout)
    except OpenClawError:
        return False
    return True


def parse_result(stdout: str) -> dict[str, Any]:
    """OpenClaw's `--json` turn object ({"payloads", "meta"}) from its stdout (logs may precede it);
    a daemon turn's envelope ({"runId", "status", "result": {...}}) is unwrapped."""
    text = stdout.strip()
    start = text.find("{")
    if start < 0:
        raise OpenClawError(f"openclaw printed no JSON object; stdout starts: {text[:300]!r}")
    try:
        out = json.loads(text[start:])
    except json.JSONDecodeError as err:
        raise OpenClawError(f"openclaw's --json output does not parse ({err}); stdout starts: "
                            f"{text[:300]!r}") from err
    if isinstance(out, dict) and "payloads" not in out and isinstance(out.get("result"), dict):
        out = {**out["result"], "daemon": {k: v for k, v in out.items() if k != "result"}}
    if not isinstance(out, dict) or "payloads" not in out:
        raise OpenClawError(f"openclaw's --json output has no 'payloads': {text[:300]!r}")
    return out


class OpenClawAgent:
    """A person's OpenClaw agent, one process per turn; thread-safe, sessions may interleave."""

    def __init__(self, gateway_url: str, state_dir: str | Path, model_id: str = "smollm2",
                 context_window: int = 8192, max_tokens: int = 256, api_key: str = "none",
                 profile: Profile = "minimal", *, timeout_s: float = 600.0,
                 notify_session_done: bool = True, install: Path | None = None,
                 side_session_prefixes: Sequence[str] = (), person_id: str = ""):
        self.cfg = OpenClawAgentConfig(gateway_url=gateway_url, state_dir=Path(state_dir), model_id=model_id,
                                       context_window=context_window, max_tokens=max_tokens,
                                       api_key=api_key, profile=profile, timeout_s=timeout_s,
                                       notify_session_done=notify_session_done,
                                       side_session_prefixes=tuple(side_session_prefixes), person_id=person_id)
        self.install = Path(install) if install else install_dir()
        missing = missing_install(self.install)
        if missing:
            raise OpenClawError("OpenClaw is not installed: missing " + "; ".join(missing))
        self.daemon_port: int | None = None  # set by OpenClawDaemon while it runs
        self.write_config()

    @property
    def config_path(self) -> Path:
        return self.cfg.state_dir / "openclaw.json"

    @property
    def workspace(self) -> Path:
        """OpenClaw's default workspace `<OPENCLAW_STATE_DIR>/workspace` (`env()` clears any
        `OPENCLAW_WORKSPACE_DIR`): where it reads its bootstrap and memory files (USER.md, MEMORY.md) and
        injects the ones that exist into the system prompt."""
        return self.cfg.state_dir / "workspace"

    def write_config(self) -> Path:
        (self.cfg.state_dir / "home").mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(openclaw_config(self.cfg, daemon_port=self.daemon_port), indent=2) + "\n")
        tmp.replace(self.config_path)
        return self.config_path

    def env(self) -> dict[str, str]:
        """The isolated environment of an OpenClaw process: nothing read from the caller's home."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
        env.update(PATH=f"{node_bin(self.install).parent}{os.pathsep}{env.get('PATH', '')}",
                   OPENCLAW_STATE_DIR=str(self.cfg.state_dir), OPENCLAW_CONFIG_PATH=str(self.config_path),
                   HOME=str(self.cfg.state_dir / "home"), NO_COLOR="1")
        return env

    def command(self, session_id: str, message: str) -> list[str]:
        local = [] if self.daemon_port is not None else ["--local"]
        return [str(openclaw_bin(self.install)), "agent", *local, "--session-id", session_id,
                "-m", message, "--json", "--timeout", str(int(self.cfg.timeout_s))]

    def system_event(self, text: str) -> dict[str, Any]:
        """Enqueue a system event and wake a heartbeat run now (needs the daemon): OpenClaw's
        housekeeping path, in the agent's main session; returns OpenClaw's JSON answer."""
        if self.daemon_port is None:
            raise OpenClawError("system_event needs OpenClaw's gateway daemon: run it inside `with OpenClawDaemon(agent)`")
        cmd = [str(openclaw_bin(self.install)), "system", "event", "--text", text, "--mode", "now",
               "--port", str(self.daemon_port), "--json"]
        rc, _, out, err = _run_measured(cmd, self.env(), self.cfg.timeout_s)
        if rc != 0:
            raise OpenClawError(f"openclaw system event exited {rc}; stderr tail: {err[-1500:]}")
        start = out.find("{")
        return json.loads(out[start:]) if start >= 0 else {}

    def run_turn(self, session_id: str, message: str) -> TurnResult:
        """One turn of `session_id`; raises OpenClawError when OpenClaw gives no result."""
        if not _SESSION_ID.match(session_id or ""):
            raise ValueError(f"session_id={session_id!r}: letters, digits and . _ : - (1-128 chars)")
        if not message.strip():
            raise ValueError("message is empty: OpenClaw needs a non-empty message")
        start = time.monotonic()
        rc, cpu_s, out, err = _run_measured(self.command(session_id, message), self.env(), self.cfg.timeout_s,
                                            finished=_has_result)
        wall_s = time.monotonic() - start
        if rc != 0:
            raise OpenClawError(f"openclaw agent (session {session_id}) exited {rc} after {wall_s:.1f} s; "
                                f"stderr tail: {err[-1500:]}")
        result = parse_result(out)
        texts = [p.get("text") or "" for p in result.get("payloads") or [] if isinstance(p, dict)]
        turn = TurnResult(session_id=session_id, message=message, text="\n".join(t for t in texts if t),
                          stop_reason=result.get("meta", {}).get("stopReason"), result=result,
                          wall_s=wall_s, cpu_s=cpu_s)
        logger.info("openclaw turn session=%s stop=%s wall=%.1fs cpu=%.1fs", session_id, turn.stop_reason,
                    wall_s, cpu_s)
        return turn

    async def arun_turn(self, session_id: str, message: str) -> TurnResult:
        """`run_turn` off the event loop (the process is waited for in a worker thread)."""
        return await asyncio.to_thread(self.run_turn, session_id, message)


def _run_measured(cmd: Sequence[str], env: dict[str, str], timeout_s: float, *,
                  finished: Callable[[str], bool] | None = None, linger_s: float = 20.0
                  ) -> tuple[int, float, str, str]:
    """Run `cmd` in its own process group; (exit code, CPU seconds of its tree, stdout, stderr).

    With `finished`: once the stdout so far satisfies it (the whole `--json` result is out), a
    process still running `linger_s` later is killed and counted as exited 0. An `openclaw agent
    --local` turn once stayed up for the whole 300 s timeout after printing its reply, with one of
    its SQLite maintenance workers failed ("SQLite automatic maintenance inputs changed before
    commit"); the turn itself had ended."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        lingered = False
        try:
            # wait4 (not Popen.wait) returns the child's own rusage: its CPU, not the caller's.
            if finished is None:
                _, status, usage = os.wait4(proc.pid, 0)
            else:
                seen_size, done_at = -1, None
                while True:
                    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        break
                    size = os.fstat(out.fileno()).st_size
                    if done_at is None and size != seen_size:
                        seen_size = size
                        if finished(os.pread(out.fileno(), size, 0).decode(errors="replace")):
                            done_at = time.monotonic()
                    if done_at is not None and time.monotonic() - done_at > linger_s and not timed_out.is_set():
                        lingered = True
                        os.killpg(proc.pid, signal.SIGKILL)
                        _, status, usage = os.wait4(proc.pid, 0)
                        break
                    time.sleep(0.1)
        finally:
            timer.cancel()
        proc.returncode = 0 if lingered else os.waitstatus_to_exitcode(status)
        try:  # Node may leave workers of its group behind after the main process exits
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if timed_out.is_set():
        raise OpenClawError(f"openclaw agent ran past timeout_s={timeout_s}; stderr tail: {stderr[-1500:]}")
    if lingered:
        logger.warning("%s printed its whole result but was still running %.0f s later; killed it and kept "
                       "the result (stderr tail: %s)", Path(cmd[0]).name, linger_s, stderr[-300:])
    return proc.returncode, usage.ru_utime + usage.ru_stime, stdout, stderr


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DAEMON_READY = re.compile(r"\[gateway\]\s+ready\s*$", re.MULTILINE)


class OpenClawDaemon:
    """OpenClaw's own gateway daemon for one agent's state dir; while it runs, the agent's turns go
    through it. A context manager: `with OpenClawDaemon(agent): agent.run_turn(...)`."""

    def __init__(self, agent: OpenClawAgent, port: int | None = None, start_timeout_s: float = 120.0):
        self.agent = agent
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self.log_path = agent.cfg.state_dir / "daemon.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "OpenClawDaemon":
        self.agent.daemon_port = self.port
        self.agent.write_config()
        cmd = [str(openclaw_bin(self.agent.install)), "gateway", "run", "--port", str(self.port),
               "--bind", "loopback", "--auth", "none"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=self.agent.env(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise OpenClawError(f"openclaw gateway exited {self.proc.returncode} at start; log "
                                    f"{self.log_path}: {self.log()[-1500:]}")
            if _DAEMON_READY.search(self.log()):
                logger.info("openclaw daemon ready on 127.0.0.1:%d (pid %d)", self.port, self.proc.pid)
                return self
            time.sleep(0.5)
        self.stop()
        raise OpenClawError(f"openclaw gateway not ready after {self.start_timeout_s} s; log {self.log_path}: "
                            f"{self.log()[-1500:]}")

    @property
    def base_url(self) -> str:
        """OpenClaw's OpenAI-compatible endpoint (`.../v1`): a person's client talks to the agent here,
        sending only their newest message with `user` = the conversation; model `openclaw/default`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        try:
            return _ANSI.sub("", self.log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return ""

    def cpu_s(self) -> float:
        """CPU seconds the daemon process has used so far (Linux /proc)."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, grace_s: float = 15.0) -> None:
        self.agent.daemon_port = None
        self.agent.write_config()
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # helpers of its group (spawn broker, sqlite workers) go with it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "OpenClawDaemon":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openclaw_jax.envs.openclaw_agent",
        description="Run one real OpenClaw turn against the gateway and print OpenClaw's --json result "
                    "(plus wall_s / cpu_s) as JSON.")
    p.add_argument("--gateway", required=True, help="the gateway's root URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--session-id", required=True, help="OpenClaw session id (the same id continues it)")
    p.add_argument("--message", required=True, help="the person's message")
    p.add_argument("--state", default=None,
                   help="OpenClaw state directory (default: <repo>/runs/openclaw-state); reuse it to continue")
    p.add_argument("--max-tokens", type=int, default=256, help="completion ceiling (default 256)")
    p.add_argument("--context-window", type=int, default=8192, help="declared context window (default 8192)")
    p.add_argument("--model-id", default="smollm2", help="model name the gateway serves (default smollm2)")
    p.add_argument("--api-key", default=os.environ.get("OPENCLAW_JAX_API_KEY", "none"),
                   help="the gateway's bearer key (default $OPENCLAW_JAX_API_KEY or 'none')")
    p.add_argument("--profile", choices=["minimal", "default"], default="minimal",
                   help="minimal: tools.profile minimal, no skills, no bootstrap files (default)")
    p.add_argument("--person-id", default="",
                   help="whose turns these are (sent as X-Person-Id; default: nobody named, the gateway's default "
                        "person or the person of the key)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole turn (default 600)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    state = Path(args.state) if args.state else REPO / "runs" / "openclaw-state"
    try:
        agent = OpenClawAgent(args.gateway, state, model_id=args.model_id, context_window=args.context_window,
                              max_tokens=args.max_tokens, api_key=args.api_key, profile=args.profile,
                              timeout_s=args.timeout, person_id=args.person_id)
        turn = agent.run_turn(args.session_id, args.message)
    except (OpenClawError, ValueError) as err:
        logger.error("%s", err)
        return 1
    json.dump({**turn.result, "wall_s": round(turn.wall_s, 3), "cpu_s": round(turn.cpu_s, 3)}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0 if turn.ok else 2


if __name__ == "__main__":
    sys.exit(main())
