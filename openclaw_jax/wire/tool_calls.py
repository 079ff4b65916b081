"""Tool calls in model output -> OpenAI `tool_calls` (the Qwen/Hermes `<tool_call>` format).

Qwen2.5/Qwen3 (and many fine-tunes) emit

    some text
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

SGLang's `qwen25` parser keeps the text before the first `<tool_call>` as the message
content and turns every block into an OpenAI tool call with JSON-string arguments.  We
do the same; calls to functions that are not in the request's `tools` are dropped (as
SGLang does), and output whose blocks are not valid JSON stays plain content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON object text, as OpenAI sends it
    index: int


def has_tool_call(text: str) -> bool:
    return TOOL_CALL_START in text


def _tool_names(tools: Sequence[dict[str, Any]] | None) -> set[str] | None:
    if tools is None:
        return None
    return {t["function"]["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)}


def _blocks(text: str) -> list[str]:
    """The stripped text of each ``<tool_call>...</tool_call>`` block, in order (each from its start tag to
    the first end tag after it); plain searches, linear in the text (a regular expression with a lazy
    body between two whitespace runs backtracks quadratically on long whitespace)."""
    blocks, pos = [], 0
    while True:
        start = text.find(TOOL_CALL_START, pos)
        if start < 0:
            return blocks
        end = text.find(TOOL_CALL_END, start + len(TOOL_CALL_START))
        if end < 0:
            # A generation stopped by EOS right after the JSON may lack the closing tag: the last open block.
            last_open = text.rfind(TOOL_CALL_START)
            blocks.append(text[last_open + len(TOOL_CALL_START):].strip())
            return blocks
        blocks.append(text[start + len(TOOL_CALL_START):end].strip())
        pos = end + len(TOOL_CALL_END)


def parse_tool_calls(text: str, tools: Sequence[dict[str, Any]] | None = None) -> tuple[str, list[ParsedToolCall]]:
    """(content, calls). Without a parsable `<tool_call>` block, content is the text unchanged."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, []
    allowed = _tool_names(tools)
    calls: list[ParsedToolCall] = []
    for block in _blocks(text):
        try:
            obj = json.loads(block)
        except ValueError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
                args = parsed if isinstance(parsed, dict) else args
            except ValueError:
                pass
        if allowed is not None and obj["name"] not in allowed:
            continue
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(ParsedToolCall(name=obj["name"], arguments=arguments, index=len(calls)))
    return text[:start].strip(), calls


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_tool_calls(calls: Sequence[ParsedToolCall]) -> list[dict[str, Any]]:
    """OpenAI `message.tool_calls` (SGLang also sends the `index`)."""
    return [{"id": new_tool_call_id(), "index": c.index, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def safe_stream_prefix(text: str) -> int:
    """How much of a streamed text can be sent as content before a tool call may start.

    Everything before `<tool_call>` (or before a suffix that could grow into it) is safe.
    """
    start = text.find(TOOL_CALL_START)
    if start >= 0:
        return start
    for k in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-k:]):
            return len(text) - k
    return len(text)


def split_tool_calls(text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[dict[str, Any]]]:
    """(content, OpenAI ``tool_calls``) of a reply; the text unchanged and no calls without tools or blocks."""
    if not tools:
        return text, []
    content, calls = parse_tool_calls(text, tools)
    if not calls:
        return text, []
    return content, openai_tool_calls(calls)
