"""One logging set-up for every CLI: our records at the chosen level, third-party noise kept out.

JAX announces at INFO which backends it could not open (libtpu, CUDA) and the openai client
logs every request through httpx; none of that helps a user reading a training run, so those
loggers are raised to WARNING unless the user asks for DEBUG.

Log lines quote what clients send (session ids, reasons, errors naming a field's value). The
formatter escapes every control character of a record's message (``\\n``, ``\\x1b``, ...; also the
C1 controls and the Unicode line separators), so no client text can forge a log line of its own or
send escape sequences to an operator's terminal. A traceback keeps its lines.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NOISY = ("jax._src.xla_bridge", "jax._src.compiler", "jax._src.dispatch", "absl", "orbax", "httpx", "httpx2", "httpcore",
         "urllib3", "aiohttp.access", "grain", "tensorboardX")


_CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c != 0x09}
_CONTROL_ESCAPES.update({0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def escape_controls(text: str) -> str:
    """``text`` with its control characters written as escapes (tab kept)."""
    return text.translate(_CONTROL_ESCAPES)


class EscapingFormatter(logging.Formatter):
    """A Formatter that escapes control characters in each record's message (see the module docstring)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


def configure_logging(level: int | str = logging.INFO) -> None:
    """basicConfig on stderr with our format; third-party loggers at WARNING unless `level` is DEBUG."""
    level = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    # force: an imported library may have put a handler on the root logger already (grain does, on import),
    # which would make basicConfig a no-op and leave the console silent
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if level > logging.DEBUG:
        for name in NOISY:
            logging.getLogger(name).setLevel(logging.WARNING)
