"""What is the gateway's own in its OpenAI protocol: session headers and the gateway's limits.

The OpenAI wire format itself (messages, tools, responses, chunks, SSE, error bodies) is
:mod:`openclaw_jax.wire.openai`. Here: the session fields (``X-Session-Id``, ``X-Turn-Type``,
``X-Session-Done`` or their body twins), the chat request as the gateway accepts it (only what
keeps the rollout log-probs the policy's own: no penalties, n=1, text output, tool_choice auto or
none; fields that cannot change the reply, such as OpenClaw's ``store: false``, are accepted; any
other field is refused with a 400 naming it), and
`GatewayHTTPError`, rendered as OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
Pure functions, no I/O.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from openclaw_jax.pool.client import NoHealthyWorkerError, RequestRejectedError, WorkerUnavailableError
from openclaw_jax.wire import openai as O
from openclaw_jax.wire.errors import WireError, with_context_advice
from openclaw_jax.wire.images import DEFAULT_LIMITS, ImageInput, ImageLimits, extract_images
from openclaw_jax.wire.openai import short as _short
from openclaw_jax.wire.fields import optional_bool

TURN_TYPES = ("main", "side")
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})
MAX_SESSION_ID_CHARS = 256
MAX_STOP_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20


class GatewayHTTPError(Exception):
    """An error answered to the client as an OpenAI-shaped JSON body with HTTP ``status``."""

    def __init__(self, status: int, message: str, *, err_type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.err_type = err_type or O.error_type(self.status)
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.close = close   # also end the connection after answering

    def body(self) -> dict[str, Any]:
        return O.error_body(self.message, err_type=self.err_type, param=self.param, code=self.code)

    @classmethod
    def of(cls, err: WireError) -> "GatewayHTTPError":
        return cls(err.status, err.message, param=err.param)


def bad_request(message: str, param: str | None = None) -> GatewayHTTPError:
    return GatewayHTTPError(400, message, param=param)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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
    # The request's images in prompt order (data-URL image_url parts); each message that had some
    # holds their placeholders in its text (`wire.images.extract_images`).
    images: tuple[ImageInput, ...] = ()


def _number(body: Mapping[str, Any], name: str, ok, bounds: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_number(v) or not ok(v):
        raise bad_request(f"{name}={_short(v)} must be a number in {bounds}", param=name)
    return float(v)


def _check_policy_own(body: Mapping[str, Any]) -> None:
    """What would make the rollout log-probs other than the policy's own is refused."""
    for name in ("frequency_penalty", "presence_penalty"):
        v = _number(body, name, lambda x: -2 <= x <= 2, "[-2, 2]")
        if v:
            raise bad_request(f"{name}={v:g} is not supported by the gateway (the rollout log-probs must be the "
                              "policy's own); send 0 or leave it out", param=name)
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request(f"n={_short(n)} is not supported; the gateway returns one choice (n=1)", param="n")
    ptc = body.get("parallel_tool_calls")
    if ptc is not None and not isinstance(ptc, bool):
        raise bad_request("parallel_tool_calls must be true or false", param="parallel_tool_calls")
    if ptc is False:
        raise bad_request("parallel_tool_calls=false cannot be enforced (the policy may call several tools in one "
                          "reply); send true or leave it out", param="parallel_tool_calls")


# Every top-level field the gateway takes. Each is honoured (read below), or accepted because it
# cannot change the reply (`_check_no_effect_fields`); any other field is refused with a 400 that
# names it, so that nothing which would change sampling is dropped in silence (OpenAI also
# refuses unknown arguments). OpenClaw 2026.9.6 sends model, messages, stream, stream_options,
# tools, tool_choice and max_completion_tokens; with some provider settings also store (false),
# prompt_cache_key, temperature, top_p, stop, seed, response_format.
HONOURED_FIELDS = frozenset({
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "stop", "seed", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "n",
    "frequency_penalty", "presence_penalty", "response_format", "chat_template_kwargs",
    "session_id", "turn_type", "session_done"})
NO_EFFECT_FIELDS = frozenset({"store", "prompt_cache_key", "prompt_cache_retention", "user", "metadata",
                              "tool_stream"})
_REFUSAL_ADVICE = {
    "reasoning_effort": "the served model has no reasoning mode; in openclaw.json set \"reasoning\": false on the "
                        "model entry of the provider",
    "reasoning": "the served model has no reasoning mode; in openclaw.json set \"reasoning\": false",
    "thinking": "the served model has no reasoning mode; in openclaw.json set \"reasoning\": false",
    "enable_thinking": "pass it as chat_template_kwargs.enable_thinking if the model's chat template reads it",
}


