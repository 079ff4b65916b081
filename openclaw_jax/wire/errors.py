"""The one error type of the wire layer: a request (or response) that does not follow the protocol."""

from __future__ import annotations


class WireError(ValueError):
    """Bad wire data; servers answer it with HTTP ``status`` (400 unless told otherwise).

    ``param`` names the offending top-level field when there is one (OpenAI error bodies carry it).
    """

    def __init__(self, message: str, *, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = int(status)
        self.param = param
