"""XLA_FLAGS for the processes tests start: the suite's compile settings kept, a device count set or removed.

tests/conftest.py sets the suite's XLA_FLAGS (LLVM at -O0) before JAX starts; every process a test
starts inherits them. A test that needs a simulated device count, or one device where its parent
may have several, changes only `--xla_force_host_platform_device_count`.
"""

from __future__ import annotations

import os

DEVICE_COUNT = "--xla_force_host_platform_device_count"


def env_without_device_count(env=None) -> dict[str, str]:
    """A copy of `env` (default os.environ) whose XLA_FLAGS name no device count (one CPU device)."""
    env = dict(os.environ if env is None else env)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT)]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    return env


def env_optimized(env=None) -> dict[str, str]:
    """A copy of `env` (default os.environ) without the suite's -O0 compile flags: for a process whose
    time is a real model's arithmetic (SmolLM2-135M decoding and training), not compiling."""
    from tests.conftest import TEST_XLA_FLAGS

    env = dict(os.environ if env is None else env)
    names = {f.split("=")[0] for f in TEST_XLA_FLAGS}
    flags = [f for f in env.get("XLA_FLAGS", "").split() if f.split("=")[0] not in names]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    return env
