"""Run wiring beside `openclaw_jax.train`: what turns the experiment config into the parts of a run.

`train.py` is the entry point and the order of start-up; the modules here translate the
`ExperimentConfig` into the arguments of the components (which take only their own config
section), so the components never import the experiment config, the trainer or the gateway:
`users.py` (simulated users on the gateway) and `agentic.py` (the agentic run mode).
"""
