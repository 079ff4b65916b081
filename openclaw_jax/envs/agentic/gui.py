"""The GUI environment: a real X server per episode running a small real Tk application (issue 28, item 3).

Per episode:
  * **Xvfb** on a display of its own (`-displayfd` lets the server pick a free number), started
    (under a small shell, see below) in its own session / process group, `-nolisten tcp`, screen
    `448x336x24` (16 x 12 patches of 28 pixels for the Qwen2.5-VL patcher);
  * **the application** (`gui_apps.py`, Tk) runs **inside the sandbox jail** (`envs/sandbox.py`:
    own mount / PID / network / IPC namespaces, chroot of read-only system paths, an unprivileged
    uid of its own, rlimits). The jail's /tmp is private and its network namespace cannot reach
    Xvfb's abstract socket, so the host hard-links Xvfb's filesystem socket
    (/tmp/.X11-unix/X<N>) into the sandbox directory and the app symlinks it to its own
    /tmp/.X11-unix/X0 (a unix socket is reached through any link to its inode). The jail has no
    /etc/fonts either, so the host writes a fonts.conf next to it. `Sandbox.run` blocks until the
    code ends, so `_AppJail.start` launches the same jail (same spec, same init) without waiting;
  * **actions** are injected with `xdotool` (XTEST): `click(x, y)`, `type(text)`, `key(name)`, and
    `done` ends the agent's work (later actions are refused);
  * **observations** are screenshots, PNG bytes (`state.screenshot`, `GuiEnv.screenshot(state)`),
    captured with Pillow's `ImageGrab.grab(xdisplay=":N")`: one in-process XCB GetImage plus a
    fast PNG encode (about 3 ms here), no extra package (Pillow is already a dependency), no
    process per frame and no file on disk, where `xwd | convert` or ImageMagick `import` start one
    or two processes per frame (and need x11-apps / imagemagick). The tool result text says what
    happened; with `a11y=True` it also lists the widgets and their boxes (for text-only policies and
    debugging). Every frame is kept (`state.frames`); `observation_content` makes the OpenAI
    `image_url` parts. The episode runner is text-only today: putting the screenshot into the tool
    message is item 2's work;
  * **the checker** reads the application's own state through a control pipe (stdin/stdout of
    the jailed process; the agent only has the display): entry values, button presses (each with
    the entries at that moment), the chosen menu item. `progress` grades the state after every
    action (fraction of the task done, `state.step_progress`); with `step_check=True` the
    observation carries it and `checker_step_vote` turns it into PRM step votes;
  * a crashed (exited) or hung (no reply within `reply_timeout_s`) application ends the episode:
    later calls raise a ToolError naming the failure, the score is 0, and `close` kills both
    process groups (the jail's PID namespace takes every process the app started with it). Xvfb
    runs under a shell holding a lifeline pipe from this process, and the app reads its control
    pipe: a host that dies without `close` still takes Xvfb, the app and the sandbox directory along.

Demonstrations: `demonstration(task)` (one action per turn, from the task's widget boxes; menus
are walked with the keyboard) for `rollout.demonstrations`; `demonstration_conversations(...,
screenshots=True)` and `python -m openclaw_jax.envs.agentic.gui_demos` run them and embed the real
screenshots (the multimodal warm-up set).

Task families (generated from a seed; layouts, labels and values vary; train and held-out are
disjoint by a hash of the task):
  * `form`: fill two or three labelled fields with given values, then press Submit;
  * `button`: press the button with a given label among three to five;
  * `menu`: choose an item from a given drop-down menu (a decoy menu beside it);
  * `copy`: copy a read-only field's value into another field, then press OK.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import random
import re
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

from openclaw_jax.envs.agentic.episode import Environment, Task, ToolError, format_tool_call, register_environment
from openclaw_jax.envs.sandbox import INIT_SCRIPT, Sandbox, SandboxError, SandboxLimits, _python_prefix
from openclaw_jax.envs.agentic.episode import parse_assistant_turn

FAMILIES = ("form", "button", "menu", "copy")
WIDTH, HEIGHT = 448, 336
APP_SOURCE = Path(__file__).with_name("gui_apps.py")
INSTALL_HINT = "apt-get install -y --no-install-recommends xvfb xdotool"
REQUIRED_TOOLS = ("Xvfb", "xdotool", "unshare")
FONTS_CONF = ("<?xml version=\"1.0\"?>\n<fontconfig><dir>/usr/share/fonts</dir>"
              "<cachedir>/tmp/fontconfig</cachedir></fontconfig>\n")
_KEY = re.compile(r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$")


class GuiError(RuntimeError):
    """The display or the application could not be started."""


def missing_tools() -> list[str]:
    return [t for t in REQUIRED_TOOLS if shutil.which(t) is None]


# ----------------------------------------------------------------------------- tasks

_FIELDS = ("Name", "City", "Email", "Phone", "Country", "Company", "Street", "Zip")
_VALUES = {"Name": ("Alice", "Bruno", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana"),
           "City": ("Paris", "Lima", "Oslo", "Kyoto", "Cairo", "Quito", "Perth", "Turin"),
           "Email": ("a@x.org", "bob@mail.com", "kim@ex.net", "li@web.io", "mo@site.fr"),
           "Phone": ("555-0142", "555-0199", "555-7731", "555-2046", "555-6610"),
           "Country": ("Peru", "Chile", "Japan", "Ghana", "Spain", "Nepal"),
           "Company": ("Acme", "Globex", "Initech", "Umbrella", "Hooli"),
           "Street": ("Elm St 4", "Oak Rd 17", "Main St 9", "Pine Ave 2"),
           "Zip": ("10115", "75001", "02139", "94110", "60614")}
_BUTTONS = ("Save", "Delete", "Print", "Open", "Close", "Help", "Apply", "Reset", "Cancel", "Export", "Import",
            "Refresh", "Share", "Undo", "Redo", "Send")
_MENUS = {"Color": ("Red", "Green", "Blue", "Yellow", "Black", "White", "Orange"),
          "Size": ("Small", "Medium", "Large", "Huge", "Tiny"),
          "Font": ("Serif", "Sans", "Mono", "Script", "Display"),
          "Speed": ("Slow", "Normal", "Fast", "Turbo"),
          "Shape": ("Circle", "Square", "Triangle", "Star", "Hexagon")}
_ROW_H, _ROW0 = 48, 14


def _w(name, kind, x, y, w, h, **kw) -> dict[str, Any]:
    return {"name": name, "kind": kind, "x": int(x), "y": int(y), "w": int(w), "h": int(h), **kw}


def _rows(rng: random.Random, n: int) -> list[int]:
    return [_ROW0 + r * _ROW_H for r in sorted(rng.sample(range(6), n))]


def _generate(family: str, rng: random.Random) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(prompt, app spec, goal) of one task."""
    if family == "form":
        fields = rng.sample(_FIELDS, rng.randint(2, 3))
        rows = _rows(rng, len(fields) + 1)
        x0, ew = rng.randint(8, 100), rng.randint(150, 220)
        widgets, goal = [], {}
        for f, y in zip(fields, rows):
            widgets.append(_w(f"label_{f}", "label", x0, y, 84, 28, text=f + ":"))
            widgets.append(_w(f"entry_{f}", "entry", x0 + 90, y, ew, 28))
            goal[f"entry_{f}"] = rng.choice(_VALUES[f])
        widgets.append(_w("submit", "button", rng.randint(x0, x0 + 90 + ew - 90), rows[-1], 90, 32, text="Submit"))
        wanted = " and ".join(f"{f} to '{goal['entry_' + f]}'" for f in fields)
        return f"Fill in the form: set {wanted}, then press Submit.", {"widgets": widgets}, \
            {"entries": goal, "press": "submit"}
    if family == "button":
        labels = rng.sample(_BUTTONS, rng.randint(3, 5))
        cells = rng.sample([(c, r) for c in range(4) for r in range(6)], len(labels))
        widgets = [_w(f"button_{lab}", "button", 8 + c * 110 + rng.randint(0, 14), _ROW0 + r * _ROW_H, 90, 32, text=lab)
                   for lab, (c, r) in zip(labels, cells)]
        target = rng.choice(labels)
        return f"Press the {target} button.", {"widgets": widgets}, {"press": f"button_{target}"}
    if family == "menu":
        names = rng.sample(sorted(_MENUS), 2)
        xs = sorted(rng.sample(range(8, WIDTH - 130, 10), 2))
        if xs[1] - xs[0] < 130:
            xs[1] = min(xs[0] + 140, WIDTH - 124)
        y = rng.randint(8, 60)
        widgets = []
        for name, x in zip(names, xs):
            items = list(rng.sample(_MENUS[name], rng.randint(3, len(_MENUS[name]))))
            widgets.append(_w(f"menu_{name}", "menu", x, y, 116, 30, text=name, items=items))
        target_menu = rng.choice(widgets)
        item = rng.choice(target_menu["items"])
        return (f"From the {target_menu['text']} menu, choose {item}.", {"widgets": widgets},
                {"menu": target_menu["name"], "item": item, "index": target_menu["items"].index(item)})
    if family == "copy":
        code = f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randint(10, 99)}-{rng.randint(1000, 9999)}"
        source, target = rng.choice([("Order number", "Confirm order"), ("Invoice", "Repeat invoice"),
                                     ("Ticket", "Ticket again"), ("Serial", "Confirm serial")])
        rows = _rows(rng, 3)
        x0, ew = rng.randint(8, 80), rng.randint(140, 200)
        widgets = [_w("label_source", "label", x0, rows[0], 120, 28, text=source + ":"),
                   _w("source", "entry", x0 + 126, rows[0], ew, 28, value=code, readonly=True),
                   _w("label_target", "label", x0, rows[1], 120, 28, text=target + ":"),
                   _w("target", "entry", x0 + 126, rows[1], ew, 28),
                   _w("ok", "button", x0 + 126 + rng.randint(0, ew - 80), rows[2], 80, 32, text="OK")]
        return (f"Copy the {source} value into the {target} field, then press OK.", {"widgets": widgets},
                {"entries": {"target": code}, "press": "ok"})
    raise ValueError(f"unknown gui family {family!r}; use one of {FAMILIES}")


