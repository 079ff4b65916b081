"""The embedded server's reading of requests, in engine terms (docs/design.md §8).

The wire formats themselves live in :mod:`openclaw_jax.wire` (``sglang``: sampling params,
``/generate``; ``openai``: messages, tools, responses). Here: what SGLang's OpenAI-compatible
endpoints make of a request (`parse_chat_request`, `parse_completion_request`: OpenAI fields ->
SGLang sampling params, as SGLang's ``to_sampling_params``) and the prompt checks of SGLang's
``_validate_one_request`` (`validate_prompt`). Every problem is a `WireError` (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from openclaw_jax.wire import openai as O
from openclaw_jax.wire.errors import WireError, with_context_advice
from openclaw_jax.wire.images import DEFAULT_LIMITS, ImageInput, ImageLimits, extract_images
from openclaw_jax.wire.fields import as_float, as_int, is_int, optional_bool
from openclaw_jax.wire.sglang import SamplingParams, parse_sampling_params


def check_prompt_length(n: int, context_length: int) -> None:
    if n >= context_length:
        raise WireError(with_context_advice(f"The input ({n} tokens) is longer than the model's context length "
                                            f"({context_length} tokens)."))


def validate_prompt(prompt_ids: Sequence[int], sampling: SamplingParams, *, context_length: int,
                    vocab_size: int) -> None:
    """Length and vocabulary checks of a tokenized prompt (SGLang `_validate_one_request`)."""
    n = len(prompt_ids)
    if n == 0:
        raise WireError("the prompt is empty: input_ids (or the tokenized text) needs at least one token")
    check_prompt_length(n, context_length)
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise WireError(f"The input_ids contain values outside the vocabulary [0, {vocab_size}): {bad[:8]}")
    if sampling.max_new_tokens is not None and n + sampling.max_new_tokens > context_length:
        raise WireError(with_context_advice(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {n + sampling.max_new_tokens} tokens: {n} tokens from the input messages "
            f"and {sampling.max_new_tokens} tokens for the completion. Please reduce the number of tokens in the "
            f"input messages or the completion to fit within the limit."))


# OpenAI request fields -> SGLang sampling_params keys (as SGLang's `to_sampling_params`).
_OPENAI_TO_SGLANG = {"temperature": "temperature", "stop": "stop", "stop_token_ids": "stop_token_ids",
                     "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "n": "n", "no_stop_trim": "no_stop_trim",
                     "ignore_eos": "ignore_eos", "skip_special_tokens": "skip_special_tokens", "seed": "sampling_seed",
                     "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                     "repetition_penalty": "repetition_penalty", "min_tokens": "min_new_tokens",
                     "logit_bias": "logit_bias", "regex": "regex", "ebnf": "ebnf", "json_schema": "json_schema"}


def _openai_sampling(body: Mapping, *, vocab_size: int, max_new_tokens: int | None) -> SamplingParams:
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            as_float(body[name], name)
    sp: dict[str, Any] = {key: body[name] for name, key in _OPENAI_TO_SGLANG.items() if body.get(name) is not None}
    sp["max_new_tokens"] = max_new_tokens
    O.check_response_format(body)
    return parse_sampling_params(sp, vocab_size=vocab_size)


def _model_and_rid(body: Mapping) -> tuple[str, str | None]:
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise WireError(f"model must be a string, got {model!r}")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise WireError(f"rid must be a string, got {rid!r}")
    return model, rid


def _lora_path(body: Mapping) -> str | None:
    """SGLang's `lora_path` extra field: the adapter (a person id) to generate with; None: the base model."""
    lora = body.get("lora_path")
    if lora is not None and not isinstance(lora, str):
        raise WireError(f"lora_path must be an adapter name (a string), got {str(lora)[:80]!r}", param="lora_path")
    return lora


# Chat fields SGLang may honour but this server cannot: answered 400 rather than ignored, since
# each would change what is sampled. Fields that cannot change the reply (store, prompt_cache_key,
# user, metadata, ...) are ignored, as SGLang does.
_UNSERVED_CHAT_FIELDS = {
    "reasoning_effort": "the embedded server has no reasoning mode (in openclaw.json: \"reasoning\": false)",
    "reasoning": "the embedded server has no reasoning mode (in openclaw.json: \"reasoning\": false)",
    "thinking": "the embedded server has no reasoning mode (in openclaw.json: \"reasoning\": false)",
}


