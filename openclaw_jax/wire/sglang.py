"""SGLang's native wire protocol (DESIGN section 8), both directions.

`SamplingParams` is the typed ``sampling_params``: the embedded server parses requests into it
(`parse_sampling_params`, ranges and messages as SGLang's ``verify``) and the pool client sends it
(`SamplingParams.to_json`). `/generate` requests are built (`generate_request_body`) and parsed
(`parse_generate_request`); responses are built (`build_generate_response`) and parsed
(`parse_generate_response` -> `GenerateResult`). Weight updates, pause, model info and the native
error body (``{"error": {"message": ...}}``) are here too. Pure: no I/O, no state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Protocol, Sequence

from openclaw_jax.wire.errors import WireError

TokenText = Callable[[int], str]

# SGLang's default when `max_new_tokens` is absent from /generate's sampling_params.
DEFAULT_MAX_NEW_TOKENS = 128
PAUSE_MODES = ("abort", "retract", "in_place")
OWNED_BY = "sglang"


# ---------------------------------------------------------------------------------------------
# error bodies
# ---------------------------------------------------------------------------------------------
def native_error_body(message: str) -> dict[str, Any]:
    """The body of an error on a native endpoint (`/generate`, ...)."""
    return {"error": {"message": str(message)}}


def error_message(body: Any, fallback: str) -> str:
    """The human message out of any error body SGLang (or our servers) send: native, OpenAI, FastAPI."""
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping) and err.get("message") is not None:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message") is not None:
            return str(body["message"])
        if body.get("detail") is not None:
            return str(body["detail"])
    return fallback


# ---------------------------------------------------------------------------------------------
# typed getters (JSON numbers: bool is not a number)
# ---------------------------------------------------------------------------------------------
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def as_int(v: Any, name: str) -> int:
    if is_int(v):
        return int(v)
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return int(v)
    raise WireError(f"{name} must be an integer, got {v!r}")


def as_float(v: Any, name: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise WireError(f"{name} must be a number, got {v!r}")


def as_bool(v: Any, name: str) -> bool:
    if isinstance(v, bool):
        return v
    raise WireError(f"{name} must be true or false, got {v!r}")


def optional_bool(body: Mapping, name: str, default: bool) -> bool:
    v = body.get(name)
    return default if v is None else as_bool(v, name)


def as_str_list(v: Any, name: str, *, max_count: int | None = None) -> tuple[str, ...]:
    """A string or a list of strings (empty strings dropped), as `stop` is sent."""
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        if max_count is not None and len(v) > max_count:
            raise WireError(f"{name} has {len(v)} entries; at most {max_count} are allowed", param=name)
        return tuple(s for s in v if s)
    raise WireError(f"{name} must be a string or a list of strings, got {v!r}", param=name)


def _as_int_list(v: Any, name: str, vocab_size: int) -> tuple[int, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise WireError(f"{name} must be a list of token ids, got {v!r}")
    out = []
    for t in v:
        if t is None:
            continue
        tid = as_int(t, f"{name} entries")
        if not 0 <= tid < vocab_size:
            raise WireError(f"{name} contains token id {tid} outside the vocabulary [0, {vocab_size})")
        out.append(tid)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# sampling params
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplingParams:
    """SGLang ``sampling_params`` (the subset this project uses; defaults are SGLang's)."""

    # None = until the context is full (what SGLang does for OpenAI requests without max_tokens)
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = whole vocabulary
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    ignore_eos: bool = False
    n: int = 1
    sampling_seed: int | None = None
    # grammar-guided decoding (SGLang workers only: the embedded engine refuses it)
    regex: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6

    def to_json(self) -> dict[str, Any]:
        """The ``sampling_params`` object to send: max_new_tokens always, other fields when not default."""
        out: dict[str, Any] = {"max_new_tokens": self.max_new_tokens}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "max_new_tokens" and value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


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


def _check_neutral(name: str, v: Any) -> None:
    if name in ("frequency_penalty", "presence_penalty"):
        fv = as_float(v, name)
        if not -2.0 <= fv <= 2.0:
            raise WireError(f"{name} must be in [-2, 2], got {fv}.")
        if fv != 0.0:
            raise WireError(f"{name}={fv} is not supported by the embedded JAX engine; use 0")
    elif name == "repetition_penalty":
        fv = as_float(v, name)
        if not 0.0 < fv <= 2.0:
            raise WireError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {fv}.")
        if fv != 1.0:
            raise WireError(f"repetition_penalty={fv} is not supported by the embedded JAX engine; use 1.0")
    elif name == "min_new_tokens":
        iv = as_int(v, name)
        if iv < 0:
            raise WireError(f"min_new_tokens must be in [0, max_new_tokens], got {iv}.")
        if iv != 0:
            raise WireError(f"min_new_tokens={iv} is not supported by the embedded JAX engine; use 0")
    elif name == "logit_bias":
        if not isinstance(v, Mapping):
            raise WireError(f"logit_bias must be an object, got {v!r}")
        if v:
            raise WireError("logit_bias is not supported by the embedded JAX engine")
    else:
        raise WireError(f"{name} (constrained decoding) is not supported by the embedded JAX engine")


def parse_sampling_params(raw: Any, *, vocab_size: int, default_max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS,
                          ) -> SamplingParams:
    """SGLang `sampling_params` -> SamplingParams; ranges and messages as SGLang's `verify`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise WireError(f"sampling_params must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(k for k in raw if k not in _ALL_SAMPLING_KEYS)
    if unknown:
        raise WireError(f"unknown sampling parameter(s) {unknown}; supported: {sorted(_ALL_SAMPLING_KEYS)}")

    def get(name, default):
        v = raw.get(name)
        return default if v is None else v

    temperature = as_float(get("temperature", 1.0), "temperature")
    if not math.isfinite(temperature) or temperature < 0.0:
        raise WireError(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = as_float(get("top_p", 1.0), "top_p")
    if not 0.0 < top_p <= 1.0:
        raise WireError(f"top_p must be in (0, 1], got {top_p}.")
    min_p = as_float(get("min_p", 0.0), "min_p")
    if not 0.0 <= min_p <= 1.0:
        raise WireError(f"min_p must be in [0, 1], got {min_p}.")
    top_k = as_int(get("top_k", -1), "top_k")
    if top_k < 1 and top_k != -1:
        raise WireError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if top_k >= vocab_size:
        top_k = -1
    if "max_new_tokens" not in raw:
        max_new_tokens = default_max_new_tokens
    elif raw["max_new_tokens"] is None:
        max_new_tokens = None
    else:
        max_new_tokens = as_int(raw["max_new_tokens"], "max_new_tokens")
        if max_new_tokens < 0:
            raise WireError(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
    n = as_int(get("n", 1), "n")
    if n < 1:
        raise WireError(f"n must be at least 1, got {n}.")
    if n > 256:
        raise WireError(f"n={n} is too large; at most 256 samples per prompt")
    seed = raw.get("sampling_seed")
    if seed is not None:
        seed = as_int(seed, "sampling_seed")
    for name in _NEUTRAL_ONLY:
        if raw.get(name) is not None:
            _check_neutral(name, raw[name])
    for name in ("skip_special_tokens", "no_stop_trim", "ignore_eos", "spaces_between_special_tokens"):
        if raw.get(name) is not None:
            as_bool(raw[name], name)
    return SamplingParams(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        stop=as_str_list(raw.get("stop"), "stop"),
        stop_token_ids=_as_int_list(raw.get("stop_token_ids"), "stop_token_ids", vocab_size),
        skip_special_tokens=bool(get("skip_special_tokens", True)), no_stop_trim=bool(get("no_stop_trim", False)),
        ignore_eos=bool(get("ignore_eos", False)), n=n, sampling_seed=seed)


def sampling_params_json(params: "SamplingParams | Mapping[str, Any] | None") -> dict[str, Any]:
    """What to send as ``sampling_params``: a SamplingParams, or a raw mapping passed through."""
    if isinstance(params, SamplingParams):
        return params.to_json()
    return dict(params or {})


# ---------------------------------------------------------------------------------------------
# /generate requests
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


@dataclass(frozen=True)
class GenerateRequest:
    items: tuple[GenerateItem, ...]
    is_batch: bool
    stream: bool
    return_text_in_logprobs: bool = False


def generate_request_body(*, input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
                          text: str | Sequence[str] | None = None,
                          sampling_params: "SamplingParams | Mapping[str, Any] | None" = None,
                          return_logprob: bool = False, top_logprobs_num: int = 0, logprob_start_len: int = -1,
                          rid: str | None = None, stream: bool = False) -> dict[str, Any]:
    """The `/generate` body a client sends (one prompt, or a batch of ids/texts)."""
    if (input_ids is None) == (text is None):
        raise ValueError("pass exactly one of input_ids (list[int]) or text (str) to generate")
    payload: dict[str, Any] = {"sampling_params": sampling_params_json(sampling_params)}
    if input_ids is not None:
        payload["input_ids"] = list(input_ids)
    else:
        payload["text"] = text if isinstance(text, str) else list(text)
    if return_logprob or top_logprobs_num > 0 or logprob_start_len >= 0:
        payload["return_logprob"] = True
        payload["top_logprobs_num"] = int(top_logprobs_num)
        payload["logprob_start_len"] = int(logprob_start_len)
    if rid is not None:
        payload["rid"] = rid
    if stream:
        payload["stream"] = True
    return payload


_UNSUPPORTED_GENERATE_FIELDS = ("input_embeds", "image_data", "video_data", "audio_data", "lora_path",
                                "session_params", "custom_logit_processor")


def _per_item(value: Any, n_items: int, is_batch: bool, name: str, *, list_is_scalar: bool = False) -> list[Any]:
    """SGLang lets batch requests give a field once or as one value per prompt."""
    per_prompt = isinstance(value, list) and (
        not list_is_scalar or (bool(value) and isinstance(value[0], (list, type(None)))))
    if is_batch and per_prompt:
        if len(value) != n_items:
            raise WireError(f"{name} has {len(value)} entries for a batch of {n_items} prompts")
        return list(value)
    return [value] * n_items


def _check_vocab(ids: Sequence[int], vocab_size: int, what: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise WireError(f"The {what} contain values outside the vocabulary [0, {vocab_size}): {bad[:8]}")


def _generate_prompts(body: Mapping, vocab_size: int) -> tuple[bool, list[str | None], list[tuple[int, ...] | None]]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise WireError("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        if isinstance(text, str):
            return False, [text], [None]
        if isinstance(text, list) and all(isinstance(t, str) for t in text):
            if not text:
                raise WireError("text is an empty list; send at least one prompt")
            return True, list(text), [None] * len(text)
        raise WireError("text must be a string or a list of strings")
    if not isinstance(input_ids, list) or not input_ids:
        raise WireError("input_ids must be a non-empty list of token ids (or a list of such lists)")
    if all(isinstance(x, list) for x in input_ids):
        is_batch, prompts = True, [tuple(as_int(t, "input_ids entries") for t in p) for p in input_ids]
    elif any(isinstance(x, list) for x in input_ids):
        raise WireError("input_ids mixes token ids and lists; send list[int] or list[list[int]]")
    else:
        is_batch, prompts = False, [tuple(as_int(t, "input_ids entries") for t in input_ids)]
    for p in prompts:
        if not p:
            raise WireError("input_ids contains an empty prompt; every prompt needs at least one token")
        _check_vocab(p, vocab_size, "input_ids")
    return is_batch, [None] * len(prompts), list(prompts)


def parse_generate_request(body: Any, *, vocab_size: int) -> GenerateRequest:
    if not isinstance(body, Mapping):
        raise WireError(f"the /generate body must be a JSON object, got {type(body).__name__}")
    for name in _UNSUPPORTED_GENERATE_FIELDS:
        if body.get(name) is not None:
            raise WireError(f"{name} is not supported by the embedded JAX server")
    is_batch, prompts_text, prompts_ids = _generate_prompts(body, vocab_size)
    n_items = len(prompts_text)
    sampling_raw = body.get("sampling_params")
    samplings = [parse_sampling_params(s, vocab_size=vocab_size)
                 for s in _per_item(sampling_raw, n_items, is_batch, "sampling_params")]
    return_logprob = _per_item(body.get("return_logprob", False), n_items, is_batch, "return_logprob")
    start_lens = _per_item(body.get("logprob_start_len", -1), n_items, is_batch, "logprob_start_len")
    top_nums = _per_item(body.get("top_logprobs_num", 0), n_items, is_batch, "top_logprobs_num")
    token_ids_lp = _per_item(body.get("token_ids_logprob"), n_items, is_batch, "token_ids_logprob",
                             list_is_scalar=True)
    rids = _per_item(body.get("rid"), n_items, is_batch, "rid")
    items = []
    for i in range(n_items):
        rl = return_logprob[i]
        rl = False if rl is None else as_bool(rl, "return_logprob")
        sl = -1 if start_lens[i] is None else as_int(start_lens[i], "logprob_start_len")
        if sl < -1:
            raise WireError(f"logprob_start_len must be -1 (output only) or >= 0, got {sl}")
        tn = 0 if top_nums[i] is None else as_int(top_nums[i], "top_logprobs_num")
        if tn < 0:
            raise WireError(f"top_logprobs_num must be >= 0, got {tn}")
        tids = token_ids_lp[i]
        tids = None if tids is None else _as_int_list(tids, "token_ids_logprob", vocab_size)
        rid = rids[i]
        if rid is not None and not isinstance(rid, str):
            raise WireError(f"rid must be a string, got {rid!r}")
        items.append(GenerateItem(text=prompts_text[i], input_ids=prompts_ids[i], sampling=samplings[i],
                                  return_logprob=rl, logprob_start_len=sl, top_logprobs_num=min(tn, vocab_size),
                                  token_ids_logprob=tids, rid=rid))
    return GenerateRequest(items=tuple(items), is_batch=is_batch, stream=optional_bool(body, "stream", False),
                           return_text_in_logprobs=optional_bool(body, "return_text_in_logprobs", False))


# ---------------------------------------------------------------------------------------------
# /generate responses: built by the server ...
# ---------------------------------------------------------------------------------------------
class LogprobAsk(Protocol):
    """What a request asked for in log-probs (a GenerateItem or the engine's GenerationSpec)."""

    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    token_ids_logprob: tuple[int, ...] | None


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


def build_generate_response(out: Any, ask: LogprobAsk, *, return_text_in_logprobs: bool = False,
                            token_text: TokenText | None = None, now: float | None = None,
                            index: int | None = None) -> dict[str, Any]:
    """The `/generate` response object for one sequence (also each streamed chunk).

    ``out`` has the engine's ``SequenceOutput`` fields (rid, prompt_ids, output_ids, text, finish_reason,
    log-probs, weight versions, times, cached_tokens).
    """
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
    if ask.return_logprob or ask.top_logprobs_num > 0 or ask.logprob_start_len >= 0:
        start = max(ask.logprob_start_len, 0)
        input_ids = out.prompt_ids[start:] if ask.logprob_start_len >= 0 else []
        meta["input_token_logprobs"] = logprob_entries(out.input_logprobs or [], input_ids, text_fn)
        meta["output_token_logprobs"] = logprob_entries(out.output_logprobs, out.output_ids, text_fn)
        if ask.top_logprobs_num > 0:
            meta["input_top_logprobs"] = top_logprob_entries(out.input_top_logprobs or [], text_fn)
            meta["output_top_logprobs"] = top_logprob_entries(out.output_top_logprobs, text_fn)
        if ask.token_ids_logprob is not None:
            meta["input_token_ids_logprobs"] = top_logprob_entries(out.input_token_ids_logprobs or [], text_fn)
            meta["output_token_ids_logprobs"] = top_logprob_entries(out.output_token_ids_logprobs, text_fn)
    body: dict[str, Any] = {"text": out.text, "output_ids": list(out.output_ids), "meta_info": meta}
    if index is not None:
        body["index"] = index
    return body


# ---------------------------------------------------------------------------------------------
# ... and parsed by the client
# ---------------------------------------------------------------------------------------------
class MalformedResponse(ValueError):
    """A 200 answer whose body is not a valid SGLang response."""


class ErrorAnswer(Exception):
    """A 200 answer (or stream chunk) that carries an error body instead of a result."""

    def __init__(self, message: str, body: Any):
        super().__init__(message)
        self.message = message
        self.body = body


@dataclass(frozen=True)
class FinishReason:
    """SGLang `meta_info.finish_reason`: type is "stop", "length" or "abort"."""

    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> "FinishReason | None":
        if value is None:
            return None
        if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
            raise MalformedResponse(f"finish_reason must be an object with a string 'type', got {value!r}")
        matched = value.get("matched")
        if matched is not None and not isinstance(matched, (int, str)):
            raise MalformedResponse(f"finish_reason.matched must be an int, str or null, got {matched!r}")
        length = value.get("length")
        message = value.get("message")
        return cls(type=value["type"], matched=matched,
                   length=int(length) if isinstance(length, (int, float)) else None,
                   message=str(message) if message is not None else None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        elif self.type == "length":
            out["length"] = self.length
        elif self.type == "abort":
            out["message"] = self.message
        return out


def openai_finish(finish_reason: "Mapping[str, Any] | FinishReason | None", *,
                  has_tool_calls: bool = False) -> tuple[str | None, Any]:
    """(OpenAI finish_reason, matched_stop) of an SGLang finish reason; a stop with tool calls is "tool_calls"."""
    if not finish_reason:
        return None, None
    if isinstance(finish_reason, FinishReason):
        kind, matched = finish_reason.type, finish_reason.matched
    else:
        kind, matched = finish_reason.get("type"), finish_reason.get("matched")
    if has_tool_calls and kind == "stop":
        return "tool_calls", None
    return kind, matched


@dataclass(frozen=True)
class GenerateResult:
    """One generated sequence as returned by a worker's `/generate`."""

    text: str
    output_ids: list[int]
    output_logprobs: list[float]
    # per output position: [(logprob, token_id), ...] best first; empty lists when not requested
    output_top_logprobs: list[list[tuple[float, int]]]
    # None while a streamed generation is still running
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    # the oldest weight version that produced this response (the first of `weight_versions` when the
    # worker reports them): staleness and importance correction count from it
    weight_version: str | None
    # prompt log-probs from logprob_start_len on (the first one is None); None when log-probs were not
    # requested; [] from SGLang when only output log-probs were (logprob_start_len=-1)
    input_logprobs: list[float | None] | None
    raw: dict = field(repr=False)
    worker_url: str = ""
    # which version produced which output tokens: [{"version", "start", "end"}] (empty if not reported)
    weight_versions: list[dict] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason is not None and self.finish_reason.type == "abort"

    @property
    def last_weight_version(self) -> str | None:
        return str(self.weight_versions[-1]["version"]) if self.weight_versions else self.weight_version


def _logprob_triples(value: Any, what: str) -> list[list[Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedResponse(f"meta_info.{what} must be a list, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) < 2:
            raise MalformedResponse(f"meta_info.{what} entries must be [logprob, token_id, text], got {item!r}")
    return value


def _logprob(value: Any) -> float:
    # JSON has no -inf: SGLang (orjson) sends null for a log-prob of -inf
    return float("-inf") if value is None else float(value)


def _output_top(top_raw: Any) -> list[list[tuple[float, int]]]:
    if top_raw is None:
        return []
    if not isinstance(top_raw, list):
        raise MalformedResponse("meta_info.output_top_logprobs must be a list")
    return [[] if pos is None else [(_logprob(e[0]), int(e[1])) for e in _logprob_triples(pos, "output_top_logprobs[i]")]
            for pos in top_raw]


def _weight_spans(meta: Mapping, worker_url: str) -> list[dict]:
    spans = []
    for span in meta.get("weight_versions") or []:
        if not (isinstance(span, dict) and "version" in span):
            raise MalformedResponse(f"meta_info.weight_versions entry {span!r} from {worker_url} has no version")
        spans.append({"version": str(span["version"]), "start": int(span.get("start", 0)),
                      "end": int(span.get("end", 0))})
    return spans


def parse_generate_response(body: Any, *, worker_url: str = "", expect_logprobs: bool = False,
                            top_logprobs_num: int = 0) -> GenerateResult:
    """Parse one `/generate` response object; `MalformedResponse` on anything unexpected, `ErrorAnswer` for an
    error body.

    Fields this parser does not use are kept in `raw` and otherwise ignored: real SGLang (0.5.23) also
    sends `weight_versions`, `cached_tokens_details`, `num_retractions`, `reasoning_tokens`, `dp_rank`,
    `output_token_logprobs_length` and `response_sent_to_client_ts` (tests/fixtures/sglang holds recordings).
    """
    if not isinstance(body, Mapping):
        raise MalformedResponse(f"/generate answered {type(body).__name__}, expected a JSON object: {body!r:.200}")
    if "error" in body and "meta_info" not in body:
        raise ErrorAnswer(error_message(body, str(body)), body)
    meta = body.get("meta_info")
    if not isinstance(meta, Mapping):
        raise MalformedResponse(f"/generate response from {worker_url} has no meta_info object: {body!r:.300}")
    output_ids = body.get("output_ids")
    if output_ids is None:
        raise MalformedResponse(
            f"/generate response from {worker_url} has no output_ids; start SGLang without --skip-tokenizer-init "
            f"quirks or upgrade it (keys: {sorted(body)})")
    if not isinstance(output_ids, list) or not all(isinstance(t, int) for t in output_ids):
        raise MalformedResponse(f"output_ids must be a list of ints, got {output_ids!r:.200}")
    text = body.get("text", "")
    if not isinstance(text, str):
        raise MalformedResponse(f"text must be a string, got {type(text).__name__}")
    finish = FinishReason.from_json(meta.get("finish_reason"))

    out_lp_raw = _logprob_triples(meta.get("output_token_logprobs"), "output_token_logprobs")
    if expect_logprobs and len(out_lp_raw) != len(output_ids):
        raise MalformedResponse(
            f"asked for log-probs but got {len(out_lp_raw)} output_token_logprobs for {len(output_ids)} output ids "
            f"from {worker_url}")
    for item, tok in zip(out_lp_raw, output_ids):
        if int(item[1]) != tok:
            raise MalformedResponse(
                f"output_token_logprobs token id {item[1]} does not match output id {tok} from {worker_url}")
    output_top = _output_top(meta.get("output_top_logprobs"))
    if top_logprobs_num > 0 and expect_logprobs and len(output_top) != len(output_ids):
        raise MalformedResponse(
            f"asked for top-{top_logprobs_num} log-probs but got {len(output_top)} positions for "
            f"{len(output_ids)} output ids from {worker_url}")
    in_raw = meta.get("input_token_logprobs")
    input_logprobs = (None if in_raw is None else
                      [None if e[0] is None else float(e[0]) for e in _logprob_triples(in_raw, "input_token_logprobs")])
    weight_version = meta.get("weight_version")
    spans = _weight_spans(meta, worker_url)
    if spans:
        weight_version = spans[0]["version"]
    return GenerateResult(
        text=text, output_ids=list(output_ids), output_logprobs=[_logprob(item[0]) for item in out_lp_raw],
        output_top_logprobs=output_top, finish_reason=finish, prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        weight_version=None if weight_version is None else str(weight_version), input_logprobs=input_logprobs,
        raw=dict(body), worker_url=worker_url, weight_versions=spans)


# ---------------------------------------------------------------------------------------------
# weight updates, control, info
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpdateWeightsRequest:
    model_path: str
    load_format: str | None = None
    weight_version: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model_path": self.model_path, "flush_cache": self.flush_cache}
        if self.weight_version is not None:
            out["weight_version"] = self.weight_version
        if self.load_format is not None:
            out["load_format"] = self.load_format
        if self.abort_all_requests:
            out["abort_all_requests"] = True
        return out


def parse_update_weights_request(body: Any) -> UpdateWeightsRequest:
    if not isinstance(body, Mapping):
        raise WireError("the /update_weights_from_disk body must be a JSON object with model_path")
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        raise WireError("model_path must be a non-empty string (an HF safetensors directory)")
    lf = body.get("load_format")
    if lf is not None and not isinstance(lf, str):
        raise WireError(f"load_format must be a string, got {lf!r}")
    wv = body.get("weight_version")
    if wv is not None and not isinstance(wv, (str, int)):
        raise WireError(f"weight_version must be a string, got {wv!r}")
    return UpdateWeightsRequest(model_path=path, load_format=lf, weight_version=None if wv is None else str(wv),
                                flush_cache=optional_bool(body, "flush_cache", True),
                                abort_all_requests=optional_bool(body, "abort_all_requests", False))


def update_weights_body(success: bool, message: str, num_paused_requests: int = 0) -> dict[str, Any]:
    """The answer of `/update_weights_from_disk`."""
    return {"success": bool(success), "message": str(message), "num_paused_requests": int(num_paused_requests)}


def parse_update_weights_answer(status: int | None, body: Any) -> tuple[bool, str, int]:
    """(success, message, num_paused_requests) of an `/update_weights_from_disk` answer."""
    if isinstance(body, Mapping) and "success" in body:
        return (bool(body["success"]) and status == 200, str(body.get("message", "")),
                int(body.get("num_paused_requests", 0) or 0))
    return False, f"HTTP {status}: {error_message(body, str(body)[:300])}", 0


def pause_request_body(mode: str | None) -> dict[str, Any]:
    """`/pause_generation` body (SGLang 0.5.23 answers 400 to a body-less POST: always an object)."""
    if mode is not None and mode not in PAUSE_MODES:
        raise ValueError(f"pause mode {mode!r} must be one of {PAUSE_MODES} (or None for the worker's default)")
    return {"mode": mode} if mode else {}


def parse_pause_mode(body: Any) -> str:
    mode = body.get("mode") if isinstance(body, Mapping) and body.get("mode") is not None else "abort"
    if mode not in PAUSE_MODES:
        raise WireError(f"mode must be 'abort', 'in_place' or 'retract', got {mode!r}")
    return mode


def model_info(*, model_path: str, tokenizer_path: str | None, weight_version: str | None) -> dict[str, Any]:
    """The `/get_model_info` body."""
    return {"model_path": model_path, "tokenizer_path": tokenizer_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": weight_version}
