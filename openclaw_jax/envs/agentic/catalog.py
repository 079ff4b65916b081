"""The agentic environments by name (`agentic.env`): a leaf the config validates against.

Each built-in environment is *declared* here with the module that defines it and registers it with
`@register_environment(name)`; that module is imported only when the environment is built
(`episode.make_env`), so knowing the names (loading a config) imports no environment: no GUI, no
sandbox. An environment of your own registers itself when its module is imported.
"""

from __future__ import annotations

from typing import Any, Callable

from openclaw_jax.registry import Registry

ENVIRONMENTS: Registry[Any] = Registry("agentic environment")   # name -> an `episode.Environment` subclass

BUILT_IN = {"easy": "easy", "toolcall": "toolcall", "terminal": "terminal", "swe": "swe", "gui": "gui"}
for _name, _module in BUILT_IN.items():
    ENVIRONMENTS.declare(_name, f"openclaw_jax.envs.agentic.{_module}")


def register_environment(name: str) -> Callable[[type], type]:
    """Class decorator: register an `Environment` subclass as `agentic.env: <name>` (sets its `name`)."""

    def decorate(cls: type) -> type:
        cls.name = name
        ENVIRONMENTS.add(name, cls)
        return cls

    return decorate
