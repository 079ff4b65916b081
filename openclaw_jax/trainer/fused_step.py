"""One trainer step as one program, the old pass folded into the train step's forward (pure, jittable).

`trainer.fused_old_pass`: the step makes one optimizer update per batch, so pi_old is the student at
this step's weights, the same weights the train step differentiates. The separate old pass
(`step.old_pass`) runs the student's whole forward once more only to read, without gradient, what the
train step's forward computes anyway: log-probs of y_t, the top-K S^q and the response hidden states.
Here the student's forward runs once, under `jax.vjp`: its hidden states (stopped) give the old-pass
outputs, then the teacher pass (which needs S^q), the reference log-probs and the loss batch run in
the same program, the loss is differentiated w.r.t. the hidden states and the LM head, and the
forward's pullback turns that into the parameters' gradients. Values are those of the phased step
(`train_step.TrainStep` without fusion; tests/trainer/test_fused_step.py compares the two). The price: the student's
activations stay live through the teacher and reference forwards (more peak memory), so it is off by
default and meant for small models (the CPU demo), where the saved forward is ~1/6 of a step.

Not with micro-batches (the teacher rows are packed apart from the student's, so a micro-batch of one
is not a micro-batch of the other) or image batches: `make_train_step` refuses those combinations.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import nnx

from openclaw_jax.losses import get_loss
from openclaw_jax.trainer import advantages as A
from openclaw_jax.trainer import step as S


def fused_loss_and_grads(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State, inputs: S.StudentInputs,
                         teacher_graphdef: nnx.GraphDef, teacher_state: nnx.State, teacher_inputs: S.TeacherInputs,
                         settings: S.StepSettings, *, run_teacher: bool, folded_reference: bool,
                         importance_cap: float | None):
    """(loss, metric stats, gradients, k* [B, T]) with the old pass, the teacher pass and the reference
    pass inside (module doc); `importance_cap` set: the truncated importance correction of the advantages."""
    length = inputs.response_ids.shape[1]

    def forward(tr):
        model = nnx.merge(graphdef, *S.cast_floating((tr, frozen), settings.compute_dtype))
        return S._student_hidden(model, inputs, length, settings.image_grid), model.lm_head_kernel()

    (hidden, head), pullback = jax.vjp(forward, trainable)
    hidden0, head0 = jax.lax.stop_gradient(hidden), jax.lax.stop_gradient(head)
    old = S.old_pass_outputs(hidden0, head0, inputs.response_ids, settings)
    b, c = teacher_inputs.candidate_mask.shape
    if run_teacher:
        teach = S.teacher_pass(teacher_graphdef, teacher_state, teacher_inputs, inputs.response_ids, old.topk_ids,
                               settings)
        old_at = S.logprobs_at_teacher_ids(hidden0, head0, teach.topk_ids, settings)
    else:
        teach = S.no_teacher_outputs(b, c, length, settings.top_k)
        old_at = teach.logprobs_at_student_ids
    ref = None
    if settings.loss.kl_coef != 0:
        ref = teach.reference_logprobs if folded_reference else S.reference_pass(
            teacher_graphdef, teacher_state, inputs, settings)
    advantages = None
    if importance_cap is not None:
        advantages = A.importance_weighted(inputs.advantages, old.old_logprobs, inputs.rollout_logprobs,
                                           inputs.response_mask, cap=importance_cap)
    batch = jax.lax.stop_gradient(S.assemble_batch(inputs, teacher_inputs, old, teach, old_at, advantages, ref))

    def loss_of(h, w):
        return get_loss(settings.loss.name).chunked_with_stats(
            h, w, batch, settings.loss, temperature=settings.temperature, chunk_size=settings.chunk_size,
            with_k_star=True)

    (loss, (metric_stats, k_star)), (d_hidden, d_head) = jax.value_and_grad(loss_of, argnums=(0, 1), has_aux=True)(
        hidden0, head0)
    (grads,) = pullback((d_hidden.astype(hidden.dtype), d_head.astype(head.dtype)))
    return loss, metric_stats, grads, k_star


def fused_train_step(graphdef: nnx.GraphDef, trainable: nnx.State, frozen: nnx.State, opt_state: Any,
                     inputs: S.StudentInputs, teacher_graphdef: nnx.GraphDef, teacher_state: nnx.State,
                     teacher_inputs: S.TeacherInputs, run_teacher: bool, folded_reference: bool, *,
                     settings: S.StepSettings, optimizer: optax.GradientTransformation,
                     lr_schedule: optax.Schedule | None = None, importance_cap: float | None = None,
                     serve: bool = False, merge_lora: bool = False):
    """The whole step in one program: (new trainable, new opt state, metrics, k* [B, T]) and, with `serve`,
    the serving state, as `step.update_step` / `step.update_step_serving` return them. `run_teacher` and
    `folded_reference` are positional so that jit can hold them static (as `TrainStep` calls its phases)."""
    if settings.micro_batch_size > 0 or settings.image_grid:
        raise ValueError("trainer.fused_old_pass runs without micro-batches and image batches: set "
                         "trainer.micro_batch_size=0 or trainer.fused_old_pass=false")
    loss, metric_stats, grads, k_star = fused_loss_and_grads(
        graphdef, trainable, frozen, inputs, teacher_graphdef, teacher_state, teacher_inputs, settings,
        run_teacher=run_teacher, folded_reference=folded_reference, importance_cap=importance_cap)
    signal = S.has_learning_signal(inputs.advantages, teacher_inputs.candidate_mask, settings)
    trainable, opt_state, metrics = S.apply_update(trainable, opt_state, loss, metric_stats, grads, optimizer,
                                                   lr_schedule, signal=signal)
    if not serve:
        return trainable, opt_state, metrics, k_star
    return trainable, opt_state, metrics, k_star, S.serving_state(graphdef, trainable, frozen, merge_lora=merge_lora,
                                                                  dtype=settings.compute_dtype)
