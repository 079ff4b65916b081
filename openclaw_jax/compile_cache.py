"""JAX's persistent compilation cache for our CLIs: a program compiled by one run is loaded by the next.

On a CPU the embedded engine's decode step for SmolLM2-135M takes 10-20 s to compile and the trainer's
phases as long again per batch shape, so a second run of the same config spends most of its start-up
compiling what the first already compiled. JAX keys each entry on the program, the compiler options
and the backend, so a changed model, shape or flag compiles anew; entries are evicted least recently
used beyond `MAX_BYTES`.

`JAX_COMPILATION_CACHE_DIR` in the environment wins over the config (the test suite points every process
it starts at one fresh directory per session, so a CI run never reuses a previous run's programs).
"""

from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger(__name__)

AUTO = "auto"
ENV = "JAX_COMPILATION_CACHE_DIR"
MAX_BYTES = 4 << 30
# programs that compile faster than this are not worth a file read (the engine's small copy kernels)
MIN_COMPILE_S = 0.5


def default_dir() -> str:
    """`$XDG_CACHE_HOME/openclaw_jax/xla`, else `~/.cache/openclaw_jax/xla`."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "openclaw_jax", "xla")


def enable_compile_cache(directory: str) -> str | None:
    """Turn the persistent cache on in `directory` ("auto": `default_dir()`, "": off); returns the directory
    in use (the environment's, when set) or None when off."""
    if os.environ.get(ENV):
        return os.environ[ENV]   # JAX reads it itself
    if not directory:
        return None
    path = os.path.abspath(os.path.expanduser(default_dir() if directory == AUTO else directory))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:   # a read-only home must not stop a run: it only compiles everything again
        log.warning("compilation cache %s cannot be created (%s); compiling without it", path, err)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    log.info("compilation cache: %s", path)
    return path
