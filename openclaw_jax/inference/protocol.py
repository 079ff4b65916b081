"""The SGLang wire protocol subset of DESIGN section 8, as pure functions.

Parsing functions take the decoded JSON body and return frozen dataclasses or raise
`ProtocolError` (HTTP 400) with an SGLang-style message; building functions take engine
outputs and return the exact JSON objects SGLang sends.  Nothing here does I/O, holds
state or touches JAX, so all of it is unit-testable on its own.

Error bodies (what SGLang sends):
  * native endpoints (`/generate`, ...):      {"error": {"message": ...}}
  * OpenAI endpoints (`/v1/...`):             {"object": "error", "message": ..., "type": "BadRequestError",
                                               "param": null, "code": 400}
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from openclaw_jax.inference.types import (
    DEFAULT_MAX_NEW_TOKENS,
    GenerationSpec,
    SamplingParams,
    SequenceOutput,
)
from openclaw_jax.serving import json_safe

TokenText = Callable[[int], str]

OWNED_BY = "sglang"


class ProtocolError(ValueError):
    """A request the server must answer with an HTTP error (400 unless told otherwise)."""

    def __init__(self, message: str, *, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status


# ---------------------------------------------------------------------------------------------
# error bodies
# ---------------------------------------------------------------------------------------------
def native_error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": str(message)}}


def openai_error_body(message: str, *, err_type: str = "BadRequestError", code: int = 400,
                      param: str | None = None) -> dict[str, Any]:
    return {"object": "error", "message": str(message), "type": err_type, "param": param, "code": int(code)}


def parse_json_body(raw: bytes) -> Any:
    """Decode a request body (strict UTF-8, bounded depth, no lone surrogates); problems are a 400."""
    try:
        return json_safe.loads(raw, allow_nonfinite=True)
    except json_safe.JSONRejected as exc:
        raise ProtocolError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# small typed getters (JSON numbers: bool is not a number)
# ---------------------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_int(v: Any, name: str) -> int:
    if _is_int(v):
        return int(v)
    if isinstance(v, float) and not isinstance(v, bool) and math.isfinite(v) and v == int(v):
        return int(v)
    raise ProtocolError(f"{name} must be an integer, got {v!r}")


def _as_float(v: Any, name: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ProtocolError(f"{name} must be a number, got {v!r}")


def _as_bool(v: Any, name: str) -> bool:
    if isinstance(v, bool):
        return v
    raise ProtocolError(f"{name} must be true or false, got {v!r}")


def _as_str_list(v: Any, name: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise ProtocolError(f"{name} must be a string or a list of strings, got {v!r}")


def _as_int_list(v: Any, name: str, vocab_size: int) -> tuple[int, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ProtocolError(f"{name} must be a list of token ids, got {v!r}")
    out = []
    for t in v:
        if t is None:
            continue
        tid = _as_int(t, f"{name} entries")
        if not 0 <= tid < vocab_size:
            raise ProtocolError(f"{name} contains token id {tid} outside the vocabulary [0, {vocab_size})")
        out.append(tid)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# sampling params
# ---------------------------------------------------------------------------------------------
# SGLang SamplingParams fields the JAX engine accepts only at their neutral value.
_NEUTRAL_ONLY: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "logit_bias": None,
}
# SGLang SamplingParams fields that do not change what we generate.
_IGNORED = ("spaces_between_special_tokens", "stream_interval", "custom_params")
_SUPPORTED = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
              "skip_special_tokens", "no_stop_trim", "ignore_eos", "n", "sampling_seed")
_ALL_SAMPLING_KEYS = frozenset(_SUPPORTED) | frozenset(_NEUTRAL_ONLY) | frozenset(_IGNORED)


def parse_sampling_params(raw: Any, *, vocab_size: int, default_max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS,
                          ) -> SamplingParams:
    """SGLang `sampling_params` -> SamplingParams; ranges and messages as SGLang's `verify`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ProtocolError(f"sampling_params must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(k for k in raw if k not in _ALL_SAMPLING_KEYS)
    if unknown:
        raise ProtocolError(f"unknown sampling parameter(s) {unknown}; supported: {sorted(_ALL_SAMPLING_KEYS)}")

    def get(name, default):
        v = raw.get(name)
        return default if v is None else v

    temperature = _as_float(get("temperature", 1.0), "temperature")
    if not math.isfinite(temperature) or temperature < 0.0:
        raise ProtocolError(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = _as_float(get("top_p", 1.0), "top_p")
    if not 0.0 < top_p <= 1.0:
        raise ProtocolError(f"top_p must be in (0, 1], got {top_p}.")
    min_p = _as_float(get("min_p", 0.0), "min_p")
    if not 0.0 <= min_p <= 1.0:
        raise ProtocolError(f"min_p must be in [0, 1], got {min_p}.")
    top_k = _as_int(get("top_k", -1), "top_k")
    if top_k < 1 and top_k != -1:
        raise ProtocolError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if top_k >= vocab_size:
        top_k = -1
    max_new_raw = raw.get("max_new_tokens", "__absent__")
    if max_new_raw == "__absent__":
        max_new_tokens = default_max_new_tokens
    elif max_new_raw is None:
        max_new_tokens = None
    else:
        max_new_tokens = _as_int(max_new_raw, "max_new_tokens")
        if max_new_tokens < 0:
            raise ProtocolError(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
    n = _as_int(get("n", 1), "n")
    if n < 1:
        raise ProtocolError(f"n must be at least 1, got {n}.")
    if n > 256:
        raise ProtocolError(f"n={n} is too large; at most 256 samples per prompt")
    seed = raw.get("sampling_seed")
    if seed is not None:
        seed = _as_int(seed, "sampling_seed")
    for name, neutral in _NEUTRAL_ONLY.items():
        v = raw.get(name)
        if v is None:
            continue
        if name in ("frequency_penalty", "presence_penalty"):
            fv = _as_float(v, name)
            if not -2.0 <= fv <= 2.0:
                raise ProtocolError(f"{name} must be in [-2, 2], got {fv}.")
            if fv != neutral:
                raise ProtocolError(f"{name}={fv} is not supported by the embedded JAX engine; use 0")
        elif name == "repetition_penalty":
            fv = _as_float(v, name)
            if not 0.0 < fv <= 2.0:
                raise ProtocolError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {fv}.")
            if fv != 1.0:
                raise ProtocolError(f"repetition_penalty={fv} is not supported by the embedded JAX engine; use 1.0")
        elif name == "min_new_tokens":
            iv = _as_int(v, name)
            if iv < 0:
                raise ProtocolError(f"min_new_tokens must be in [0, max_new_tokens], got {iv}.")
            if iv != 0:
                raise ProtocolError(f"min_new_tokens={iv} is not supported by the embedded JAX engine; use 0")
        elif name == "logit_bias":
            if not isinstance(v, Mapping):
                raise ProtocolError(f"logit_bias must be an object, got {v!r}")
            if v:
                raise ProtocolError("logit_bias is not supported by the embedded JAX engine")
        else:
            raise ProtocolError(f"{name} (constrained decoding) is not supported by the embedded JAX engine")
    for name in ("skip_special_tokens", "no_stop_trim", "ignore_eos", "spaces_between_special_tokens"):
        if raw.get(name) is not None:
            _as_bool(raw[name], name)
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        stop=_as_str_list(raw.get("stop"), "stop"),
        stop_token_ids=_as_int_list(raw.get("stop_token_ids"), "stop_token_ids", vocab_size),
        skip_special_tokens=bool(get("skip_special_tokens", True)),
        no_stop_trim=bool(get("no_stop_trim", False)),
        ignore_eos=bool(get("ignore_eos", False)),
        n=n,
        sampling_seed=seed,
    )


def validate_prompt(prompt_ids: Sequence[int], sampling: SamplingParams, *, context_length: int,
                    vocab_size: int) -> None:
    """Length and vocabulary checks of a tokenized prompt (SGLang `_validate_one_request`)."""
    n = len(prompt_ids)
    if n == 0:
        raise ProtocolError("the prompt is empty: input_ids (or the tokenized text) needs at least one token")
    if n >= context_length:
        raise ProtocolError(f"The input ({n} tokens) is longer than the model's context length "
                            f"({context_length} tokens).")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise ProtocolError(f"The input_ids contain values outside the vocabulary [0, {vocab_size}): {bad[:8]}")
    if sampling.max_new_tokens is not None and n + sampling.max_new_tokens > context_length:
        raise ProtocolError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {n + sampling.max_new_tokens} tokens: {n} tokens from the input messages "
            f"and {sampling.max_new_tokens} tokens for the completion. Please reduce the number of tokens in the "
            f"input messages or the completion to fit within the limit.")


