"""The ``tail_kl`` loss: ``w_rl`` GRPO + ``w_opd`` top-K tail reverse KL to the selected teacher k*."""

from __future__ import annotations

import jax.numpy as jnp

from openclaw_jax.losses.hybrid import LossKind, grpo_plus_distill, grpo_sample_loss, masked
from openclaw_jax.losses.opd import take_candidate, topk_tail_kl
from openclaw_jax.losses.registry import loss_kind, register_loss


@loss_kind("tail_kl")
class TailKLKind(LossKind):
    """GRPO + the reverse KL to the k* teacher over its top-K ids (with a tail bucket)."""

    per_position = True

    def gather(self, batch, cfg, *, tokens, kstar, active):
        teacher_ids = masked(take_candidate(batch.teacher_topk_ids, kstar), active[..., None], jnp.int32)
        teacher_lp = masked(take_candidate(batch.teacher_topk_logprobs, kstar), active[..., None])
        return jnp.concatenate([tokens, teacher_ids], axis=-1), teacher_lp

    def terms(self, cur_logprobs, batch, cfg, plan, *, old, rewards, raw_kl, stats):
        grpo_sample = grpo_sample_loss(raw_kl, rewards, cfg, plan, stats)
        opd_token = jnp.where(plan.active, topk_tail_kl(cur_logprobs[..., 1:], plan.extra), 0.0)
        return grpo_plus_distill(grpo_sample, opd_token, cfg, plan, stats)


register_loss("tail_kl", "tail_kl", None, "GRPO + top-K tail reverse KL to the selected teacher")
