"""Typed results and errors of the SGLang pool client (DESIGN section 8).

These are plain frozen dataclasses so that the gateway, the judge and the trainer can
record exactly what a worker returned (token ids, log-probs, weight version) without
touching raw JSON.  `from_generate_json` is the single place that turns an SGLang
`/generate` response into a `GenerateResult`; it refuses malformed responses loudly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


class PoolError(RuntimeError):
    """Base class of every error the pool client raises."""


class NoHealthyWorkerError(PoolError):
    """Every worker of the pool is marked unhealthy (or the pool is empty)."""


class RequestRejectedError(PoolError):
    """A worker answered 4xx (other than 408/429): the request itself is wrong; not retried."""

    def __init__(self, status: int, message: str, *, url: str | None = None, body: Any = None):
        self.status = int(status)
        self.message = str(message)
        self.url = url
        self.body = body
        where = f" from {url}" if url else ""
        super().__init__(f"request rejected with HTTP {self.status}{where}: {self.message}")


class WorkerUnavailableError(PoolError):
    """Retries were exhausted on connection errors, timeouts, 408/429/5xx or aborted generations."""

    def __init__(self, message: str, *, attempts: list[str] | None = None):
        self.attempts = list(attempts or [])
        detail = "" if not self.attempts else " (attempts: " + "; ".join(self.attempts) + ")"
        super().__init__(message + detail)


class MalformedResponseError(PoolError):
    """A worker answered 200 but the body is not a valid SGLang response."""


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
            raise MalformedResponseError(f"finish_reason must be an object with a string 'type', got {value!r}")
        matched = value.get("matched")
        if matched is not None and not isinstance(matched, (int, str)):
            raise MalformedResponseError(f"finish_reason.matched must be an int, str or null, got {matched!r}")
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
    def last_weight_version(self) -> str | None:
        return str(self.weight_versions[-1]["version"]) if self.weight_versions else self.weight_version


@dataclass(frozen=True)
class WeightUpdateResult:
    """Per-worker answer of `/update_weights_from_disk`."""

    url: str
    success: bool
    message: str
    num_paused_requests: int


def _logprob_triples(value: Any, what: str) -> list[list[Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedResponseError(f"meta_info.{what} must be a list, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) < 2:
            raise MalformedResponseError(f"meta_info.{what} entries must be [logprob, token_id, text], got {item!r}")
    return value


def generate_result_from_json(body: Any, *, worker_url: str = "", expect_logprobs: bool = False,
                              top_logprobs_num: int = 0) -> GenerateResult:
    """Parse one `/generate` response object; raise MalformedResponseError on anything unexpected.

    Fields this parser does not use are kept in `raw` and otherwise ignored: real SGLang (0.5.23) also
    sends `weight_versions`, `cached_tokens_details`, `num_retractions`, `reasoning_tokens`, `dp_rank`,
    `output_token_logprobs_length` and `response_sent_to_client_ts` (tests/fixtures/sglang holds recordings).
    """
    if not isinstance(body, Mapping):
        raise MalformedResponseError(f"/generate answered {type(body).__name__}, expected a JSON object: {body!r:.200}")
    if "error" in body and "meta_info" not in body:
        err = body["error"]
        msg = err.get("message") if isinstance(err, Mapping) else err
        raise RequestRejectedError(400, str(msg), url=worker_url, body=body)
    meta = body.get("meta_info")
    if not isinstance(meta, Mapping):
        raise MalformedResponseError(f"/generate response from {worker_url} has no meta_info object: {body!r:.300}")
    output_ids = body.get("output_ids")
    if output_ids is None:
        raise MalformedResponseError(
            f"/generate response from {worker_url} has no output_ids; start SGLang without --skip-tokenizer-init "
            f"quirks or upgrade it (keys: {sorted(body)})")
    if not isinstance(output_ids, list) or not all(isinstance(t, int) for t in output_ids):
        raise MalformedResponseError(f"output_ids must be a list of ints, got {output_ids!r:.200}")
    text = body.get("text", "")
    if not isinstance(text, str):
        raise MalformedResponseError(f"text must be a string, got {type(text).__name__}")
    finish = FinishReason.from_json(meta.get("finish_reason"))

    out_lp_raw = _logprob_triples(meta.get("output_token_logprobs"), "output_token_logprobs")
    if expect_logprobs and len(out_lp_raw) != len(output_ids):
        raise MalformedResponseError(
            f"asked for log-probs but got {len(out_lp_raw)} output_token_logprobs for {len(output_ids)} output ids "
            f"from {worker_url}")
    # JSON has no -inf: SGLang (orjson) sends null for a log-prob of -inf
    output_logprobs = [float("-inf") if item[0] is None else float(item[0]) for item in out_lp_raw]
    for item, tok in zip(out_lp_raw, output_ids):
        if int(item[1]) != tok:
            raise MalformedResponseError(
                f"output_token_logprobs token id {item[1]} does not match output id {tok} from {worker_url}")

    top_raw = meta.get("output_top_logprobs")
    output_top: list[list[tuple[float, int]]] = []
    if top_raw is not None:
        if not isinstance(top_raw, list):
            raise MalformedResponseError("meta_info.output_top_logprobs must be a list")
        for pos in top_raw:
            if pos is None:
                output_top.append([])
                continue
            output_top.append([(float("-inf") if e[0] is None else float(e[0]), int(e[1]))
                               for e in _logprob_triples(pos, "output_top_logprobs[i]")])
    if top_logprobs_num > 0 and expect_logprobs and len(output_top) != len(output_ids):
        raise MalformedResponseError(
            f"asked for top-{top_logprobs_num} log-probs but got {len(output_top)} positions for "
            f"{len(output_ids)} output ids from {worker_url}")

    input_logprobs: list[float | None] | None = None
    in_raw = meta.get("input_token_logprobs")
    if in_raw is not None:
        input_logprobs = [None if e[0] is None else float(e[0]) for e in _logprob_triples(in_raw, "input_token_logprobs")]

    weight_version = meta.get("weight_version")
    spans = []
    for span in meta.get("weight_versions") or []:
        if not (isinstance(span, dict) and "version" in span):
            raise MalformedResponseError(f"meta_info.weight_versions entry {span!r} from {worker_url} has no version")
        spans.append({"version": str(span["version"]), "start": int(span.get("start", 0)),
                      "end": int(span.get("end", 0))})
    if spans:
        weight_version = spans[0]["version"]
    return GenerateResult(
        text=text,
        output_ids=list(output_ids),
        output_logprobs=output_logprobs,
        output_top_logprobs=output_top,
        finish_reason=finish,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        weight_version=None if weight_version is None else str(weight_version),
        input_logprobs=input_logprobs,
        raw=dict(body),
        worker_url=worker_url,
        weight_versions=spans,
    )
