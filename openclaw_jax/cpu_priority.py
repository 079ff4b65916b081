"""CPU priority per thread: a person's turn first, background work (training, loading new weights) after it.

Linux keeps the scheduling class and the nice value per thread, and a new thread starts with its
creator's. Two ways down, neither needing a privilege (and neither undone without one):

* a nice value (1-19): a smaller share of a core while normal threads want it. At nice 19 a thread still
  runs in slices between a serving thread's wake-ups, and a warm turn waits for them;
* the SCHED_IDLE class: a core only when no normal thread wants it; a serving thread that wakes takes the
  core at once. Under BFQ its disk writes also go to the idle I/O class.

`python bench/serving_priority.py` times a warm turn beside a busy XLA process at each.

A process that serves and trains in one (the run's own: gateway on the event loop, trainer on worker
threads) lowers every thread but the event loop's (`lower_threads`) and gives the loop an executor whose
threads lower themselves (`lowered_executor`): work handed to `asyncio.to_thread` is background work there.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from typing import Iterable

log = logging.getLogger(__name__)


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


def lower_thread(nice: int = 19, idle: bool = True) -> None:
    """The calling thread (and every thread it starts from now on) down to `nice` and, with `idle`, SCHED_IDLE."""
    _lower(threading.get_native_id(), nice, idle)


def lower_threads(nice: int = 19, idle: bool = True, spare: Iterable[int] = ()) -> int:
    """Every thread of this process but the native thread ids in `spare` down to `nice` and, with `idle`,
    SCHED_IDLE (XLA's pools included); returns how many changed. Threads started later inherit their
    creator's priority: a spared thread's new threads keep the normal one."""
    keep = set(spare)
    lowered = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) not in keep:
            lowered += _lower(int(tid), nice, idle)
    return lowered


def lowered_executor(nice: int = 19, idle: bool = True, max_workers: int | None = None,
                     name: str = "background") -> concurrent.futures.ThreadPoolExecutor:
    """A thread pool whose threads run at `nice` and, with `idle`, in SCHED_IDLE."""
    return concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix=name,
                                                 initializer=lower_thread, initargs=(nice, idle))


def thread_priority(tid: int) -> tuple[str, int]:
    """("idle" or "normal", nice) of thread `tid` of this process."""
    policy = os.sched_getscheduler(tid)
    return ("idle" if policy == os.SCHED_IDLE else "normal"), os.getpriority(os.PRIO_PROCESS, tid)
