"""Agent-facing OpenAI protocol of the gateway: request validation and response shapes.

Pure functions, no I/O. Everything a client can send is checked here, so that bad input
becomes an HTTP 4xx with an OpenAI-shaped error body
(``{"error": {"message", "type", "param", "code"}}``) and never reaches code that could
fail in a less controlled way.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from openclaw_jax.serving import json_safe

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
TURN_TYPES = ("main", "side")
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})
MAX_SESSION_ID_CHARS = 256
MAX_STOP_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20
# Keys of a message that reach the chat template; anything else a client sends is dropped.
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


class GatewayHTTPError(Exception):
    """An error answered to the client as an OpenAI-shaped JSON body with HTTP ``status``."""

    def __init__(self, status: int, message: str, *, err_type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.err_type = err_type or default_error_type(self.status)
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, err_type=self.err_type, param=self.param, code=self.code)


def default_error_type(status: int) -> str:
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
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> GatewayHTTPError:
    return GatewayHTTPError(400, message, param=param)


# ----------------------------------------------------------------------------- JSON and strings

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------------------- session fields

@dataclass(frozen=True)
class SessionInfo:
    session_id: str | None
    turn_type: str  # "main" | "side"
    done: bool


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"header {name} must be text")
    return value


def _check_text_field(value: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{what} is not valid UTF-8 text") from None
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise bad_request(f"{what} contains control characters")
    return value


def parse_bool_word(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise bad_request(f"{what}={_short(value)} must be one of 1, true, yes, on (or 0, false, no, off)")


def parse_session_info(headers: Mapping[str, str], body: Mapping[str, Any]) -> SessionInfo:
    """Session id, turn type and session end from the X-* headers, falling back to body fields."""
    sid: Any = _header(headers, "X-Session-Id")
    sid_what = "header X-Session-Id"
    if sid is None and body.get("session_id") is not None:
        sid, sid_what = body["session_id"], "session_id"
    if sid is not None:
        if not isinstance(sid, str):
            raise bad_request(f"{sid_what}={_short(sid)} must be a string", param="session_id")
        sid = _check_text_field(sid.strip(), sid_what)
        if not sid or len(sid) > MAX_SESSION_ID_CHARS:
            raise bad_request(f"{sid_what} must be 1 to {MAX_SESSION_ID_CHARS} characters, got {len(sid)}",
                              param="session_id")

    turn: Any = _header(headers, "X-Turn-Type")
    turn_what = "header X-Turn-Type"
    if turn is None and body.get("turn_type") is not None:
        turn, turn_what = body["turn_type"], "turn_type"
    if turn is None:
        turn_type = "side"
    else:
        if not isinstance(turn, str) or turn.strip().lower() not in TURN_TYPES:
            raise bad_request(f"{turn_what}={_short(turn)} must be 'main' or 'side'", param="turn_type")
        turn_type = turn.strip().lower()

    done: Any = _header(headers, "X-Session-Done")
    done_what = "header X-Session-Done"
    if done is None and body.get("session_done") is not None:
        done, done_what = body["session_done"], "session_done"
    session_done = False if done is None else parse_bool_word(done, done_what)

    if turn_type == "main" and sid is None:
        raise bad_request("a main turn needs a session: send the X-Session-Id header (or body session_id)",
                          param="session_id")
    if session_done and sid is None:
        raise bad_request("X-Session-Done needs a session: send the X-Session-Id header (or body session_id)",
                          param="session_id")
    return SessionInfo(sid, turn_type, session_done)


# ----------------------------------------------------------------------------- chat request

@dataclass(frozen=True)
class ChatCompletionRequest:
    messages: list[dict[str, Any]]          # normalised: text content, developer -> system
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list[dict[str, Any]] | None = None     # None when tool_choice is "none"
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def _text_content(content: Any, where: str, *, allow_none: bool) -> str | None:
    if content is None:
        if allow_none:
            return None
        raise bad_request(f"{where}.content is required", param="messages")
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
                raise bad_request(f"{where}.content[{j}] must be a text part ({{'type': 'text', 'text': ...}}); "
                                  f"got {_short(kind)}: the gateway is text-only", param="messages")
        return "\n".join(parts)
    raise bad_request(f"{where}.content must be a string, a list of text parts or null, got "
                      f"{type(content).__name__}", param="messages")


def _normalise_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad_request(f"{where}.tool_calls must be a list", param="messages")
    out = []
    for j, call in enumerate(calls):
        cw = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise bad_request(f"{cw} must be an object with a 'function' object", param="messages")
        fn = call["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"{cw}.function.name must be a non-empty string", param="messages")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            # Chat templates render arguments as a mapping (SGLang does the same before templating).
            try:
                args = json_safe.loads(args, what=f"{cw}.function.arguments") if args.strip() else {}
            except json_safe.JSONRejected as err:
                raise bad_request(f"{cw}.function.arguments must be a JSON object (text): {err}",
                                  param="messages") from None
        if not isinstance(args, dict):
            raise bad_request(f"{cw}.function.arguments must be a JSON object", param="messages")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad_request(f"{cw}.id must be a string", param="messages")
        item: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
        if call_id is not None:
            item["id"] = call_id
        out.append(item)
    return out


def normalise_message(i: int, msg: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise bad_request(f"{where} must be an object with 'role' and 'content', got {type(msg).__name__}",
                          param="messages")
    role = msg.get("role")
    if not isinstance(role, str) or role not in MESSAGE_ROLES:
        raise bad_request(f"{where}.role={_short(role)} is not one of {', '.join(MESSAGE_ROLES)}", param="messages")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    has_calls = role == "assistant" and msg.get("tool_calls") not in (None, [])
    out["content"] = _text_content(msg.get("content"), where, allow_none=role == "assistant")
    if has_calls:
        out["tool_calls"] = _normalise_tool_calls(msg["tool_calls"], where)
    elif role == "assistant" and out["content"] is None:
        out["content"] = ""
    for key in ("name", "tool_call_id", "reasoning_content"):
        value = msg.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad_request(f"{where}.{key} must be a string", param="messages")
        if key == "tool_call_id" and role != "tool":
            continue
        out[key] = value
    return out


def _parse_tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, Any]:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("tools must be a list of {type: function, function: {name, ...}} objects", param="tools")
        for j, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if (not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]
                    or tool.get("type", "function") != "function"):
                raise bad_request(f"tools[{j}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}",
                                  param="tools")
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise bad_request(f"tools[{j}].function.parameters must be a JSON schema object", param="tools")
            if fn.get("description") is not None and not isinstance(fn["description"], str):
                raise bad_request(f"tools[{j}].function.description must be a string", param="tools")
        tools = [dict(t) for t in tools] or None
    choice = body.get("tool_choice")
    if choice is not None:
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                raise bad_request(f"tool_choice={_short(choice)} must be 'auto', 'none', 'required' or "
                                  "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
        elif isinstance(choice, dict):
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str):
                raise bad_request("tool_choice object must be {'type': 'function', 'function': {'name': ...}}",
                                  param="tool_choice")
            if not tools or name not in {t["function"]["name"] for t in tools}:
                raise bad_request(f"tool_choice names function {name!r}, which is not in tools", param="tool_choice")
        else:
            raise bad_request(f"tool_choice has the wrong type ({type(choice).__name__})", param="tool_choice")
    if choice == "none":
        tools = None
    return tools, choice


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    """Validate an OpenAI chat-completions body; raises GatewayHTTPError(400) naming the bad field."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects", param="messages")
    msgs = [normalise_message(i, m) for i, m in enumerate(messages)]

    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"model={_short(model)} must be a string", param="model")

    def opt_bool(name: str) -> bool:
        v = body.get(name)
        if v is None:
            return False
        if not isinstance(v, bool):
            raise bad_request(f"{name}={_short(v)} must be true or false", param=name)
        return v

    stream = opt_bool("stream")
    include_usage = False
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad_request("stream_options must be an object", param="stream_options")
        inc = so.get("include_usage")
        if inc is not None and not isinstance(inc, bool):
            raise bad_request("stream_options.include_usage must be true or false", param="stream_options")
        include_usage = bool(inc)

    max_tokens = body.get("max_completion_tokens")
    mt_name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, mt_name = body.get("max_tokens"), "max_tokens"
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens <= 0):
        raise bad_request(f"{mt_name}={_short(max_tokens)} must be a positive integer", param=mt_name)

    temperature = body.get("temperature")
    if temperature is not None and (not _is_number(temperature) or not 0 <= temperature <= 2):
        raise bad_request(f"temperature={_short(temperature)} must be a number in [0, 2]", param="temperature")
    top_p = body.get("top_p")
    if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
        raise bad_request(f"top_p={_short(top_p)} must be a number in (0, 1]", param="top_p")
    for name in ("frequency_penalty", "presence_penalty"):
        v = body.get(name)
        if v is None:
            continue
        if not _is_number(v) or not -2 <= v <= 2:
            raise bad_request(f"{name}={_short(v)} must be a number in [-2, 2]", param=name)
        if v != 0:
            raise bad_request(f"{name}={v} is not supported by the gateway (the rollout log-probs must be the "
                              "policy's own); send 0 or leave it out", param=name)
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad_request(f"n={_short(n)} is not supported; the gateway returns one choice (n=1)", param="n")

    stop_raw = body.get("stop")
    if stop_raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,) if stop_raw else ()
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        if len(stop_raw) > MAX_STOP_SEQUENCES:
            raise bad_request(f"stop has {len(stop_raw)} sequences; at most {MAX_STOP_SEQUENCES} are allowed",
                              param="stop")
        stop = tuple(s for s in stop_raw if s)
    else:
        raise bad_request("stop must be a string or a list of strings", param="stop")

    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -(2 ** 63) <= seed < 2 ** 63):
        raise bad_request(f"seed={_short(seed)} must be a 64-bit integer", param="seed")

    logprobs = opt_bool("logprobs")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is None:
        top_logprobs = 0
    elif not _is_int(top_logprobs) or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise bad_request(f"top_logprobs={_short(top_logprobs)} must be an integer in [0, {MAX_TOP_LOGPROBS}]",
                          param="top_logprobs")
    if top_logprobs and not logprobs:
        raise bad_request("top_logprobs requires logprobs=true", param="top_logprobs")

    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") != "text":
            raise bad_request("response_format other than {'type': 'text'} (constrained decoding) is not supported "
                              "by the gateway", param="response_format")
    ptc = body.get("parallel_tool_calls")
    if ptc is not None and not isinstance(ptc, bool):
        raise bad_request("parallel_tool_calls must be true or false", param="parallel_tool_calls")

    tools, tool_choice = _parse_tools(body)
    ctk = body.get("chat_template_kwargs")
    if ctk is None:
        ctk = {}
    if not isinstance(ctk, dict):
        raise bad_request("chat_template_kwargs must be an object", param="chat_template_kwargs")
    reserved = {"messages", "tools", "add_generation_prompt", "tokenize", "chat_template"} & set(ctk)
    if reserved:
        raise bad_request(f"chat_template_kwargs may not set {sorted(reserved)}", param="chat_template_kwargs")

    return ChatCompletionRequest(
        messages=msgs, model=model, stream=stream, include_usage=include_usage, max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p), stop=stop, seed=seed, logprobs=logprobs,
        top_logprobs=top_logprobs, tools=tools, tool_choice=tool_choice, chat_template_kwargs=dict(ctk))


