"""The OpenAI chat/completions wire format, written once for the gateway and the embedded server.

Requests: message normalisation (text-only content, tool calls with JSON-object arguments), tools
and ``tool_choice``, the request fields both servers read the same way (max tokens, stop, stream
options, log-prob counts, response format, chat-template kwargs). Responses: chat completions and
their stream chunks, text completions, log-prob content, usage, model lists. SSE framing, written
(`sse_event`) and parsed (`SSEDecoder`). Error bodies: OpenAI's nested ``{"error": {...}}`` and
SGLang's flat ``{"object": "error", ...}``. Every request problem is a `WireError` naming the field.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Mapping, Sequence

from openclaw_jax.wire import json_safe
from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.fields import as_bool, as_int, as_str_list

# Roles of a strict (gateway) conversation; the lenient (SGLang) form also takes "function".
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
LENIENT_MESSAGE_ROLES = ("system", "user", "assistant", "tool", "function", "developer")
# Keys of a strict message that reach the chat template; anything else a client sends is dropped.
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")
TOOL_CHOICES = ("auto", "none", "required")
_TEMPLATE_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "tokenize", "chat_template"})
SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def short(v: Any) -> str:
    """A value for an error message, cut to 80 characters."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------------------- error bodies

def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 413:
        return "request_too_large"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "api_error" if status == 500 else "upstream_error"
    return "invalid_request_error"


def error_body(message: str, *, err_type: str = "invalid_request_error", param: str | None = None,
               code: Any = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


_SGLANG_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                       500: "InternalServerError", 503: "ServiceUnavailableError"}


def flat_error_body(message: str, status: int = 400, *, param: str | None = None) -> dict[str, Any]:
    """SGLang's body for errors of its OpenAI endpoints: ``{"object": "error", "message", "type", "param", "code"}``."""
    err_type = _SGLANG_ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return {"object": "error", "message": str(message), "type": err_type, "param": param, "code": int(status)}


# ----------------------------------------------------------------------------- messages

def text_content(content: Any, where: str, *, allow_none: bool, sep: str = "\n") -> str | None:
    """Message content as text: a string, or text parts joined by ``sep``; None only when allowed."""
    if content is None:
        if allow_none:
            return None
        raise WireError(f"{where}.content is required", param="messages")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise WireError(f"{where}.content[{j}] must be a text part ({{'type': 'text', 'text': ...}}); "
                                f"got {short(kind)}: only text is served", param="messages")
        return sep.join(parts)
    raise WireError(f"{where}.content must be a string, a list of text parts or null, got {type(content).__name__}",
                    param="messages")


