"""A cgroup per sandbox, where the host may make one: memory and process count for the whole sandbox.

Rlimits bound each process (address space) and the processes of one uid; a cgroup bounds the sum:
every process of the sandbox, the pages of its tmpfs areas and its kernel memory. Used where
writable, in this order:

* **cgroup v2**: a child of `$OPENCLAW_SANDBOX_CGROUP` (a delegated folder, e.g. one a systemd
  unit with `Delegate=yes` owns) or of this process's own cgroup, when that folder is writable and
  has both `memory` and `pids` in its `cgroup.subtree_control`: `memory.max`, `memory.swap.max=0`,
  `pids.max`;
* **cgroup v1** (hybrid hosts, usually only as root): a child of this process's cgroup in the
  `memory` and `pids` hierarchies: `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where
  swap is accounted), `pids.max`;
* else none: the sandbox relies on its rlimits (docs/sandbox.md states what that leaves open).

`OPENCLAW_SANDBOX_CGROUP=none` turns cgroups off (rlimits only).
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
ENV_PARENT = "OPENCLAW_SANDBOX_CGROUP"


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of the cgroup file systems."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
            out.append((fields[4].replace("\\040", " "), rfields[0], set(rfields[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """hierarchy key ("" for v2, else its controllers) -> this process's cgroup path in it."""
    out = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


@dataclass(frozen=True)
class CgroupPlan:
    """Where sandbox cgroups go: (parent folder, version) per hierarchy used."""
    parents: tuple[tuple[str, str], ...]   # (folder, "memory"|"pids"|"unified")

    @property
    def version(self) -> int:
        return 2 if self.parents[0][1] == "unified" else 1


def _writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _plan_v2(mounts, own) -> CgroupPlan | None:
    roots = [m for m, fstype, _ in mounts if fstype == "cgroup2"]
    if not roots:
        return None
    parent = os.environ.get(ENV_PARENT) or (roots[0] + own[""] if "" in own else None)
    if not parent:
        return None
    try:
        enabled = set(Path(parent, "cgroup.subtree_control").read_text().split())
    except OSError:
        return None
    if {"memory", "pids"} <= enabled and _writable(parent):
        return CgroupPlan(((parent, "unified"),))
    if os.environ.get(ENV_PARENT):
        log.warning("%s=%s cannot hold sandbox cgroups (needs memory and pids in its cgroup.subtree_control "
                    "and write access; has %s)", ENV_PARENT, parent, sorted(enabled))
    return None


def _plan_v1(mounts, own) -> CgroupPlan | None:
    parents = []
    for controller in ("memory", "pids"):
        point = next((m for m, fstype, opts in mounts if fstype == "cgroup" and controller in opts), None)
        if point is None or controller not in own:
            return None
        parent = point + own[controller]
        if not _writable(parent):
            return None
        parents.append((parent, controller))
    return CgroupPlan(tuple(parents))


@functools.lru_cache(maxsize=1)
def plan() -> CgroupPlan | None:
    """The cgroups this process can make for its sandboxes (None: rlimits only); looked up once."""
    if os.environ.get(ENV_PARENT) == "none":
        return None
    mounts, own = _mounts(), _own_paths()
    found = _plan_v2(mounts, own) or _plan_v1(mounts, own)
    log.info("sandbox cgroups: %s", f"v{found.version} under {[p for p, _ in found.parents]}" if found
             else "none writable here (memory and processes bounded by rlimits only)")
    return found


class SandboxCgroup:
    """One sandbox's cgroup(s): limits written, `procs_files` for the jail's init to join, removed on close."""

    def __init__(self, plan_: CgroupPlan, memory_bytes: int, max_processes: int):
        self.dirs: list[str] = []
        name = f"openclaw-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            for parent, kind in plan_.parents:
                path = os.path.join(parent, name)
                os.mkdir(path)
                self.dirs.append(path)
                for key, value in self._settings(kind, memory_bytes, max_processes):
                    if kind == "memory" and key.startswith("memory.memsw") and not os.path.exists(f"{path}/{key}"):
                        continue  # swap not accounted on this host
                    Path(path, key).write_text(str(value))
        except OSError:
            self.close()
            raise

    @staticmethod
    def _settings(kind: str, memory_bytes: int, max_processes: int) -> list[tuple[str, int]]:
        if kind == "unified":
            return [("memory.max", memory_bytes), ("memory.swap.max", 0), ("pids.max", max_processes)]
        if kind == "memory":
            return [("memory.limit_in_bytes", memory_bytes), ("memory.memsw.limit_in_bytes", memory_bytes)]
        return [("pids.max", max_processes)]

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def close(self, wait_s: float = 5.0) -> None:
        """Remove the folders (a cgroup goes once its last process has been reaped)."""
        deadline = time.monotonic() + wait_s
        for path in reversed(self.dirs):
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if time.monotonic() > deadline:
                        log.warning("could not remove the sandbox cgroup %s: %s", path, err)
                        break
                    time.sleep(0.02)
        self.dirs = []


__all__ = ["CgroupPlan", "ENV_PARENT", "SandboxCgroup", "plan"]
