"""Environments: personas (pure preference checks and reactions, `personas.py`), question sources with
disjoint train / held-out splits (`questions.py`), simulated users that drive sessions through the
gateway (`simulated_user.py`), the sandbox, and the agentic environments (`agentic/`). Each section of
the config is its own module (`config.py`, `agentic/config.py`); this `__init__` imports nothing, so
loading the config imports no environment.
"""