def _refuse_unserved(body: Mapping, tool_choice: Any) -> None:
    for name, why in _UNSERVED_CHAT_FIELDS.items():
        if body.get(name) is not None:
            raise WireError(f"{name} is not supported: {why}", param=name)
    if tool_choice not in (None, "auto", "none"):
        raise WireError(f"tool_choice={tool_choice!r} cannot be enforced (no constrained decoding here); "
                        "send 'auto' or 'none'", param="tool_choice")


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
    images: tuple[ImageInput, ...] = ()  # data-URL image_url parts, in prompt order (wire/images.py)
    lora_path: str | None = None


def parse_chat_request(body: Any, *, vocab_size: int, image_limits: ImageLimits = DEFAULT_LIMITS) -> ChatRequest:
    if not isinstance(body, Mapping):
        raise WireError(f"the request body must be a JSON object, got {type(body).__name__}")
    raw_messages, images = extract_images(body.get("messages"), image_limits)
    msgs = O.parse_messages({"messages": raw_messages}, strict=False)
    model, rid = _model_and_rid(body)
    sampling = _openai_sampling(body, vocab_size=vocab_size, max_new_tokens=O.parse_max_tokens(body))
    logprobs = optional_bool(body, "logprobs", False)
    top_logprobs = O.parse_top_logprobs(body, logprobs)
    tools, tool_choice = O.parse_tools(body)
    _refuse_unserved(body, tool_choice)
    input_ids = body.get("input_ids")
    if input_ids is not None:
        if not isinstance(input_ids, list) or not input_ids:
            raise WireError("input_ids must be a non-empty list of token ids")
        input_ids = tuple(as_int(t, "input_ids entries") for t in input_ids)
    include_usage, continuous = O.parse_stream_options(body)
    return ChatRequest(messages=msgs, model=model, sampling=sampling,
                       stream=optional_bool(body, "stream", False), include_usage=include_usage,
                       continuous_usage_stats=continuous, logprobs=logprobs,
                       top_logprobs=min(top_logprobs, vocab_size) if logprobs else 0, tools=tools,
                       tool_choice=tool_choice if tool_choice is not None else ("auto" if tools else "none"),
                       chat_template_kwargs=O.parse_chat_template_kwargs(body), input_ids=input_ids, rid=rid,
                       continue_final_message=optional_bool(body, "continue_final_message", False),
                       images=tuple(images), lora_path=_lora_path(body))


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
    lora_path: str | None = None


def _completion_prompts(prompt: Any, vocab_size: int) -> list[str | tuple[int, ...]]:
    prompts: list[str | tuple[int, ...]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(is_int(p) for p in prompt):
        prompts = [tuple(int(p) for p in prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [tuple(as_int(t, "prompt token ids") for t in p) for p in prompt]
    elif prompt is None:
        raise WireError("prompt is required (a string, a list of strings, or token ids)")
    else:
        raise WireError("prompt must be a string, a list of strings, a list of token ids or a list of lists")
    if any(not p for p in prompts):
        raise WireError("Prompt cannot be empty")
    for p in prompts:
        if isinstance(p, tuple):
            bad = [t for t in p if not 0 <= t < vocab_size]
            if bad:
                raise WireError(f"The prompt token ids contain values outside the vocabulary [0, {vocab_size}): "
                                f"{bad[:8]}")
    return prompts


def parse_completion_request(body: Any, *, vocab_size: int) -> CompletionRequest:
    if not isinstance(body, Mapping):
        raise WireError(f"the request body must be a JSON object, got {type(body).__name__}")
    prompts = _completion_prompts(body.get("prompt"), vocab_size)
    model, rid = _model_and_rid(body)
    max_tokens = O.parse_max_tokens({"max_tokens": body.get("max_tokens")}, default=16) or 16
    sampling = _openai_sampling(body, vocab_size=vocab_size, max_new_tokens=max_tokens)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = as_int(logprobs, "logprobs")
        if logprobs < 0:
            raise WireError(f"logprobs must be >= 0, got {logprobs}")
        logprobs = min(logprobs, vocab_size)
    if body.get("suffix") is not None:
        raise WireError("suffix is not supported")
    if body.get("best_of") not in (None, 1):
        raise WireError("best_of is not supported; use n")
    include_usage, continuous = O.parse_stream_options(body)
    return CompletionRequest(prompts=tuple(prompts), model=model, sampling=sampling,
                             stream=optional_bool(body, "stream", False), include_usage=include_usage,
                             continuous_usage_stats=continuous, logprobs=logprobs,
                             echo=optional_bool(body, "echo", False), rid=rid, lora_path=_lora_path(body))
