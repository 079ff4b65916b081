"""The GUI environment (openclaw_jax/envs/agentic/gui.py): a real Xvfb per episode, the real Tk app
(gui_apps.py) in the sandbox jail, real xdotool input, PNG screenshots through XCB.

Needs Debian's `xvfb` and `xdotool` (scripts/test.sh installs them): under CI (env CI set) the
tests FAIL without them, elsewhere they skip with the install command.

Scripted solutions act on the geometry the *application* reports (never on the task's pixels),
and for the menu family on the geometry of the menu it reports as posted.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import time

from pathlib import Path

import pytest

from openclaw_jax.envs.agentic.config import AgenticConfig
from openclaw_jax.envs.agentic.episode import EpisodeLimits, EpisodeRunner, ScriptedPolicy, make_env
from openclaw_jax.envs.agentic.episode import ToolError
from openclaw_jax.envs.agentic.gui import (GuiEnv, checker_step_vote, demonstration_conversations,
                                           observation_content)
from openclaw_jax.envs.agentic.gui_desktop import descendants
from openclaw_jax.envs.agentic.gui_tasks import FAMILIES, HEIGHT, WIDTH, center, check

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def env(require_gui_tools):
    return GuiEnv(reply_timeout_s=10.0)  # generous: 2 shared cores; the hang test uses its own


def _task(env, family, split="train", seed=0):
    return next(t for t in env.tasks(split, 8, seed) if t.family == family)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _app_pid(state) -> int:
    """The jailed Python running Tk: the deepest process below the jail's `unshare`."""
    kids = descendants(state.app.pid)
    assert kids, "the jail has no processes"
    return kids[-1]


def _correct(env, state, task) -> None:
    """Solve `task` from the geometry the application reports."""
    goal, geo = task.answer, state.geometry
    if "menu" in goal:
        x, y = center(geo[goal["menu"]])
        env.act(state, task, "click", {"x": x, "y": y})
        assert state.menu and state.menu["name"] == goal["menu"], state.menu
        item = next(i for i in state.menu["items"] if i[0] == goal["item"])
        x, y = center(item[1:])
        env.act(state, task, "click", {"x": x, "y": y})
        return
    for name, value in goal.get("entries", {}).items():
        x, y = center(geo[name])
        env.act(state, task, "click", {"x": x, "y": y})
        env.act(state, task, "type", {"text": value})
    x, y = center(geo[goal["press"]])
    env.act(state, task, "click", {"x": x, "y": y})


def _wrong(env, state, task) -> None:
    """A plausible mistake per family: another button, another item, a wrong value, swapped values."""
    goal, geo = task.answer, state.geometry
    if "menu" in goal:
        x, y = center(geo[goal["menu"]])
        env.act(state, task, "click", {"x": x, "y": y})
        item = next(i for i in state.menu["items"] if i[0] != goal["item"])
        env.act(state, task, "click", {"x": center(item[1:])[0], "y": center(item[1:])[1]})
        return
    if "entries" not in goal:
        other = next(n for n in geo if n.startswith("button_") and n != goal["press"])
        x, y = center(geo[other])
        env.act(state, task, "click", {"x": x, "y": y})
        return
    values = list(goal["entries"].values())
    values = values[::-1] if len(values) > 1 and len(set(values)) > 1 else [v + "x" for v in values]
    for name, value in zip(goal["entries"], values):
        x, y = center(geo[name])
        env.act(state, task, "click", {"x": x, "y": y})
        env.act(state, task, "type", {"text": value})
    x, y = center(geo[goal["press"]])
    env.act(state, task, "click", {"x": x, "y": y})