def tool_call_arguments(args: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments as a mapping: chat templates render them so (SGLang decodes them too)."""
    if isinstance(args, str):
        try:
            args = json_safe.loads(args, what=f"{where}.function.arguments") if args.strip() else {}
        except json_safe.JSONRejected as err:
            raise WireError(f"{where}.function.arguments must be a JSON object (text): {err}",
                            param="messages") from None
    if not isinstance(args, dict):
        raise WireError(f"{where}.function.arguments must be a JSON object", param="messages")
    return args


def _tool_calls(calls: Any, where: str, *, strict: bool) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise WireError(f"{where}.tool_calls must be a list", param="messages")
    out = []
    for j, call in enumerate(calls):
        cw = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise WireError(f"{cw} must be an object with a 'function' object", param="messages")
        fn = call["function"]
        if not strict:
            args = fn.get("arguments")
            fixed = dict(fn) if not isinstance(args, str) else {**fn, "arguments": tool_call_arguments(args, cw)}
            out.append({**call, "function": fixed})
            continue
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise WireError(f"{cw}.function.name must be a non-empty string", param="messages")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise WireError(f"{cw}.id must be a string", param="messages")
        item: dict[str, Any] = {"type": "function",
                                "function": {"name": name, "arguments": tool_call_arguments(fn.get("arguments", {}), cw)}}
        if call_id is not None:
            item["id"] = call_id
        out.append(item)
    return out


def normalise_message(i: int, msg: Any, *, strict: bool = True) -> dict[str, Any]:
    """One chat message, normalised for the chat template.

    Strict (the gateway): roles of `MESSAGE_ROLES`, developer -> system, only `MESSAGE_KEYS` kept,
    content required except on assistant turns, tool calls rebuilt from name/arguments/id.
    Lenient (SGLang's server): roles of `LENIENT_MESSAGE_ROLES` in any case, every key kept, content
    null except on user turns, tool-call arguments decoded in place.
    """
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise WireError(f"{where} must be an object with 'role' and 'content', got {type(msg).__name__}",
                        param="messages")
    role = msg.get("role")
    roles = MESSAGE_ROLES if strict else LENIENT_MESSAGE_ROLES
    if isinstance(role, str) and not strict:
        role = role.lower()
    if not isinstance(role, str) or role not in roles:
        raise WireError(f"{where}.role={short(role)} is not one of {', '.join(roles)}", param="messages")
    if not strict:
        out = {**msg, "role": role,
               "content": text_content(msg.get("content"), where, allow_none=role != "user",
                                       sep=" " if role == "tool" else "\n")}
        if msg.get("tool_calls") is not None:
            out["tool_calls"] = _tool_calls(msg["tool_calls"], where, strict=False)
        return out
    out = {"role": "system" if role == "developer" else role,
           "content": text_content(msg.get("content"), where, allow_none=role == "assistant")}
    if role == "assistant" and msg.get("tool_calls") not in (None, []):
        out["tool_calls"] = _tool_calls(msg["tool_calls"], where, strict=True)
    if role == "assistant" and out["content"] is None:
        # Text, even beside tool calls (OpenClaw sends null there): templates such as SmolLM2's read
        # message.content unconditionally, and those that test it render "" and null alike.
        out["content"] = ""
    for key in ("name", "tool_call_id", "reasoning_content"):
        value = msg.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise WireError(f"{where}.{key} must be a string", param="messages")
        if key == "tool_call_id" and role != "tool":
            continue
        out[key] = value
    return out


def parse_messages(body: Mapping[str, Any], *, strict: bool = True) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError("messages must be a non-empty list of {role, content} objects", param="messages")
    return [normalise_message(i, m, strict=strict) for i, m in enumerate(messages)]


# ----------------------------------------------------------------------------- tools and request fields

def parse_tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, Any]:
    """(tools or None, tool_choice as sent or None), both validated."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise WireError("tools must be a list of {type: function, function: {name, ...}} objects", param="tools")
        for j, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]
                    or tool.get("type", "function") != "function"):
                raise WireError(f"tools[{j}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}",
                                param="tools")
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise WireError(f"tools[{j}].function.parameters must be a JSON schema object", param="tools")
            if fn.get("description") is not None and not isinstance(fn["description"], str):
                raise WireError(f"tools[{j}].function.description must be a string", param="tools")
        tools = [dict(t) for t in tools] or None
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise WireError(f"tool_choice={short(choice)} must be 'auto', 'none', 'required' or "
                            "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
        if choice == "required" and not tools:
            raise WireError("tool_choice 'required' needs tools", param="tool_choice")
    elif isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise WireError("tool_choice object must be {'type': 'function', 'function': {'name': ...}}",
                            param="tool_choice")
        if not tools or name not in {t["function"]["name"] for t in tools}:
            raise WireError(f"tool_choice names function {name!r}, which is not in tools", param="tool_choice")
    elif choice is not None:
        raise WireError(f"tool_choice has the wrong type ({type(choice).__name__})", param="tool_choice")
    return tools, choice


def parse_max_tokens(body: Mapping[str, Any], default: Any = None) -> int | None:
    """``max_completion_tokens``, else ``max_tokens`` (a positive integer), else ``default``."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name, default)
    if value is None:
        return None
    value = as_int(value, name)
    if value <= 0:
        raise WireError(f"{name}={short(value)} must be a positive integer", param=name)
    return value


def parse_stop(body: Mapping[str, Any], *, max_count: int | None = None) -> tuple[str, ...]:
    return as_str_list(body.get("stop"), "stop", max_count=max_count)


def parse_stream_options(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of ``stream_options``."""
    so = body.get("stream_options")
    if so is None:
        return False, False
    if not isinstance(so, Mapping):
        raise WireError(f"stream_options must be an object, got {short(so)}", param="stream_options")
    inc, cont = so.get("include_usage"), so.get("continuous_usage_stats")
    return (False if inc is None else as_bool(inc, "stream_options.include_usage"),
            False if cont is None else as_bool(cont, "stream_options.continuous_usage_stats"))


def parse_top_logprobs(body: Mapping[str, Any], logprobs: bool, *, max_value: int | None = None) -> int:
    value = body.get("top_logprobs")
    value = 0 if value is None else as_int(value, "top_logprobs")
    if value < 0 or (max_value is not None and value > max_value):
        bound = f"[0, {max_value}]" if max_value is not None else ">= 0"
        raise WireError(f"top_logprobs={short(value)} must be an integer in {bound}", param="top_logprobs")
    if value and not logprobs:
        raise WireError("top_logprobs requires logprobs=true", param="top_logprobs")
    return value


def check_response_format(body: Mapping[str, Any]) -> None:
    """Only ``{"type": "text"}``: constrained decoding is not served."""
    rf = body.get("response_format")
    if rf is None:
        return
    if not isinstance(rf, Mapping) or rf.get("type") not in ("text", "json_object", "json_schema", "structural_tag"):
        raise WireError(f"response_format must be an object with type text|json_object|json_schema, got {short(rf)}",
                        param="response_format")
    if rf["type"] != "text":
        raise WireError(f"response_format type {rf['type']!r} (constrained decoding) is not supported",
                        param="response_format")


def parse_chat_template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    ctk = body.get("chat_template_kwargs")
    if ctk is None:
        return {}
    if not isinstance(ctk, Mapping):
        raise WireError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    reserved = _TEMPLATE_RESERVED & set(ctk)
    if reserved:
        raise WireError(f"chat_template_kwargs may not set {sorted(reserved)}", param="chat_template_kwargs")
    return dict(ctk)


# ----------------------------------------------------------------------------- responses

def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, *, details: bool = False,
          cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI ``usage``; ``details`` adds SGLang's ``prompt_tokens_details`` and ``reasoning_tokens``;
    ``cached_tokens`` (prompt tokens served from a prefix cache) goes into ``prompt_tokens_details`` as
    OpenAI reports prompt caching."""
    out: dict[str, Any] = {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens),
                           "total_tokens": int(prompt_tokens + completion_tokens)}
    if details:
        out.update(prompt_tokens_details=None, reasoning_tokens=0)
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": int(cached_tokens)}
    return out


def _token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", "replace"))


def logprobs_content(token_texts: Sequence[str], logprobs: Sequence[float],
                     top: Sequence[Sequence[tuple[float, str]]] | None) -> dict[str, Any]:
    """OpenAI chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}, ...]}``; ``top`` holds
    (logprob, token text) per position."""
    content = []
    for i, (tok, lp) in enumerate(zip(token_texts, logprobs)):
        tops = [] if not top or i >= len(top) else [
            {"token": t, "logprob": float(v), "bytes": _token_bytes(t)} for v, t in top[i]]
        content.append({"token": tok, "logprob": float(lp), "bytes": _token_bytes(tok), "top_logprobs": tops})
    return {"content": content}


def logprobs_of_ids(ids: Sequence[int], logprobs: Sequence[float],
                    tops: Sequence[Sequence[tuple[float, int]]] | None, token_text: Callable[[int], str],
                    *, top_n: int | None = None) -> dict[str, Any]:
    """`logprobs_content` of token ids, each spelt by ``token_text(id)``; ``tops`` as (logprob, id) per position,
    the first ``top_n`` of each kept."""
    top = None if not tops else [[(lp, token_text(int(t))) for lp, t in pos[:top_n]] for pos in tops]
    return logprobs_content([token_text(int(t)) for t in ids], logprobs, top)


def completion_logprobs(tokens: Sequence[str], logprobs: Sequence[float | None],
                        tops: Sequence[Sequence[tuple[float, str]] | None] | None) -> dict[str, Any]:
    """OpenAI completions ``logprobs`` (SGLang's `to_openai_style_logprobs`); ``tops`` as (logprob, text)."""
    return {"text_offset": [-1] * len(tokens), "token_logprobs": [None if lp is None else float(lp) for lp in logprobs],
            "tokens": list(tokens),
            "top_logprobs": [] if tops is None else [None if pos is None else {t: float(v) for v, t in pos}
                                                     for pos in tops]}


def chat_message(content: str | None, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "reasoning_content": None, "tool_calls": tool_calls or None}


def chat_choice(index: int, message: dict[str, Any], *, finish_reason: str | None, matched_stop: Any = None,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
            "matched_stop": matched_stop}


def chat_completion(*, completion_id: str, created: int, model: str, choices: list[dict[str, Any]],
                    usage: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"id": completion_id, "object": "chat.completion", "created": int(created), "model": model,
           "choices": choices, "usage": usage}
    if metadata is not None:
        out["metadata"] = metadata
    return out


def full_delta(delta: dict[str, Any] | None) -> dict[str, Any]:
    """A chunk delta with every key SGLang sends (null when absent)."""
    return {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **(delta or {})}


def chat_chunk(*, completion_id: str, created: int, model: str, delta: dict[str, Any] | None = None, index: int = 0,
               finish_reason: str | None = None, matched_stop: Any = None, logprobs: dict[str, Any] | None = None,
               usage: dict[str, Any] | None = None, no_choices: bool = False) -> dict[str, Any]:
    choices = [] if no_choices else [{"index": index, "delta": delta or {}, "logprobs": logprobs,
                                      "finish_reason": finish_reason, "matched_stop": matched_stop}]
    return {"id": completion_id, "object": "chat.completion.chunk", "created": int(created), "model": model,
            "choices": choices, "usage": usage}


def completion_choice(index: int, text: str, *, finish_reason: str | None, matched_stop: Any,
                      logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "matched_stop": matched_stop}


def text_completion(*, completion_id: str, created: int, model: str, choices: list[dict[str, Any]],
                    usage: dict[str, Any] | None, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A text completion, or one of its stream chunks (same object type)."""
    out = {"id": completion_id, "object": "text_completion", "created": int(created), "model": model,
           "choices": choices, "usage": usage}
    if metadata is not None:
        out["metadata"] = metadata
    return out


def model_card(model: str, created: int, *, owned_by: str, **extra: Any) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": int(created), "owned_by": owned_by, **extra}


def model_list(*cards: dict[str, Any]) -> dict[str, Any]:
    return {"object": "list", "data": list(cards)}


# ----------------------------------------------------------------------------- server-sent events

def sse_event(data: Any) -> bytes:
    """One SSE event: ``data: <compact JSON>`` (or the text itself) and a blank line."""
    text = data if isinstance(data, str) else json_safe.dumps(data)
    return f"data: {text}\n\n".encode("utf-8")


class SSEDecoder:
    """The ``data:`` payloads of an SSE byte stream, fed in pieces of any size (events end with a blank line)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, piece: bytes) -> list[str]:
        self._buffer += piece
        out = []
        while True:
            cut = self._buffer.find(b"\n\n")
            if cut < 0:
                return out
            event, self._buffer = self._buffer[:cut], self._buffer[cut + 2:]
            data_lines = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
            if data_lines:
                out.append(b"\n".join(data_lines).decode("utf-8"))

    def close(self) -> list[str]:
        """The payload of an unterminated last event, if any."""
        tail, self._buffer = self._buffer.strip(), b""
        return [tail[5:].lstrip().decode("utf-8")] if tail.startswith(b"data:") else []
