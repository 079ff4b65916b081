"""Generation with images for a Qwen2.5-VL policy (`models.qwen_vl.QwenVL`): prefill with the pixels,
decode text with the per-sequence rope delta, and the rollout log-probs of every sampled token.

Each prompt is prefilled on its own (in its caller's thread) and then decoded together with every
other sequence in flight (`_BatchDecoder`: one batch cache, one decode call per token for all rows).
No prefix cache: the batched engine (engine.py, its kernels) serves text decoders; its prefix cache
keys K/V by token ids, and the image tokens of two different images are the same ids, so image
prompts must not share it. `VisionGenerator` is the image path of the
embedded server: `/generate` with `image_data` runs here when `InferenceServer.vision` is set
(`image_sequence_output`); the batched engine serves the text decoder of the same weights. The prompt holds each
image's placeholders (`<|image_pad|>` x `image_token_count(grid)`, `expand_image_placeholders`);
weight updates reach both paths through `swap_served_weights` (one version, checked before either changes);
`prefill_hidden` places the image features there and returns the M-RoPE delta; each decoded token
at cache slot s then rotates at position s + delta (`QwenVL.decode`). The returned log-probs are
log_softmax(logits / T) at the sampled token, what the trainer recomputes as pi_old (docs/design.md §6).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.models.image_processing import DEFAULT_MAX_DECODE_PIXELS, ImageProcessorConfig, process_images
from openclaw_jax.models.decoder import KVCache
from openclaw_jax.models.qwen_vl import QwenVL, check_image_tokens
from openclaw_jax.inference.sampling import sample_tokens, step_keys
from openclaw_jax.inference.scheduler import bucket
from openclaw_jax.inference.types import SequenceOutput
from openclaw_jax.wire.errors import WireError


class ImageRequestError(ValueError):
    """The request's images cannot be served: one does not decode (or is too large), or the prompt's image
    placeholders do not match them. The request's fault, checked before the model runs."""


@dataclass
class VisionOutput:
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    rope_delta: int = 0
    weight_version: str | None = None   # of the weights that generated it (None: the generator was given none)


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _prefill(graphdef, state, ids, length, pixel_values, grid, cache_len):
    model = nnx.merge(graphdef, state)
    mask = (jnp.arange(ids.shape[1])[None, :] < length).astype(jnp.int32)
    cache = model.init_cache(1, cache_len)
    hidden, cache, deltas = model.prefill_hidden(ids, cache, pixel_values=pixel_values, image_grid_thw=grid,
                                                 attention_mask=mask)
    last = jax.lax.dynamic_index_in_dim(hidden, length - 1, axis=1, keepdims=True)
    return model.logits(last)[:, 0], cache, deltas


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(4,))
def _decode_rows(graphdef, state, tokens, positions, cache, deltas):
    """One decode step of every row of the batch cache (idle rows decode a dummy token at slot 0)."""
    model = nnx.merge(graphdef, state)
    logits, cache = model.decode(tokens[:, None], positions[:, None], cache, deltas)
    return logits[:, 0], cache


@jax.jit
def _sample_rows(logits, temperature, top_p, top_k, min_p, base_keys, steps):
    """The engine's own sampler (`sampling.sample_tokens`), a key per row and step; the tokens' log-probs."""
    tokens, lp = sample_tokens(logits, temperature, top_p, top_k, min_p, step_keys(base_keys, steps))
    return tokens, jnp.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, donate_argnums=(0, 1))
def _place_row(cache: KVCache, logits, row_cache: KVCache, row_logits, slot):
    """A prefilled sequence (its cache, at most the batch cache's length, and last logits) into row `slot`.
    The slots past its prompt keep the previous occupant's k/v: decode never reads a slot >= the position."""
    put = lambda c, r: jax.lax.dynamic_update_slice(c, r.astype(c.dtype), (0, slot, 0, 0, 0))  # noqa: E731
    return KVCache(put(cache.k, row_cache.k), put(cache.v, row_cache.v)), logits.at[slot].set(row_logits[0])


@functools.partial(jax.jit, static_argnums=(1,))
def _grow(cache: KVCache, length: int) -> KVCache:
    pad = ((0, 0), (0, 0), (0, length - cache.k.shape[2]), (0, 0), (0, 0))
    return KVCache(jnp.pad(cache.k, pad), jnp.pad(cache.v, pad))