def test_task_sets_are_seeded_disjoint_and_laid_out_on_the_screen():
    env = GuiEnv()  # no display needed
    train, heldout = env.tasks("train", 40, 0), env.tasks("heldout", 20, 0)
    assert {t.family for t in train} == set(FAMILIES) == {t.family for t in heldout}
    key = lambda t: json.dumps([t.prompt, t.data, t.answer], sort_keys=True)  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in heldout}
    assert [key(t) for t in env.tasks("train", 40, 0)] == [key(t) for t in train]
    assert [key(t) for t in env.tasks("train", 40, 1)] != [key(t) for t in train]
    assert WIDTH % 28 == 0 and HEIGHT % 28 == 0
    for t in train + heldout:
        boxes = [(w["x"], w["y"], w["x"] + w["w"], w["y"] + w["h"]) for w in t.data["app"]["widgets"]]
        for i, (x0, y0, x1, y1) in enumerate(boxes):
            assert 0 <= x0 < x1 <= WIDTH and 0 <= y0 < y1 <= HEIGHT, (t.task_id, boxes[i])
            for a0, b0, a1, b1 in boxes[i + 1:]:
                assert x1 <= a0 or a1 <= x0 or y1 <= b0 or b1 <= y0, f"{t.task_id}: overlapping widgets"
    with pytest.raises(ValueError, match="subset"):
        GuiEnv(["form", "nope"])
    assert make_env(AgenticConfig(env="gui", families=("menu",))).families == ("menu",)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_correct_sequence_from_the_reported_geometry_succeeds_and_a_wrong_one_fails(env, family):
    task = _task(env, family)
    state = env.launch(task)
    try:
        # the application reports the boxes the task placed its widgets at
        assert state.geometry == {w["name"]: [w["x"], w["y"], w["w"], w["h"]] for w in task.data["app"]["widgets"]}
        assert asyncio.run(env.score(state, task, "")) == 0.0  # nothing done yet
        _correct(env, state, task)
        assert asyncio.run(env.score(state, task, "")) == 1.0, state.app_state
        assert state.step_progress[-1] == 1.0 and all(p < 1.0 for p in state.step_progress[:-1])
        assert state.step_progress == sorted(state.step_progress)
    finally:
        asyncio.run(env.close(state))
    state = env.launch(task)
    try:
        _wrong(env, state, task)
        assert asyncio.run(env.score(state, task, "")) == 0.0, state.app_state
        assert state.step_progress[-1] < 1.0
    finally:
        asyncio.run(env.close(state))


