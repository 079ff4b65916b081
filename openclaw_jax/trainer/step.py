"""Pure, jittable functions of one trainer step (docs/design.md §7): no I/O, no config parsing.

`train_step.py` builds the jitted versions (settings, shardings) and runs them in this order:

1. `old_pass`         no grad: the student's log-prob of y_t and top-K (S^q), and its response hidden states.
2. `teacher_pass`     no grad: the frozen teacher over every hint candidate at once ([B*C, L], or one
                      row per sample with the shared prefix): its top-K and its log-probs at S^q.
3. `old_logprobs_at`  l_old at the teacher's top-K ids, from phase 1's hidden states.
4. `reference_pass`   (only with a KL anchor the teacher pass did not give) the frozen base model's
                      log-prob of y_t.
5. `importance`       (only with `staleness_mode=importance`) the truncated importance weights.
6. `assemble_batch`   the loss batch (`HybridBatch`) from the phases above.
7. `update_step`      value_and_grad of the registered loss (chunked over the vocab), the optax update;
                      `update_step_serving` also returns the serving weights (`serving_state`).

Models cross the jit boundary as (graphdef, state) pairs. `settings.compute_dtype` is what floating
params are cast to inside each phase (the state passed in keeps its master dtype, so gradients and
updates are in it). With `settings.micro_batch_size` m > 0 each phase runs over micro-batches of m
rows in a scan; micro-batch i holds rows i, i + n, i + 2n, ... so it stays spread over the devices,
and the loss divides by the real samples of the whole batch: one step with micro-batches equals one
without. Response token t of sequence b is predicted at `response_start[b] - 1 + t`; packed rows
(`segment_ids`; batcher.py) place sequence b at `row[b], offset[b]` and the hidden states are
gathered back to `[B, T, H]` at once, so nothing after the forward sees the packing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from openclaw_jax import ops
from openclaw_jax.losses import HybridBatch, LossConfig, get_loss
from openclaw_jax.losses.policy import MetricStat, finalize_metrics
from openclaw_jax.models.lora import merge_lora as merge_lora_adapters
from openclaw_jax.trainer.batch import num_micro_batches  # the batcher splits rows the same way


@dataclass(frozen=True, kw_only=True)
class _SequenceRows:
    """The rows a forward pass reads, one sequence per row or packed (module doc): input_ids, and
    with packing positions, segment_ids and each sequence's row and offset; images as patches."""

    input_ids: jax.Array
    response_start: jax.Array
    positions: jax.Array | None = None
    segment_ids: jax.Array | None = None
    row: jax.Array | None = None
    offset: jax.Array | None = None
    pixel_values: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class StudentInputs(_SequenceRows):
    """Prompt + response sequences of one batch (host-built, padded to a bucket).

    input_ids [B, L]; response_start [B] (prompt length, >= 1); response_ids, response_mask,
    advantages, rollout_logprobs [B, T]; sample_mask [B] (0 = padding row). Packed (module doc):
    input_ids, positions, segment_ids [R, L]; row, offset [B].
    """

    response_ids: jax.Array
    response_mask: jax.Array
    advantages: jax.Array
    rollout_logprobs: jax.Array
    sample_mask: jax.Array
    # pixel_values (a vision-language student, QwenVL): each row's images as patches `[B, N_row, D]`, every
    # row with the same grid (`StepSettings.image_grid`: static) and its image tokens in input_ids; unpacked.


@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class TeacherInputs(_SequenceRows):
    """Hint-augmented prompt + the same response, per candidate.

    input_ids [B, C, Lt]; response_start [B, C]; candidate_mask [B, C] (0 = padding candidate).
    Packed (module doc): input_ids, positions, segment_ids [R, Lt]; row, offset [B, C].
    Shared prefix (prefix_len [B] given): row b of input_ids, positions, segment_ids [B, Lt] holds
    sample b's prompt prefix common to its candidates (prefix_len tokens, segment `SHARED_SEGMENT`,
    which every segment of the row sees), then each candidate's tokens after it (hint + response),
    one segment each at positions from prefix_len; offset [B, C] where each starts, response_start
    counted from it; row [B, C] the sample's row within its micro-batch (micro-batches split the B
    rows like the student's). reference_offset, reference_start [B] (with a KL anchor): where the
    un-hinted prompt's rest sits in the row (a candidate's place, or a segment of its own), so the
    teacher pass also gives the reference log-probs (the teacher is the frozen initial model).
    """

    candidate_mask: jax.Array
    prefix_len: jax.Array | None = None
    reference_offset: jax.Array | None = None
    reference_start: jax.Array | None = None
    # pixel_values [B, C, N_row, D]: each candidate row's images (as the student's)


