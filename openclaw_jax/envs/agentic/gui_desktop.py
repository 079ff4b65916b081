"""The GUI episode's processes: Xvfb on a display of its own, the Tk application in the sandbox jail, and
the episode state that owns them (gui.py describes the whole)."""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from openclaw_jax.envs.agentic.gui_tasks import HEIGHT, WIDTH
from openclaw_jax.envs.agentic.episode import ToolError
from openclaw_jax.envs.sandbox import Sandbox, _python_prefix

APP_SOURCE = Path(__file__).with_name("gui_apps.py")
INSTALL_HINT = "apt-get install -y --no-install-recommends xvfb xdotool"
REQUIRED_TOOLS = ("Xvfb", "xdotool", "unshare")
FONTS_CONF = ("<?xml version=\"1.0\"?>\n<fontconfig><dir>/usr/share/fonts</dir>"
              "<cachedir>/tmp/fontconfig</cachedir></fontconfig>\n")


class GuiError(RuntimeError):
    """The display or the application could not be started."""


def missing_tools() -> list[str]:
    return [t for t in REQUIRED_TOOLS if shutil.which(t) is None]



def kill_group(proc: subprocess.Popen | None, term_first: float = 0.0) -> None:
    if proc is None:
        return
    if proc.stdin is not None and proc.args and proc.args[0] == "sh":  # start_xvfb's lifeline
        try:
            proc.stdin.close()
        except OSError:
            pass
    if term_first and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=term_first)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def start_xvfb(private_tmp: str | Path, width: int = WIDTH, height: int = HEIGHT, timeout_s: float = 60.0,
               cleanup_dir: str | None = None) -> tuple[subprocess.Popen, int, Path]:
    """(process, display number, socket path) of a fresh Xvfb.

    The server picks its display number itself (`-displayfd` without a number: the first whose
    abstract socket it can bind, atomically, so concurrent episodes, processes and test workers
    never race for a number), and reports it once it listens (its own readiness signal). It runs in
    a private mount namespace whose /tmp is `private_tmp` (ours, per episode), so its socket file
    lands in `private_tmp/.X11-unix/X<N>`, a path nobody else creates or removes: an exiting server
    of another episode that reused the number cannot unlink it, and nothing global is left behind.
    Host clients (xdotool, screenshots) reach the server through its abstract socket (`DISPLAY=:N`);
    the jail gets the socket file. `cleanup_dir` is removed when the server ends (also when this
    process dies without closing it). `timeout_s` bounds a server that never gets ready, not speed."""
    private_tmp = Path(private_tmp)
    private_tmp.mkdir(parents=True, exist_ok=True)
    r, w = os.pipe()
    log = tempfile.TemporaryFile()  # Xvfb's stderr (a file: an unread pipe could block or SIGPIPE it)
    try:
        if shutil.which("Xvfb") is None:
            raise FileNotFoundError("Xvfb")
        private_ns = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:  # an ordinary user mounts in a user namespace of its own
            private_ns[1:1] = ["--user", "--map-root-user"]
        # Under a shell that waits on a pipe from us: if this process dies without closing the episode
        # (killed, crashed), the pipe's end reaches `read` and the shell takes Xvfb down with it.
        # (The shell ignores SIGTERM once Xvfb runs, and on the pipe's end waits for Xvfb's clean exit.)
        # `unshare` and the inner shell exec into Xvfb, so $x is the server itself.
        script = ('"$@" & x=$!; trap "" TERM; read _; kill $x; wait $x; '
                  '[ -z "$GUI_DIR" ] || rm -rf -- "$GUI_DIR"')
        server = [*private_ns, "sh", "-c", 'mount --bind "$GUI_TMP" /tmp && exec Xvfb "$@"', "xvfb",
                  "-displayfd", str(w), "-screen", "0", f"{width}x{height}x24",
                  "-nolisten", "tcp", "-nocursor", "-noreset"]
        proc = subprocess.Popen(["sh", "-c", script, "sh", *server],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                                pass_fds=(w,), start_new_session=True,
                                env={**os.environ, "GUI_DIR": cleanup_dir or "", "GUI_TMP": str(private_tmp)})
    except FileNotFoundError as err:
        os.close(r)
        os.close(w)
        log.close()
        raise GuiError(f"Xvfb is not installed ({INSTALL_HINT})") from err
    os.close(w)
    data, deadline = b"", time.monotonic() + timeout_s
    try:
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                break
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
    socket_path = private_tmp / ".X11-unix" / f"X{data.decode(errors='replace').strip()}"
    if not data.strip().isdigit() or not socket_path.is_socket():
        kill_group(proc)
        log.seek(0)
        err = log.read().decode(errors="replace")[-500:]
        log.close()
        why = "did not report a display" if not data.strip().isdigit() else f"has no socket at {socket_path}"
        raise GuiError(f"Xvfb {why} within {timeout_s:g} s: {err.strip()}")
    log.close()
    return proc, int(data), socket_path