# ---------------------------------------------------------------------------------------------
# /generate
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenerateItem:
    """One prompt of a /generate request (before tokenization)."""

    text: str | None
    input_ids: tuple[int, ...] | None
    sampling: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: tuple[int, ...] | None = None
    rid: str | None = None

    def spec(self, prompt_ids: Sequence[int], sample_index: int = 0, rid: str | None = None) -> GenerationSpec:
        return GenerationSpec(prompt_ids=tuple(int(t) for t in prompt_ids), sampling=self.sampling,
                              return_logprob=self.return_logprob, logprob_start_len=self.logprob_start_len,
                              top_logprobs_num=self.top_logprobs_num, token_ids_logprob=self.token_ids_logprob,
                              rid=rid if rid is not None else self.rid, sample_index=sample_index)


@dataclass(frozen=True)
class GenerateRequest:
    items: tuple[GenerateItem, ...]
    is_batch: bool
    stream: bool
    return_text_in_logprobs: bool = False


_UNSUPPORTED_GENERATE_FIELDS = ("input_embeds", "image_data", "video_data", "audio_data", "lora_path",
                                "session_params", "custom_logit_processor")


def _per_item(value: Any, n_items: int, is_batch: bool, name: str, *, list_is_scalar: bool = False) -> list[Any]:
    """SGLang lets batch requests give a field once or as one value per prompt."""
    if is_batch and isinstance(value, list) and not list_is_scalar:
        if len(value) != n_items:
            raise ProtocolError(f"{name} has {len(value)} entries for a batch of {n_items} prompts")
        return list(value)
    if is_batch and list_is_scalar and isinstance(value, list) and value and isinstance(value[0], (list, type(None))):
        if len(value) != n_items:
            raise ProtocolError(f"{name} has {len(value)} entries for a batch of {n_items} prompts")
        return list(value)
    return [value] * n_items


