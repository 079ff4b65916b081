"""The `policy:` section reaches the policy server the same way in both modes: the embedded engine's
`EngineConfig` (`runs.policy_process.engine_config`) equals the one the server process builds from its
command line (`server_command`, parsed by the server's own flags). No process is started."""

from __future__ import annotations

import dataclasses

from openclaw_jax.config import load_experiment_config
from openclaw_jax.inference.cli import build_arg_parser, engine_config_from
from openclaw_jax.runs.policy_process import engine_config, server_command


def test_the_server_process_gets_the_embedded_engines_settings(tmp_path):
    cfg = load_experiment_config(overrides=[
        "policy.max_batch_size=6", "policy.min_batch_rows=2", "policy.max_prefill_rows=3", "policy.min_cache_len=128",
        "policy.min_prompt_len=64", "policy.prefix_cache_mb=96", "policy.prefix_refresh_tokens=4096",
        "policy.prefix_refresh_entries=3", "policy.prefix_refresh_wait_s=2.5", "policy.prefix_refresh_chunk_tokens=128"])
    cmd = server_command(cfg, "tiny", "7", [tmp_path])
    assert cmd[1:3] == ["-m", "openclaw_jax.inference"]
    args = build_arg_parser().parse_args(cmd[3:])
    process, embedded = engine_config_from(args), engine_config(cfg.policy)
    assert process == embedded, {f.name: (getattr(process, f.name), getattr(embedded, f.name))
                                 for f in dataclasses.fields(process)
                                 if getattr(process, f.name) != getattr(embedded, f.name)}
    assert (process.prefix_refresh_chunk_tokens, process.prefix_refresh_wait_s, process.max_batch_size) == (128, 2.5, 6)


def test_the_default_policy_section_recomputes_as_a_server_started_alone_does():
    """A server started by hand (`python -m openclaw_jax.inference` with no refresh flags) recomputes hot prefixes
    at a swap as a live run's policy server does by default: same budget, wait and chunk."""
    refresh = ("prefix_refresh_tokens", "prefix_refresh_entries", "prefix_refresh_wait_s", "prefix_refresh_chunk_tokens")
    by_hand = engine_config_from(build_arg_parser().parse_args(["--model", "tiny"]))
    live = engine_config(load_experiment_config(overrides=[]).policy)
    assert {name: getattr(by_hand, name) for name in refresh} == {name: getattr(live, name) for name in refresh}