class OldPassOutput(NamedTuple):
    old_logprobs: jax.Array        # [B, T]
    topk_ids: jax.Array            # [B, T, K]
    topk_logprobs: jax.Array       # [B, T, K]
    hidden: jax.Array              # [B, T, H] response hidden states (for phase 3)


class TeacherPassOutput(NamedTuple):
    topk_ids: jax.Array                 # [B, C, T, K]
    topk_logprobs: jax.Array            # [B, C, T, K]
    logprobs_at_student_ids: jax.Array  # [B, C, T, K]
    logprobs_at_tokens: jax.Array       # [B, C, T]
    reference_logprobs: jax.Array | None = None   # [B, T]: the un-hinted prompt's, when the inputs place it


@dataclass(frozen=True)
class StepSettings:
    """Static settings of the jitted phases (hashable; part of the compile cache key), under the config's
    names: `loss` (the section: the loss's name and K, `loss.top_k`), `temperature` (tau, the samples'
    sampling temperature), `chunk_size` and `micro_batch_size` (`trainer.`), `dtype` and `param_dtype`
    (`model.`: the compute and the master dtype)."""

    loss: LossConfig = LossConfig()
    temperature: float = 1.0
    chunk_size: int = 128
    micro_batch_size: int = 0          # rows per micro-batch (0: the whole batch at once)
    dtype: str = "float32"
    param_dtype: str = "float32"
    # the images of every row of a batch with `pixel_values` (a QwenVL model): one (t, h, w) per image
    image_grid: tuple[tuple[int, int, int], ...] = ()
    # `trainer.skip_steps_without_signal`: a batch without a learning signal (`has_learning_signal`) leaves
    # the trained params and the optimizer state unchanged
    skip_without_signal: bool = False

    @property
    def top_k(self) -> int:
        return self.loss.top_k

    @property
    def compute_dtype(self) -> str | None:
        """What floating params are cast to in every phase: `dtype` when it differs from the master
        dtype, else None (used as stored)."""
        return self.dtype if self.dtype != self.param_dtype else None


jax.tree_util.register_static(StepSettings)


def cast_floating(tree: Any, dtype: str | jnp.dtype | None) -> Any:
    """`tree` with every floating leaf cast to `dtype` (integer leaves, e.g. RNG counts, unchanged)."""
    if dtype is None:
        return tree
    dt = jnp.dtype(dtype)

    def cast(x):
        return x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt else x

    return jax.tree.map(cast, tree)


def split_micro(tree: Any, n: int) -> Any:
    """Leading dim B of every leaf -> `[n, B // n, ...]`; micro-batch i = rows i, i + n, i + 2n, ..."""
    def split(x):
        return jnp.swapaxes(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 0, 1)

    return jax.tree.map(split, tree)


def join_micro(tree: Any) -> Any:
    """Inverse of `split_micro`: `[n, m, ...]` -> `[n * m, ...]` in the original row order."""
    def join(x):
        return jnp.swapaxes(x, 0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])

    return jax.tree.map(join, tree)


def _map_rows(fn, rows: Any, micro_batch_size: int, count: int) -> Any:
    """`fn(rows)` computed over micro-batches in a scan (rows: a tree of arrays whose leading dim
    splits into the micro-batches of `count` sequences: `[count, ...]`, or packed rows)."""
    n = num_micro_batches(count, micro_batch_size)
    if n == 1:
        return fn(rows)
    return join_micro(jax.lax.map(fn, split_micro(rows, n)))


def gather_response(x: jax.Array, response_start: jax.Array, length: int, row: jax.Array | None = None) -> jax.Array:
    """Rows of `x [B, L, ...]` at indices `response_start[b] - 1 + t`, t < length -> `[B, length, ...]`
    (the slots that predict the response tokens). With `row [N]` (packed rows), sequence n is read
    from row `row[n]` of `x` and the result is `[N, length, ...]`.

    Indices past the sequence are clamped; those positions are masked by the caller.
    """
    idx = response_start[:, None].astype(jnp.int32) - 1 + jnp.arange(length, dtype=jnp.int32)[None, :]
    idx = jnp.clip(idx, 0, x.shape[1] - 1)
    if row is not None:
        return x[row.astype(jnp.int32)[:, None], idx]
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def _merge(graphdef: nnx.GraphDef, state: nnx.State | tuple[nnx.State, ...], *, frozen: bool = True,
           dtype: str | None = None):
    """Rebuild the model from one state or a tuple of split states (no gradient when `frozen`),
    floating params cast to `dtype`."""
    states = state if isinstance(state, tuple) else (state,)
    if frozen:
        states = jax.lax.stop_gradient(states)
    return nnx.merge(graphdef, *cast_floating(states, dtype))


