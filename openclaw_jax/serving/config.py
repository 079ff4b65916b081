"""The promotion gate's settings (the `gate:` section of the experiment config).

Every field has a default; `__post_init__` names the key (``gate.<field>``), the value and what is
allowed. docs/gate_and_status.md states the rule these numbers parameterise.
"""

from __future__ import annotations

from dataclasses import dataclass

from openclaw_jax.configlib import require


@dataclass(frozen=True)
class GateConfig:
    """When a trained weight version may replace the served one, and what is kept for rollback."""

    # off: every version the trainer hands over is served (still logged in <run_dir>/versions/events.jsonl)
    enabled: bool = False
    # 1 scored turn in this many is held out of training and becomes replay material (samples/holdout.py)
    holdout_every: int = 4
    # the most recent held-out turns the check replays
    replay_size: int = 16
    # fewer held-out turns carrying a signal than this: the candidate is refused (too little evidence)
    min_replay: int = 4
    # the candidate's replay score against the served version (nats per token) must be at least this
    min_score: float = 0.0
    # and its mean per-token KL(served || candidate) on the replayed responses at most this
    max_kl: float = 0.1
    # promoted versions whose weights stay on disk for rollback (the served one is never removed)
    keep: int = 3
    # after this many refusals in a row the trainer restarts from the served weights (0: never)
    reset_after: int = 3

    def __post_init__(self) -> None:
        require(self.holdout_every >= 2, f"gate.holdout_every={self.holdout_every} must be >= 2 (1 in N scored turns "
                                         "is held out; 1 would leave nothing to train on)")
        require(self.replay_size >= 1, f"gate.replay_size={self.replay_size} must be >= 1")
        require(0 <= self.min_replay <= self.replay_size,
                f"gate.min_replay={self.min_replay} must be in [0, gate.replay_size={self.replay_size}]")
        require(self.max_kl > 0, f"gate.max_kl={self.max_kl} must be > 0 (nats per token)")
        require(self.keep >= 1, f"gate.keep={self.keep} must be >= 1 (kept promoted versions, besides the served one)")
        require(self.reset_after >= 0, f"gate.reset_after={self.reset_after} must be >= 0 (0: never reset)")

    @property
    def holdout(self) -> int:
        """The trainer's hold-out rate: 1 in `holdout_every` when the gate is on, none when it is off."""
        return self.holdout_every if self.enabled else 0
