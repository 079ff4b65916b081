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
# whose default system prompt alone is about 10.5 k SmolLM2 tokens (docs/design.md §14). It leads the
# message because OpenClaw shows only the first 200 characters of a provider's error.
CONTEXT_ADVICE = (
    "Prompt too long for the model. With OpenClaw: tools.profile: \"minimal\", agents.defaults.skills: [], "
    "agents.defaults.skipBootstrap: true, contextWindow = the model's context.")


def with_context_advice(message: str) -> str:
    """`CONTEXT_ADVICE`, then ``message`` (any copy of the advice already in it removed)."""
    return f"{CONTEXT_ADVICE} {message.replace(CONTEXT_ADVICE + ' ', '').replace(CONTEXT_ADVICE, '').strip()}"
