"""Event counters: one way to declare the plain tallies a component keeps (requests, drops, errors, ...).

``counters("GatewayStats", "requests pool_errors ...")`` makes a dataclass whose fields are those
names, each an ``int`` starting at 0, so ``stats.requests += 1`` counts and
``dataclasses.asdict(stats)`` is the dict a ``/healthz`` body reports. Imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
import sys


def counters(name: str, names: str, doc: str) -> type:
    """A dataclass named ``name`` with one ``int`` field per word of ``names``, each 0 at the start.

    ``doc`` becomes the class docstring (say there what each counter counts). The class belongs to
    the calling module, so its repr, pickling and documentation point there.
    """
    cls = dataclasses.make_dataclass(name, [(f, int, 0) for f in names.split()])  # refuses a name twice
    cls.__module__ = sys._getframe(1).f_globals.get("__name__", __name__)  # as collections.namedtuple does
    cls.__doc__ = doc
    return cls
