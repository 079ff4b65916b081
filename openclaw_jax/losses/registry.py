"""Losses registered by name with decorators, so a loss is one file that registers itself.

A *loss kind* (``losses.hybrid.LossKind`` subclass, ``@loss_kind("name")``) says which vocabulary ids
it needs and how it turns the current log-probs there into loss terms. A *named loss*
(``register_loss``) is a kind plus the weights it fixes: ``rl`` is the hybrid kind with
``w_opd = 0``. ``loss.name`` picks one; the allowed names are this registry's. A weight a loss fixes
is resolved once, when the ``LossConfig`` is built, and an explicit conflicting weight is refused
there (``losses/config.py``). Both tables are the package's one ``Registry`` (``openclaw_jax/registry.py``).
This module never imports the loss files.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, TypeVar

from openclaw_jax.losses.policy import finalize_metrics
from openclaw_jax.ops.logprobs import DEFAULT_CHUNK_SIZE
from openclaw_jax.registry import Registry

KINDS: Registry[Any] = Registry("loss kind")            # name -> LossKind instance
LOSSES: Registry["RegisteredLoss"] = Registry("loss")   # name -> RegisteredLoss
WEIGHTS = ("w_rl", "w_opd")   # the loss weights a named loss may fix (default 1.0 each)

K = TypeVar("K", bound=type)


def loss_kind(name: str, *, overwrite: bool = False) -> Callable[[K], K]:
    """Class decorator: register a ``LossKind`` subclass (one instance) as loss kind ``name``."""

    def decorate(cls: K) -> K:
        KINDS.add(name, cls(), overwrite=overwrite)   # (a taken name is refused before the class is renamed)
        cls.name = name
        return cls

    return decorate


def get_kind(name: str) -> Any:
    """The registered ``LossKind`` instance called ``name``."""
    return KINDS.get(name)


def available_kinds() -> tuple[str, ...]:
    return KINDS.names()


@dataclass(frozen=True)
class RegisteredLoss:
    """A named loss: the loss kind it computes and the loss weights it fixes (e.g. ``{"w_opd": 0.0}``).

    Its methods take a ``LossConfig`` built for this name (``cfg.name``): the weights are resolved there.
    """

    name: str
    kind: str
    fixed_weights: Mapping[str, float]
    description: str
    uses_hints: bool = True   # False: no teacher candidates, no hint votes, hint-only samples dropped

    def _check(self, cfg) -> None:
        if cfg.name != self.name:
            raise ValueError(f"loss {self.name!r} was given a LossConfig for loss.name={cfg.name!r}; build the "
                             f"config with name={self.name!r} (its weights are resolved for that name)")

    def dense_with_stats(self, logits, batch, cfg, *, sample_count=None, with_k_star: bool = False):
        self._check(cfg)
        return get_kind(self.kind).dense_with_stats(logits, batch, cfg, sample_count=sample_count,
                                                    with_k_star=with_k_star)

    def chunked_with_stats(self, hidden, lm_head, batch, cfg, *, temperature=1.0,
                           chunk_size: int = DEFAULT_CHUNK_SIZE, sample_count=None, with_k_star: bool = False):
        self._check(cfg)
        return get_kind(self.kind).chunked_with_stats(hidden, lm_head, batch, cfg, temperature=temperature,
                                                      chunk_size=chunk_size, sample_count=sample_count,
                                                      with_k_star=with_k_star)

    def dense(self, logits, batch, cfg, *, sample_count=None):
        loss, stats = self.dense_with_stats(logits, batch, cfg, sample_count=sample_count)
        return loss, finalize_metrics(stats)

    def chunked(self, hidden, lm_head, batch, cfg, *, temperature=1.0, chunk_size: int = DEFAULT_CHUNK_SIZE,
                sample_count=None):
        loss, stats = self.chunked_with_stats(hidden, lm_head, batch, cfg, temperature=temperature,
                                              chunk_size=chunk_size, sample_count=sample_count)
        return loss, finalize_metrics(stats)


def register_loss(name: str, kind: str, fixed_weights: Mapping[str, float] | None = None, description: str = "",
                  *, uses_hints: bool = True, overwrite: bool = False) -> RegisteredLoss:
    """Register ``name`` as loss kind ``kind`` with the weights it fixes (``w_rl`` / ``w_opd``)."""
    if kind not in KINDS:
        raise ValueError(f"cannot register loss {name!r}: kind {kind!r} is not one of {available_kinds()}")
    unknown = set(fixed_weights or {}) - set(WEIGHTS)
    if unknown:
        raise ValueError(f"loss {name!r} fixes {sorted(unknown)}; only {WEIGHTS} can be fixed")
    entry = RegisteredLoss(name, kind, MappingProxyType(dict(fixed_weights or {})), description, uses_hints)
    LOSSES.add(name, entry, overwrite=overwrite)
    return entry


def get_loss(name: str) -> RegisteredLoss:
    """The named loss ``name`` (``combine``, ``rl``, ``opd``, ``token_combine``, ``tail_kl``, ...)."""
    return LOSSES.get(name)


def available_losses() -> tuple[str, ...]:
    return LOSSES.names()
