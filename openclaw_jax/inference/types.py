"""Plain data passed between the HTTP layer (`protocol`, `server`) and the engine.

`GenerationSpec` (with the wire's `SamplingParams`, :mod:`openclaw_jax.wire.sglang`) is one
sequence to generate (a request with n > 1 becomes n specs); `SequenceOutput` is
what the engine reports back, cumulatively while streaming and once more when done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from openclaw_jax.wire.sglang import GenerateItem, SamplingParams


@dataclass(frozen=True)
class GenerationSpec:
    """One sequence for the engine to generate."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = False
    # -1: output log-probs only; >= 0: also prompt log-probs from this position (the first is None)
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: tuple[int, ...] | None = None
    rid: str | None = None
    # which of the request's n samples this is (folded into the PRNG key so samples differ)
    sample_index: int = 0
    # the person's LoRA adapter to serve this sequence with (SGLang's field name; None: the base model)
    lora_path: str | None = None

    @classmethod
    def of_item(cls, item: GenerateItem, prompt_ids: Sequence[int], sample_index: int = 0,
                rid: str | None = None) -> "GenerationSpec":
        """Sample ``sample_index`` of one `/generate` prompt."""
        return cls(prompt_ids=tuple(int(t) for t in prompt_ids), sampling=item.sampling,
                   return_logprob=item.return_logprob, logprob_start_len=item.logprob_start_len,
                   top_logprobs_num=item.top_logprobs_num, token_ids_logprob=item.token_ids_logprob,
                   rid=rid if rid is not None else item.rid, sample_index=sample_index, lora_path=item.lora_path)


@dataclass
class SequenceOutput:
    """Engine result for one `GenerationSpec` (cumulative)."""

    rid: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    # the decoded output: stop string / stop token trimmed unless no_stop_trim
    text: str = ""
    # SGLang finish_reason JSON ({"type": "stop", "matched": ...} | {"type": "length", "length": N} |
    # {"type": "abort", "message": ...}); None while running
    finish_reason: dict[str, Any] | None = None
    output_logprobs: list[float] = field(default_factory=list)
    # per output position [(logprob, token_id), ...] best first
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    output_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    # prompt positions logprob_start_len.. ; the first entry of a request starting at 0 is None
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] | None = None
    # the version that computed the prompt (the oldest this response saw: staleness is counted from it)
    weight_version: str | None = None
    # which version produced which output tokens, as SGLang reports it: [{"version", "start", "end"}]
    weight_versions: list[dict[str, Any]] = field(default_factory=list)
    created_time: float = 0.0
    # when its prefill call started and when its first output token was accepted (queue wait and time to
    # the first token, as the server logs them); None until then
    prefill_started_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def record_version(self, version: str) -> None:
        """Output token `len(output_ids) - 1` was produced by weights `version`."""
        n = len(self.output_ids)
        if self.weight_versions and self.weight_versions[-1]["version"] == version \
                and self.weight_versions[-1]["end"] == n - 1:
            self.weight_versions[-1]["end"] = n
        else:
            self.weight_versions.append({"version": version, "start": n - 1, "end": n})

    def snapshot(self) -> "SequenceOutput":
        """A copy that later engine steps will not mutate (for streaming)."""
        return SequenceOutput(
            rid=self.rid, prompt_ids=self.prompt_ids, output_ids=list(self.output_ids), text=self.text,
            finish_reason=None if self.finish_reason is None else dict(self.finish_reason),
            output_logprobs=list(self.output_logprobs), output_top_logprobs=list(self.output_top_logprobs),
            output_token_ids_logprobs=list(self.output_token_ids_logprobs),
            input_logprobs=None if self.input_logprobs is None else list(self.input_logprobs),
            input_top_logprobs=None if self.input_top_logprobs is None else list(self.input_top_logprobs),
            input_token_ids_logprobs=(None if self.input_token_ids_logprobs is None
                                      else list(self.input_token_ids_logprobs)),
            weight_version=self.weight_version, weight_versions=[dict(s) for s in self.weight_versions],
            created_time=self.created_time, prefill_started_time=self.prefill_started_time,
            first_token_time=self.first_token_time, finished_time=self.finished_time,
            cached_tokens=self.cached_tokens)
