"""cpu_priority: which threads step down, to what (SCHED_IDLE only where no Python runs), and what the threads they
start inherit.

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


def test_every_thread_but_the_spared_ones_steps_down_and_only_threads_without_python_go_idle():
    got = _run("""
        import jax, jax.numpy as jnp
        from openclaw_jax.cpu_priority import lower_threads, python_thread_ids
        x = jnp.ones((256, 256)); (x @ x).block_until_ready()     # XLA's own thread pools exist from here
        stop = threading.Event()
        ids = {}
        def body(name):
            ids[name] = threading.get_native_id(); stop.wait()
        spared = threading.Thread(target=body, args=('spared',)); spared.start()
        early = [threading.Thread(target=body, args=(f'early{i}',)) for i in range(3)]
        for t in early: t.start()
        while len(ids) < 4: pass
        main = threading.get_native_id()
        native = {int(t) for t in os.listdir('/proc/self/task')} - python_thread_ids()
        xla = [int(t) for t in os.listdir('/proc/self/task')
               if open(f'/proc/self/task/{t}/comm').read().strip() == 'tf_XLAEigen']
        n = lower_threads(11, True, spare=[main, ids['spared']])
        late = threading.Thread(target=body, args=('late',)); late.start()   # started by the spared main thread
        while 'late' not in ids: pass
        result = {'lowered': n, 'native': len(native), 'xla': len(xla), 'main': prio(main),
                  'spared': prio(ids['spared']), 'late': prio(ids['late']),
                  'early': sorted({tuple(prio(ids[f'early{i}'])) for i in range(3)}),
                  'native_prios': sorted({tuple(prio(t)) for t in native}), 'xla_prios': sorted({tuple(prio(t)) for t in xla})}
        stop.set()
        print(json.dumps(result))
    """)
    base = os.nice(0)
    assert got["main"] == got["spared"] == got["late"] == ["normal", base]
    assert got["early"] == [["normal", max(11, base)]]                   # Python threads: the nice value alone
    assert got["xla"] >= 1 and got["xla_prios"] == [["idle", max(11, base)]]
    assert got["native_prios"] == [["idle", max(11, base)]]
    assert got["lowered"] == 3 + got["native"]


def test_a_lowered_executor_runs_its_work_at_the_nice_value_and_its_threads_children_too():
    got = _run("""
        from openclaw_jax.cpu_priority import lowered_executor, thread_priority
        pool = lowered_executor(nice=13, max_workers=2, name='background')
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
    assert got["worker"] == got["child"] == got["reported"] == ["normal", max(13, base)]
    assert got["caller"] == ["normal", base]


def test_idle_applies_to_the_calling_thread_when_asked():
    got = _run("""
        from openclaw_jax.cpu_priority import lower_thread
        lower_thread(nice=9, idle=True)
        print(json.dumps({'me': prio(threading.get_native_id())}))
    """)
    assert got["me"] == ["idle", max(9, os.nice(0))]
