"""General agentic RL (docs/design.md §13): episodes, environments, group rollouts.

Environments: `toolcall` (python interpreter; math), `terminal` (bash in a prepared directory),
`swe` (fix a small repository until its tests pass), `gui` (a real Tk application on its own Xvfb
display, acted on with click/type/key) and `easy` (a one-turn environment a tiny random model can
learn, for tests), each in its own module and registered with `@register_environment(name)`
(`catalog.py`, which knows their names without importing them). `episode.make_env(cfg)` builds one
from the `agentic:` config, `episode.episode_runner(cfg, env, tokenizer)` the runner of its episodes;
`rollout.py` runs groups of episodes into the sample store. This package's `__init__` imports nothing:
loading the experiment config (`config.py` here) imports no environment.
"""
