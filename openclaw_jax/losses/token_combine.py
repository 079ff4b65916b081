"""The legacy ``token_combine`` loss: token-level advantage ``w_OPD (l_T - l_old) + w_RL r``, PPO on y_t."""

from __future__ import annotations

from openclaw_jax.losses.hybrid import LossKind, masked
from openclaw_jax.losses.opd import take_candidate, token_combine_advantages
from openclaw_jax.losses.policy import ppo_clip_loss, sample_stat, sample_token_aggregate, token_stat
from openclaw_jax.losses.registry import loss_kind, register_loss


@loss_kind("token_combine")
class TokenCombineKind(LossKind):
    """PPO on the sampled token with the k* teacher's log-prob gap folded into the advantage."""

    per_position = True

    def gather(self, batch, cfg, *, tokens, kstar, active):
        if batch.teacher_logprobs_at_tokens is None:
            raise ValueError(
                "the token_combine loss needs HybridBatch.teacher_logprobs_at_tokens [B,C,T] "
                "(each candidate's log-prob of the sampled token); the teacher pass must provide it"
            )
        return tokens, None

    def terms(self, cur_logprobs, batch, cfg, plan, *, old, rewards, raw_kl, stats):
        teacher_token = masked(take_candidate(batch.teacher_logprobs_at_tokens, plan.kstar), plan.active)
        advantages = token_combine_advantages(teacher_token, old, rewards, plan.active, w_opd=cfg.w_opd,
                                              w_rl=cfg.w_rl)
        pg, clipped = ppo_clip_loss(raw_kl, advantages, cfg.eps_clip, cfg.eps_clip_high, kl_clamp=None)
        pg_sample = sample_token_aggregate(pg, plan.trained, cfg.sample_norm_tokens)
        stats["grpo_pg_loss"] = sample_stat(pg_sample, plan.sample_mask)
        stats["grpo_pg_clipfrac"] = token_stat(clipped, plan.trained)
        return pg_sample


register_loss("token_combine", "token_combine", None, "legacy token-level combine advantage, PPO on y_t")