def parse_generate_request(body: Any, *, vocab_size: int) -> GenerateRequest:
    if not isinstance(body, Mapping):
        raise ProtocolError(f"the /generate body must be a JSON object, got {type(body).__name__}")
    for name in _UNSUPPORTED_GENERATE_FIELDS:
        if body.get(name) is not None:
            raise ProtocolError(f"{name} is not supported by the embedded JAX server")
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise ProtocolError("Either text, input_ids or input_embeds should be provided.")
    prompts_text: list[str | None]
    prompts_ids: list[tuple[int, ...] | None]
    if text is not None:
        if isinstance(text, str):
            is_batch, prompts_text = False, [text]
        elif isinstance(text, list) and all(isinstance(t, str) for t in text):
            if not text:
                raise ProtocolError("text is an empty list; send at least one prompt")
            is_batch, prompts_text = True, list(text)
        else:
            raise ProtocolError("text must be a string or a list of strings")
        prompts_ids = [None] * len(prompts_text)
    else:
        if not isinstance(input_ids, list) or not input_ids:
            raise ProtocolError("input_ids must be a non-empty list of token ids (or a list of such lists)")
        if all(isinstance(x, list) for x in input_ids):
            is_batch = True
            prompts_ids = [tuple(_as_int(t, "input_ids entries") for t in p) for p in input_ids]
        elif any(isinstance(x, list) for x in input_ids):
            raise ProtocolError("input_ids mixes token ids and lists; send list[int] or list[list[int]]")
        else:
            is_batch = False
            prompts_ids = [tuple(_as_int(t, "input_ids entries") for t in input_ids)]
        for p in prompts_ids:
            if not p:
                raise ProtocolError("input_ids contains an empty prompt; every prompt needs at least one token")
            bad = [t for t in p if not 0 <= t < vocab_size]
            if bad:
                raise ProtocolError(f"The input_ids contain values outside the vocabulary [0, {vocab_size}): "
                                    f"{bad[:8]}")
        prompts_text = [None] * len(prompts_ids)
    n_items = len(prompts_text)

    sampling_raw = body.get("sampling_params")
    if is_batch and isinstance(sampling_raw, list):
        if len(sampling_raw) != n_items:
            raise ProtocolError(f"sampling_params has {len(sampling_raw)} entries for a batch of {n_items} prompts")
        samplings = [parse_sampling_params(s, vocab_size=vocab_size) for s in sampling_raw]
    else:
        samplings = [parse_sampling_params(sampling_raw, vocab_size=vocab_size)] * n_items

    return_logprob = _per_item(body.get("return_logprob", False), n_items, is_batch, "return_logprob")
    start_lens = _per_item(body.get("logprob_start_len", -1), n_items, is_batch, "logprob_start_len")
    top_nums = _per_item(body.get("top_logprobs_num", 0), n_items, is_batch, "top_logprobs_num")
    token_ids_lp = _per_item(body.get("token_ids_logprob"), n_items, is_batch, "token_ids_logprob",
                             list_is_scalar=True)
    rids = _per_item(body.get("rid"), n_items, is_batch, "rid")
    stream = body.get("stream", False)
    stream = False if stream is None else _as_bool(stream, "stream")
    rtl = body.get("return_text_in_logprobs", False)
    rtl = False if rtl is None else _as_bool(rtl, "return_text_in_logprobs")

    items = []
    for i in range(n_items):
        rl = return_logprob[i]
        rl = False if rl is None else _as_bool(rl, "return_logprob")
        sl = -1 if start_lens[i] is None else _as_int(start_lens[i], "logprob_start_len")
        if sl < -1:
            raise ProtocolError(f"logprob_start_len must be -1 (output only) or >= 0, got {sl}")
        tn = 0 if top_nums[i] is None else _as_int(top_nums[i], "top_logprobs_num")
        if tn < 0:
            raise ProtocolError(f"top_logprobs_num must be >= 0, got {tn}")
        tn = min(tn, vocab_size)
        tids = token_ids_lp[i]
        tids = None if tids is None else _as_int_list(tids, "token_ids_logprob", vocab_size)
        rid = rids[i]
        if rid is not None and not isinstance(rid, str):
            raise ProtocolError(f"rid must be a string, got {rid!r}")
        items.append(GenerateItem(text=prompts_text[i], input_ids=prompts_ids[i], sampling=samplings[i],
                                  return_logprob=rl, logprob_start_len=sl, top_logprobs_num=tn,
                                  token_ids_logprob=tids, rid=rid))
    return GenerateRequest(items=tuple(items), is_batch=is_batch, stream=stream, return_text_in_logprobs=rtl)


