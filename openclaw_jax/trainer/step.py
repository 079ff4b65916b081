"""Pure, jittable trainer step functions (DESIGN section 7), one per phase.

Nothing here does I/O or reads configs: the trainer loop (`loop.py`) owns state, builds the
jitted versions with explicit shardings, and calls them in order:

1. `old_pass`       no grad: student forward over prompt+response; per response token the
                    log-prob of the sampled token and the top-K (S^q), chunked over the vocab.
2. `teacher_pass`   no grad: the frozen teacher over every hint candidate of the batch as one
                    batched forward ([B*C, L]); its own top-K and its log-probs at S^q.
3. `old_logprobs_at` the old policy's log-probs at the teacher's top-K ids (from the old
                    hidden states kept by phase 1, so the student runs once).
4. `train_step`     value_and_grad of the registered loss on the chunked path over the
                    trainable params (full model or LoRA adapters), then the optax update.

Models cross the jit boundary as (graphdef, state) pairs (`nnx.split` / `nnx.merge`).
Response positions are addressed by `response_start[b]` (= prompt length): the hidden state
that predicts response token t sits at sequence index `response_start[b] - 1 + t`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from openclaw_jax import ops
from openclaw_jax.losses import HybridBatch, LossConfig, get_loss


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class StudentInputs:
    """Prompt + response sequences of one batch (host-built, padded to a bucket).

    input_ids [B, L]; response_start [B] (prompt length, >= 1); response_ids, response_mask,
    advantages, rollout_logprobs [B, T]; sample_mask [B] (0 = padding row).
    """

    input_ids: jax.Array
    response_start: jax.Array
    response_ids: jax.Array
    response_mask: jax.Array
    advantages: jax.Array
    rollout_logprobs: jax.Array
    sample_mask: jax.Array


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class TeacherInputs:
    """Hint-augmented prompt + the same response, per candidate.

    input_ids [B, C, Lt]; response_start [B, C]; candidate_mask [B, C] (0 = padding candidate).
    """

    input_ids: jax.Array
    response_start: jax.Array
    candidate_mask: jax.Array


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


@dataclass(frozen=True)
class StepSettings:
    """Static settings of the jitted phases (hashable; part of the compile cache key)."""

    loss_name: str = "combine"
    loss: LossConfig = LossConfig()
    temperature: float = 1.0
    top_k: int = 4
    chunk_size: int = 128


jax.tree_util.register_static(StepSettings)


def gather_response(x: jax.Array, response_start: jax.Array, length: int) -> jax.Array:
    """Rows of `x [B, L, ...]` at indices `response_start[b] - 1 + t`, t < length -> `[B, length, ...]`.

    Indices past the sequence are clamped; those positions are masked by the caller.
    """
    idx = response_start[:, None].astype(jnp.int32) - 1 + jnp.arange(length, dtype=jnp.int32)[None, :]
    idx = jnp.clip(idx, 0, x.shape[1] - 1)
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def _merge(graphdef: nnx.GraphDef, state: nnx.State | tuple[nnx.State, ...], *, frozen: bool = True):
    """Rebuild the model from one state or a tuple of split states (no gradient when `frozen`)."""
    states = state if isinstance(state, tuple) else (state,)
    if frozen:
        states = jax.lax.stop_gradient(states)
    return nnx.merge(graphdef, *states)


def _response_hidden(model, input_ids, response_start, length):
    hidden = model.hidden_states(input_ids)
    return gather_response(hidden, response_start, length)


def old_pass(graphdef: nnx.GraphDef, state: nnx.State | tuple[nnx.State, ...], inputs: StudentInputs,
             settings: StepSettings) -> OldPassOutput:
    """Phase 1: old-policy log-probs of y_t and top-K (S^q), no gradient."""
    model = _merge(graphdef, state)
    length = inputs.response_ids.shape[1]
    hidden = _response_hidden(model, inputs.input_ids, inputs.response_start, length)
    stats = ops.vocab_stats(hidden, model.lm_head_kernel(), ids=inputs.response_ids[..., None],
                            top_k=settings.top_k, temperature=settings.temperature, chunk_size=settings.chunk_size)
    return OldPassOutput(stats.logprobs_at_ids[..., 0], stats.topk_ids, stats.topk_logprobs, hidden)


def teacher_pass(graphdef: nnx.GraphDef, state: nnx.State, inputs: TeacherInputs, response_ids: jax.Array,
                 student_topk_ids: jax.Array, settings: StepSettings) -> TeacherPassOutput:
    """Phase 2: the frozen teacher over all candidates as one [B*C, Lt] forward, no gradient."""
    model = _merge(graphdef, state)
    b, c, lt = inputs.input_ids.shape
    t, k = student_topk_ids.shape[1], student_topk_ids.shape[2]
    flat_ids = inputs.input_ids.reshape(b * c, lt)
    flat_start = inputs.response_start.reshape(b * c)
    hidden = _response_hidden(model, flat_ids, flat_start, t)                      # [B*C, T, H]
    # One LM-head pass gives the teacher's own top-K, its log-prob of y_t and its log-probs at S^q.
    tokens = jnp.broadcast_to(response_ids[:, None, :, None], (b, c, t, 1))
    at_ids = jnp.concatenate([tokens, jnp.broadcast_to(student_topk_ids[:, None], (b, c, t, k))], axis=-1)
    stats = ops.vocab_stats(hidden, model.lm_head_kernel(), ids=at_ids.reshape(b * c, t, 1 + k),
                            top_k=settings.top_k, temperature=settings.temperature, chunk_size=settings.chunk_size)
    kt = stats.topk_ids.shape[-1]
    at = stats.logprobs_at_ids.reshape(b, c, t, 1 + k)
    return TeacherPassOutput(
        stats.topk_ids.reshape(b, c, t, kt),
        stats.topk_logprobs.reshape(b, c, t, kt),
        at[..., 1:],
        at[..., 0],
    )


def old_logprobs_at(graphdef: nnx.GraphDef, state: nnx.State | tuple[nnx.State, ...], old_hidden: jax.Array, ids: jax.Array,
                    settings: StepSettings) -> jax.Array:
    """Phase 3: l_old at `ids [B, C, T, K]` from the old response hidden states `[B, T, H]`."""
    model = _merge(graphdef, state)
    b, c, t, k = ids.shape
    flat_ids = ids.transpose(0, 2, 1, 3).reshape(b, t, c * k)
    logp = ops.logprobs_at_ids(jax.lax.stop_gradient(old_hidden), model.lm_head_kernel(), flat_ids,
                               temperature=settings.temperature, chunk_size=settings.chunk_size)
    return jax.lax.stop_gradient(logp.reshape(b, t, c, k).transpose(0, 2, 1, 3))


def importance_weights(old_logprobs: jax.Array, rollout_logprobs: jax.Array, mask: jax.Array,
                       cap: float) -> jax.Array:
    """Truncated importance weights min(pi_old / pi_rollout, cap) per token (1 where masked)."""
    ratio = jnp.exp(jnp.clip(old_logprobs - rollout_logprobs, -20.0, 20.0))
    return jnp.where(mask > 0, jnp.minimum(ratio, cap), 1.0)


def assemble_batch(inputs: StudentInputs, teacher: TeacherInputs, old: OldPassOutput,
                   teach: TeacherPassOutput, old_at_teacher: jax.Array,
                   advantage_weights: jax.Array | None = None) -> HybridBatch:
    """The loss batch from the three no-grad phases (advantages optionally importance-weighted)."""
    advantages = inputs.advantages if advantage_weights is None else inputs.advantages * advantage_weights
    return HybridBatch(
        tokens=inputs.response_ids,
        loss_mask=inputs.response_mask,
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
    )


def loss_fn(trainable: nnx.State, graphdef: nnx.GraphDef, frozen: nnx.State, inputs: StudentInputs,
            batch: HybridBatch, settings: StepSettings) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The registered loss on the chunked path; differentiable w.r.t. `trainable`."""
    model = nnx.merge(graphdef, trainable, frozen)
    hidden = _response_hidden(model, inputs.input_ids, inputs.response_start, inputs.response_ids.shape[1])
    return get_loss(settings.loss_name).chunked(
        hidden, model.lm_head_kernel(), batch, settings.loss,
        temperature=settings.temperature, chunk_size=settings.chunk_size)


