"""`LossConfig`: the hyper-parameters of the loss family (a leaf: static under jit, no array leaves)."""

from __future__ import annotations

from dataclasses import dataclass

import jax

from openclaw_jax.losses.opd import SUBSET_MODES
from openclaw_jax.losses.selection import HINT_SELECTION_MODES


@dataclass(frozen=True)
class LossConfig:
    """Hyper-parameters of the loss family (docs/design.md §6). Static under jit (no leaves).

    ``adv_diff_clip <= 0`` disables the OPD diff clip; ``ppo_kl_clamp`` None or ``<= 0``
    disables the +-clamp of ``l_old - l_cur`` in the GRPO and top-K OPD branches.
    """

    w_rl: float = 1.0
    w_opd: float = 1.0
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    adv_diff_clip: float = 1.0
    hint_selection: str = "sequence_optimal"
    subset_mode: str = "student"
    ppo_kl_clamp: float | None = 20.0
    entropy_coef: float = 0.0
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.hint_selection not in HINT_SELECTION_MODES:
            raise ValueError(
                f"loss.hint_selection={self.hint_selection!r} is not supported; use one of {HINT_SELECTION_MODES}"
            )
        if self.subset_mode not in SUBSET_MODES:
            raise ValueError(f"loss.subset_mode={self.subset_mode!r} is not supported; use one of {SUBSET_MODES}")
        for name in ("eps_clip", "eps_clip_high"):
            value = getattr(self, name)
            if not 0.0 <= value:
                raise ValueError(f"loss.{name}={value!r} must be >= 0")
        if self.eps_clip >= 1.0:
            raise ValueError(f"loss.eps_clip={self.eps_clip!r} must be < 1 (the ratio's lower bound is 1 - eps_clip)")

    @property
    def kl_clamp(self) -> float | None:
        return self.ppo_kl_clamp if self.ppo_kl_clamp is not None and self.ppo_kl_clamp > 0 else None


jax.tree_util.register_static(LossConfig)
