"""Losses registered by name with decorators, so a loss is one file that registers itself.

A *loss kind* is a ``losses.hybrid.LossKind`` subclass (which ids it needs from the vocabulary,
how it turns the current log-probs there into loss terms) decorated with ``@loss_kind("name")``.
A *named loss* is a kind plus an optional config adjustment, added with ``register_loss``; the
trainer picks one by name (``get_loss(name)``). A new loss is a new file under ``losses/``
(imported by ``losses/__init__.py``) that defines its kind and registers its names; nothing else
changes. This module is a leaf: it stores what the loss files register and never imports them.

``get_loss(name)`` returns a :class:`RegisteredLoss` whose ``dense(logits, batch, cfg)`` and
``chunked(hidden, lm_head, batch, cfg, *, temperature, chunk_size)`` both return
``(loss, metrics)``; ``*_with_stats`` variants return metrics as ``(sum, count)`` pairs.

Built-ins:
  ``combine``        hybrid GRPO + top-K OPD with the config's weights (the method's default; ``hybrid.py``);
  ``rl``             the same with ``w_opd = 0`` (GRPO only; OPD metrics still reported);
  ``opd``            the same with ``w_rl = 0`` (top-K OPD only);
  ``token_combine``  legacy token-level advantage ``w_OPD (l_T - l_old) + w_RL r``, PPO on y_t (``token_combine.py``);
  ``tail_kl``        ``w_rl`` GRPO + ``w_opd`` top-K tail reverse KL to the k* teacher (``tail_kl.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from openclaw_jax.losses.config import LossConfig
from openclaw_jax.losses.policy import finalize_metrics
from openclaw_jax.ops.logprobs import DEFAULT_CHUNK_SIZE

_KINDS: dict[str, Any] = {}  # name -> LossKind instance
_REGISTRY: dict[str, "RegisteredLoss"] = {}

K = TypeVar("K", bound=type)


def loss_kind(name: str, *, overwrite: bool = False) -> Callable[[K], K]:
    """Class decorator: register a ``LossKind`` subclass (one instance) as loss kind ``name``."""

    def decorate(cls: K) -> K:
        if name in _KINDS and not overwrite:
            raise ValueError(f"a loss kind named {name!r} is already registered ({type(_KINDS[name]).__name__}); "
                             "pass overwrite=True to replace it")
        cls.name = name
        _KINDS[name] = cls()
        return cls

    return decorate


def _lookup(table: dict[str, Any], name: str, what: str) -> Any:
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; registered: {tuple(sorted(table))}")
    return table[name]


def get_kind(name: str) -> Any:
    """The registered ``LossKind`` instance called ``name``."""
    return _lookup(_KINDS, name, "loss kind")


def available_kinds() -> tuple[str, ...]:
    return tuple(sorted(_KINDS))


@dataclass(frozen=True)
class RegisteredLoss:
    """A named loss: the loss kind it computes and how it adjusts the config."""

    name: str
    kind: str
    adjust_config: Callable[[LossConfig], LossConfig]
    description: str

    def dense_with_stats(self, logits, batch, cfg: LossConfig = LossConfig(), *, sample_count=None):
        return get_kind(self.kind).dense_with_stats(logits, batch, self.adjust_config(cfg), sample_count=sample_count)

    def chunked_with_stats(self, hidden, lm_head, batch, cfg: LossConfig = LossConfig(), *, temperature=1.0,
                           chunk_size: int = DEFAULT_CHUNK_SIZE, sample_count=None):
        return get_kind(self.kind).chunked_with_stats(hidden, lm_head, batch, self.adjust_config(cfg),
                                                      temperature=temperature, chunk_size=chunk_size,
                                                      sample_count=sample_count)

    def dense(self, logits, batch, cfg: LossConfig = LossConfig(), *, sample_count=None):
        loss, stats = self.dense_with_stats(logits, batch, cfg, sample_count=sample_count)
        return loss, finalize_metrics(stats)

    def chunked(self, hidden, lm_head, batch, cfg: LossConfig = LossConfig(), *, temperature=1.0,
                chunk_size: int = DEFAULT_CHUNK_SIZE, sample_count=None):
        loss, stats = self.chunked_with_stats(hidden, lm_head, batch, cfg, temperature=temperature,
                                              chunk_size=chunk_size, sample_count=sample_count)
        return loss, finalize_metrics(stats)


def register_loss(name: str, kind: str, adjust_config: Callable[[LossConfig], LossConfig] | None = None,
                  description: str = "", *, overwrite: bool = False) -> RegisteredLoss:
    """Register ``name`` as the registered loss kind ``kind`` with an optional config adjustment."""
    if kind not in _KINDS:
        raise ValueError(f"cannot register loss {name!r}: kind {kind!r} is not one of {available_kinds()}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"a loss named {name!r} is already registered; pass overwrite=True to replace it")
    entry = RegisteredLoss(name, kind, adjust_config or (lambda cfg: cfg), description)
    _REGISTRY[name] = entry
    return entry


def get_loss(name: str) -> RegisteredLoss:
    """The named loss ``name`` (``combine``, ``rl``, ``opd``, ``token_combine``, ``tail_kl``, ...)."""
    return _lookup(_REGISTRY, name, "loss")


def available_losses() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))
