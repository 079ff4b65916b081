"""Environments: personas (pure preference checks and reactions), question sources with disjoint
train / held-out splits, and simulated users that drive sessions through the gateway."""

from openclaw_jax.envs.personas import (
    Persona,
    PreferenceVerdict,
    make_persona,
    persona_from_spec,
    persona_names,
    register_persona,
)
from openclaw_jax.envs.questions import Question, heldout_questions, train_questions

__all__ = [
    "Persona",
    "PreferenceVerdict",
    "Question",
    "heldout_questions",
    "make_persona",
    "persona_from_spec",
    "persona_names",
    "register_persona",
    "train_questions",
]
