"""`LossConfig`: the `loss` section, which loss and its hyper-parameters (static under jit, no array leaves)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax

from openclaw_jax.losses.opd import SUBSET_MODES
from openclaw_jax.losses.registry import WEIGHTS, available_losses, get_loss
from openclaw_jax.losses.selection import HINT_SELECTION_MODES


@dataclass(frozen=True)
class LossConfig:
    """The loss (docs/design.md §6): ``name`` from the registry (``available_losses()``), its weights
    and hyper-parameters. Static under jit (no leaves).

    ``w_rl`` / ``w_opd`` None means "the loss's default", resolved here once: the weight the named loss
    fixes (``rl``: ``w_opd = 0``; ``opd``: ``w_rl = 0``), else 1.0. An explicit weight that conflicts
    with one the loss fixes is refused. ``top_k``: K of the top-K sets (S^q, the teacher's).
    ``adv_diff_clip <= 0`` disables the OPD diff clip; ``log_ratio_clamp`` None or ``<= 0`` disables
    the +-clamp of the log-ratio ``l_old - l_cur`` in the GRPO and top-K OPD branches.

    ``sample_norm_tokens``: 0 (default) makes each sample's terms its masked token mean (docs/design.md
    §6). N > 0 makes them its masked token *sum* / N, the same N for every sample (Dr. GRPO's constant
    normaliser; N is best the response budget): under the mean a token of a short response weighs more
    than one of a long response, so a short wrong episode is pushed down harder per token than a long
    wrong one, which favours long wrong episodes (rambling past the answer) in multi-turn agentic RL.
    """

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "ppo_kl_clamp": "renamed loss.log_ratio_clamp (it clamps the log-ratio l_old - l_cur)"}

    name: str = "combine"
    top_k: int = 4
    w_rl: float | None = None
    w_opd: float | None = None
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    adv_diff_clip: float = 1.0
    hint_selection: str = "sequence_optimal"
    subset_mode: str = "student"
    log_ratio_clamp: float | None = 20.0
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    sample_norm_tokens: int = 0

    def __post_init__(self) -> None:
        if self.name not in available_losses():
            raise ValueError(f"loss.name={self.name!r} is not a registered loss; use one of {available_losses()}")
        self._resolve_weights()
        if self.top_k <= 0:
            raise ValueError(f"loss.top_k={self.top_k} must be > 0")
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
        if isinstance(self.sample_norm_tokens, bool) or not isinstance(self.sample_norm_tokens, int) \
                or self.sample_norm_tokens < 0:
            raise ValueError(f"loss.sample_norm_tokens={self.sample_norm_tokens!r} must be an integer >= 0 (0: each "
                             "sample's token mean; N: its token sum / N, e.g. the response budget)")
        if self.eps_clip >= 1.0:
            raise ValueError(f"loss.eps_clip={self.eps_clip!r} must be < 1 (the ratio's lower bound is 1 - eps_clip)")

    def _resolve_weights(self) -> None:
        fixed = get_loss(self.name).fixed_weights
        for weight in WEIGHTS:
            value, pinned = getattr(self, weight), fixed.get(weight)
            if pinned is not None and value is not None and float(value) != pinned:
                raise ValueError(
                    f"loss.name={self.name!r} fixes loss.{weight}={pinned:g}, but loss.{weight}={value!r} is set: "
                    f"drop loss.{weight} (or set it to null) for {self.name!r}, or pick a loss that uses it "
                    f"(e.g. loss.name=combine)")
            resolved = pinned if value is None and pinned is not None else 1.0 if value is None else float(value)
            object.__setattr__(self, weight, resolved)   # frozen: resolved once, here

    @property
    def uses_hints(self) -> bool:
        """Whether the loss learns from hints at all: `rl` (GRPO only) needs no hint votes, no teacher
        pass and no hint-only samples."""
        return get_loss(self.name).uses_hints

    @property
    def kl_clamp(self) -> float | None:
        return self.log_ratio_clamp if self.log_ratio_clamp is not None and self.log_ratio_clamp > 0 else None


jax.tree_util.register_static(LossConfig)