def _entry(lp: float | None, tid: int, token_text: TokenText | None) -> list[Any]:
    return [None if lp is None else float(lp), int(tid), None if token_text is None else token_text(int(tid))]


def logprob_entries(values: Sequence[float | None], ids: Sequence[int],
                    token_text: TokenText | None = None) -> list[list[Any]]:
    """[[logprob, token_id, text|null], ...] (SGLang `output_token_logprobs`)."""
    return [_entry(lp, tid, token_text) for lp, tid in zip(values, ids)]


def top_logprob_entries(positions: Sequence[Sequence[tuple[float, int]] | None],
                        token_text: TokenText | None = None) -> list[list[list[Any]] | None]:
    """Per position [[logprob, token_id, text|null], ...] or null (SGLang `output_top_logprobs`)."""
    return [None if pos is None else [_entry(lp, tid, token_text) for lp, tid in pos] for pos in positions]


def build_generate_response(out: SequenceOutput, spec: GenerationSpec, *, return_text_in_logprobs: bool = False,
                            token_text: TokenText | None = None, now: float | None = None,
                            index: int | None = None) -> dict[str, Any]:
    """The `/generate` response object for one sequence (also each streamed chunk)."""
    now = time.time() if now is None else now
    text_fn = token_text if return_text_in_logprobs else None
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": len(out.prompt_ids),
        "weight_version": out.weight_version,
        "weight_versions": [dict(span) for span in out.weight_versions],
        "completion_tokens": len(out.output_ids),
        "cached_tokens": out.cached_tokens,
        "e2e_latency": max(0.0, (out.finished_time or now) - out.created_time),
    }
    if spec.return_logprob or spec.top_logprobs_num > 0 or spec.logprob_start_len >= 0:
        start = max(spec.logprob_start_len, 0)
        input_ids = out.prompt_ids[start:] if spec.logprob_start_len >= 0 else []
        meta["input_token_logprobs"] = logprob_entries(out.input_logprobs or [], input_ids, text_fn)
        meta["output_token_logprobs"] = logprob_entries(out.output_logprobs, out.output_ids, text_fn)
        if spec.top_logprobs_num > 0:
            meta["input_top_logprobs"] = top_logprob_entries(out.input_top_logprobs or [], text_fn)
            meta["output_top_logprobs"] = top_logprob_entries(out.output_top_logprobs, text_fn)
        if spec.token_ids_logprob is not None:
            meta["input_token_ids_logprobs"] = top_logprob_entries(out.input_token_ids_logprobs or [], text_fn)
            meta["output_token_ids_logprobs"] = top_logprob_entries(out.output_token_ids_logprobs, text_fn)
    body: dict[str, Any] = {"text": out.text, "output_ids": list(out.output_ids), "meta_info": meta}
    if index is not None:
        body["index"] = index
    return body


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible endpoints
# ---------------------------------------------------------------------------------------------
def usage_info(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": int(prompt_tokens), "total_tokens": int(prompt_tokens + completion_tokens),
            "completion_tokens": int(completion_tokens), "prompt_tokens_details": None, "reasoning_tokens": 0}