@dataclass
class _Row:
    """One sequence of the batched decode: its prefill, sampling settings and output so far."""
    state: Any                  # the weights it started on (the batch decodes one version at a time)
    cache: KVCache | None       # its prefill, batch 1 (dropped once placed in the batch cache)
    logits: jax.Array | None    # [1, V] at its last prompt token
    length: int                 # prompt length: the first decoded token goes to this cache slot
    max_new_tokens: int
    sampling: tuple[float, float, int, float]   # temperature, top_p, top_k, min_p
    key: np.ndarray             # raw PRNG key [2] uint32; step i samples with fold_in(key, i)
    stops: frozenset[int]
    out: VisionOutput
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class _BatchDecoder:
    """Decodes every sequence in flight together: a thread steps a batch cache of `width` rows, one
    decode call and one sampling call per token for all of them (the weights are read once per token,
    not once per sequence, which is what a CPU decode step costs). Prefills run in the callers' threads
    and join at the next token; a row leaves when it stops and its slot takes the next sequence. One
    weight version at a time: a sequence prefilled on other weights waits until the batch drains."""

    def __init__(self, graphdef: Any, width: int):
        self.graphdef, self.width = graphdef, width
        self._cond = threading.Condition()
        self._pending: deque[_Row] = deque()
        self._rows: list[_Row | None] = [None] * width
        self._state: Any = None
        self._cache: KVCache | None = None
        self._logits: jax.Array | None = None
        self._thread: threading.Thread | None = None
        self._host = {"temperature": np.zeros(width, np.float32), "top_p": np.ones(width, np.float32),
                      "top_k": np.zeros(width, np.int32), "min_p": np.zeros(width, np.float32),
                      "keys": np.zeros((width, 2), np.uint32), "steps": np.zeros(width, np.int32),
                      "tokens": np.zeros(width, np.int32), "positions": np.zeros(width, np.int32),
                      "deltas": np.zeros(width, np.int32)}

    def run(self, row: _Row) -> VisionOutput:
        with self._cond:
            self._pending.append(row)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="vision-decode", daemon=True)
                self._thread.start()
            self._cond.notify()
        row.done.wait()
        if row.error is not None:
            raise row.error
        return row.out

    def _admit(self) -> list[tuple[int, _Row]]:
        """Pending rows into free slots (under the lock), in arrival order, while their weights match."""
        admitted = []
        active = any(r is not None for r in self._rows)
        while self._pending and None in self._rows:
            row = self._pending[0]
            if active and row.state is not self._state:
                break
            self._pending.popleft()
            slot = self._rows.index(None)
            self._rows[slot] = row
            self._state, active = row.state, True
            admitted.append((slot, row))
        return admitted

    def _place(self, slot: int, row: _Row) -> None:
        need = row.cache.k.shape[2]
        if self._cache is None:
            self._cache = KVCache(*(jnp.zeros((c.shape[0], self.width) + c.shape[2:], c.dtype) for c in row.cache))
            self._logits = jnp.zeros((self.width, row.logits.shape[-1]), jnp.float32)
        if need > self._cache.k.shape[2]:
            self._cache = _grow(self._cache, need)
        self._cache, self._logits = _place_row(self._cache, self._logits, row.cache, row.logits, jnp.int32(slot))
        row.cache = row.logits = None   # placed: drop the prefill's buffers
        h = self._host
        h["temperature"][slot], h["top_p"][slot], h["top_k"][slot], h["min_p"][slot] = row.sampling
        h["keys"][slot], h["steps"][slot], h["deltas"][slot] = row.key, 0, row.out.rope_delta

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and all(r is None for r in self._rows):
                    self._cond.wait()
                admitted = self._admit()
            try:
                for slot, row in admitted:
                    self._place(slot, row)
                self._step()
            except BaseException as err:   # noqa: BLE001 -- every waiting caller gets it; the loop goes on
                with self._cond:
                    failed = [r for r in self._rows if r is not None]
                    self._rows = [None] * self.width
                    self._cache = self._logits = None
                for row in failed:
                    row.error = err
                    row.done.set()

    def _step(self) -> None:
        """Sample a token for every live row; retire the finished ones; decode the rest one step."""
        h = self._host
        tokens, lps = _sample_rows(self._logits, h["temperature"], h["top_p"], h["top_k"], h["min_p"],
                                   h["keys"], h["steps"])
        tokens, lps = np.asarray(tokens), np.asarray(lps)
        h["tokens"][:] = 0
        h["positions"][:] = 0
        finished = []
        for slot, row in enumerate(self._rows):
            if row is None:
                continue
            tok = int(tokens[slot])
            row.out.output_ids.append(tok)
            row.out.output_logprobs.append(float(lps[slot]))
            n_out = len(row.out.output_ids)
            if tok in row.stops or n_out == row.max_new_tokens:
                row.out.finish_reason = "stop" if tok in row.stops else "length"
                finished.append(slot)
                continue
            h["tokens"][slot], h["positions"][slot], h["steps"][slot] = tok, row.length + n_out - 1, n_out
        with self._cond:
            for slot in finished:
                row, self._rows[slot] = self._rows[slot], None
                row.done.set()
            live = any(r is not None for r in self._rows)
        if live:
            self._logits, self._cache = _decode_rows(self.graphdef, self._state, h["tokens"], h["positions"],
                                                     self._cache, h["deltas"])