def _check_fields(body: Mapping[str, Any]) -> None:
    unknown = sorted(k for k in body if k not in HONOURED_FIELDS and k not in NO_EFFECT_FIELDS)
    if not unknown:
        return
    first = unknown[0]
    advice = _REFUSAL_ADVICE.get(first, "the gateway serves the policy's own sampling only (temperature, top_p, "
                                        "max tokens, stop, seed); remove the field")
    raise bad_request(f"unsupported field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: {advice}",
                      param=first)


def _check_no_effect_fields(body: Mapping[str, Any]) -> None:
    """Fields accepted because they cannot change the reply; each still has to be well-formed."""
    if body.get("store") not in (None, False):
        raise bad_request(f"store={_short(body['store'])}: OpenAI's stored completions are not served (the gateway "
                          "records main turns for training by itself); send false or leave it out", param="store")
    for name in ("prompt_cache_key", "prompt_cache_retention", "user"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise bad_request(f"{name}={_short(body[name])} must be a string", param=name)
    meta = body.get("metadata")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise bad_request(f"metadata={_short(meta)} must be an object of strings", param="metadata")
    optional_bool(body, "tool_stream", False)


def parse_agent_chat_request(body: Any, image_limits: ImageLimits = DEFAULT_LIMITS) -> ChatCompletionRequest:
    """Validate an agent's OpenAI chat-completions body, strictly (fields without effect and the
    policy's own settings are refused; unlike the inference server's lenient
    `inference.protocol.parse_chat_request`); raises GatewayHTTPError(400) naming the bad field."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    _check_fields(body)
    try:
        _check_no_effect_fields(body)
        raw_messages, images = extract_images(body.get("messages"), image_limits)
        msgs = O.parse_messages({"messages": raw_messages}, strict=True)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise bad_request(f"model={_short(model)} must be a string", param="model")
        include_usage, _ = O.parse_stream_options(body)
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not -(2 ** 63) <= seed < 2 ** 63):
            raise bad_request(f"seed={_short(seed)} must be a 64-bit integer", param="seed")
        _check_policy_own(body)
        logprobs = optional_bool(body, "logprobs", False)
        tools, tool_choice = O.parse_tools(body)
        if tool_choice not in (None, "auto", "none"):
            raise bad_request(f"tool_choice={_short(tool_choice)} cannot be enforced (the policy samples freely, "
                              "without constrained decoding); send 'auto' or 'none'", param="tool_choice")
        O.check_response_format(body)
        return ChatCompletionRequest(
            messages=msgs, model=model, stream=optional_bool(body, "stream", False), include_usage=include_usage,
            max_tokens=O.parse_max_tokens(body),
            temperature=_number(body, "temperature", lambda x: 0 <= x <= 2, "[0, 2]"),
            top_p=_number(body, "top_p", lambda x: 0 < x <= 1, "(0, 1]"),
            stop=O.parse_stop(body, max_count=MAX_STOP_SEQUENCES), seed=seed, logprobs=logprobs,
            top_logprobs=O.parse_top_logprobs(body, logprobs, max_value=MAX_TOP_LOGPROBS),
            tools=None if tool_choice == "none" else tools, tool_choice=tool_choice,
            chat_template_kwargs=O.parse_chat_template_kwargs(body), images=tuple(images))
    except WireError as err:
        raise GatewayHTTPError.of(err) from None


def pool_error_to_http(err: BaseException, what: str = "policy pool") -> GatewayHTTPError:
    """Map a pool failure to the status the agent sees (no sample is recorded for it)."""
    if isinstance(err, NoHealthyWorkerError):
        return GatewayHTTPError(503, f"no healthy worker in the {what}: {err}", headers={"Retry-After": "1"})
    if isinstance(err, RequestRejectedError):
        if err.status in (400, 413, 422):
            # The worker refused this request itself (e.g. the prompt exceeds the context length).
            message = f"the {what} rejected the request: {err.message}"
            if "context length" in message:
                message = with_context_advice(message)
            return GatewayHTTPError(400, message)
        return GatewayHTTPError(502, f"the {what} answered HTTP {err.status}: {err.message}")
    if isinstance(err, WorkerUnavailableError):
        attempts = err.attempts
        if attempts and all("timed out" in a for a in attempts):
            return GatewayHTTPError(504, f"the {what} timed out: {err}")
        return GatewayHTTPError(502, f"the {what} failed: {err}")
    if isinstance(err, asyncio.TimeoutError):
        return GatewayHTTPError(504, f"the {what} timed out")
    return GatewayHTTPError(502, f"the {what} failed: {type(err).__name__}: {err}")
