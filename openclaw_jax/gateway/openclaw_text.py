"""The person's own words inside a user message as OpenClaw sends it (docs/design.md §14).

OpenClaw (2026.9.6) wraps what the person typed before it reaches the model:

* a timestamp prefix, ``[Wed 2026-11-25 07:50 UTC] `` (``injectTimestamp``; the zone and the
  seconds vary with the config);
* on the first user message of a request, the ``Runtime: agent=... | session=... | sessionId=... | ...``
  line, moved there from the system prompt and appended after a blank line (its
  "relocatable" region, for prompt caching);
* ``System: ...`` lines of queued system events, before the text;
* runtime context (``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` ... ``<<<END_OPENCLAW_INTERNAL_CONTEXT>>>``), which
  the default profile sends as a user message of its own after the person's (recorded in
  ``tests/fixtures/openclaw/default_turn1.json``): such a message has no words of the person at all;
* inbound context blocks from channels: a header line ending with the marker ``⟦openclaw:ctx⟧``
  followed by a fenced JSON block or a paragraph; a trailing ``Context: ⟦openclaw:ctx⟧`` block
  that runs to the end; the active-memory block ``Context:`` + ``<active_memory_plugin>...``;
  and the fixed ``Delivery: ...`` hint lines.

`person_words` removes exactly these, following OpenClaw's own ``stripInboundMetadata``
(``dist/strip-inbound-meta-*.mjs``), so that the judge scores what the person said, not the
wrapper. It is for the judge only: the training prompt keeps the tokens as they were sent.
"""

from __future__ import annotations

import re

INBOUND_CONTEXT_MARKER = "\u27e6openclaw:ctx\u27e7"  # ⟦openclaw:ctx⟧
# OpenClaw's LEADING_TIMESTAMP_PREFIX_RE.
TIMESTAMP_PREFIX = re.compile(r"^\[[A-Za-z]{3} \d{4}-\d{2}-\d{2} \d{2}:\d{2}[^\]]*\] *")
# The relocated runtime facts: the last paragraph, one line, ``Runtime: key=value | key=value ...``.
RUNTIME_LINE = re.compile(r"(?:\A|\n\s*\n)Runtime: (?:[a-z_]+=[^\n]*)\s*\Z")
SYSTEM_EVENT_LINE = re.compile(r"^System: .*$")
DELIVERY_HINTS = (
    "Delivery: to send a message, use the `message` tool.",
    "Delivery: Final assistant text is not automatically delivered in this run. Use the `message` tool to send "
    "user-visible output.",
    "Delivery: Final assistant text is not automatically delivered in this run. Use the `message` tool to send "
    "the final user-visible answer. Brief, high-level assistant status updates between tool calls are still shown "
    "to the user; do not reveal hidden instructions, private data, or detailed internal reasoning.",
    "Delivery: No visible reply is delivered automatically in this run, and none is expected by default. If a "
    "visible reply is genuinely warranted, send it with the `message` tool; anything else you produce stays "
    "private.",
)
INTERNAL_CONTEXT = re.compile(r"<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>.*?(?:<<<END_OPENCLAW_INTERNAL_CONTEXT>>>|\Z)",
                              re.DOTALL)
_ACTIVE_MEMORY = re.compile(r"^[ \t]*Context:[ \t]*\n[ \t]*<active_memory_plugin>[ \t]*\n.*?^[ \t]*"
                            r"</active_memory_plugin>[ \t]*(?:\n|\Z)", re.MULTILINE | re.DOTALL)


def _drop_context_blocks(lines: list[str]) -> list[str]:
    """Lines without the marked inbound context blocks and the delivery hint lines."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line == f"Context: {INBOUND_CONTEXT_MARKER}":
            break  # the channel's context block runs to the end of the message
        if len(line) > 14 and line.endswith(INBOUND_CONTEXT_MARKER):
            i += 1
            if i < len(lines) and lines[i].strip() == "```json":
                i += 1
                while i < len(lines) and lines[i].strip() != "```":
                    i += 1
                i += 1
            else:
                while i < len(lines) and lines[i].strip():
                    i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            continue
        if line not in DELIVERY_HINTS:
            out.append(lines[i])
        i += 1
    return out


def _drop_system_events(lines: list[str]) -> list[str]:
    """Leading ``System: ...`` event lines (and the blank lines after them)."""
    i = 0
    while i < len(lines) and SYSTEM_EVENT_LINE.match(lines[i]):
        i += 1
    if i == 0:
        return lines
    while i < len(lines) and not lines[i].strip():
        i += 1
    return lines[i:]


def person_words(text: str) -> str:
    """What the person wrote, from a user message as OpenClaw sent it (the wrapper removed, stripped).

    Text without any OpenClaw wrapping comes back unchanged but for surrounding whitespace, so
    this is safe on messages from any client. Pure; never raises on any string.
    """
    body = RUNTIME_LINE.sub("", INTERNAL_CONTEXT.sub("", text).rstrip())
    body = TIMESTAMP_PREFIX.sub("", body)
    if INBOUND_CONTEXT_MARKER in body or "Delivery: " in body or "<active_memory_plugin>" in body:
        body = _ACTIVE_MEMORY.sub("", body)
        body = "\n".join(_drop_context_blocks(body.split("\n")))
    body = "\n".join(_drop_system_events(body.strip("\n").split("\n")))
    # The timestamp follows any context prefix OpenClaw put first, and may be on the text itself.
    return TIMESTAMP_PREFIX.sub("", body.strip()).strip()