class AppJail(Sandbox):
    """The sandbox jail (same spec and init as `Sandbox.run`) started without waiting for its end. One run
    per jail, so no holder: the area is filled from `directory` when the app starts (a unix socket
    linked there, the X server's, is bound in)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "persistent": False})

    def start(self, code: str, argv_tail: Sequence[str] = ()) -> subprocess.Popen:
        argv = [_python_prefix()[0], "-I", "-B", "-c", code, *argv_tail]
        status_r, status_w = os.pipe()
        try:
            cmd = self.command(argv, status_w)
        except BaseException:
            os.close(status_r)
            os.close(status_w)
            raise
        self.stderr_path = self._host / "app.stderr"
        with open(self.stderr_path, "wb") as err:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                        start_new_session=True, close_fds=True, pass_fds=(status_w,))
            except BaseException:
                os.close(status_r)
                raise
            finally:
                os.close(status_w)
        self.status_r = status_r  # the jail's init writes the app's exit status here
        return proc

    def exit_status(self) -> str:
        """How the app ended, from the jail's status pipe ("" when not reported)."""
        fd = getattr(self, "status_r", None)
        if fd is None or not select.select([fd], [], [], 0.5)[0]:
            return ""
        try:
            code = int(json.loads(os.read(fd, 256))["exit_code"])
        except (OSError, ValueError, KeyError, TypeError):
            return ""
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def close(self) -> None:
        fd = getattr(self, "status_r", None)
        if fd is not None:
            self.status_r = None
            os.close(fd)
        super().close()

    def stderr_tail(self, n: int = 400) -> str:
        try:
            return self.stderr_path.read_bytes()[-n:].decode(errors="replace").strip()
        except (OSError, AttributeError):
            return ""


@dataclass
class GuiState:
    """One episode: its display, its application, its screenshots and how it ended."""

    display: int
    xvfb: subprocess.Popen
    jail: AppJail
    app: subprocess.Popen
    reply_timeout_s: float
    screenshot: bytes = b""                       # the latest (PNG)
    frames: list[bytes] = field(default_factory=list)   # every screenshot of the episode, the first at start
    geometry: dict[str, list[int]] = field(default_factory=dict)
    app_state: dict[str, Any] = field(default_factory=dict)
    menu: dict[str, Any] | None = None
    done: bool = False
    failure: str | None = None
    actions: int = 0
    step_progress: list[float] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    _buf: bytes = b""
    _lock: threading.Lock = field(default_factory=threading.Lock)  # an episode timeout can leave a call running

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DISPLAY": f":{self.display}"}

    def alive(self) -> bool:
        return self.app.poll() is None

    def request(self, cmd: str) -> dict[str, Any]:
        """One command to the application and its reply; a dead or silent application fails the episode."""
        with self._lock:
            return self._request(cmd)

    def _request(self, cmd: str) -> dict[str, Any]:
        if self.failure:
            raise ToolError(self.failure)
        if not self.alive():
            self.fail("the application crashed")
        try:
            self.app.stdin.write((json.dumps({"cmd": cmd}) + "\n").encode())
            self.app.stdin.flush()
        except (BrokenPipeError, OSError):
            self.fail("the application crashed")
        return self.read_reply()

    def read_reply(self) -> dict[str, Any]:
        fd = self.app.stdout.fileno()
        deadline = time.monotonic() + self.reply_timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.fail(f"the application stopped responding (no reply in {self.reply_timeout_s:g} s)")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.fail("the application crashed")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            self.fail(f"the application sent a malformed reply: {line[:200]!r}")
        if "state" in reply:
            self.app_state, self.geometry, self.menu = reply["state"], reply["geometry"], reply.get("menu")
        return reply

    def fail(self, reason: str):
        if reason.endswith("crashed"):
            status = self.jail.exit_status()
            reason += f" ({status})" if status else ""
        kill_group(self.app)
        detail = self.jail.stderr_tail()
        self.failure = reason + (f"; its stderr ends: {detail}" if detail else "")
        raise ToolError(self.failure)

    def grab(self) -> bytes:
        from PIL import ImageGrab

        t0 = time.monotonic()
        image = ImageGrab.grab(xdisplay=f":{self.display}").convert("RGB")
        buf = io.BytesIO()
        image.save(buf, format="PNG", compress_level=1)
        self.screenshot = buf.getvalue()
        self.frames.append(self.screenshot)
        self.timings["screenshot_s"] = time.monotonic() - t0
        return self.screenshot

    def xdotool(self, *args: str) -> None:
        try:
            proc = subprocess.run(["xdotool", *args], env=self.env, capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            raise ToolError("the input injection timed out") from None
        if proc.returncode != 0:
            raise ToolError(f"the action failed: {proc.stderr.decode(errors='replace').strip()[-200:]}")

    def pids(self) -> list[int]:
        """Every process of this episode (Xvfb, the jail and what runs in it)."""
        out = []
        for proc in (self.xvfb, self.app):
            if proc.poll() is None:
                out += [proc.pid, *descendants(proc.pid)]
        return out

    def close(self) -> None:
        if self.app.poll() is None:
            try:
                self.app.stdin.write(b'{"cmd": "quit"}\n')
                self.app.stdin.flush()
                self.app.wait(timeout=1.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
        kill_group(self.app)
        for stream in (self.app.stdin, self.app.stdout):
            try:
                stream.close()
            except OSError:
                pass
        kill_group(self.xvfb, term_first=5.0)  # SIGTERM first: a clean exit; its socket file is ours anyway
        self.jail.close()