def _response_hidden(model, input_ids, response_start, length, positions=None, segment_ids=None, row=None,
                     offset=None, pixel_values=None, image_grid=()):
    """Hidden states `[N, length, H]` that predict each sequence's response tokens; packed rows
    (`segment_ids` given) are gathered back to one row per sequence. `pixel_values [N, N_row, D]`
    (a QwenVL model, unpacked rows): the rows' images of grid `image_grid`, M-RoPE positions from them."""
    if pixel_values is not None:
        if segment_ids is not None:
            raise ValueError("packed rows with images are not supported: batches with images are not packed")
        return gather_response(model.hidden_states(input_ids, pixel_values=pixel_values, image_grid_thw=image_grid),
                               response_start, length)
    if segment_ids is None:
        return gather_response(model.hidden_states(input_ids), response_start, length)
    hidden = model.hidden_states(input_ids, positions=positions, segment_ids=segment_ids)    # [R, L, H]
    return gather_response(hidden, offset + response_start, length, row)


def _student_hidden(model, inputs: StudentInputs, length: int, image_grid=()) -> jax.Array:
    return _response_hidden(model, inputs.input_ids, inputs.response_start, length, inputs.positions,
                            inputs.segment_ids, inputs.row, inputs.offset, inputs.pixel_values, image_grid)


def old_pass(graphdef: nnx.GraphDef, state: nnx.State | tuple[nnx.State, ...], inputs: StudentInputs,
             settings: StepSettings) -> OldPassOutput:
    """Phase 1: old-policy log-probs of y_t and top-K (S^q), no gradient (micro-batched)."""
    model = _merge(graphdef, state, dtype=settings.compute_dtype)
    length = inputs.response_ids.shape[1]

    def rows(x: StudentInputs):
        return old_pass_outputs(_student_hidden(model, x, length, settings.image_grid), model.lm_head_kernel(),
                                x.response_ids, settings)

    return _map_rows(rows, inputs, settings.micro_batch_size, inputs.response_ids.shape[0])


def old_pass_outputs(hidden: jax.Array, lm_head: jax.Array, response_ids: jax.Array,
                     settings: StepSettings) -> OldPassOutput:
    """Phase 1's outputs from the student's response hidden states `[B, T, H]` and its LM head."""
    stats = ops.vocab_stats(hidden, lm_head, ids=response_ids[..., None], top_k=settings.top_k,
                            temperature=settings.temperature, chunk_size=settings.chunk_size)
    return OldPassOutput(stats.logprobs_at_ids[..., 0], stats.topk_ids, stats.topk_logprobs, hidden)


def reference_pass(graphdef: nnx.GraphDef, state: nnx.State, inputs: StudentInputs,
                   settings: StepSettings) -> jax.Array:
    """The reference policy's log-probs of y_t on the student's own rows `[B, T]`, no gradient: the
    frozen base model without any hint, for the `kl_coef` anchor (micro-batched like the old pass)."""
    model = _merge(graphdef, state, dtype=settings.compute_dtype)
    length = inputs.response_ids.shape[1]

    def rows(x: StudentInputs):
        return ops.logprobs_at_ids(_student_hidden(model, x, length, settings.image_grid), model.lm_head_kernel(),
                                   x.response_ids[..., None], temperature=settings.temperature,
                                   chunk_size=settings.chunk_size)[..., 0]

    return jax.lax.stop_gradient(_map_rows(rows, inputs, settings.micro_batch_size, inputs.response_ids.shape[0]))