def train_step(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State, opt_state: Any,
               inputs: StudentInputs, batch: HybridBatch, settings: StepSettings,
               optimizer: optax.GradientTransformation,
               lr_schedule: optax.Schedule | None = None) -> tuple[nnx.State, Any, dict[str, jax.Array]]:
    """Phase 4: one optimizer update; returns (new trainable, new opt state, metrics)."""
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        trainable, graphdef, frozen, inputs, batch, settings)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    metrics = dict(metrics)
    metrics["loss"] = loss
    metrics["grad_norm"] = optax.global_norm(grads)
    if lr_schedule is not None:
        metrics["lr"] = jnp.asarray(lr_schedule(_optimizer_count(opt_state) - 1), jnp.float32)
    return trainable, opt_state, metrics


def _optimizer_count(opt_state: Any) -> jax.Array:
    """The step count kept by optax's schedule wrappers (the first `count` leaf found)."""
    for leaf_path, leaf in jax.tree_util.tree_leaves_with_path(opt_state):
        if any(getattr(p, "name", None) == "count" for p in leaf_path):
            return leaf
    return jnp.zeros((), jnp.int32)


def make_optimizer(lr: float, *, warmup_steps: int = 0, weight_decay: float = 0.0, b1: float = 0.9,
                   b2: float = 0.98, eps: float = 1e-8, grad_clip: float = 1.0
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Global-norm clip then AdamW with linear warm-up to a constant learning rate."""
    if warmup_steps > 0:
        schedule = optax.join_schedules(
            [optax.linear_schedule(lr / max(warmup_steps, 1), lr, warmup_steps), optax.constant_schedule(lr)],
            [warmup_steps])
    else:
        schedule = optax.constant_schedule(lr)
    tx = optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
    )
    return tx, schedule
