"""The GUI desktop under stress: more episodes at once than the rollouts run (16), started and
stopped together from two processes while CPU burners load every core. Each episode's jailed
application must be on its own display: text typed through one episode's display shows up in that
episode's application state and in no other. (Before the display's socket lived in the episode's own
folder, this failed: a slow Xvfb start retried on another display after its shell had already
removed the episode's folder, and an exiting server could unlink the socket path of a new one.)

Needs Debian's `xvfb` and `xdotool` (the `require_gui_tools` fixture of conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


EPISODES_PER_PROCESS = 12
ROUNDS = 2

# One host process: ROUNDS times, EPISODES_PER_PROCESS episodes launched at once, each typed into
# through its own display, then all closed at once. Prints one JSON line per episode.
HOST = r"""
import json, os, sys
from concurrent.futures import ThreadPoolExecutor
from openclaw_jax.envs.agentic.gui import GuiEnv
from openclaw_jax.envs.agentic.gui_tasks import center

n, rounds = int(sys.argv[1]), int(sys.argv[2])
env = GuiEnv(reply_timeout_s=60.0)   # a bound on a hang, not on speed: the machine is loaded on purpose
tasks = [t for t in env.tasks("train", 64, 0) if t.family == "form"]

def one(round_, i):
    task = tasks[i % len(tasks)]
    state = env.launch(task)
    entry = sorted(state.geometry)[0] if not task.answer.get("entries") else next(iter(task.answer["entries"]))
    token = f"p{os.getpid()}r{round_}e{i}"
    x, y = center(state.geometry[entry])
    env.act(state, task, "click", {"x": x, "y": y})
    env.act(state, task, "type", {"text": token})
    return state, token

for round_ in range(rounds):
    with ThreadPoolExecutor(n) as pool:
        started = list(pool.map(lambda i: one(round_, i), range(n)))
    for state, token in started:
        state.request("state")
        print(json.dumps({"host": os.getpid(), "round": round_, "display": state.display, "token": token,
                          "entries": list(state.app_state["entries"].values()),
                          "folder": str(state.jail._host)}), flush=True)
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda s: s[0].close(), started))
"""


def test_many_episodes_at_once_under_cpu_load_each_on_its_own_display(require_gui_tools):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        hosts = [subprocess.Popen([sys.executable, "-c", HOST, str(EPISODES_PER_PROCESS), str(ROUNDS)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [host.communicate(timeout=600) for host in hosts]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for host, (out, err) in zip(hosts, outs):
        assert host.returncode == 0, err[-3000:]
    records = [json.loads(line) for out, _ in outs for line in out.splitlines()]
    assert len(records) == 2 * ROUNDS * EPISODES_PER_PROCESS
    for key in {(r["host"], r["round"]) for r in records}:
        # the episodes of one round of one process were all open at once: each had its own display
        live = [r for r in records if (r["host"], r["round"]) == key]
        assert len({r["display"] for r in live}) == len(live), sorted(r["display"] for r in live)
    tokens = {r["token"] for r in records}
    for r in records:
        # this episode's application got the text typed on its display, and no other episode's text
        assert r["token"] in r["entries"], r
        assert not (tokens - {r["token"]}) & set(r["entries"]), r
        assert not os.path.exists(r["folder"]), "an episode's folder outlived its close"