def _is_heldout(key: str) -> bool:
    return hashlib.sha256(key.encode()).digest()[0] % 4 == 0


def center(box: Sequence[int]) -> tuple[int, int]:
    """The middle of an [x, y, w, h] box."""
    x, y, w, h = box
    return int(x + w // 2), int(y + h // 2)


def check(goal: dict[str, Any], app_state: dict[str, Any]) -> float:
    """1.0 when the application's state shows the task done, else 0.0."""
    presses = app_state.get("pressed", [])
    if "menu" in goal:
        return 1.0 if app_state.get("menu") == goal["item"] and app_state.get("menu_of") == goal["menu"] \
            and not presses else 0.0
    if "entries" in goal:  # exactly one press, of the right button, with the right values at that moment
        if len(presses) != 1 or presses[0]["name"] != goal["press"]:
            return 0.0
        return 1.0 if all(presses[0]["entries"].get(k) == v for k, v in goal["entries"].items()) else 0.0
    return 1.0 if [p["name"] for p in presses] == [goal["press"]] else 0.0


def progress(goal: dict[str, Any], app_state: dict[str, Any]) -> float:
    """The fraction of the task done in `app_state` (for step grading); 1.0 exactly when `check` is."""
    if check(goal, app_state) >= 1.0:
        return 1.0
    presses = app_state.get("pressed", [])
    if "entries" in goal and not presses:
        entries = app_state.get("entries", {})
        done = sum(entries.get(k) == v for k, v in goal["entries"].items())
        return done / (len(goal["entries"]) + 1)
    return 0.0


# ----------------------------------------------------------------------------- processes


def _kill_group(proc: subprocess.Popen | None, term_first: float = 0.0) -> None:
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


def start_xvfb(width: int = WIDTH, height: int = HEIGHT, timeout_s: float = 10.0,
               cleanup_dir: str | None = None) -> tuple[subprocess.Popen, int]:
    """(process, display number) of a fresh Xvfb that picked a free display itself; `cleanup_dir` is
    removed when it ends (also when this process dies without closing it)."""
    r, w = os.pipe()
    log = tempfile.TemporaryFile()  # Xvfb's stderr (a file: an unread pipe could block or SIGPIPE it)
    try:
        if shutil.which("Xvfb") is None:
            raise FileNotFoundError("Xvfb")
        # Under a shell that waits on a pipe from us: if this process dies without closing the episode
        # (killed, crashed), the pipe's end reaches `read` and the shell takes Xvfb down with it.
        # (The shell ignores SIGTERM once Xvfb runs, and on the pipe's end waits for Xvfb's clean exit.)
        script = 'Xvfb "$@" & x=$!; trap "" TERM; read _; kill $x; wait $x; [ -z "$GUI_DIR" ] || rm -rf -- "$GUI_DIR"'
        proc = subprocess.Popen(["sh", "-c", script, "sh",
                                 "-displayfd", str(w),
                                 "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp", "-nocursor", "-noreset"],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                                pass_fds=(w,), start_new_session=True,
                                env={**os.environ, "GUI_DIR": cleanup_dir or ""})
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
    if not data.strip().isdigit():
        _kill_group(proc)
        log.seek(0)
        err = log.read().decode(errors="replace")[-500:]
        log.close()
        raise GuiError(f"Xvfb did not report a display: {err.strip()}")
    log.close()
    return proc, int(data)


class _AppJail(Sandbox):
    """The sandbox jail (same spec and init as `Sandbox.run`) started without waiting for its end."""

    def start(self, code: str, argv_tail: Sequence[str] = ()) -> subprocess.Popen:
        if self._closed:
            raise SandboxError("this sandbox is closed")
        argv = [_python_prefix()[0], "-I", "-B", "-c", code, *argv_tail]
        cmd = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
        if not self.is_root:
            cmd += ["--user", "--map-root-user"]
        status_r, status_w = os.pipe()
        cmd += ["--", _python_prefix()[0], "-I", "-S", INIT_SCRIPT, json.dumps(self._spec(argv, status_w))]
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
    jail: _AppJail
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
        _kill_group(self.app)
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
        _kill_group(self.app)
        for stream in (self.app.stdin, self.app.stdout):
            try:
                stream.close()
            except OSError:
                pass
        _kill_group(self.xvfb, term_first=2.0)  # SIGTERM first: Xvfb removes its lock file and socket
        for stale in (f"/tmp/.X{self.display}-lock", f"/tmp/.X11-unix/X{self.display}"):
            if self.xvfb.returncode is not None and os.path.lexists(stale):
                try:
                    os.unlink(stale)
                except OSError:
                    pass
        self.jail.close()


# ----------------------------------------------------------------------------- the environment

_TOOLS = [
    {"type": "function", "function": {
        "name": "click", "description": f"Left-click the screen at pixel (x, y); the screen is {WIDTH}x{HEIGHT}.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                       "required": ["x", "y"]}}},
    {"type": "function", "function": {
        "name": "type", "description": "Type text with the keyboard into the focused widget.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
    {"type": "function", "function": {
        "name": "key", "description": "Press a key or combination by X keysym name, e.g. Return, Tab, Down, ctrl+a.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
    {"type": "function", "function": {
        "name": "done", "description": "Say the task is finished; no further actions are taken.",
        "parameters": {"type": "object", "properties": {}}}},
]


@register_environment("gui")
class GuiEnv(Environment):
    system_prompt = (f"You operate a desktop application through screenshots ({WIDTH}x{HEIGHT} pixels). Act with "
                     "the click, type and key tools, one action per turn; call done (or answer without a tool "
                     "call) when the task is finished.")
    tools = _TOOLS

    def __init__(self, families: Sequence[str] = FAMILIES, sandbox: SandboxLimits | None = None, *,
                 a11y: bool = False, step_check: bool = False, reply_timeout_s: float = 5.0,
                 max_type_chars: int = 200):
        self.families = self.check_families(families, FAMILIES)
        # the jail's limits: the app lives for the whole episode (wall and CPU), Tk needs some memory
        self.sandbox = sandbox or SandboxLimits(timeout_s=600.0, memory_mb=512)
        self.a11y = a11y
        self.step_check = step_check
        self.reply_timeout_s = reply_timeout_s
        self.max_type_chars = max_type_chars

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: SandboxLimits) -> "GuiEnv":
        # the config's sandbox limits are per command; an app lives for an episode
        limits = SandboxLimits(timeout_s=max(sandbox.timeout_s, 600.0), memory_mb=max(sandbox.memory_mb, 512))
        return cls(families or FAMILIES, limits)

    # -- tasks
    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        self.check_split(split)
        rng = random.Random(f"gui/{seed}")
        out: list[Task] = []
        seen: set[str] = set()
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 100 * n + 1000:
                raise ValueError(f"could not generate {n} distinct {split} gui tasks of {self.families}")
            family = self.families[len(out) % len(self.families)]
            prompt, spec, goal = _generate(family, rng)
            key = json.dumps([family, spec, goal], sort_keys=True)
            if key in seen or _is_heldout(key) != (split == "heldout"):
                continue
            seen.add(key)
            spec = {"width": WIDTH, "height": HEIGHT, "title": family, **spec}
            out.append(Task(f"gui/{split}/{seed}/{len(out)}", prompt, goal, {"app": spec}, family))
        return out

    # -- episodes
    def launch(self, task: Task) -> GuiState:
        """Blocking start of an episode: the display, the jailed application, the first screenshot."""
        missing = missing_tools()
        if missing:
            raise GuiError(f"missing {', '.join(missing)}; install with: {INSTALL_HINT}")
        t0 = time.monotonic()
        jail = _AppJail(self.sandbox, files={"app.json": json.dumps(task.data["app"]), "fonts.conf": FONTS_CONF},
                        base_dir="/tmp")  # the X socket is hard-linked into it: same filesystem as /tmp
        try:
            xvfb, display = start_xvfb(cleanup_dir=str(jail._host))
        except BaseException:
            jail.close()
            raise
        try:
            os.link(f"/tmp/.X11-unix/X{display}", jail.directory / ".X11-socket")  # same filesystem as /tmp
            app = jail.start(APP_SOURCE.read_text())
        except BaseException:
            _kill_group(xvfb, term_first=2.0)
            jail.close()
            raise
        state = GuiState(display, xvfb, jail, app, max(self.reply_timeout_s, 20.0))  # Tk's first start is slower
        try:
            reply = state.read_reply()
            if not reply.get("ready"):
                raise GuiError(f"the application did not start: {reply}")
            state.reply_timeout_s = self.reply_timeout_s
            state.grab()
        except (ToolError, GuiError) as err:
            state.close()
            raise GuiError(f"the application did not start: {err}") from None
        state.timings["start_s"] = time.monotonic() - t0
        return state

    async def start(self, task: Task) -> GuiState:
        return await asyncio.to_thread(self.launch, task)

    def act(self, state: GuiState, task: Task, name: str, arguments: dict[str, Any]) -> str:
        """Blocking: one action, then the application's state and a fresh screenshot."""
        if state.failure:
            raise ToolError("the episode is over: " + state.failure)
        if state.done:
            raise ToolError("the task was declared done; no further actions are taken")
        t0 = time.monotonic()
        if name == "click":
            x, y = arguments.get("x"), arguments.get("y")
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (x, y)):
                raise ToolError('click needs integer pixel coordinates {"x": <int>, "y": <int>}')
            if not (0 <= x < WIDTH and 0 <= y < HEIGHT):
                raise ToolError(f"({x}, {y}) is off the {WIDTH}x{HEIGHT} screen")
            # press + release rather than `click`, which sleeps its 100 ms repeat delay even for one click
            state.xdotool("mousemove", str(x), str(y), "mousedown", "1", "mouseup", "1")
            what = f"clicked ({x}, {y})"
        elif name == "type":
            text = arguments.get("text")
            if not isinstance(text, str) or not text:
                raise ToolError('type needs {"text": "<text>"}')
            if len(text) > self.max_type_chars or any(ord(c) < 32 for c in text):
                raise ToolError(f"type takes at most {self.max_type_chars} printable characters; use key for "
                                "Return, Tab and the like")
            state.xdotool("type", "--delay", "2", "--", text)
            what = f"typed {text!r}"
        elif name == "key":
            key = arguments.get("name")
            if not isinstance(key, str) or not _KEY.match(key):
                raise ToolError('key needs {"name": "<keysym>"}, e.g. Return, Tab, Down, ctrl+a')
            state.xdotool("key", "--", key)
            what = f"pressed {key}"
        elif name == "done":
            state.done = True
            state.request("state")
            return "The task is marked done."
        else:
            raise ToolError(f"unknown tool {name!r}")
        state.actions += 1
        state.request("state")  # the app has handled the action's events when it replies
        before = state.step_progress[-1] if state.step_progress else 0.0
        state.step_progress.append(progress(task.answer, state.app_state))
        state.grab()
        state.timings["action_s"] = time.monotonic() - t0
        out = what + ". " + self.describe(state)
        if self.step_check:
            out += f" [step check: progress {before:.2f} -> {state.step_progress[-1]:.2f}]"
        return out

    def describe(self, state: GuiState) -> str:
        """The text half of an observation (the screenshot is `state.screenshot`)."""
        out = "Screenshot updated."
        if self.a11y:
            boxes = "; ".join(f"{n} at {b[0]},{b[1]} size {b[2]}x{b[3]}" for n, b in state.geometry.items())
            out += f" Widgets: {boxes}."
            if state.menu:
                items = "; ".join(f"{i[0]} at {i[1]},{i[2]} size {i[3]}x{i[4]}" for i in state.menu["items"])
                out += f" Open menu {state.menu['name']}: {items}."
        return out

    async def call(self, state: GuiState, task: Task, name: str, arguments: dict[str, Any]) -> str:
        return await asyncio.to_thread(self.act, state, task, name, arguments)

    def final_state(self, state: GuiState) -> dict[str, Any] | None:
        """The application's state at the end (or when `done` was called); None when it failed."""
        if state.failure:
            return None
        if not state.done:
            try:
                state.request("state")
            except ToolError:
                return None
        return state.app_state

    async def score(self, state: GuiState, task: Task, final_text: str) -> float:
        final = await asyncio.to_thread(self.final_state, state)
        return 0.0 if final is None else check(task.answer, final)

    async def progress(self, state: GuiState, task: Task) -> float:
        final = await asyncio.to_thread(self.final_state, state)
        return 0.0 if final is None else progress(task.answer, final)

    def screenshot(self, state: GuiState) -> bytes:
        """The latest screenshot (PNG bytes, WIDTH x HEIGHT)."""
        return state.screenshot

    async def close(self, state: GuiState) -> None:
        if state is not None:
            await asyncio.to_thread(state.close)

    # -- demonstrations
    def demonstration(self, task: Task) -> list[str]:
        """One action per turn, then a final message; positions are the centres of the task's widgets
        (the application places them at exactly those boxes and reports them back; tests check it)."""
        boxes = {w["name"]: (w["x"], w["y"], w["w"], w["h"]) for w in task.data["app"]["widgets"]}
        goal = task.answer
        calls: list[tuple[str, dict[str, Any]]] = []
        if "menu" in goal:  # open the menu (its first item is active), walk down to the item, pick it
            x, y = center(boxes[goal["menu"]])
            calls.append(("click", {"x": x, "y": y}))
            calls += [("key", {"name": "Down"})] * goal["index"]
            calls.append(("key", {"name": "Return"}))
        else:
            for name, value in goal.get("entries", {}).items():
                x, y = center(boxes[name])
                calls += [("click", {"x": x, "y": y}), ("type", {"text": value})]
            x, y = center(boxes[goal["press"]])
            calls.append(("click", {"x": x, "y": y}))
        return [format_tool_call(n, a) for n, a in calls] + ["Done."]


def image_part(png: bytes) -> dict[str, Any]:
    """An OpenAI `image_url` content part carrying `png` as a data URL (what the gateway accepts)."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


def observation_content(text: str, png: bytes) -> list[dict[str, Any]]:
    """A multimodal message content: the observation's text and its screenshot (for an image-aware
    runner; today's `EpisodeRunner` carries the text only)."""
    return [{"type": "text", "text": text}, image_part(png)]


_STEP = re.compile(r"\[step check: progress ([0-9.]+) -> ([0-9.]+)\]")


async def checker_step_vote(turn_text: str, observation: str, seed: int) -> int:
    """A `rollout.StepVote` from the checker (a `GuiEnv(step_check=True)` observation): +1 when the
    step moved the task forward, -1 when it undid progress or the action was refused, else 0."""
    found = _STEP.search(observation)
    if found is None:
        return -1 if observation.startswith("Error") else 0
    before, after = float(found.group(1)), float(found.group(2))
    return 1 if after > before else -1 if after < before else 0


def demonstration_conversations(env: GuiEnv, tasks: Sequence[Task], *, screenshots: bool = False
                                ) -> list[list[dict[str, Any]]]:
    """The demonstrations as OpenAI-style conversations (system, user, assistant tool calls, tool results).

    `screenshots=False`: text only, no display (the observations are placeholders). `screenshots=True`:
    each demonstration really runs (its own Xvfb and app), the user message and every tool result carry
    the real observation text and screenshot as `image_url` content parts, and a demonstration that
    does not solve its task (checker) is left out -- the multimodal warm-up set for a VLM policy."""

    names = [t["function"]["name"] for t in env.tools]
    out = []
    for task in tasks:
        turns = env.demonstration(task)
        system = {"role": "system", "content": env.system_prompt}
        if not screenshots:
            messages = [system, {"role": "user", "content": task.prompt}]
            for i, turn in enumerate(turns):
                messages.append({"role": "assistant", "content": turn})
                if i < len(turns) - 1:
                    messages.append({"role": "tool", "content": "Screenshot updated."})
            out.append(messages)
            continue
        state = env.launch(task)
        try:
            messages = [system, {"role": "user", "content": observation_content(task.prompt, state.screenshot)}]
            for turn in turns:
                messages.append({"role": "assistant", "content": turn})
                _, attempts = parse_assistant_turn(turn, names, 1)
                if not attempts:
                    break
                a = attempts[0]
                text = env.act(state, task, a.name, a.arguments or {})
                messages.append({"role": "tool", "name": a.name, "content": observation_content(text, state.screenshot)})
            final = env.final_state(state)
        finally:
            state.close()
        if final is not None and check(task.answer, final) >= 1.0:
            out.append(messages)
    return out


__all__ = ["FAMILIES", "GuiEnv", "GuiError", "GuiState", "HEIGHT", "INSTALL_HINT", "WIDTH", "center", "check",
           "checker_step_vote", "image_part", "observation_content",
           "demonstration_conversations", "missing_tools", "progress", "start_xvfb"]