def _openai_sampling(body: Mapping, *, vocab_size: int, max_new_tokens: int | None,
                     top_k_default: int = -1) -> SamplingParams:
    """OpenAI request fields -> SGLang sampling_params (as SGLang's `to_sampling_params`)."""
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            _as_float(body[name], name)
    sp: dict[str, Any] = {
        "temperature": body.get("temperature"),
        "max_new_tokens": max_new_tokens,
        "stop": body.get("stop"),
        "stop_token_ids": body.get("stop_token_ids"),
        "top_p": body.get("top_p"),
        "top_k": body.get("top_k", top_k_default),
        "min_p": body.get("min_p"),
        "n": body.get("n", 1),
        "no_stop_trim": body.get("no_stop_trim"),
        "ignore_eos": body.get("ignore_eos"),
        "skip_special_tokens": body.get("skip_special_tokens"),
        "sampling_seed": body.get("seed"),
        "frequency_penalty": body.get("frequency_penalty"),
        "presence_penalty": body.get("presence_penalty"),
        "repetition_penalty": body.get("repetition_penalty"),
        "min_new_tokens": body.get("min_tokens"),
        "logit_bias": body.get("logit_bias"),
        "regex": body.get("regex"),
        "ebnf": body.get("ebnf"),
        "json_schema": body.get("json_schema"),
    }
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, Mapping) or rf.get("type") not in ("text", "json_object", "json_schema",
                                                                 "structural_tag"):
            raise ProtocolError(f"response_format must be an object with type text|json_object|json_schema, got {rf!r}")
        if rf.get("type") != "text":
            raise ProtocolError(f"response_format type {rf.get('type')!r} (constrained decoding) is not supported "
                                f"by the embedded JAX engine")
    return parse_sampling_params({k: v for k, v in sp.items() if v is not None or k == "max_new_tokens"},
                                 vocab_size=vocab_size)


def _stream_options(body: Mapping) -> tuple[bool, bool]:
    so = body.get("stream_options")
    if so is None:
        return False, False
    if not isinstance(so, Mapping):
        raise ProtocolError(f"stream_options must be an object, got {so!r}")
    inc = so.get("include_usage")
    cont = so.get("continuous_usage_stats")
    return (bool(_as_bool(inc, "stream_options.include_usage")) if inc is not None else False,
            bool(_as_bool(cont, "stream_options.continuous_usage_stats")) if cont is not None else False)


def _optional_bool(body: Mapping, name: str, default: bool) -> bool:
    v = body.get(name)
    return default if v is None else _as_bool(v, name)


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    model: str
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "none"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    input_ids: tuple[int, ...] | None = None
    rid: str | None = None
    continue_final_message: bool = False


_MESSAGE_ROLES = ("system", "user", "assistant", "tool", "function", "developer")


