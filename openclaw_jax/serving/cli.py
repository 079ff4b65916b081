"""`python -m openclaw_jax.serving list|rollback`: the kept weight versions of a running gateway, and
serving one of them again.

    python -m openclaw_jax.serving list --gateway http://127.0.0.1:8000 --key ADMIN_KEY
    python -m openclaw_jax.serving rollback --version 3 --gateway http://127.0.0.1:8000 --key ADMIN_KEY

The key is the gateway's admin key (``gateway.admin_key``); ``--key`` may be left out when the
environment variable OPENCLAW_GATEWAY_ADMIN_KEY holds it. ``list`` prints the served version, the
kept ones and the recent decisions (``--json``: the gateway's answer as it is); ``rollback`` asks the
gateway's ``POST /v1/admin/rollback`` and prints what is served now. Exit status 0 on success, 1 when
the gateway refused (its message is printed), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

ADMIN_KEY_ENV = "OPENCLAW_GATEWAY_ADMIN_KEY"


class GatewayRefused(RuntimeError):
    """The gateway answered with an error status (the message is its own)."""


def _request(gateway: str, path: str, key: str, body: dict[str, Any] | None = None, timeout_s: float = 600.0):
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(gateway.rstrip("/") + path, data=data, method="GET" if body is None else "POST",
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return json.loads(reply.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read().decode("utf-8"))["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = err.reason
        raise GatewayRefused(f"HTTP {err.code}: {message}") from None
    except (urllib.error.URLError, OSError) as err:
        raise GatewayRefused(f"cannot reach the gateway at {gateway}: {getattr(err, 'reason', err)}") from None


def _print_list(answer: dict[str, Any]) -> None:
    served = answer.get("served_version")
    print(f"served version: {served if served is not None else 'unknown'}")
    kept = answer.get("kept") or []
    print("kept versions:  " + (", ".join(f"{v}{' (served)' if v == served else ''}" for v in kept) or "none"))
    events = answer.get("events") or []
    if events:
        print("recent decisions (newest first):")
    for ev in events[:20]:
        check = ev.get("check") or {}
        score = f" score={check['score']:.4g} drift={check['drift']:.4g}" if "score" in check else ""
        print(f"  {ev['event']:<9} v{ev['version']:<6}{score}  {ev.get('reason', '')}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m openclaw_jax.serving",
                                     description="List the kept weight versions of a gateway, or serve one again.",
                                     epilog=f"The admin key may also come from ${ADMIN_KEY_ENV}.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{list,rollback}")
    for name, help_text in (("list", "print the served version, the kept ones and the recent gate decisions"),
                            ("rollback", "serve a kept version again (every policy worker loads its weights)")):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("--gateway", required=True, help="the gateway's base URL, e.g. http://127.0.0.1:8000")
        cmd.add_argument("--key", help=f"the gateway's admin key (default: ${ADMIN_KEY_ENV})")
        if name == "rollback":
            cmd.add_argument("--version", required=True, help="the kept weight version to serve, e.g. 3")
            cmd.add_argument("--reason", default="", help="a note kept in the versions log")
        else:
            cmd.add_argument("--json", action="store_true", help="print the gateway's JSON answer as it is")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    key = args.key or os.environ.get(ADMIN_KEY_ENV, "")
    if not key:
        print(f"error: no admin key: pass --key or set {ADMIN_KEY_ENV}", file=sys.stderr)
        return 2
    try:
        if args.command == "list":
            answer = _request(args.gateway, "/v1/admin/versions", key)
            print(json.dumps(answer, indent=2)) if args.json else _print_list(answer)
        else:
            answer = _request(args.gateway, "/v1/admin/rollback", key, {"version": args.version, "reason": args.reason})
            print(f"serving version {answer['served_version']} (was {answer['from_version']}) on "
                  f"{len(answer['workers'])} worker(s)")
    except GatewayRefused as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
