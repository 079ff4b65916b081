"""cpu_priority: which threads step down, to what, and which threads they start inherit it.

Each case runs in a fresh interpreter (a lowered thread cannot be raised back without a privilege), and
the priorities are read back from /proc, not from the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, threading
def prio(tid):
    fields = open(f'/proc/self/task/{tid}/stat').read().rsplit(')', 1)[1].split()
    return ['idle' if int(fields[38]) == os.SCHED_IDLE else 'normal', int(fields[16])]
"""


def _run(body: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE + textwrap.dedent(body)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_thread_but_the_spared_ones_steps_down_and_what_they_start_inherits_it():
    got = _run("""
        from openclaw_jax.cpu_priority import lower_threads
        stop = threading.Event()
        spared_tid = []
        def spared_body():
            spared_tid.append(threading.get_native_id()); stop.wait()
        spared = threading.Thread(target=spared_body); spared.start()
        early = [threading.Thread(target=stop.wait) for _ in range(3)]
        for t in early: t.start()
        while not spared_tid: pass
        main = threading.get_native_id()
        n = lower_threads(11, True, spare=[main, spared_tid[0]])
        late_tid = []
        def late_body():
            late_tid.append(threading.get_native_id()); stop.wait()
        late = threading.Thread(target=late_body); late.start()     # started by the spared main thread
        while not late_tid: pass
        result = {'lowered': n, 'main': prio(main), 'spared': prio(spared_tid[0]), 'late': prio(late_tid[0]),
                  'others': sorted({tuple(prio(t)) for t in os.listdir('/proc/self/task')
                                    if int(t) not in (main, spared_tid[0], late_tid[0])})}
        stop.set()
        print(json.dumps(result))
    """)
    base = os.nice(0)
    assert got["main"] == ["normal", base] and got["spared"] == ["normal", base] and got["late"] == ["normal", base]
    assert got["others"] == [["idle", max(11, base)]]
    assert got["lowered"] == 3


def test_a_lowered_executor_runs_its_work_in_sched_idle_and_its_threads_children_too():
    got = _run("""
        from openclaw_jax.cpu_priority import lowered_executor, thread_priority
        pool = lowered_executor(nice=13, idle=True, max_workers=2, name='background')
        def work():
            child = []
            t = threading.Thread(target=lambda: child.append(prio(threading.get_native_id()))); t.start(); t.join()
            return {'worker': prio(threading.get_native_id()), 'child': child[0],
                    'reported': list(thread_priority(threading.get_native_id()))}
        result = pool.submit(work).result()
        result['caller'] = prio(threading.get_native_id())
        pool.shutdown()
        print(json.dumps(result))
    """)
    base = os.nice(0)
    assert got["worker"] == got["child"] == got["reported"] == ["idle", max(13, base)]
    assert got["caller"] == ["normal", base]


def test_nice_alone_leaves_the_class_normal():
    got = _run("""
        from openclaw_jax.cpu_priority import lower_thread
        lower_thread(nice=9, idle=False)
        print(json.dumps({'me': prio(threading.get_native_id())}))
    """)
    assert got["me"] == ["normal", max(9, os.nice(0))]
