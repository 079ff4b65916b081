"""What starting sandboxes costs here: CPU (the caller's and its children's) and wall time per run.

    python scripts/sandbox_startup.py [--runs N]

Prints one JSON object: for a one-shot `run_code` (Python and bash), a persistent `Sandbox` (its
start and close: the holder), and a run inside an existing `Sandbox`, the mean CPU milliseconds
(user + system, this process and every process it waited for) and wall milliseconds. CPU time is
the steadier number on a shared machine; wall time also holds the waits for the kernel and the
scheduler. Run it as root and as an ordinary user to see both modes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import time

from openclaw_jax.envs.sandbox import Sandbox, run_code
from openclaw_jax.envs.sandbox_cgroup import plan


def _cost(action, runs: int) -> dict[str, float]:
    def used() -> float:
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                      resource.getrusage(resource.RUSAGE_CHILDREN)))
    cpu0, wall0 = used(), time.perf_counter()
    for _ in range(runs):
        action()
    return {"cpu_ms": round((used() - cpu0) / runs * 1e3, 1),
            "wall_ms": round((time.perf_counter() - wall0) / runs * 1e3, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/sandbox_startup.py", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per measurement (default 30)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    run_code("pass")  # the seccomp filter is built once per process; not part of a run's cost
    with Sandbox() as warm:
        out = {"mode": "root" if os.geteuid() == 0 else "user",
               "cgroup": f"v{plan().version}" if plan() else "none",
               "run_code python": _cost(lambda: run_code("pass"), args.runs),
               "run_code bash": _cost(lambda: run_code("true", "bash"), args.runs),
               "Sandbox start + close": _cost(lambda: Sandbox().close(), args.runs),
               "run in a Sandbox (bash)": _cost(lambda: warm.run("true", "bash"), args.runs)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