class VisionGenerator:
    """`VisionGenerator(model).generate(prompt_ids, images, max_new_tokens=..., temperature=..., seed=...)`."""

    def __init__(self, model: QwenVL, processor: ImageProcessorConfig | None = None, *,
                 weight_version: str | None = None, max_batch: int = 8):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be >= 1 (sequences decoded together)")
        if not isinstance(model, QwenVL):
            raise TypeError(f"VisionGenerator serves a QwenVL, got {type(model).__name__}")
        self.vl_cfg = model.vl_cfg
        self.processor = processor or ImageProcessorConfig.for_vision(model.vl_cfg.vision)
        self.graphdef, state = nnx.split(model)
        # (weights, their version), replaced together: a generation reads both once, at its start
        self._weights: tuple[Any, str | None] = (state, None if weight_version is None else str(weight_version))
        self.swap_lock = threading.Lock()   # one weight swap at a time (swap_served_weights)
        self._seeds = np.random.default_rng()   # a request's sampling seed when it names none
        self._seeds_lock = threading.Lock()   # numpy's generators are not for concurrent callers
        self._decoder = _BatchDecoder(self.graphdef, max_batch)

    @property
    def state(self) -> Any:
        return self._weights[0]

    @property
    def weight_version(self) -> str | None:
        return self._weights[1]

    def set_state(self, state: Any, weight_version: str | None = None) -> None:
        """New weights (same structure; `swap_served_weights` checks and places them) and their version
        (None keeps the current one); generations already running finish on the weights they started with."""
        self._weights = (state, self._weights[1] if weight_version is None else str(weight_version))

    def pixels(self, images: Sequence[Any], max_decode_pixels: int = DEFAULT_MAX_DECODE_PIXELS
               ) -> tuple[np.ndarray, tuple[tuple[int, int, int], ...]]:
        pv, grid = process_images(list(images), self.processor, max_decode_pixels=max_decode_pixels)
        return pv, tuple(tuple(int(v) for v in g) for g in grid)

    def generate(self, prompt_ids: Sequence[int], images: Sequence[Any], *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
                 seed: int | None = None, stop_token_ids: Sequence[int] = (),
                 max_decode_pixels: int = DEFAULT_MAX_DECODE_PIXELS) -> VisionOutput:
        """`seed` None: a fresh one per call (as the batched engine does): the episodes of a group
        share a prompt and must not share their samples."""
        n = len(prompt_ids)
        if n == 0 or max_new_tokens < 1:
            raise ValueError("generate needs a prompt and max_new_tokens >= 1")
        state, version = self._weights   # one version for the whole sequence
        try:
            pv, grid = self.pixels(images, max_decode_pixels) if images else (None, None)
            check_image_tokens(np.asarray(prompt_ids)[None], grid, self.vl_cfg.image_token_id,
                               self.vl_cfg.vision.spatial_merge_size)
        except ValueError as err:   # an image that does not decode, or placeholders that do not match the images
            raise ImageRequestError(str(err)) from None
        lp_len = bucket(n, minimum=16)
        cache_len = bucket(n + max_new_tokens, minimum=16)
        ids = np.zeros((1, lp_len), np.int32)
        ids[0, :n] = prompt_ids
        logits, cache, deltas = _prefill(self.graphdef, state, jnp.asarray(ids), jnp.int32(n),
                                         None if pv is None else jnp.asarray(pv), grid, cache_len)
        out = VisionOutput(rope_delta=int(deltas[0]), weight_version=version)
        if seed is None:
            with self._seeds_lock:
                seed = int(self._seeds.integers(0, 2 ** 31 - 1))
        row = _Row(state=state, cache=cache, logits=logits, length=n, max_new_tokens=max_new_tokens,
                   sampling=(temperature, top_p, top_k, min_p),
                   key=np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32),
                   stops=frozenset(int(t) for t in stop_token_ids), out=out)
        return self._decoder.run(row)


# ---------------------------------------------------------------------------------------------
# weight updates of a server with an image path: the engine's text decoder and the whole QwenVL


