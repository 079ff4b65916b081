"""Losses registered by name (tunix style), each with a dense and a chunked implementation.

``get_loss(name)`` returns a :class:`RegisteredLoss` whose ``dense(logits, batch, cfg)`` and
``chunked(hidden, lm_head, batch, cfg, *, temperature, chunk_size)`` both return
``(loss, metrics)``; ``*_with_stats`` variants return metrics as ``(sum, count)`` pairs.

Built-ins:
  ``combine``        hybrid GRPO + top-K OPD with the config's weights (the method's default);
  ``rl``             the same with ``w_opd = 0`` (GRPO only; OPD metrics still reported);
  ``opd``            the same with ``w_rl = 0`` (top-K OPD only);
  ``token_combine``  legacy token-level advantage ``w_OPD (l_T - l_old) + w_RL r``, PPO on y_t;
  ``tail_kl``        ``w_rl`` GRPO + ``w_opd`` top-K tail reverse KL to the k* teacher.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from openclaw_jax.losses.hybrid import LossConfig, chunked_loss_with_stats, dense_loss_with_stats
from openclaw_jax.losses.policy import finalize_metrics
from openclaw_jax.ops.logprobs import DEFAULT_CHUNK_SIZE


@dataclass(frozen=True)
class RegisteredLoss:
    """A named loss: the loss kind it computes and how it adjusts the config."""

    name: str
    kind: str
    adjust_config: Callable[[LossConfig], LossConfig]
    description: str

    def dense_with_stats(self, logits, batch, cfg: LossConfig = LossConfig(), *, sample_count=None):
        return dense_loss_with_stats(logits, batch, self.adjust_config(cfg), kind=self.kind,
                                     sample_count=sample_count)

    def chunked_with_stats(self, hidden, lm_head, batch, cfg: LossConfig = LossConfig(), *, temperature=1.0,
                           chunk_size: int = DEFAULT_CHUNK_SIZE, sample_count=None):
        return chunked_loss_with_stats(hidden, lm_head, batch, self.adjust_config(cfg), kind=self.kind,
                                       temperature=temperature, chunk_size=chunk_size, sample_count=sample_count)

    def dense(self, logits, batch, cfg: LossConfig = LossConfig(), *, sample_count=None):
        loss, stats = self.dense_with_stats(logits, batch, cfg, sample_count=sample_count)
        return loss, finalize_metrics(stats)

    def chunked(self, hidden, lm_head, batch, cfg: LossConfig = LossConfig(), *, temperature=1.0,
                chunk_size: int = DEFAULT_CHUNK_SIZE, sample_count=None):
        loss, stats = self.chunked_with_stats(hidden, lm_head, batch, cfg, temperature=temperature,
                                              chunk_size=chunk_size, sample_count=sample_count)
        return loss, finalize_metrics(stats)


_REGISTRY: dict[str, RegisteredLoss] = {}


def register_loss(name: str, kind: str, adjust_config: Callable[[LossConfig], LossConfig] | None = None,
                  description: str = "", *, overwrite: bool = False) -> RegisteredLoss:
    """Register ``name`` as loss ``kind`` (see ``hybrid.LOSS_KINDS``) with an optional config adjustment."""
    from openclaw_jax.losses.hybrid import LOSS_KINDS

    if kind not in LOSS_KINDS:
        raise ValueError(f"cannot register loss {name!r}: kind {kind!r} is not one of {LOSS_KINDS}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"a loss named {name!r} is already registered; pass overwrite=True to replace it")
    entry = RegisteredLoss(name, kind, adjust_config or (lambda cfg: cfg), description)
    _REGISTRY[name] = entry
    return entry


def get_loss(name: str) -> RegisteredLoss:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; registered losses: {sorted(_REGISTRY)}") from None


def available_losses() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


register_loss("combine", "hybrid", None, "hybrid GRPO + top-K OPD (w_rl, w_opd from the config)")
register_loss("rl", "hybrid", lambda cfg: dataclasses.replace(cfg, w_opd=0.0), "GRPO only")
register_loss("opd", "hybrid", lambda cfg: dataclasses.replace(cfg, w_rl=0.0), "top-K OPD only")
register_loss("token_combine", "token_combine", None, "legacy token-level combine advantage, PPO on y_t")
register_loss("tail_kl", "tail_kl", None, "GRPO + top-K tail reverse KL to the selected teacher")