def test_screenshots_are_pngs_of_the_screen_that_change_with_actions_and_bad_calls_are_refused(env):
    from PIL import Image

    task = _task(env, "copy")
    state = env.launch(task)
    try:
        first = env.screenshot(state)
        assert first.startswith(PNG)
        image = Image.open(io.BytesIO(first))
        assert image.size == (WIDTH, HEIGHT) and image.mode == "RGB"
        assert len(set(image.getdata())) > 2  # the app is drawn (not a blank screen)
        x, y = center(state.geometry["target"])
        env.act(state, task, "click", {"x": x, "y": y})
        env.act(state, task, "type", {"text": "WWWW"})
        after = env.screenshot(state)
        assert after.startswith(PNG) and Image.open(io.BytesIO(after)).size == (WIDTH, HEIGHT)
        diff = [i for i, (a, b) in enumerate(zip(image.getdata(), Image.open(io.BytesIO(after)).getdata())) if a != b]
        assert diff, "typing did not change the screen"
        ys = {i // WIDTH for i in diff}
        tx, ty, tw, th = state.geometry["target"]
        assert ty <= min(ys) and max(ys) < ty + th, "the change is not in the field typed into"
        assert state.app_state["entries"]["target"] == "WWWW"
        env.act(state, task, "key", {"name": "BackSpace"})
        assert state.app_state["entries"]["target"] == "WWW"
        for name, args, match in [("click", {"x": WIDTH, "y": 3}, "off the"), ("click", {"x": "1", "y": 2}, "integer"),
                                  ("type", {"text": ""}, "type needs"), ("type", {"text": "a\nb"}, "printable"),
                                  ("key", {"name": "Return; rm -rf /"}, "key needs"), ("scroll", {}, "unknown")]:
            with pytest.raises(ToolError, match=match):
                env.act(state, task, name, args)
        assert "done" in env.act(state, task, "done", {})
        with pytest.raises(ToolError, match="declared done"):
            env.act(state, task, "click", {"x": 1, "y": 1})
        a11y = GuiEnv(a11y=True).describe(state)
        assert f"target at {tx},{ty} size {tw}x{th}" in a11y
        # every screenshot is kept; each goes through the Qwen2.5-VL patcher without a resize
        assert state.frames[0] == first and state.frames[-1] == state.screenshot and len(state.frames) == 4
        from openclaw_jax.models.image_processing import image_token_count, process_image

        pixels, grid = process_image(after)
        assert tuple(grid) == (1, HEIGHT // 14, WIDTH // 14) and image_token_count(grid) == HEIGHT * WIDTH // 28 ** 2
        part = observation_content("x", after)[1]
        assert base64.b64decode(part["image_url"]["url"].split(",", 1)[1]) == after
    finally:
        asyncio.run(env.close(state))


def test_the_app_runs_jailed_and_two_episodes_are_isolated(env):
    async def two():
        return await asyncio.gather(env.start(_task(env, "form")), env.start(_task(env, "copy")))

    a, b = asyncio.run(two())
    try:
        assert a.display != b.display
        assert not set(a.pids()) & set(b.pids())
        app = _app_pid(a)
        assert os.readlink(f"/proc/{app}/ns/pid") != os.readlink("/proc/self/ns/pid")
        assert os.readlink(f"/proc/{app}/ns/net") != os.readlink("/proc/self/ns/net")
        assert os.readlink(f"/proc/{app}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        # its own root (pivot_root, the host's detached): another file system, none of the host's files
        assert os.stat(f"/proc/{app}/root/").st_dev != os.stat("/").st_dev
        assert not os.path.exists(f"/proc/{app}/root{Path(__file__).resolve()}")
        uid = int(next(line for line in open(f"/proc/{app}/status") if line.startswith("Uid:")).split()[1])
        assert uid != 0 and uid != os.getuid()
        # input to one display does not reach the other
        ta = _task(env, "form")
        x, y = center(a.geometry[next(iter(ta.answer["entries"]))])
        env.act(a, ta, "click", {"x": x, "y": y})
        env.act(a, ta, "type", {"text": "only-a"})
        assert "only-a" in a.app_state["entries"].values()
        b.request("state")
        assert "only-a" not in b.app_state["entries"].values()
        # ending one leaves the other running
        a_pids = a.pids()
        asyncio.run(env.close(a))
        time.sleep(0.2)
        assert not [p for p in a_pids if _alive(p)]
        # the server's socket file lived in the episode's own folder, which is gone; nothing global is left
        assert not a.jail._host.exists()
        assert all(_alive(p) for p in b.pids())
        tb = _task(env, "copy")
        x, y = center(b.geometry["target"])
        env.act(b, tb, "click", {"x": x, "y": y})
        env.act(b, tb, "type", {"text": "still-b"})
        assert b.app_state["entries"]["target"] == "still-b" and b.screenshot.startswith(PNG)
    finally:
        asyncio.run(env.close(a))
        asyncio.run(env.close(b))


@pytest.mark.parametrize("how", ["crash", "hang"])
def test_a_crashed_or_hung_app_ends_the_episode_with_a_clear_failure_and_leaks_nothing(require_gui_tools, how):
    env = GuiEnv(reply_timeout_s=1.5)
    task = _task(env, "button")
    state = env.launch(task)
    pids = state.pids()
    try:
        assert len(pids) >= 4  # Xvfb, unshare, the jail's init and the app
        os.kill(_app_pid(state), signal.SIGKILL if how == "crash" else signal.SIGSTOP)
        x, y = center(state.geometry[task.answer["press"]])
        expected = r"crashed \(killed by signal 9\)" if how == "crash" else "stopped responding"
        t0 = time.monotonic()
        with pytest.raises(ToolError, match=expected):
            env.act(state, task, "click", {"x": x, "y": y})
        assert time.monotonic() - t0 < env.reply_timeout_s + 3
        with pytest.raises(ToolError, match="the episode is over: the application " + expected):
            env.act(state, task, "click", {"x": x, "y": y})
        assert asyncio.run(env.score(state, task, "")) == 0.0
    finally:
        asyncio.run(env.close(state))
    time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "processes outlived the episode"
    assert not os.path.exists(state.jail._host)


def test_demonstrations_solve_their_tasks_through_the_episode_runner(env):
    from openclaw_jax.envs.agentic.rollout import demonstrations
    from openclaw_jax.models.tokenizer import smollm2_tokenizer

    tok = smollm2_tokenizer()
    tasks = [_task(env, f, split) for f, split in zip(FAMILIES, ("train", "heldout", "train", "heldout"))]
    runner = EpisodeRunner(env, tok, EpisodeLimits(max_turns=10, max_response_tokens=2048,
                                                   max_observation_chars=2048))
    pairs = asyncio.run(demonstrations(runner, tasks))
    assert len(pairs) == sum(len(env.demonstration(t)) for t in tasks)  # every demonstration solved its task
    assert tok.decode(pairs[0][1]).startswith("<tool_call>")
    # and a demonstration replayed on another task's screen fails (the checker is not fooled)
    other = next(t for t in env.tasks("train", 16, 3) if t.family == "button" and t.answer != tasks[1].answer)
    ep = asyncio.run(runner.run(other, ScriptedPolicy(tok, env.demonstration(_task(env, "button"))), temperature=0.0))
    assert ep.reward == 0.0
    convs = demonstration_conversations(env, tasks)
    assert [m["role"] for m in convs[1][:4]] == ["system", "user", "assistant", "tool"]
    assert convs[1][-1] == {"role": "assistant", "content": "Done."}


def test_cited_demonstrations_name_the_widget_as_the_observation_lists_it_and_still_solve(require_gui_tools):
    """`cite_target`: every demonstrated click is preceded by `<widget> <x>,<y>`, which must be the very
    entry the application's reported widget list showed the policy just before that turn (the list is
    the app's own geometry, the citation comes from the task spec); the tool call still solves the task."""
    from openclaw_jax.models.tokenizer import smollm2_tokenizer

    with pytest.raises(ValueError, match="cite_target=true needs a11y=true and terse=true"):
        GuiEnv(cite_target=True)
    env = GuiEnv(reply_timeout_s=10.0, a11y=True, terse=True, cite_target=True)
    tok = smollm2_tokenizer()
    runner = EpisodeRunner(env, tok, EpisodeLimits(max_turns=10, max_response_tokens=2048,
                                                   max_observation_chars=2048))
    for family in ("button", "form"):
        task = _task(env, family, "heldout")
        turns = env.demonstration(task)
        ep = asyncio.run(runner.run(task, ScriptedPolicy(tok, turns), temperature=0.0))
        assert ep.reward == 1.0
        clicks = 0
        for i, message in enumerate(ep.messages):
            if message["role"] != "assistant" or "click" not in message["content"]:
                continue
            cited, call = message["content"].split("\n", 1)
            assert call.startswith("<tool_call>")
            name, xy = cited.split(" ")
            x, y = (int(v) for v in xy.split(","))
            assert f'"x": {x}, "y": {y}' in call
            seen = ep.messages[i - 1]["content"]
            seen = seen if isinstance(seen, str) else " ".join(p.get("text", "") for p in seen)
            assert f"{name} {x},{y}" in seen.split("Widgets: ", 1)[1]
            clicks += 1
        assert clicks == sum("click" in t for t in turns) >= (1 if family == "button" else 3)


def test_the_checker_needs_the_right_press_with_the_right_values():
    goal = {"entries": {"e": "v"}, "press": "ok"}
    assert check(goal, {"pressed": [{"name": "ok", "entries": {"e": "v"}}]}) == 1.0
    assert check(goal, {"pressed": [{"name": "ok", "entries": {"e": "w"}}]}) == 0.0
    twice = [{"name": "ok", "entries": {"e": "w"}}, {"name": "ok", "entries": {"e": "v"}}]
    assert check(goal, {"pressed": twice}) == 0.0
    assert check(goal, {"pressed": [], "entries": {"e": "v"}}) == 0.0
    assert check({"press": "b"}, {"pressed": [{"name": "a", "entries": {}}]}) == 0.0
    assert check({"menu": "m", "item": "i"}, {"pressed": [], "menu": "i", "menu_of": "n"}) == 0.0


def test_step_check_votes_follow_the_checker_through_an_episode(require_gui_tools):
    """With `step_check=True` each action's observation carries the checker's progress and
    `checker_step_vote` votes +1 on steps that advance the task, 0 on neutral ones, -1 on refused ones."""
    from openclaw_jax.envs.agentic.rollout import step_votes
    from openclaw_jax.models.tokenizer import smollm2_tokenizer

    env = GuiEnv(["form"], step_check=True)
    task = env.tasks("train", 1, 0)[0]
    turns = env.demonstration(task)
    bad = '<tool_call>\n{"name": "click", "arguments": {"x": -5, "y": 0}}\n</tool_call>'
    turns = [bad] + turns
    tok = smollm2_tokenizer()
    ep = asyncio.run(EpisodeRunner(env, tok, EpisodeLimits(max_turns=12, max_response_tokens=2048)).run(
        task, ScriptedPolicy(tok, turns), temperature=0.0))
    assert ep.success, ep.observations
    votes = asyncio.run(step_votes(checker_step_vote, ep))
    # refused click, then per field: click (no progress) and type (progress), then Submit (done), then the answer
    n = len(task.answer["entries"])
    assert votes == [-1] + [0, 1] * n + [1, 0], (votes, ep.observations)


def test_an_episode_dies_with_the_process_that_started_it(require_gui_tools):
    """A host killed mid-episode (no `close`) leaves nothing: Xvfb's shell sees its lifeline pipe
    close (stops Xvfb, removes the sandbox directory), the app sees its control pipe close and exits,
    and the jail's PID namespace goes with it."""
    import subprocess
    import sys

    code = ("from openclaw_jax.envs.agentic.gui import GuiEnv\n"
            "env = GuiEnv(); s = env.launch(env.tasks('train', 1, 0)[0])\n"
            "print(s.jail._host, s.display, *s.pids(), flush=True)\n"
            "import time; time.sleep(60)\n")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        directory, display, *pids = host.stdout.readline().split()
        display, pids = int(display), [int(p) for p in pids]
    finally:
        host.kill()
        host.wait()
    assert len(pids) >= 4  # Xvfb (and its shell), unshare, the jail init, the app
    deadline = time.monotonic() + 60  # a bound on processes that never end, not on a loaded machine's speed
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "processes outlived their host"
    assert not os.path.exists(directory), "the sandbox directory outlived its host"


def test_screenshot_demonstrations_embed_every_screen_and_leave_out_failures(env, tmp_path):
    """`demonstration_conversations(screenshots=True)` (and the gui_demos CLI) runs each demonstration:
    the user message and every tool result carry the real screenshot; one the checker rejects is left out."""
    from openclaw_jax.envs.agentic.gui_demos import main

    task = _task(env, "button")
    (conv,) = demonstration_conversations(env, [task], screenshots=True)
    parts = [m["content"] for m in conv if m["role"] in ("user", "tool")]
    assert len(parts) == 2 and all(p[1]["image_url"]["url"].startswith("data:image/png;base64,") for p in parts)
    pngs = [base64.b64decode(p[1]["image_url"]["url"].split(",", 1)[1]) for p in parts]
    assert all(png.startswith(PNG) for png in pngs) and pngs[0] != pngs[1]  # the press redrew the button
    assert parts[0][0]["text"] == task.prompt

    class Wrong(GuiEnv):
        def demonstration(self, task):
            return ['<tool_call>\n{"name": "click", "arguments": {"x": 1, "y": 330}}\n</tool_call>', "Done."]

    assert demonstration_conversations(Wrong(), [task], screenshots=True) == []
    out = tmp_path / "demos.jsonl"
    assert main(["--n", "2", "--families", "button,menu", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["family"] for r in rows] == ["button", "menu"] and rows[0]["messages"][0]["role"] == "system"
