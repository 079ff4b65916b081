"""GatewayConfig validation and the CLI's precedence (YAML < --set < flags; API key from the env)."""

from __future__ import annotations

import pytest

from openclaw_jax.configlib import ConfigError
from openclaw_jax.gateway.__main__ import build_parser, config_from_args
from openclaw_jax.gateway.config import GatewayConfig


@pytest.mark.parametrize("changes,key", [
    ({"port": 70000}, "gateway.port"),
    ({"policy_urls": ("127.0.0.1:30000",)}, "gateway.policy_urls[0]"),
    ({"judge_urls": ("ftp://x",)}, "gateway.judge_urls[0]"),
    ({"judge": "oracle"}, "gateway.judge"),
    ({"judge_votes": 0}, "gateway.judge_votes"),
    ({"max_candidates": 0}, "gateway.max_candidates"),
    ({"temperature": 3.0}, "gateway.temperature"),
    ({"max_body_bytes": 10}, "gateway.max_body_bytes"),
    ({"default_max_tokens": 100, "max_tokens_limit": 50}, "gateway.max_tokens_limit"),
    ({"min_main_turn_tokens": 0}, "gateway.min_main_turn_tokens"),
    ({"default_max_tokens": 4, "min_main_turn_tokens": 5}, "gateway.min_main_turn_tokens"),
])
def test_config_errors_name_the_key(changes, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        GatewayConfig(**changes)


def test_defaults_and_derived_values():
    cfg = GatewayConfig(policy_urls=("http://127.0.0.1:1",), model="/models/Qwen3-0.6B/")
    assert cfg.host == "127.0.0.1" and cfg.max_candidates == 3 and cfg.judge == "model"
    assert cfg.judge_pool_urls == ("http://127.0.0.1:1",)  # judge on the policy pool by default
    assert cfg.served_model_name == "Qwen3-0.6B"
    assert cfg.replace(judge_urls=("http://127.0.0.1:2",)).judge_pool_urls == ("http://127.0.0.1:2",)


def test_cli_precedence_yaml_set_flags_and_env(tmp_path):
    yaml_file = tmp_path / "gw.yaml"
    yaml_file.write_text("gateway:\n  port: 9000\n  judge_votes: 5\n  store_dir: /from/yaml\n"
                         "  policy_urls: [http://127.0.0.1:1]\n")
    args = build_parser().parse_args(["--config", str(yaml_file), "--set", "judge_votes=7", "--set", "port=9001",
                                      "--port", "9002", "--judge-url", "http://127.0.0.1:5"])
    cfg = config_from_args(args, environ={"OPENCLAW_GATEWAY_API_KEY": "k3y"})
    assert cfg.port == 9002 and cfg.judge_votes == 7 and cfg.store_dir == "/from/yaml"
    assert cfg.policy_urls == ("http://127.0.0.1:1",)
    assert cfg.judge == "model" and cfg.judge_urls == ("http://127.0.0.1:5",)
    assert cfg.api_key == "k3y"
    rule = config_from_args(build_parser().parse_args(["--judge", "rule", "--api-key", "flag"]),
                            environ={"OPENCLAW_GATEWAY_API_KEY": "env"})
    assert rule.judge == "rule" and rule.api_key == "flag"
    with pytest.raises(ConfigError, match="unknown config key gateway.bogus"):
        config_from_args(build_parser().parse_args(["--set", "bogus=1"]), environ={})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--judge", "rule", "--judge-url", "http://x"])  # mutually exclusive
