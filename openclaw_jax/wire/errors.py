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


# What to change on the client when a prompt does not fit the model's context: written for OpenClaw,
# whose default system prompt alone is about 10.5 k SmolLM2 tokens (DESIGN section 14).
CONTEXT_ADVICE = (
    "With OpenClaw: use the minimal tools profile (tools.profile: \"minimal\") with agents.defaults.skills: [] "
    "and agents.defaults.skipBootstrap: true (a system prompt of about 2.3 k tokens instead of 10.5 k), and "
    "declare the served model's real context as contextWindow on its entry under models.providers.<id>.models "
    "so that OpenClaw compacts a long session before it overflows.")


def with_context_advice(message: str) -> str:
    """``message`` followed by `CONTEXT_ADVICE` (once)."""
    return message if CONTEXT_ADVICE in message else f"{message.rstrip()} {CONTEXT_ADVICE}"
