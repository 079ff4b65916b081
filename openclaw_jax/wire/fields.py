"""Typed getters for JSON request fields (JSON numbers: bool is not a number); problems are `WireError`."""

from __future__ import annotations

import math
from typing import Any, Mapping

from openclaw_jax.wire.errors import WireError


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def as_int(v: Any, name: str) -> int:
    if is_int(v):
        return int(v)
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return int(v)
    raise WireError(f"{name} must be an integer, got {v!r}")


def as_float(v: Any, name: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise WireError(f"{name} must be a number, got {v!r}")


def as_bool(v: Any, name: str) -> bool:
    if isinstance(v, bool):
        return v
    raise WireError(f"{name} must be true or false, got {v!r}")


def optional_bool(body: Mapping, name: str, default: bool) -> bool:
    v = body.get(name)
    return default if v is None else as_bool(v, name)


def as_str_list(v: Any, name: str, *, max_count: int | None = None) -> tuple[str, ...]:
    """A string or a list of strings (empty strings dropped), as `stop` is sent."""
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        if max_count is not None and len(v) > max_count:
            raise WireError(f"{name} has {len(v)} entries; at most {max_count} are allowed", param=name)
        return tuple(s for s in v if s)
    raise WireError(f"{name} must be a string or a list of strings, got {v!r}", param=name)