def swap_served_weights(engine: Any, vision: VisionGenerator, state: Any, weight_version: str | None = None, *,
                        drain: bool = False) -> None:
    """Install new QwenVL weights (`state`: the whole model's, the structure of `nnx.split(QwenVL)`) in both
    serving paths under one version: the engine (`Engine.swap_weights`) gets the text decoder, the image
    path the vision tower plus the engine's installed text weights (the same arrays: the decoder is not
    held twice). Everything is checked before anything changes: a bad state leaves both as they were.
    Each output names the version of the weights that made it (a text sequence may span versions,
    as `Engine.swap_weights` says; an image sequence runs on the version it started with)."""
    new_flat = dict(nnx.to_flat_state(state))
    with vision.swap_lock:
        old_flat = dict(nnx.to_flat_state(vision.state))
        if new_flat.keys() != old_flat.keys():
            missing = sorted(".".join(map(str, k)) for k in old_flat.keys() - new_flat.keys())[:5]
            extra = sorted(".".join(map(str, k)) for k in new_flat.keys() - old_flat.keys())[:5]
            raise ValueError(f"new weights do not match the served Qwen2.5-VL model: missing {missing}, "
                             f"unexpected {extra}")
        for key, old in old_flat.items():
            got, want = tuple(new_flat[key].get_value().shape), tuple(old.get_value().shape)
            if got != want:
                raise ValueError(f"new weight {'.'.join(map(str, key))} has shape {got}, the served model has {want}")
        # the image path's own weights in their served dtypes and placements (no recompilation)
        own = {k: old.replace(jax.device_put(jnp.asarray(new_flat[k].get_value(), old.get_value().dtype),
                                             old.get_value().sharding))
               for k, old in old_flat.items() if k[0] != "language_model"}
        text = nnx.from_flat_state([(k[1:], v) for k, v in new_flat.items() if k[0] == "language_model"])
        engine.swap_weights(text, weight_version, drain=drain)
        installed = dict(nnx.to_flat_state(engine.params))
        merged = [(k, installed[k[1:]] if k[0] == "language_model" else own[k]) for k in old_flat]
        vision.set_state(nnx.from_flat_state(merged), engine.weight_version)


# ---------------------------------------------------------------------------------------------
# the embedded server's /generate with `image_data` (InferenceServer.vision: a VisionGenerator)


def image_sequence_output(vision: VisionGenerator, tokenizer: Any, item: Any, prompt_ids: Sequence[int], *,
                          eos_token_ids: Sequence[int], weight_version: str, rid: str,
                          max_decode_pixels: int = DEFAULT_MAX_DECODE_PIXELS) -> Any:
    """Run one `/generate` item with images (`wire.sglang.GenerateItem.images`) -> a `SequenceOutput`.
    What the image path cannot honour is refused (WireError): n > 1, stop strings; an image that does not
    decode (or decodes to more than ``max_decode_pixels``) raises ImageRequestError before the model runs."""
    sp = item.sampling
    if sp.n != 1 or sp.stop:
        raise WireError("a prompt with images is served with n=1 and no stop strings", param="sampling_params")
    started = time.time()
    stops = tuple(sp.stop_token_ids or ()) + (() if sp.ignore_eos else tuple(eos_token_ids))
    out = vision.generate(list(prompt_ids), [im.data for im in item.images], max_new_tokens=int(sp.max_new_tokens),
                          max_decode_pixels=max_decode_pixels,
                          temperature=float(sp.temperature), top_p=float(sp.top_p), top_k=int(sp.top_k),
                          min_p=float(sp.min_p), seed=None if sp.sampling_seed is None else int(sp.sampling_seed),
                          stop_token_ids=stops)
    keep = out.output_ids[:-1] if out.finish_reason == "stop" and not sp.no_stop_trim else out.output_ids
    finish = ({"type": "stop", "matched": out.output_ids[-1]} if out.finish_reason == "stop"
              else {"type": "length", "length": len(out.output_ids)})
    if out.weight_version is not None:   # the version of the weights that made it
        weight_version = out.weight_version
    seq = SequenceOutput(rid=rid, prompt_ids=list(prompt_ids), output_ids=list(out.output_ids),
                         text=tokenizer.decode(keep, skip_special_tokens=sp.skip_special_tokens),
                         finish_reason=finish, output_logprobs=list(out.output_logprobs),
                         weight_version=weight_version, created_time=started, finished_time=time.time())
    seq.weight_versions = [{"version": weight_version, "start": 0, "end": len(out.output_ids)}]
    return seq
