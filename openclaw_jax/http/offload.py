"""One small thread pool for the heavy work of large requests (decoding, validating, rendering,
tokenizing), so that it leaves the event loop and cannot multiply.

Two workers: at most two large requests are worked on at once (others wait their turn), which
bounds the CPU they take from small requests and the memory they hold. It also bounds how many
malloc arenas keep a large request's high-water mark after it is freed (glibc gives each thread
its own arena), so a server's RSS settles instead of creeping up with every thread that ever
handled a large body.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import Any, Callable, TypeVar

T = TypeVar("T")
HEAVY_WORKERS = 2
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(HEAVY_WORKERS, thread_name_prefix="heavy-request")
    return _pool


async def run_heavy(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the heavy-work pool, awaited from the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))


def return_large_blocks_to_the_os(threshold_bytes: int = 1 << 20) -> bool:
    """Serve every allocation of ``threshold_bytes`` or more with its own mapping, given back to the
    OS when freed (glibc ``mallopt(M_MMAP_THRESHOLD)``; this also stops glibc from raising the
    threshold after each large free, which is what otherwise keeps a large request's high-water
    mark in the heap). Request buffers, decoded bodies and token lists of large requests are such
    blocks. Returns False where there is no glibc (nothing changes there)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    M_MMAP_THRESHOLD = -3
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))


def freeze_startup_heap() -> None:
    """Move every object alive now (modules, the model, the tokenizer) out of the cyclic garbage
    collector's reach (``gc.freeze``). A large request allocates hundreds of thousands of objects,
    which can trigger a full collection; without this it scans the whole startup heap while holding
    the interpreter lock (measured: 0.9 s with JAX loaded), stalling every other request."""
    import gc

    gc.collect()
    gc.freeze()
