"""Bounded, strict JSON decoding of untrusted request text (pure: no I/O, no aiohttp).

`loads(raw)` is `json.loads` plus the checks that keep malformed input from reaching code that
would fail in a less controlled way: strict UTF-8 (raw bytes of an encoded surrogate such as
``ED A0 80`` are not UTF-8), no lone surrogates from ``\\udXXX`` escapes (tokenizers reject them),
bounded nesting depth (iteratively checked, so a deep document cannot exhaust the stack), and,
optionally, no ``NaN``/``Infinity`` constants. Every failure is a :class:`JSONRejected` (a
``ValueError``) whose message says what was wrong; callers turn it into an HTTP 400.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

DEFAULT_MAX_DEPTH = 64
# A JSON escape that decodes to a UTF-16 surrogate (\ud800-\udfff), paired or not.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


class JSONRejected(ValueError):
    """Untrusted JSON that must be answered with HTTP 400 (the message says why)."""


def _reject_constant(name: str) -> Any:
    raise JSONRejected(f"{name} is not valid JSON (numbers must be finite)")


def loads(raw: bytes | bytearray | str, *, max_depth: int = DEFAULT_MAX_DEPTH, allow_nonfinite: bool = False,
          what: str = "the request body") -> Any:
    """Decode ``raw`` (UTF-8 bytes or text) as JSON under the checks in the module docstring."""
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise JSONRejected(f"{what} is not valid UTF-8 ({err.reason} at byte {err.start})") from None
        probe = raw
    else:
        text = raw
        probe = None
    if not text.strip():
        raise JSONRejected(f"{what} is empty; send a JSON object")
    try:
        value = json.loads(text, parse_constant=None if allow_nonfinite else _reject_constant)
    except RecursionError:
        raise JSONRejected(f"{what} nests JSON more than {max_depth} levels deep") from None
    except JSONRejected:
        raise
    except ValueError as err:
        raise JSONRejected(f"{what} is not valid JSON: {err}") from None
    if probe is None:
        probe = text.encode("utf-8", "surrogatepass")
    # Cheap byte scans first: most bodies need no walk at all.
    need_depth = probe.count(b"[") + probe.count(b"{") > max_depth
    need_strings = _SURROGATE_ESCAPE.search(probe) is not None
    if need_depth or need_strings:
        check_tree(value, max_depth=max_depth, check_strings=need_strings, what=what)
    return value


def check_tree(value: Any, *, max_depth: int = DEFAULT_MAX_DEPTH, check_strings: bool = True,
               what: str = "the request body") -> None:
    """Iterative walk: depth <= ``max_depth`` and every string (and key) encodable as UTF-8."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if check_strings:
                _check_text(node, what)
            continue
        if isinstance(node, (list, dict)):
            if depth >= max_depth:
                raise JSONRejected(f"{what} nests JSON more than {max_depth} levels deep")
            if isinstance(node, dict):
                for key, item in node.items():
                    if check_strings:
                        _check_text(key, what)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in node)


def _check_text(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise JSONRejected(f"{what} contains an invalid unicode code point (a lone surrogate "
                           f"{text[err.start]!r} at character {err.start} of a string)") from None


def finite(obj: Any) -> Any:
    """``obj`` with NaN/Infinity replaced by null (JSON has neither; SGLang's orjson sends null)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (list, tuple)):
        return [finite(x) for x in obj]
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    return obj


def dumps(obj: Any) -> str:
    """Compact UTF-8 JSON text of an outgoing body; non-finite numbers become null."""
    return json.dumps(finite(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)
