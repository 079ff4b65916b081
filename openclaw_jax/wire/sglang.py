"""SGLang's native wire protocol (docs/design.md §8), both directions.

`SamplingParams` is the typed ``sampling_params``: the embedded server parses requests into it
(`parse_sampling_params`, ranges and messages as SGLang's ``verify``) and the pool client sends it
(`SamplingParams.to_json`). `/generate` requests are built (`generate_request_body`) and parsed
(`parse_generate_request`); their responses, both ways, are `sglang_results`. Weight updates, pause,
model info and the native error body (``{"error": {"message": ...}}``) are here too. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.fields import as_bool, as_float, as_int, as_str_list, optional_bool
from openclaw_jax.wire.images import DEFAULT_LIMITS, ImageLimits, check_request_images, decode_data_url

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
# sampling params
# ---------------------------------------------------------------------------------------------
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
        """The ``sampling_params`` to send: the sampling distribution always (a worker would otherwise apply
        its model's generation-config defaults, and the rollout records these values), the rest when set."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ALWAYS_SENT or value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


ALWAYS_SENT = frozenset({"max_new_tokens", "temperature", "top_p", "top_k"})


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
    images: tuple[Any, ...] = ()   # `wire.images.ImageInput`s of `image_data` (data URLs), prompt order
    lora_path: str | None = None   # the LoRA adapter (a person id) to generate with; None: the base model


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
                          rid: str | None = None, stream: bool = False,
                          image_data: Sequence[str] | None = None, lora_path: str | None = None) -> dict[str, Any]:
    """The `/generate` body a client sends (one prompt, or a batch of ids/texts); `image_data`: the
    prompt's images as data URLs, in order (one prompt only)."""
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
    if image_data:
        payload["image_data"] = list(image_data)
    if lora_path is not None:
        payload["lora_path"] = lora_path
    return payload


_UNSUPPORTED_GENERATE_FIELDS = ("input_embeds", "video_data", "audio_data", "session_params",
                                "custom_logit_processor")


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


def _image_data(value: Any, is_batch: bool, limits: ImageLimits) -> tuple[Any, ...]:
    """`image_data`: a data URL or a list of them (one prompt's images, in order), within ``limits``."""
    if value is None:
        return ()
    if is_batch:
        raise WireError("image_data is supported for a single prompt only", param="image_data")
    urls = [value] if isinstance(value, str) else value
    if not isinstance(urls, list) or not urls:
        raise WireError("image_data must be a data URL or a non-empty list of them", param="image_data")
    if len(urls) > limits.max_images:   # before decoding any of them
        raise WireError(f"at most {limits.max_images} images are accepted per request "
                        f"({limits.key('max_images')}), got {len(urls)}", param="image_data")
    images: list[Any] = []
    for i, url in enumerate(urls):
        images.append(decode_data_url(url, f"image_data[{i}]", limits))
        check_request_images(images, limits, "image_data")
    return tuple(images)


def parse_generate_request(body: Any, *, vocab_size: int, image_limits: ImageLimits = DEFAULT_LIMITS
                           ) -> GenerateRequest:
    if not isinstance(body, Mapping):
        raise WireError(f"the /generate body must be a JSON object, got {type(body).__name__}")
    for name in _UNSUPPORTED_GENERATE_FIELDS:
        if body.get(name) is not None:
            raise WireError(f"{name} is not supported by the embedded JAX server")
    is_batch, prompts_text, prompts_ids = _generate_prompts(body, vocab_size)
    n_items = len(prompts_text)
    images = _image_data(body.get("image_data"), is_batch, image_limits)
    sampling_raw = body.get("sampling_params")
    samplings = [parse_sampling_params(s, vocab_size=vocab_size)
                 for s in _per_item(sampling_raw, n_items, is_batch, "sampling_params")]
    return_logprob = _per_item(body.get("return_logprob", False), n_items, is_batch, "return_logprob")
    start_lens = _per_item(body.get("logprob_start_len", -1), n_items, is_batch, "logprob_start_len")
    top_nums = _per_item(body.get("top_logprobs_num", 0), n_items, is_batch, "top_logprobs_num")
    token_ids_lp = _per_item(body.get("token_ids_logprob"), n_items, is_batch, "token_ids_logprob",
                             list_is_scalar=True)
    rids = _per_item(body.get("rid"), n_items, is_batch, "rid")
    lora_paths = _per_item(body.get("lora_path"), n_items, is_batch, "lora_path")
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
        lora = lora_paths[i]
        if lora is not None and not isinstance(lora, str):
            raise WireError(f"lora_path must be an adapter name (a string), got {str(lora)[:80]!r}", param="lora_path")
        items.append(GenerateItem(text=prompts_text[i], input_ids=prompts_ids[i], sampling=samplings[i],
                                  return_logprob=rl, logprob_start_len=sl, top_logprobs_num=min(tn, vocab_size),
                                  token_ids_logprob=tids, rid=rid, images=images, lora_path=lora))
    return GenerateRequest(items=tuple(items), is_batch=is_batch, stream=optional_bool(body, "stream", False),
                           return_text_in_logprobs=optional_bool(body, "return_text_in_logprobs", False))


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


def expect_request_body(within_s: float) -> dict[str, Any]:
    """`/expect_request` body (ours; SGLang has no such route): a request is coming within `within_s`."""
    return {"within_s": float(within_s)}


def parse_expect_request(body: Any) -> float:
    """`/expect_request` {"within_s": seconds, 0 to 600}: the seconds a coming request holds background work."""
    if not isinstance(body, Mapping) or "within_s" not in body:
        raise WireError('the body must be a JSON object {"within_s": seconds}', param="within_s")
    within_s = as_float(body["within_s"], "within_s")
    if not 0 <= within_s <= 600:  # also NaN
        raise WireError(f"within_s={within_s!r} must be between 0 and 600 seconds", param="within_s")
    return within_s


def parse_pause_mode(body: Any) -> str:
    mode = body.get("mode") if isinstance(body, Mapping) and body.get("mode") is not None else "abort"
    if mode not in PAUSE_MODES:
        raise WireError(f"mode must be 'abort', 'in_place' or 'retract', got {mode!r}")
    return mode


def model_info(*, model_path: str, tokenizer_path: str | None, weight_version: str | None) -> dict[str, Any]:
    """The `/get_model_info` body."""
    return {"model_path": model_path, "tokenizer_path": tokenizer_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": weight_version}
