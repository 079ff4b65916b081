"""`/generate` responses of SGLang, both ways: built by the embedded server, parsed by the pool client.

`build_generate_response` writes the object SGLang sends for one sequence (also each streamed
chunk); `parse_generate_response` reads it back into a `GenerateResult` and refuses anything
malformed (`MalformedResponse`) or an error body (`ErrorAnswer`). `FinishReason` is
``meta_info.finish_reason``; `openai_finish` maps it to OpenAI's ``finish_reason``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from openclaw_jax.wire.sglang import error_message

TokenText = Callable[[int], str]


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
    # the sampled tokens and their log-probs (SGLang's `output_ids`, and `output_token_logprobs` in
    # `meta_info`): from here on, to the loss, they are `response_ids` and `rollout_logprobs`
    response_ids: list[int]
    rollout_logprobs: list[float]
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
    # prompt tokens whose K/V the worker reused from its prefix cache (0 when not reported)
    cached_tokens: int = 0

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
        text=text, response_ids=list(output_ids), rollout_logprobs=[_logprob(item[0]) for item in out_lp_raw],
        output_top_logprobs=output_top, finish_reason=finish, prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        weight_version=None if weight_version is None else str(weight_version), input_logprobs=input_logprobs,
        raw=dict(body), worker_url=worker_url, weight_versions=spans,
        cached_tokens=_count(meta.get("cached_tokens"), "cached_tokens", worker_url))


def _count(value: Any, what: str, worker_url: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedResponse(f"meta_info.{what} from {worker_url} must be a count >= 0, got {value!r:.100}")
    return value
