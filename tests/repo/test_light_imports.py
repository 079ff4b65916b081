"""Loading the experiment config imports no environment: the agentic environments are known by name
(`envs/agentic/catalog.py`) and imported only when one is built; the registries are the package's one
`Registry` (environments, losses, personas), whose declared names import their module on first use."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from openclaw_jax.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
# what loading the config may import of envs/: the packages and their config sections, the environments' names
CONFIG_SIDE = {"openclaw_jax.envs", "openclaw_jax.envs.config", "openclaw_jax.envs.agentic",
               "openclaw_jax.envs.agentic.config", "openclaw_jax.envs.agentic.catalog"}


def _fresh(code: str) -> dict:
    """Run `code` in a fresh interpreter (nothing imported before it); it prints one JSON object."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_loading_the_config_imports_no_environment():
    got = _fresh("""
        import json, sys
        from openclaw_jax.config import load_experiment_config
        cfg = load_experiment_config(["configs/gui_cpu.yaml"], [])   # a config that names the GUI environment
        print(json.dumps({"env": cfg.agentic.env, "modules": sorted(sys.modules)}))
    """)
    assert got["env"] == "gui"
    envs = {m for m in got["modules"] if m.startswith("openclaw_jax.envs")}
    assert not any(m.startswith("openclaw_jax.envs.agentic.gui") for m in envs), envs
    assert envs <= CONFIG_SIDE, envs - CONFIG_SIDE   # no environment, sandbox, persona or simulated user
    assert "tkinter" not in got["modules"] and "selenium" not in got["modules"]


def test_an_environment_is_imported_when_it_is_built():
    got = _fresh("""
        import json, sys
        from openclaw_jax.envs.agentic.catalog import ENVIRONMENTS
        from openclaw_jax.envs.agentic.config import AgenticConfig
        from openclaw_jax.envs.agentic.episode import make_env
        names = list(ENVIRONMENTS.names())
        before = "openclaw_jax.envs.agentic.toolcall" in sys.modules
        env = make_env(AgenticConfig(env="toolcall"))
        after = "openclaw_jax.envs.agentic.toolcall" in sys.modules
        print(json.dumps({"names": names, "before": before, "after": after, "name": env.name,
                          "gui": "openclaw_jax.envs.agentic.gui" in sys.modules}))
    """)
    assert set(got["names"]) >= {"easy", "gui", "swe", "terminal", "toolcall"}
    assert (got["before"], got["after"], got["name"], got["gui"]) == (False, True, "toolcall", False)


def test_declared_names_import_their_module_on_first_use():
    registry: Registry[object] = Registry("widget")
    registry.declare("json_widget", "json")   # importing json registers nothing
    assert "json_widget" in registry and registry.names() == ("json_widget",)
    with pytest.raises(ValueError, match="json was declared to register the widget 'json_widget' but did not"):
        registry.get("json_widget")
    registry.add("json_widget", 1)
    assert registry.get("json_widget") == 1
    with pytest.raises(ValueError, match=r"unknown widget 'nope'; registered: \('json_widget',\)"):
        registry.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        registry.add("json_widget", 2)


def test_losses_use_the_package_registry():
    from openclaw_jax.losses import registry as losses

    assert isinstance(losses.KINDS, Registry) and isinstance(losses.LOSSES, Registry)
    assert {"combine", "rl", "opd", "token_combine", "tail_kl"} <= set(losses.available_losses())
    assert losses.get_loss("rl").fixed_weights["w_opd"] == 0.0
    with pytest.raises(ValueError, match=r"unknown loss 'nope'; registered: .*combine"):
        losses.get_loss("nope")
