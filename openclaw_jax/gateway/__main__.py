"""`python -m openclaw_jax.gateway`: run the OpenAI-compatible gateway.

    python -m openclaw_jax.gateway --policy-url http://127.0.0.1:30000 --judge rule \
        --model smollm2 --store runs/samples --port 8000

Every flag is also a key of `GatewayConfig`, settable from YAML (`--config gw.yaml`, flat keys
or under a top-level `gateway:` section) or as a dotted override (`--set judge_votes=5`).
Precedence: YAML < --set < explicit flags. Keys left unset come from the environment
(OPENCLAW_GATEWAY_API_KEY, OPENCLAW_GATEWAY_ADMIN_KEY, OPENCLAW_POLICY_API_KEY), so they need not
appear in the process list. A gateway bound beyond loopback needs a client key (--keys-file or
--api-key); it refuses to start otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from openclaw_jax.configlib import ConfigError, from_dict, load_yaml, parse_override, to_dict
from openclaw_jax.gateway.config import KEY_ENVIRONMENT, GatewayConfig
from openclaw_jax.gateway.server import API_KEY_ENV, start_gateway, stop_gateway
from openclaw_jax.logs import configure_logging

logger = logging.getLogger("openclaw_jax.gateway")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openclaw_jax.gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", action="append", default=[], help="YAML file(s) with GatewayConfig keys")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    p.add_argument("--policy-url", action="append", dest="policy_urls", help="policy pool URL (repeatable)")
    judge = p.add_mutually_exclusive_group()
    judge.add_argument("--judge-url", action="append", dest="judge_urls",
                       help="judge (PRM) pool URL (repeatable); implies --judge model")
    judge.add_argument("--judge", choices=["model", "rule", "openai"], help="'model' (PRM votes on the judge "
                       "pool, default: the policy pool), 'openai' (the same votes on an OpenAI-compatible endpoint: "
                       "--set judge_base_url=URL --set judge_model=ID, key in $OPENCLAW_JUDGE_API_KEY) or 'rule' "
                       "(pattern rules, no model)")
    p.add_argument("--model", help="tokenizer + chat template: an HF model directory or 'smollm2'")
    p.add_argument("--store", dest="store_dir", help="sample store directory")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (0 = ephemeral)")
    p.add_argument("--api-key", dest="api_key", help=f"one bearer key for every client (or set ${API_KEY_ENV}; "
                   f"the admin key: ${KEY_ENVIRONMENT['admin_key']}, the policy pool's: ${KEY_ENVIRONMENT['policy_api_key']})")
    p.add_argument("--keys-file", dest="keys_file", help="YAML mapping 'key: person id', one key per person "
                   "(a key may be written sha256:<hex digest>); see docs/security.md")
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(args: argparse.Namespace, environ=os.environ) -> GatewayConfig:
    data: dict = {}
    for path in args.config:
        loaded = load_yaml(path)
        if isinstance(loaded.get("gateway"), dict):
            loaded = loaded["gateway"]
        data.update(loaded)
    for text in args.set:
        key, value = parse_override(text)
        data[key] = value
    for name in ("policy_urls", "store_dir", "model", "host", "port", "api_key", "keys_file"):
        value = getattr(args, name)
        if value is not None:
            data[name] = value
    if args.judge_urls:
        data["judge_urls"] = args.judge_urls
        data["judge"] = "model"
    elif args.judge:
        data["judge"] = args.judge
    return from_dict(GatewayConfig, data, prefix="gateway").with_environment(environ)


async def serve(cfg: GatewayConfig) -> None:
    gateway, runner, url = await start_gateway(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # One machine-readable line on stdout: scripts and tests wait for it.
    print(f"openclaw_jax.gateway listening on {url}", flush=True)
    await stop.wait()
    logger.info("stopping: no new requests; finishing queued judgements")
    await stop_gateway(gateway, runner)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        cfg = config_from_args(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    safe = {k: ("***" if k in KEY_ENVIRONMENT and v else v) for k, v in to_dict(cfg).items()}
    logger.info("gateway config: %s", safe)
    try:
        asyncio.run(serve(cfg))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, OSError) as err:
        logger.error("gateway failed to start: %s", err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