# ----------------------------------------------------------------------------- responses

def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def now_s() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens),
            "total_tokens": int(prompt_tokens + completion_tokens)}


def logprobs_content(token_texts: Sequence[str], logprobs: Sequence[float],
                     top: Sequence[Sequence[tuple[float, str]]] | None) -> list[dict[str, Any]]:
    """OpenAI ``choices[].logprobs.content`` entries."""
    out = []
    for i, (tok, lp) in enumerate(zip(token_texts, logprobs)):
        tops = [] if not top or i >= len(top) else [
            {"token": t, "logprob": float(v), "bytes": list(t.encode("utf-8", "replace"))} for v, t in top[i]]
        out.append({"token": tok, "logprob": float(lp), "bytes": list(tok.encode("utf-8", "replace")),
                    "top_logprobs": tops})
    return out


def chat_completion(*, completion_id: str, created: int, model: str, content: str | None,
                    tool_calls: list[dict[str, Any]] | None, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int, logprobs: list[dict[str, Any]] | None,
                    metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    out = {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
           "choices": [{"index": 0, "message": message, "finish_reason": finish_reason,
                        "logprobs": None if logprobs is None else {"content": logprobs}}],
           "usage": usage(prompt_tokens, completion_tokens)}
    if metadata:
        out["metadata"] = metadata
    return out


def chat_chunk(*, completion_id: str, created: int, model: str, delta: dict[str, Any] | None,
               finish_reason: str | None = None, logprobs: list[dict[str, Any]] | None = None,
               usage_block: dict[str, int] | None = None, no_choices: bool = False) -> dict[str, Any]:
    choices = [] if no_choices else [{
        "index": 0, "delta": delta or {}, "finish_reason": finish_reason,
        "logprobs": None if logprobs is None else {"content": logprobs}}]
    out: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                           "model": model, "choices": choices}
    if usage_block is not None:
        out["usage"] = usage_block
    return out


def sse(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode("utf-8")


def model_list(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created,
                                        "owned_by": "openclaw_jax"}]}
