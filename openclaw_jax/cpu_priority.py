"""CPU priority per thread: a person's turn first, background work (training) after it.

Linux keeps the scheduling class and the nice value per thread, and a new thread starts with its
creator's. Two ways down, neither needing a privilege (and neither undone without one):

* a nice value (1-19): a smaller share of a core while normal threads want it. It does not keep a
  background thread off a core a serving thread is about to need: beside an XLA process at nice 19 a warm
  turn took about as long as beside one at the normal priority;
* the SCHED_IDLE class: a core only when no normal thread wants it; a serving thread that wakes takes the
  core at once, and the turn took as long as with nothing beside it (`python bench/serving_priority.py`).

But a Python thread in SCHED_IDLE that holds the interpreter lock while other processes have the cores
keeps every other thread of its process waiting for the lock: the gateway's event loop, beside the trainer.
So `idle` puts only the threads that run no Python in SCHED_IDLE (XLA's and the runtime's own pools, where
a train step's arithmetic runs); Python threads get the nice value alone.

A process that serves and trains in one (the run's own: gateway on the event loop, trainer on worker
threads) lowers every thread but the event loop's (`lower_threads`) and gives the loop an executor whose
threads lower themselves (`lowered_executor`): work handed to `asyncio.to_thread` is background work there.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Iterable


def _lower(tid: int, nice: int, idle: bool) -> bool:
    """Thread `tid` to SCHED_IDLE (with `idle`) and at least nice `nice`; False if it has ended."""
    try:
        changed = False
        if idle and os.sched_getscheduler(tid) != os.SCHED_IDLE:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            changed = True
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            changed = True
        return changed
    except (ProcessLookupError, PermissionError):  # a thread that just ended (its id may be reused: not ours)
        return False


def lower_thread(nice: int = 19, idle: bool = False) -> None:
    """The calling thread (and every thread it starts from now on) down to `nice` and, with `idle`, SCHED_IDLE
    (for a thread that will not run Python: see the module's docstring)."""
    _lower(threading.get_native_id(), nice, idle)


def python_thread_ids() -> set[int]:
    """Native ids of this process's threads that run Python (started by `threading`, or the main thread)."""
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


def lower_threads(nice: int = 19, idle: bool = False, spare: Iterable[int] = ()) -> int:
    """Every thread of this process but the native thread ids in `spare` down to `nice`, and with `idle` those
    that run no Python (XLA's pools) in SCHED_IDLE as well; returns how many changed. Threads started later
    inherit their creator's priority: a spared thread's new threads keep the normal one."""
    keep, python = set(spare), python_thread_ids()
    lowered = 0
    for tid in map(int, os.listdir("/proc/self/task")):
        if tid not in keep:
            lowered += _lower(tid, nice, idle and tid not in python)
    return lowered


def lowered_executor(nice: int = 19, max_workers: int | None = None,
                     name: str = "background") -> concurrent.futures.ThreadPoolExecutor:
    """A thread pool whose (Python) threads run at `nice`."""
    return concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix=name,
                                                 initializer=lower_thread, initargs=(nice, False))


def thread_priority(tid: int) -> tuple[str, int]:
    """("idle" or "normal", nice) of thread `tid` of this process."""
    policy = os.sched_getscheduler(tid)
    return ("idle" if policy == os.SCHED_IDLE else "normal"), os.getpriority(os.PRIO_PROCESS, tid)