def _shared_prefix_stats(model, inputs: TeacherInputs, response_ids: jax.Array, at_ids: jax.Array, stats_of,
                         settings: StepSettings):
    """The shared-prefix teacher layout (one row per sample): `stats_of` every candidate's response
    hidden states `[B*C, ...]`, and the reference log-probs `[B, T]` when the inputs place the
    un-hinted prompt (else None); micro-batched over the B rows."""
    b, c = inputs.candidate_mask.shape
    t = response_ids.shape[1]

    def sample_rows(x):
        ids, positions, segment_ids, row, offset, start, at, ref = x
        m = ids.shape[0]
        hidden = model.hidden_states(ids, positions=positions, segment_ids=segment_ids)     # [m, Lt, H]
        stats = stats_of(gather_response(hidden, (offset + start).reshape(m * c), t, row.reshape(m * c)),
                         at.reshape((m * c,) + at.shape[2:]))
        stats = jax.tree.map(lambda x: x.reshape((m, c) + x.shape[1:]), stats)
        if ref is None:
            return stats, None
        ref_offset, ref_start, ref_ids = ref
        ref_hidden = gather_response(hidden, ref_offset + ref_start, t, row[:, 0])
        return stats, ops.logprobs_at_ids(ref_hidden, model.lm_head_kernel(), ref_ids[..., None],
                                           temperature=settings.temperature, chunk_size=settings.chunk_size)[..., 0]

    ref_inputs = None if inputs.reference_offset is None else (inputs.reference_offset, inputs.reference_start,
                                                                response_ids)
    stats, reference = _map_rows(sample_rows, (inputs.input_ids, inputs.positions, inputs.segment_ids, inputs.row,
                                               inputs.offset, inputs.response_start, at_ids, ref_inputs),
                                 settings.micro_batch_size, b)
    return jax.tree.map(lambda x: x.reshape((b * c,) + x.shape[2:]), stats), reference


def teacher_pass(graphdef: nnx.GraphDef, state: nnx.State, inputs: TeacherInputs, response_ids: jax.Array,
                 student_topk_ids: jax.Array, settings: StepSettings) -> TeacherPassOutput:
    """Phase 2: the frozen teacher over all candidates as one batched [B*C, Lt] forward, no gradient
    (micro-batched over the B*C rows; shared prefix: over the B sample rows, and the reference
    log-probs too when the inputs place the un-hinted prompt)."""
    model = _merge(graphdef, state, dtype=settings.compute_dtype)
    b, c = inputs.candidate_mask.shape
    t, k = student_topk_ids.shape[1], student_topk_ids.shape[2]
    # One LM-head pass gives the teacher's own top-K, its log-prob of y_t and its log-probs at S^q.
    tokens = jnp.broadcast_to(response_ids[:, None, :, None], (b, c, t, 1))
    at_ids = jnp.concatenate([tokens, jnp.broadcast_to(student_topk_ids[:, None], (b, c, t, k))], axis=-1)

    def stats_of(hidden, at):
        return ops.vocab_stats(hidden, model.lm_head_kernel(), ids=at, top_k=settings.top_k,
                               temperature=settings.temperature, chunk_size=settings.chunk_size)

    def rows(x):
        ids, start, at, ((positions, segment_ids), (row, offset)), pixels = x
        return stats_of(_response_hidden(model, ids, start, t, positions, segment_ids, row, offset, pixels,
                                         settings.image_grid), at)

    reference = None
    if inputs.pixel_values is not None and (inputs.prefix_len is not None or inputs.segment_ids is not None):
        raise ValueError("teacher rows with images must be unpacked, without a shared prefix")
    if inputs.prefix_len is not None:  # shared prefix: row b is sample b's, micro-batched over the B samples
        stats, reference = _shared_prefix_stats(model, inputs, response_ids, at_ids, stats_of, settings)
    else:
        packed = inputs.segment_ids is not None
        flat_ids = inputs.input_ids if packed else inputs.input_ids.reshape(b * c, -1)
        packing = ((inputs.positions, inputs.segment_ids), (inputs.row.reshape(b * c), inputs.offset.reshape(b * c))
                   ) if packed else ((None, None), (None, None))
        pixels = None if inputs.pixel_values is None else inputs.pixel_values.reshape(
            (b * c,) + inputs.pixel_values.shape[2:])
        stats = _map_rows(rows, (flat_ids, inputs.response_start.reshape(b * c), at_ids.reshape(b * c, t, 1 + k),
                                 packing, pixels), settings.micro_batch_size, b * c)
    kt = stats.topk_ids.shape[-1]
    at = stats.logprobs_at_ids.reshape(b, c, t, 1 + k)
    return TeacherPassOutput(
        stats.topk_ids.reshape(b, c, t, kt),
        stats.topk_logprobs.reshape(b, c, t, kt),
        at[..., 1:],
        at[..., 0],
        None if reference is None else jax.lax.stop_gradient(reference),
    )


