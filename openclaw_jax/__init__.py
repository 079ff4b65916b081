"""openclaw_jax: an agent that gets better simply by being used (OpenClaw-RL in JAX/Flax)."""

__version__ = "0.1.0"
