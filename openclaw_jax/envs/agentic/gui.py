"""The GUI environment: a real X server per episode running a small real Tk application.

Per episode:
  * **Xvfb** on a display of its own (`-displayfd` lets the server pick a free number), started
    (under a small shell, see `gui_desktop.start_xvfb`) in its own session / process group and a
    private mount namespace whose /tmp is the episode's own folder, `-nolisten tcp`, screen
    `448x336x24` (16 x 12 patches of 28 pixels for the Qwen2.5-VL patcher);
  * **the application** (`gui_apps.py`, Tk) runs **inside the sandbox jail** (`envs/sandbox.py`:
    own mount / PID / network / IPC namespaces, a pivot_root into read-only system paths, an unprivileged
    uid of its own, rlimits). The jail's /tmp is private and its network namespace cannot reach
    Xvfb's abstract socket, so the host hard-links Xvfb's filesystem socket
    (`<episode>/xvfb-tmp/.X11-unix/X<N>`, in no shared directory) into the sandbox directory and the app symlinks it to its own
    /tmp/.X11-unix/X0 (a unix socket is reached through any link to its inode). The jail has no
    /etc/fonts either, so the host writes a fonts.conf next to it. `Sandbox.run` blocks until the
    code ends, so `AppJail.start` launches the same jail (same spec, same init) without waiting;
  * **actions** are injected with `xdotool` (XTEST): `click(x, y)`, `type(text)`, `key(name)`, and
    `done` ends the agent's work (later actions are refused);
  * **observations** are screenshots, PNG bytes (`state.screenshot`, `GuiEnv.screenshot(state)`),
    captured with Pillow's `ImageGrab.grab(xdisplay=":N")`: one in-process XCB GetImage plus a
    fast PNG encode (about 3 ms here), no extra package (Pillow is already a dependency), no
    process per frame and no file on disk, where `xwd | convert` or ImageMagick `import` start one
    or two processes per frame (and need x11-apps / imagemagick). The tool result text says what
    happened; with `a11y=True` it also lists the widgets and their boxes (for text-only policies and
    debugging). Every frame is kept (`state.frames`); `observation_content` makes the OpenAI
    `image_url` parts. An image-aware `EpisodeRunner` (a vision-language policy) shows the policy the
    first screenshot with the task and the latest one after each turn (`observation_image`);
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
import io
import json
import os
import random
import re
import time
from typing import Any, Sequence

from openclaw_jax.envs.agentic.catalog import register_environment
from openclaw_jax.envs.agentic.episode import Environment, Task, ToolError, format_tool_call, parse_assistant_turn
from openclaw_jax.envs.agentic.gui_desktop import (APP_SOURCE, FONTS_CONF, INSTALL_HINT, AppJail, GuiError, GuiState,
                                                   kill_group, missing_tools, start_xvfb)
from openclaw_jax.envs.agentic.gui_tasks import (FAMILIES, HEIGHT, WIDTH, center, check, generate_task, is_heldout,
                                                 progress)
from openclaw_jax.envs.sandbox import SandboxLimits
from openclaw_jax.wire.images import ImageInput, image_data_url

_KEY = re.compile(r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$")

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
                 max_type_chars: int = 200, screenshot_scale: float = 1.0, terse: bool = False,
                 cite_target: bool = False):
        """`screenshot_scale`: the policy sees screenshots resized by this factor (fewer image tokens; the
        actions stay in screen pixels, as the tools say). `terse`: a one-line system prompt and tool
        descriptions without prose (a small policy's context: the same tools, a third of the tokens).
        `cite_target` (with `a11y` and `terse`): each demonstrated click first names its widget as the
        accessibility list does (`button_Save 53,30`), then calls the tool -- the choice of widget is
        made on a name copied from the task, and the coordinates are copied after that name rather than
        picked from the list by position."""
        if cite_target and not (a11y and terse):
            raise ValueError("cite_target=true needs a11y=true and terse=true: the demonstrations cite the "
                             "widget as the terse accessibility list writes it")
        self.terse = terse
        self.cite_target = cite_target
        if terse:
            self.system_prompt = f"Act on the {WIDTH}x{HEIGHT} screen, one tool call per turn; say Done. when finished."
            self.tools = [{"type": "function", "function": {**t["function"], "description": ""}} for t in _TOOLS]
        if not 0.1 <= screenshot_scale <= 1.0:
            raise ValueError(f"screenshot_scale={screenshot_scale} must lie in [0.1, 1]")
        self.screenshot_scale = float(screenshot_scale)
        self.families = self.check_families(families, FAMILIES)
        # the jail's limits: the app lives for the whole episode (wall and CPU), Tk needs some memory
        self.sandbox = sandbox or SandboxLimits(timeout_s=600.0, memory_mb=512)
        self.a11y = a11y
        self.step_check = step_check
        self.reply_timeout_s = reply_timeout_s
        self.max_type_chars = max_type_chars

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: SandboxLimits, *, a11y: bool = False,
                    step_check: bool = False, screenshot_scale: float = 1.0, terse: bool = False,
                    cite_target: bool = False) -> "GuiEnv":
        # the config's sandbox limits are per command; an app lives for an episode
        limits = SandboxLimits(timeout_s=max(sandbox.timeout_s, 600.0), memory_mb=max(sandbox.memory_mb, 512))
        return cls(families or FAMILIES, limits, a11y=a11y, step_check=step_check,
                   screenshot_scale=screenshot_scale, terse=terse, cite_target=cite_target)

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
            prompt, spec, goal = generate_task(family, rng)
            key = json.dumps([family, spec, goal], sort_keys=True)
            if key in seen or is_heldout(key) != (split == "heldout"):
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
        jail = AppJail(self.sandbox, files={"app.json": json.dumps(task.data["app"]), "fonts.conf": FONTS_CONF},
                        base_dir="/tmp")  # the X socket is hard-linked into it: same filesystem as /tmp
        try:
            # the server's private /tmp beside the jail's directory: its socket is hard-linked into the jail
            xvfb, display, socket = start_xvfb(jail._host / "xvfb-tmp", cleanup_dir=str(jail._host))
        except BaseException:
            jail.close()
            raise
        try:
            os.link(socket, jail.directory / ".X11-socket")
            app = jail.start(APP_SOURCE.read_text())
        except BaseException:
            kill_group(xvfb, term_first=5.0)
            jail.close()
            raise
        state = GuiState(display, xvfb, jail, app, max(self.reply_timeout_s, 60.0))  # a bound on a hang: a first Tk start on a loaded machine is slow
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
        if self.a11y and self.terse:   # the accessibility tree as each widget's name and centre
            out += " Widgets: " + "; ".join(f"{n} {center(b)[0]},{center(b)[1]}" for n, b in state.geometry.items())
            if state.menu:
                out += f". Menu {state.menu['name']}: " + "; ".join(
                    f"{i[0]} {center(i[1:5])[0]},{center(i[1:5])[1]}" for i in state.menu["items"])
            return out + "."
        if self.a11y:
            boxes = "; ".join(f"{n} at {b[0]},{b[1]} size {b[2]}x{b[3]}" for n, b in state.geometry.items())
            out += f" Widgets: {boxes}."
            if state.menu:
                items = "; ".join(f"{i[0]} at {i[1]},{i[2]} size {i[3]}x{i[4]}" for i in state.menu["items"])
                out += f" Open menu {state.menu['name']}: {items}."
        return out

    async def call(self, state: GuiState, task: Task, name: str, arguments: dict[str, Any]) -> str:
        return await asyncio.to_thread(self.act, state, task, name, arguments)

    def opening_observation(self, state: GuiState) -> str:
        """With `a11y`: the first screen's widgets (else nothing: the screenshot alone)."""
        return self.describe(state).removeprefix("Screenshot updated. ") if self.a11y else ""

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

    def observation_image(self, state: GuiState) -> bytes | None:
        """What an image-aware runner shows the policy: the latest screenshot (resized by
        `screenshot_scale`, area-averaged)."""
        if self.screenshot_scale == 1.0:
            return state.screenshot
        from PIL import Image

        size = (round(WIDTH * self.screenshot_scale), round(HEIGHT * self.screenshot_scale))
        out = io.BytesIO()
        Image.open(io.BytesIO(state.screenshot)).resize(size, Image.Resampling.BOX).save(out, format="PNG")
        return out.getvalue()

    async def close(self, state: GuiState) -> None:
        if state is not None:
            await asyncio.to_thread(state.close)

    # -- demonstrations
    def demonstration(self, task: Task) -> list[str]:
        """One action per turn, then a final message; positions are the centres of the task's widgets
        (the application places them at exactly those boxes and reports them back; tests check it)."""
        boxes = {w["name"]: (w["x"], w["y"], w["w"], w["h"]) for w in task.data["app"]["widgets"]}
        goal = task.answer
        turns: list[str] = []

        def click(widget: str) -> None:
            x, y = center(boxes[widget])
            cited = f"{widget} {x},{y}\n" if self.cite_target else ""
            turns.append(cited + format_tool_call("click", {"x": x, "y": y}))

        if "menu" in goal:  # open the menu (its first item is active), walk down to the item, pick it
            click(goal["menu"])
            turns += [format_tool_call("key", {"name": "Down"})] * goal["index"]
            turns.append(format_tool_call("key", {"name": "Return"}))
        else:
            for name, value in goal.get("entries", {}).items():
                click(name)
                turns.append(format_tool_call("type", {"text": value}))
            click(goal["press"])
        return turns + ["Done."]


def image_part(png: bytes) -> dict[str, Any]:
    """An OpenAI `image_url` content part carrying `png` as a data URL (what the gateway accepts)."""
    return {"type": "image_url", "image_url": {"url": image_data_url(ImageInput.of(png, "image/png"))}}


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