def no_teacher_outputs(b: int, c: int, t: int, k: int) -> TeacherPassOutput:
    """Phase 2's outputs for a batch without any hint candidate (zeros: the loss reads none of them)."""
    zeros = jnp.zeros((b, c, t, k), jnp.float32)
    return TeacherPassOutput(jnp.zeros((b, c, t, k), jnp.int32), zeros, zeros, jnp.zeros((b, c, t), jnp.float32))


def old_logprobs_at(graphdef: nnx.GraphDef, state: nnx.State | tuple[nnx.State, ...], old_hidden: jax.Array, ids: jax.Array,
                    settings: StepSettings) -> jax.Array:
    """Phase 3: l_old at `ids [B, C, T, K]` from the old response hidden states `[B, T, H]`."""
    model = _merge(graphdef, state, dtype=settings.compute_dtype)
    return logprobs_at_teacher_ids(old_hidden, model.lm_head_kernel(), ids, settings)


def logprobs_at_teacher_ids(hidden: jax.Array, lm_head: jax.Array, ids: jax.Array, settings: StepSettings) -> jax.Array:
    """Log-probs `[B, C, T, K]` at the teacher's ids `[B, C, T, K]` from response hidden states `[B, T, H]`
    (no gradient)."""
    b, c, t, k = ids.shape
    flat_ids = ids.transpose(0, 2, 1, 3).reshape(b, t, c * k)
    logp = ops.logprobs_at_ids(jax.lax.stop_gradient(hidden), lm_head, flat_ids,
                               temperature=settings.temperature, chunk_size=settings.chunk_size)
    return jax.lax.stop_gradient(logp.reshape(b, t, c, k).transpose(0, 2, 1, 3))


def assemble_batch(inputs: StudentInputs, teacher: TeacherInputs, old: OldPassOutput,
                   teach: TeacherPassOutput, old_at_teacher: jax.Array, advantages: jax.Array | None = None,
                   ref_logprobs: jax.Array | None = None) -> HybridBatch:
    """Phase 6: the loss batch from the no-grad phases (`advantages`: finished by the step, e.g.
    importance-weighted, else the inputs'; the reference log-probs when the loss has a KL anchor)."""
    advantages = inputs.advantages if advantages is None else advantages
    return HybridBatch(
        response_ids=inputs.response_ids,
        response_mask=inputs.response_mask,
        old_logprobs=old.old_logprobs,
        advantages=advantages,
        student_topk_ids=old.topk_ids,
        student_topk_logprobs=old.topk_logprobs,
        teacher_topk_ids=teach.topk_ids,
        teacher_topk_logprobs=teach.topk_logprobs,
        teacher_logprobs_at_student_ids=teach.logprobs_at_student_ids,
        old_logprobs_at_teacher_ids=old_at_teacher,
        candidate_mask=teacher.candidate_mask,
        sample_mask=inputs.sample_mask,
        rollout_logprobs=inputs.rollout_logprobs,
        teacher_logprobs_at_tokens=teach.logprobs_at_tokens,
        ref_logprobs=ref_logprobs,
    )


def loss_fn(trainable: nnx.State, graphdef: nnx.GraphDef, frozen: nnx.State, inputs: StudentInputs,
            batch: HybridBatch, settings: StepSettings, sample_count: jax.Array | None = None
            ) -> tuple[jax.Array, tuple[dict[str, MetricStat], jax.Array]]:
    """The registered loss on the chunked path: `(loss, (metric stats as (sum, count), k* [B, T]))`, k*
    the hint the loss chose per token; differentiable w.r.t. `trainable` (master dtype: the cast to the
    compute dtype is inside). `sample_count` is the real-sample count of the whole step's batch."""
    model = nnx.merge(graphdef, *cast_floating((trainable, frozen), settings.compute_dtype))
    hidden = _student_hidden(model, inputs, inputs.response_ids.shape[1], settings.image_grid)
    return get_loss(settings.loss.name).chunked_with_stats(
        hidden, model.lm_head_kernel(), batch, settings.loss, temperature=settings.temperature,
        chunk_size=settings.chunk_size, sample_count=sample_count, with_k_star=True)


