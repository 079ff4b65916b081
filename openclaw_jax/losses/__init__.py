"""The hybrid GRPO + top-K OPD loss family (docs/design.md §6).

Pinned API: ``overlap_counts``, ``select_hint``, ``hybrid_loss``, ``HybridBatch``, ``LossConfig``.
Extras: the chunked path (``chunked_hybrid_loss``), stats variants for micro-batch/host
averaging, the registry (``get_loss(cfg.name)``), and the building blocks. One file per loss
(``hybrid.py``, ``token_combine.py``, ``tail_kl.py``), each registering itself when imported here.
"""

from openclaw_jax.losses import hybrid, tail_kl, token_combine  # noqa: F401  (importing a loss file registers it)
from openclaw_jax.losses.config import LossConfig
from openclaw_jax.losses.hybrid import (
    GatherPlan,
    HybridBatch,
    LossKind,
    chunked_hybrid_loss,
    chunked_loss_with_stats,
    dense_loss_with_stats,
    hybrid_loss,
    hybrid_loss_with_stats,
    make_gather_plan,
)
from openclaw_jax.losses.opd import SUBSET_MODES, topk_opd_token_loss, topk_tail_kl
from openclaw_jax.losses.policy import (
    LOSS_METRIC_NAMES,
    METRIC_NAMES,
    MetricStat,
    finalize_metrics,
    low_var_kl,
    merge_metric_stats,
    ppo_clip_loss,
)
from openclaw_jax.losses.registry import (RegisteredLoss, available_kinds, available_losses, get_kind, get_loss,
                                          loss_kind, register_loss)
from openclaw_jax.losses.selection import HINT_SELECTION_MODES, overlap_counts, select_hint



__all__ = [
    # pinned (docs/design.md §6)
    "overlap_counts",
    "select_hint",
    "hybrid_loss",
    "HybridBatch",
    "LossConfig",
    # extras
    "chunked_hybrid_loss",
    "hybrid_loss_with_stats",
    "dense_loss_with_stats",
    "chunked_loss_with_stats",
    "make_gather_plan",
    "GatherPlan",
    "LossKind",
    "loss_kind",
    "get_kind",
    "available_kinds",
    "SUBSET_MODES",
    "HINT_SELECTION_MODES",
    "METRIC_NAMES",
    "LOSS_METRIC_NAMES",
    "MetricStat",
    "finalize_metrics",
    "merge_metric_stats",
    "ppo_clip_loss",
    "low_var_kl",
    "topk_opd_token_loss",
    "topk_tail_kl",
    "RegisteredLoss",
    "register_loss",
    "get_loss",
    "available_losses",
]