def _normalize_message(i: int, msg: Any) -> dict[str, Any]:
    if not isinstance(msg, Mapping):
        raise ProtocolError(f"messages[{i}] must be an object, got {type(msg).__name__}")
    role = msg.get("role")
    if not isinstance(role, str) or role.lower() not in _MESSAGE_ROLES:
        raise ProtocolError(f"messages[{i}].role must be one of {_MESSAGE_ROLES}, got {role!r}")
    out = dict(msg)
    out["role"] = role.lower()
    content = msg.get("content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ProtocolError(f"messages[{i}].content[{j}] must be a text part "
                                    f"({{'type': 'text', 'text': ...}}); this server is text-only")
        out["content"] = "\n".join(parts) if role.lower() != "tool" else " ".join(parts)
    elif content is None:
        if out["role"] == "user":
            raise ProtocolError(f"messages[{i}] (role user) needs a content string")
        out["content"] = None
    elif not isinstance(content, str):
        raise ProtocolError(f"messages[{i}].content must be a string, a list of text parts or null")
    tool_calls = msg.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise ProtocolError(f"messages[{i}].tool_calls must be a list")
        fixed = []
        for j, call in enumerate(tool_calls):
            if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
                raise ProtocolError(f"messages[{i}].tool_calls[{j}] must be an object with a function object")
            fn = dict(call["function"])
            args = fn.get("arguments")
            if isinstance(args, str):
                # Chat templates render arguments as a mapping (as SGLang does before templating).
                try:
                    args = json_safe.loads(args, what="function.arguments") if args.strip() else {}
                except json_safe.JSONRejected as exc:
                    raise ProtocolError(f"Assistant tool call function.arguments must be valid JSON: {exc}") from None
                if not isinstance(args, dict):
                    raise ProtocolError("Assistant tool call function.arguments must be a JSON object.")
                fn["arguments"] = args
            fixed.append({**call, "function": fn})
        out["tool_calls"] = fixed
    return out


def _parse_tools(body: Mapping) -> tuple[list[dict[str, Any]] | None, Any]:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ProtocolError("tools must be a list of {type: function, function: {...}} objects")
        for j, tool in enumerate(tools):
            if (not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping)
                    or not isinstance(tool["function"].get("name"), str)):
                raise ProtocolError(f"tools[{j}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
        tools = [dict(t) for t in tools]
    tool_choice = body.get("tool_choice")
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "required", "none"):
            raise ProtocolError(f"tool_choice must be 'auto', 'required', 'none' or a function choice, "
                                f"got {tool_choice!r}")
    elif isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice.get("function"),
                                                                             Mapping) else None
        if not isinstance(name, str):
            raise ProtocolError("tool_choice object must be {'type': 'function', 'function': {'name': ...}}")
        if not tools or name not in {t["function"]["name"] for t in tools}:
            raise ProtocolError(f"Tool '{name}' not found in 'tools'.")
    else:
        raise ProtocolError(f"tool_choice has the wrong type: {tool_choice!r}")
    if tool_choice != "none" and tool_choice != "auto" and not tools:
        raise ProtocolError("tool_choice requires tools")
    return tools, tool_choice