def loss_and_grads(trainable: nnx.State, graphdef: nnx.GraphDef, frozen: nnx.State, inputs: StudentInputs,
                   batch: HybridBatch, settings: StepSettings
                   ) -> tuple[jax.Array, dict[str, MetricStat], nnx.State, jax.Array]:
    """(loss, metric stats, gradients, k* [B, T]) of the whole batch, accumulated over micro-batches."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    b = inputs.response_ids.shape[0]
    n = num_micro_batches(b, settings.micro_batch_size)
    if n == 1:
        (loss, (stats, k_star)), grads = grad_fn(trainable, graphdef, frozen, inputs, batch, settings)
        return loss, stats, grads, k_star
    sample_count = jnp.maximum(jnp.sum(jnp.asarray(batch.sample_mask, jnp.float32) > 0), 1).astype(jnp.float32)
    micro = split_micro((inputs, batch), n)

    def body(carry, xs):
        loss_acc, stats_acc, grads_acc = carry
        (loss, (stats, k_star)), grads = grad_fn(trainable, graphdef, frozen, xs[0], xs[1], settings, sample_count)
        grads_acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), grads_acc, grads)
        stats_acc = jax.tree.map(jnp.add, stats_acc, stats)
        return (loss_acc + loss, stats_acc, grads_acc), k_star

    # The carry's metric structure is that of one micro-batch's stats (shapes only, no compute).
    first = jax.tree.map(lambda x: x[0], micro)
    stats_shape = jax.eval_shape(lambda: loss_fn(trainable, graphdef, frozen, first[0], first[1], settings,
                                                 sample_count)[1][0])
    zeros_stats = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), stats_shape)
    zeros_grads = jax.tree.map(jnp.zeros_like, trainable)
    (loss, stats, grads), k_star = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros_stats, zeros_grads),
                                                micro)
    return loss, stats, grads, join_micro(k_star)


def update_step(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State, opt_state: Any,
                inputs: StudentInputs, batch: HybridBatch, settings: StepSettings,
                optimizer: optax.GradientTransformation, lr_schedule: optax.Schedule | None = None
                ) -> tuple[nnx.State, Any, dict[str, jax.Array], jax.Array]:
    """Phase 7: one optimizer update; returns (new trainable, new opt state, metrics, k* [B, T])."""
    loss, stats, grads, k_star = loss_and_grads(trainable, graphdef, frozen, inputs, batch, settings)
    signal = has_learning_signal(batch.advantages, batch.candidate_mask, settings)
    return (*apply_update(trainable, opt_state, loss, stats, grads, optimizer, lr_schedule, signal=signal), k_star)


def has_learning_signal(advantages: jax.Array, candidate_mask: jax.Array, settings: StepSettings) -> jax.Array | None:
    """With `settings.skip_without_signal`, whether a batch can teach anything (a scalar bool): a response
    token with a nonzero advantage (GRPO), or a hint candidate for a loss that distils from the hint teacher,
    or an entropy bonus; the KL anchor alone is not a signal. None without the setting (every step updates).

    Why: Adam divides each update by the gradient's running scale, so a step whose gradient is only the KL
    anchor's (under 1e-6 while the policy still equals its reference) still moves the weights a sizeable part
    of the learning rate (tests/trainer/test_signal.py); a run of such steps through OpenClaw moved its
    weights half as far as one that learned (docs/results/openclaw_learning.md, "The student person")."""
    if not settings.skip_without_signal:
        return None
    if settings.loss.entropy_coef != 0:
        return jnp.asarray(True)
    signal = jnp.any(advantages != 0)   # zero off the responses and in padding rows (trainer/batcher.py)
    if settings.loss.uses_hints:
        signal = signal | jnp.any(candidate_mask > 0)
    return signal


def apply_update(trainable: nnx.State, opt_state: Any, loss: jax.Array, stats: dict[str, MetricStat], grads: nnx.State,
                 optimizer: optax.GradientTransformation, lr_schedule: optax.Schedule | None = None, *,
                 signal: jax.Array | None = None) -> tuple[nnx.State, Any, dict[str, jax.Array]]:
    """The optax update from a step's gradients; returns (new trainable, new opt state, the step's metrics:
    the loss's, `loss`, `grad_norm` and the learning rate used). `signal` (`has_learning_signal`): when
    False the params and the optimizer state stay as they were (metric `update_skipped` 1)."""
    updates, new_opt_state = optimizer.update(grads, opt_state, trainable)
    new_trainable = optax.apply_updates(trainable, updates)
    metrics = finalize_metrics(stats)
    metrics["loss"] = loss
    metrics["grad_norm"] = optax.global_norm(grads)
    if lr_schedule is not None:
        metrics["lr"] = jnp.asarray(lr_schedule(_optimizer_count(new_opt_state) - 1), jnp.float32)
    if signal is None:
        return new_trainable, new_opt_state, metrics
    keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(signal, new, old))
    metrics["update_skipped"] = 1.0 - signal.astype(jnp.float32)
    return keep(new_trainable, trainable), keep(new_opt_state, opt_state), metrics


def _optimizer_count(opt_state: Any) -> jax.Array:
    """The step count of the learning-rate schedule (optax's `ScaleByScheduleState.count`); 0 without one."""
    return optax.tree_utils.tree_get(
        opt_state, "count", jnp.zeros((), jnp.int32),
        filtering=lambda path, _: getattr(path[-1], "tuple_name", None) == "ScaleByScheduleState")


def make_optimizer(lr: float, *, warmup_steps: int = 0, weight_decay: float = 0.0, b1: float = 0.9,
                   b2: float = 0.98, eps: float = 1e-8, grad_clip: float = 1.0, decay_steps: int = 0,
                   final_lr_ratio: float = 0.1) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Global-norm clip then AdamW with a linear warm-up to `lr`, then constant (`decay_steps` 0) or a
    cosine decay reaching `final_lr_ratio * lr` at step `decay_steps` (counted from the first step)."""
    warmup = [optax.linear_schedule(lr / warmup_steps, lr, warmup_steps)] if warmup_steps > 0 else []
    if decay_steps > warmup_steps:
        after = optax.cosine_decay_schedule(lr, decay_steps - warmup_steps, alpha=final_lr_ratio)
    else:
        after = optax.constant_schedule(lr)
    schedule = optax.join_schedules(warmup + [after], [warmup_steps]) if warmup else after
    tx = optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
    )
    return tx, schedule


def serving_model(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State, *, merge_lora: bool,
                  dtype: str | jnp.dtype | None) -> nnx.Module:
    """The plain serving model: LoRA merged (in the master dtype), then floating params cast to `dtype`
    (None: as stored). The one place the trainer's weights become servable, under jit or not."""
    model = nnx.merge(graphdef, trainable, frozen)
    if merge_lora:
        # merge_lora builds the plain model abstractly; its logical sharding names mean nothing to the
        # trainer's mesh, so trace it without one (the merged arrays' layout is left to XLA)
        with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
            model = merge_lora_adapters(model)
    if dtype is not None and jnp.dtype(dtype) != jnp.dtype(model.cfg.param_dtype):
        plain, state = nnx.split(model)
        model = nnx.merge(plain, cast_floating(state, dtype))
        model.cfg = model.cfg.replace(param_dtype=jnp.dtype(dtype).name)
    return model


def serving_state(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State, *, merge_lora: bool,
                  dtype: str | jnp.dtype | None) -> nnx.State:
    """The state of `serving_model` (what weight sync pushes); its graphdef is `nnx.split` of
    `serving_model` traced abstractly (`nnx.eval_shape`)."""
    return nnx.state(serving_model(graphdef, trainable, frozen, merge_lora=merge_lora, dtype=dtype))


def update_step_serving(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State, opt_state: Any,
                        inputs: StudentInputs, batch: HybridBatch, settings: StepSettings,
                        optimizer: optax.GradientTransformation, lr_schedule: optax.Schedule | None = None, *,
                        merge_lora: bool, serving_dtype: str | jnp.dtype | None
                        ) -> tuple[nnx.State, Any, dict[str, jax.Array], jax.Array, nnx.State]:
    """`update_step`, plus the updated weights as `serving_state` (an extra output of the same program).

    The weight sync gets arrays the step already wrote, in their own buffers: the next step, which
    donates the trainable state, cannot invalidate them, and nothing is copied outside XLA."""
    trainable, opt_state, metrics, k_star = update_step(graphdef, trainable, frozen, opt_state, inputs, batch,
                                                        settings, optimizer, lr_schedule)
    return trainable, opt_state, metrics, k_star, serving_state(graphdef, trainable, frozen, merge_lora=merge_lora,
                                                                dtype=serving_dtype)
