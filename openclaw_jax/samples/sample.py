"""A training sample: one scored main turn (docs/design.md §9), and its JSON encoding.

A :class:`Sample` is one scored main turn: the exact prompt and response token ids the
policy saw and sampled, the rollout log-probs the policy server returned, the judge's
reward, and zero or more hint-augmented prompts (teacher candidates). The store
(``store.py``) keeps them durably; ``encode_sample``/``decode_sample`` are its payloads.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from openclaw_jax.samples.person import DEFAULT_PERSON, check_person_id

SAMPLE_FORMAT_VERSION = 1
SAMPLE_KINDS = ("opd+rl", "opd", "rl")


class SampleError(ValueError):
    """A sample's fields are inconsistent (wrong kind for its reward/hints, length mismatch)."""


@dataclass(frozen=True)
class Sample:
    """One scored main turn, ready for the trainer.

    ``kind`` follows the three-case rule: ``opd+rl`` (hint accepted and eval +-1; reward =
    eval), ``opd`` (hint only; reward 0), ``rl`` (eval +-1 only; no hint candidates).
    ``hint_prompt_ids[c]`` is the chat-template rendering (with generation prompt) of the
    turn's prompt with ``hints[c]`` appended to its last user message; the response
    tokens are the same ``response_ids`` for every candidate.
    """

    session_id: str
    turn_index: int
    kind: str
    reward: float
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    hints: list[str] = field(default_factory=list)
    hint_prompt_ids: list[list[int]] = field(default_factory=list)
    # The weight version that began the response (the oldest it saw: staleness counts from it) and
    # the one that ended it; they differ when the policy's weights were swapped mid-response.
    weight_version: str | None = None
    last_weight_version: str | None = None
    # Sampling temperature the rollout log-probs were computed with (log_softmax(z / T)); the
    # trainer's tau must equal it. top_p / top_k truncated the sampling (not the log-probs).
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    eval_score: int = 0
    eval_votes: list[int | None] = field(default_factory=list)
    hint_votes: list[int | None] = field(default_factory=list)
    # The judge's raw outputs, for inspection: {"eval": [text, ...], "hint": [text, ...]}.
    judge_raw: dict[str, Any] = field(default_factory=dict)
    judge: str = ""
    next_state: dict[str, Any] = field(default_factory=dict)
    response_text: str = ""
    finish_reason: str = ""
    sample_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = field(default_factory=time.time)
    # Multi-turn (agentic) samples: which response tokens are trained (1) and which are context the
    # environment appended (0, e.g. tool observations), and a per-token advantage (e.g. the
    # group-normalised GRPO advantage, per step with PRM votes). None: every response token is
    # trained with advantage `reward` (a conversation turn).
    response_mask: list[int] | None = None
    token_advantages: list[float] | None = None
    # The prompt's images in prompt order, by content hash (sha256 hex); their bytes are blobs of the
    # store (`SampleStore.append(sample, images=...)`, `samples.store.read_image`). Hint prompts show
    # the same images.
    image_sha256: list[str] = field(default_factory=list)
    # Who the turn came from (samples/person.py): the person of the client's key (or, with one shared key,
    # the person id the client named), beside `session_id`; DEFAULT_PERSON when nobody was named, and in
    # records written before samples had a person. Session ids are unique per person only.
    person: str = DEFAULT_PERSON
    # Which person's LoRA adapter served the turn (`trainer.personalize=per_person`: their own), and its
    # optimizer steps when the turn began; None: the base model (and records written before the fields).
    adapter: str | None = None
    adapter_steps: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SAMPLE_KINDS:
            raise SampleError(f"sample kind {self.kind!r} is not one of {SAMPLE_KINDS}")
        if len(self.response_ids) != len(self.rollout_logprobs):
            raise SampleError(
                f"sample has {len(self.response_ids)} response ids but {len(self.rollout_logprobs)} rollout "
                "log-probs; they must be one per response token")
        if not self.response_ids:
            raise SampleError("sample has no response tokens; an empty response cannot be trained on")
        try:
            check_person_id(self.person, "sample person")
        except ValueError as err:
            raise SampleError(str(err)) from None
        for name in ("response_mask", "token_advantages"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.response_ids):
                raise SampleError(f"sample has {len(self.response_ids)} response ids but {len(value)} {name} "
                                  "entries; they must be one per response token (or None)")
        if len(self.hints) != len(self.hint_prompt_ids):
            raise SampleError(
                f"sample has {len(self.hints)} hints but {len(self.hint_prompt_ids)} hint prompts; "
                "they must be one per candidate")
        if self.kind == "opd+rl" and not (self.reward in (1, -1) and self.hints):
            raise SampleError(f"an 'opd+rl' sample needs reward +-1 and >= 1 hint (reward={self.reward!r}, "
                              f"{len(self.hints)} hints)")
        if self.kind == "opd" and not (self.reward == 0 and self.hints):
            raise SampleError(f"an 'opd' sample needs reward 0 and >= 1 hint (reward={self.reward!r}, "
                              f"{len(self.hints)} hints)")
        if self.kind == "rl" and not (self.reward in (1, -1) and not self.hints):
            raise SampleError(f"an 'rl' sample needs reward +-1 and no hints (reward={self.reward!r}, "
                              f"{len(self.hints)} hints)")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["format_version"] = SAMPLE_FORMAT_VERSION
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        version = data.get("format_version", SAMPLE_FORMAT_VERSION)
        if version != SAMPLE_FORMAT_VERSION:
            raise SampleError(f"sample format_version={version!r} is not supported (this code reads "
                              f"{SAMPLE_FORMAT_VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        data = {**data}
        if "loss_mask" in data:   # records written before the field was named response_mask
            data.setdefault("response_mask", data.pop("loss_mask"))
        if not data.get("person"):   # written before samples had a person (absent, or "")
            data["person"] = DEFAULT_PERSON
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class SampleSpec:
    """What the trainer knows of where its samples come from (the serving side's settings, handed to
    it by whoever builds it): the temperature they were sampled at, which is the trainer's tau, and
    the most hint candidates a sample carries (the teacher's batch shape)."""

    temperature: float = 1.0
    max_candidates: int = 3

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling temperature {self.temperature} must be > 0 (it is the trainer's tau)")
        if self.max_candidates < 1:
            raise ValueError(f"max_candidates={self.max_candidates} must be >= 1")


def encode_sample(sample: Sample) -> bytes:
    """Sample -> JSON bytes. Floats round-trip exactly (repr); -inf log-probs are kept."""
    return json.dumps(sample.to_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_sample(payload: bytes) -> Sample:
    return Sample.from_dict(json.loads(payload.decode("utf-8")))