def parse_chat_request(body: Any, *, vocab_size: int) -> ChatRequest:
    if not isinstance(body, Mapping):
        raise ProtocolError(f"the request body must be a JSON object, got {type(body).__name__}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("messages must be a non-empty list of {role, content} objects")
    msgs = [_normalize_message(i, m) for i, m in enumerate(messages)]
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise ProtocolError(f"model must be a string, got {model!r}")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        max_tokens = _as_int(max_tokens, "max_tokens")
        if max_tokens <= 0:
            raise ProtocolError(f"max_tokens must be positive, got {max_tokens}")
    sampling = _openai_sampling(body, vocab_size=vocab_size, max_new_tokens=max_tokens)
    logprobs = _optional_bool(body, "logprobs", False)
    top_logprobs = body.get("top_logprobs")
    top_logprobs = 0 if top_logprobs is None else _as_int(top_logprobs, "top_logprobs")
    if top_logprobs < 0:
        raise ProtocolError(f"top_logprobs must be >= 0, got {top_logprobs}")
    if top_logprobs > 0 and not logprobs:
        raise ProtocolError("top_logprobs requires logprobs to be true")
    tools, tool_choice = _parse_tools(body)
    ctk = body.get("chat_template_kwargs") or {}
    if not isinstance(ctk, Mapping):
        raise ProtocolError(f"chat_template_kwargs must be an object, got {ctk!r}")
    input_ids = body.get("input_ids")
    if input_ids is not None:
        if not isinstance(input_ids, list) or not input_ids:
            raise ProtocolError("input_ids must be a non-empty list of token ids")
        input_ids = tuple(_as_int(t, "input_ids entries") for t in input_ids)
    include_usage, continuous = _stream_options(body)
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(f"rid must be a string, got {rid!r}")
    return ChatRequest(messages=msgs, model=model, sampling=sampling,
                       stream=_optional_bool(body, "stream", False), include_usage=include_usage,
                       continuous_usage_stats=continuous, logprobs=logprobs,
                       top_logprobs=min(top_logprobs, vocab_size) if logprobs else 0,
                       tools=tools, tool_choice=tool_choice, chat_template_kwargs=dict(ctk), input_ids=input_ids,
                       rid=rid, continue_final_message=_optional_bool(body, "continue_final_message", False))


@dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple[str | tuple[int, ...], ...]
    model: str
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    logprobs: int | None = None
    echo: bool = False
    rid: str | None = None


def parse_completion_request(body: Any, *, vocab_size: int) -> CompletionRequest:
    if not isinstance(body, Mapping):
        raise ProtocolError(f"the request body must be a JSON object, got {type(body).__name__}")
    prompt = body.get("prompt")
    prompts: list[str | tuple[int, ...]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(_is_int(p) for p in prompt):
        prompts = [tuple(int(p) for p in prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [tuple(_as_int(t, "prompt token ids") for t in p) for p in prompt]
    elif prompt is None:
        raise ProtocolError("prompt is required (a string, a list of strings, or token ids)")
    else:
        raise ProtocolError("prompt must be a string, a list of strings, a list of token ids or a list of lists")
    if any(not p for p in prompts):
        raise ProtocolError("Prompt cannot be empty")
    for p in prompts:
        if isinstance(p, tuple):
            bad = [t for t in p if not 0 <= t < vocab_size]
            if bad:
                raise ProtocolError(f"The prompt token ids contain values outside the vocabulary "
                                    f"[0, {vocab_size}): {bad[:8]}")
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise ProtocolError(f"model must be a string, got {model!r}")
    max_tokens = body.get("max_tokens", 16)
    max_tokens = 16 if max_tokens is None else _as_int(max_tokens, "max_tokens")
    if max_tokens <= 0:
        raise ProtocolError("max_tokens must be positive")
    sampling = _openai_sampling(body, vocab_size=vocab_size, max_new_tokens=max_tokens)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _as_int(logprobs, "logprobs")
        if logprobs < 0:
            raise ProtocolError(f"logprobs must be >= 0, got {logprobs}")
        logprobs = min(logprobs, vocab_size)
    if body.get("suffix") is not None:
        raise ProtocolError("suffix is not supported")
    if body.get("best_of") not in (None, 1):
        raise ProtocolError("best_of is not supported; use n")
    include_usage, continuous = _stream_options(body)
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(f"rid must be a string, got {rid!r}")
    return CompletionRequest(prompts=tuple(prompts), model=model, sampling=sampling,
                             stream=_optional_bool(body, "stream", False), include_usage=include_usage,
                             continuous_usage_stats=continuous, logprobs=logprobs,
                             echo=_optional_bool(body, "echo", False), rid=rid)


# --- OpenAI response builders -------------------------------------------------------------------
def new_request_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def _token_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_logprobs(output_ids: Sequence[int], output_logprobs: Sequence[float],
                  output_top: Sequence[Sequence[tuple[float, int]]] | None, token_text: TokenText) -> dict[str, Any]:
    """OpenAI chat `logprobs` object: {"content": [{token, bytes, logprob, top_logprobs}, ...]}."""
    content = []
    for i, (tid, lp) in enumerate(zip(output_ids, output_logprobs)):
        tok = token_text(int(tid))
        tops = []
        if output_top:
            for tlp, ttid in (output_top[i] if i < len(output_top) else []):
                ttok = token_text(int(ttid))
                tops.append({"token": ttok, "bytes": _token_bytes(ttok), "logprob": float(tlp)})
        content.append({"token": tok, "bytes": _token_bytes(tok), "logprob": float(lp), "top_logprobs": tops})
    return {"content": content}


def completion_logprobs(ids: Sequence[int], logprobs: Sequence[float | None],
                        tops: Sequence[Sequence[tuple[float, int]] | None] | None,
                        token_text: TokenText) -> dict[str, Any]:
    """OpenAI completions `logprobs` object (SGLang `to_openai_style_logprobs`)."""
    out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for tid, lp in zip(ids, logprobs):
        out["tokens"].append(token_text(int(tid)))
        out["token_logprobs"].append(None if lp is None else float(lp))
        out["text_offset"].append(-1)
    if tops is not None:
        for pos in tops:
            out["top_logprobs"].append(None if pos is None else {token_text(int(t)): float(v) for v, t in pos})
    return out


def chat_message(content: str, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"role": "assistant", "content": content if content else "", "reasoning_content": None,
            "tool_calls": tool_calls}


def openai_finish(finish_reason: Mapping[str, Any] | None) -> tuple[str | None, Any]:
    """(finish_reason type, matched_stop) for OpenAI choices."""
    if not finish_reason:
        return None, None
    return finish_reason.get("type"), finish_reason.get("matched") if "matched" in finish_reason else None


def build_chat_response(*, request_id: str, model: str, created: int, choices: list[dict[str, Any]],
                        usage: dict[str, Any], weight_version: str | None) -> dict[str, Any]:
    return {"id": request_id, "object": "chat.completion", "created": int(created), "model": model,
            "choices": choices, "usage": usage, "metadata": {"weight_version": weight_version}}


def chat_choice(index: int, message: dict[str, Any], *, finish_reason: str | None, matched_stop: Any,
                logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
            "matched_stop": matched_stop}


def chat_chunk(*, request_id: str, model: str, created: int, index: int, delta: dict[str, Any] | None = None,
               finish_reason: str | None = None, matched_stop: Any = None, logprobs: dict[str, Any] | None = None,
               usage: dict[str, Any] | None = None, empty_choices: bool = False) -> dict[str, Any]:
    choices = [] if empty_choices else [{
        "index": index,
        "delta": {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **(delta or {})},
        "logprobs": logprobs, "finish_reason": finish_reason, "matched_stop": matched_stop}]
    return {"id": request_id, "object": "chat.completion.chunk", "created": int(created), "model": model,
            "choices": choices, "usage": usage}


def completion_choice(index: int, text: str, *, finish_reason: str | None, matched_stop: Any,
                      logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "matched_stop": matched_stop}


def build_completion_response(*, request_id: str, model: str, created: int, choices: list[dict[str, Any]],
                              usage: dict[str, Any], weight_version: str | None) -> dict[str, Any]:
    return {"id": request_id, "object": "text_completion", "created": int(created), "model": model,
            "choices": choices, "usage": usage, "metadata": {"weight_version": weight_version}}


def completion_chunk(*, request_id: str, model: str, created: int, choices: list[dict[str, Any]],
                     usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": request_id, "object": "text_completion", "created": int(created), "model": model,
            "choices": choices, "usage": usage}


def model_list(served_model_name: str, context_length: int, created: int | None = None) -> dict[str, Any]:
    created = int(time.time()) if created is None else int(created)
    return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": created,
                                        "owned_by": OWNED_BY, "root": served_model_name, "parent": None,
                                        "max_model_len": int(context_length)}]}


def model_info(*, model_path: str, tokenizer_path: str | None, weight_version: str | None) -> dict[str, Any]:
    return {"model_path": model_path, "tokenizer_path": tokenizer_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": weight_version}


# ---------------------------------------------------------------------------------------------
# weight updates / control
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpdateWeightsRequest:
    model_path: str
    load_format: str | None = None
    weight_version: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False


def parse_update_weights_request(body: Any) -> UpdateWeightsRequest:
    if not isinstance(body, Mapping):
        raise ProtocolError("the /update_weights_from_disk body must be a JSON object with model_path")
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        raise ProtocolError("model_path must be a non-empty string (an HF safetensors directory)")
    lf = body.get("load_format")
    if lf is not None and not isinstance(lf, str):
        raise ProtocolError(f"load_format must be a string, got {lf!r}")
    wv = body.get("weight_version")
    if wv is not None and not isinstance(wv, (str, int)):
        raise ProtocolError(f"weight_version must be a string, got {wv!r}")
    return UpdateWeightsRequest(model_path=path, load_format=lf, weight_version=None if wv is None else str(wv),
                                flush_cache=_optional_bool(body, "flush_cache", True),
                                abort_all_requests=_optional_bool(body, "abort_all_requests", False))


def update_weights_body(success: bool, message: str, num_paused_requests: int = 0) -> dict[str, Any]:
    return {"success": bool(success), "message": str(message), "num_paused_requests": int(num_paused_requests)}


def with_sampling(spec: GenerationSpec, **changes: Any) -> GenerationSpec:
    return replace(spec, sampling=replace(spec.sampling, **changes))
