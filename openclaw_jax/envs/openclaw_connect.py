"""Connect a person's existing OpenClaw to the gateway, and disconnect it again.

`scripts/openclaw.sh connect --gateway URL [--openclaw-config PATH] [--model-id ID] [--api-key K]
[--person-id P] ...`
(`python -m openclaw_jax.envs.openclaw_connect connect ...`) adds to the person's `openclaw.json`:

* the provider `models.providers.openclaw-jax` (`baseUrl` = the gateway's `/v1`, the model `--model-id`
  with `--context-window` and `--max-tokens`), and makes `openclaw-jax/<model-id>` the default model
  (`agents.defaults.model.primary`; the person's fallbacks stay);
* our plugin (`integrations/openclaw/`): its directory appended to `plugins.load.paths`, its entry
  `plugins.entries.openclaw-jax` (enabled, conversation access for its hooks, the gateway URL and key for
  session-done notices, and with `--person-id` the person whose turns these are: the plugin sends it as
  `X-Person-Id` on every request, docs/household.md), and its id appended to `plugins.allow` and the model to
  `agents.defaults.modelPolicy.allow` when the person keeps such allowlists (never created: an allowlist
  that was not there would shut out the person's other plugins or models);
* with `--profile minimal` (small models: the default profile's system prompt is ~10.5 k SmolLM2 tokens),
  `tools.profile: minimal`, `agents.defaults.skills: []`, `agents.defaults.skipBootstrap: true`.

Everything else (other providers, plugins, channels, settings) is kept. OpenClaw itself writes the file
(`openclaw config patch`: one validated write, objects merged; nothing is written if it does not
validate) and checks it afterwards (`openclaw config validate`); the file is read with OpenClaw's own JSON5
parser. Before the first write the original file is copied to `<config>.before-openclaw-jax` and what was
changed is recorded in `<config>.openclaw-jax.json` (each setting's earlier value). Running `connect`
again with the same settings writes nothing; with other settings (another gateway URL) it updates ours and
keeps the first backup.

`disconnect`:
* if the file is still exactly what `connect` wrote, the backup is put back byte for byte (comments and
  formatting included) and OpenClaw validates it;
* if the person (or OpenClaw) changed the file since, only what `connect` added is undone, through one
  `openclaw config patch`: each of our settings that still holds our value goes back to its earlier value
  (or is removed), our entries leave the allowlists and plugin paths; a setting of ours that the person
  changed since is kept, and so is every other change. The report names both; the backup is left in place.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal, Sequence

from openclaw_jax.envs.openclaw_agent import (PLUGIN_DIR, PLUGIN_ID, PROVIDER_ID, OpenClawError, install_dir,
                                              missing_install, node_bin, openclaw_bin, plugin_entry, provider_block)
from openclaw_jax.samples.person import check_person_id

logger = logging.getLogger(__name__)

RECORD_SUFFIX = ".openclaw-jax.json"
BACKUP_SUFFIX = ".before-openclaw-jax"
RECORD_VERSION = 1
# The system prompt of OpenClaw's default profile is ~10.5 k SmolLM2 tokens: below this context the
# minimal profile is what leaves room for the conversation.
MINIMAL_PROFILE_BELOW = 16384
Profile = Literal["keep", "minimal"]
Path_ = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ConnectSpec:
    """What `connect` points OpenClaw at."""

    gateway_url: str                      # the gateway's root (no /v1)
    model_id: str = "smollm2"
    api_key: str = "none"                 # the gateway's bearer key (OpenClaw needs a non-empty one)
    context_window: int = 8192
    max_tokens: int = 256
    profile: Profile = "keep"
    plugin_dir: Path = PLUGIN_DIR
    person_id: str = ""                   # the plugin's personId: whose turns these are ("" names nobody)

    def __post_init__(self) -> None:
        if not self.gateway_url.startswith(("http://", "https://")) or len(self.gateway_url) < 10:
            raise ValueError(f"--gateway {self.gateway_url!r}: give the gateway's URL, e.g. http://127.0.0.1:8000")
        object.__setattr__(self, "gateway_url", self.gateway_url.rstrip("/").removesuffix("/v1"))
        if not self.model_id or "/" in self.model_id:
            raise ValueError(f"--model-id {self.model_id!r}: the model name the gateway serves, without '/'")
        if not self.api_key:
            raise ValueError("--api-key is empty: OpenClaw refuses a provider without a key; use 'none' when the "
                             "gateway has none")
        if not 0 < self.max_tokens < self.context_window:
            raise ValueError(f"--max-tokens {self.max_tokens} must be in (0, --context-window {self.context_window})")
        if self.profile not in ("keep", "minimal"):
            raise ValueError(f"--profile {self.profile!r}: use keep or minimal")
        if self.person_id:
            check_person_id(self.person_id, "--person-id")

    @property
    def model_ref(self) -> str:
        return f"{PROVIDER_ID}/{self.model_id}"


# ----------------------------------------------------------------------------- the settings and their diff

_ABSENT = object()


def get_path(tree: Any, path: Path_, default: Any = _ABSENT) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return default
        tree = tree[key]
    return tree


def set_path(tree: dict, path: Path_, value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(tree.get(key), dict):
            tree[key] = {}
        tree = tree[key]
    tree[path[-1]] = value


def delete_path(tree: dict, path: Path_) -> None:
    parent = get_path(tree, path[:-1])
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One change `connect` makes: `set` a value, or `append` an item to a list."""

    path: Path_
    value: Any
    kind: Literal["set", "append"] = "set"


def our_settings(spec: ConnectSpec, current: dict) -> list[Setting]:
    """What `connect` changes in `current` (see the module docstring)."""
    out = [Setting(("models", "providers", PROVIDER_ID),
                   provider_block(spec.gateway_url, spec.model_id, spec.api_key, spec.context_window, spec.max_tokens))]
    model = get_path(current, ("agents", "defaults", "model"))
    if isinstance(model, dict) or model is _ABSENT:
        out.append(Setting(("agents", "defaults", "model", "primary"), spec.model_ref))
    else:  # a plain "provider/model" string
        out.append(Setting(("agents", "defaults", "model"), {"primary": spec.model_ref}))
    out.append(Setting(("plugins", "load", "paths"), str(spec.plugin_dir), "append"))
    out.append(Setting(("plugins", "entries", PLUGIN_ID), plugin_entry(spec.gateway_url, spec.api_key, spec.person_id)))
    if isinstance(get_path(current, ("plugins", "allow")), list):
        out.append(Setting(("plugins", "allow"), PLUGIN_ID, "append"))
    if isinstance(get_path(current, ("agents", "defaults", "modelPolicy", "allow")), list):
        out.append(Setting(("agents", "defaults", "modelPolicy", "allow"), spec.model_ref, "append"))
    if spec.profile == "minimal":
        out += [Setting(("tools", "profile"), "minimal"), Setting(("agents", "defaults", "skills"), []),
                Setting(("agents", "defaults", "skipBootstrap"), True)]
    return out


def applied(current: dict, settings: Sequence[Setting]) -> dict:
    """`current` with `settings` made (a copy)."""
    out = copy.deepcopy(current)
    for s in settings:
        if s.kind == "set":
            set_path(out, s.path, copy.deepcopy(s.value))
        else:
            items = get_path(out, s.path, [])
            items = list(items) if isinstance(items, list) else []
            if s.value not in items:
                set_path(out, s.path, items + [s.value])
    return out


def merge_patch(current: Any, desired: Any) -> dict:
    """The `openclaw config patch` that turns `current` into `desired`: objects merge recursively, arrays and
    scalars replace, null deletes (RFC 7386, as OpenClaw applies it)."""
    patch: dict[str, Any] = {k: None for k in current if k not in desired}
    for key, want in desired.items():
        have = current.get(key, _ABSENT)
        if isinstance(have, dict) and isinstance(want, dict):
            sub = merge_patch(have, want)
            if sub:
                patch[key] = sub
        elif have is _ABSENT or have != want:
            patch[key] = want
    return patch


def _highest_absent(current: dict, path: Path_) -> Path_ | None:
    """The shortest prefix of `path` missing from `current` (what setting `path` creates), or None."""
    for i in range(1, len(path) + 1):
        if get_path(current, path[:i]) is _ABSENT:
            return path[:i]
    return None


def _is_hollow(tree: Any) -> bool:
    """Only empty objects inside (what is left once our entries are taken out of a branch we created)."""
    return isinstance(tree, dict) and all(_is_hollow(v) for v in tree.values())


# ----------------------------------------------------------------------------- OpenClaw's CLI


class OpenClawCLI:
    """The installed OpenClaw (`scripts/openclaw.sh setup`) run in the person's own environment, with
    `OPENCLAW_CONFIG_PATH` pointing at the config when one is given."""

    def __init__(self, config_path: Path | None = None, install: Path | None = None, timeout_s: float = 300.0):
        self.install = Path(install) if install else install_dir()
        missing = missing_install(self.install)
        if missing:
            raise OpenClawError("OpenClaw is not installed: missing " + "; ".join(missing))
        self.config_path = Path(config_path).absolute() if config_path else None
        self.timeout_s = timeout_s

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{node_bin(self.install).parent}{os.pathsep}{env.get('PATH', '')}"
        env["NO_COLOR"] = "1"
        if self.config_path is not None:
            env["OPENCLAW_CONFIG_PATH"] = str(self.config_path)
        return env

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        cmd = [str(openclaw_bin(self.install)), *args]
        proc = subprocess.run(cmd, env=self.env(), input=stdin, capture_output=True, text=True,
                              timeout=self.timeout_s)
        if proc.returncode != 0:
            raise OpenClawError(f"`openclaw {' '.join(args)}` exited {proc.returncode}: "
                                f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        return proc

    def active_config(self) -> Path:
        """The file OpenClaw reads (`openclaw config file`): `OPENCLAW_CONFIG_PATH`, the state dir's, or ~/.openclaw's."""
        if self.config_path is not None:
            return self.config_path
        out = self.run("config", "file", "--json").stdout
        return Path(json.loads(out[out.find("{"):])["path"])

    def read(self, path: Path) -> dict:
        """The config as OpenClaw's own JSON5 parser reads it ({} when the file does not exist)."""
        if not path.exists():
            return {}
        parser = self.install / "app" / "node_modules" / "json5"
        script = ("const J=require(process.argv[1]);const fs=require('fs');"
                  "process.stdout.write(JSON.stringify(J.parse(fs.readFileSync(process.argv[2],'utf8'))))")
        proc = subprocess.run([str(node_bin(self.install)), "-e", script, str(parser), str(path)],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise OpenClawError(f"{path} does not parse as JSON5: {proc.stderr.strip()[-1000:]}")
        data = json.loads(proc.stdout)
        if not isinstance(data, dict):
            raise OpenClawError(f"{path} holds a {type(data).__name__}, not a config object")
        return data

    def patch(self, patch: dict) -> str:
        """One validated write (`openclaw config patch --stdin`); returns OpenClaw's message."""
        return self.run("config", "patch", "--stdin", stdin=json.dumps(patch)).stdout.strip()

    def validate(self) -> None:
        out = self.run("config", "validate", "--json").stdout
        result = json.loads(out[out.find("{"):])
        if not result.get("valid"):
            raise OpenClawError(f"OpenClaw does not accept {result.get('path')}: {result}")


# ----------------------------------------------------------------------------- connect / disconnect


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def _write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_path(config: Path) -> Path:
    return config.with_name(config.name + RECORD_SUFFIX)


def backup_path(config: Path) -> Path:
    return config.with_name(config.name + BACKUP_SUFFIX)


def _load_record(config: Path) -> dict | None:
    path = record_path(config)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record.get("version") != RECORD_VERSION:
        raise OpenClawError(f"{path} was written by another version (version {record.get('version')!r}); "
                            "restore the config from its backup by hand")
    return record


@dataclasses.dataclass
class Report:
    config: Path
    action: str                         # connected, unchanged, restored, undone, not-connected
    changed: list[str] = dataclasses.field(default_factory=list)   # dotted paths written
    kept: list[str] = dataclasses.field(default_factory=list)      # ours, changed by the person since: left as is
    backup: Path | None = None
    message: str = ""


def _dotted(path: Sequence[str]) -> str:
    return ".".join(path)


def connect(spec: ConnectSpec, cli: OpenClawCLI) -> Report:
    config = cli.active_config()
    current = cli.read(config)
    settings = our_settings(spec, current)
    desired = applied(current, settings)
    record = _load_record(config)
    if desired == current and record is not None:
        return Report(config, "unchanged", backup=backup_path(config),
                      message="already connected with these settings; nothing written")
    if record is None:  # the first connect: keep the original and what each setting held before
        config.parent.mkdir(parents=True, exist_ok=True)
        original = config.read_bytes() if config.exists() else None
        _write_atomic(backup_path(config), original or b"", mode=0o600)
        record = {"version": RECORD_VERSION, "original_existed": original is not None, "entries": {}}
    entries = record["entries"]
    for s in settings:
        key = _dotted(s.path)
        if key not in entries:  # the earliest value wins: disconnect goes back to before the first connect
            entries[key] = record_entry(current, s)
        entries[key]["ours"] = s.value
    patch = merge_patch(current, desired)
    message = cli.patch(patch) if patch else "nothing to change"
    record.update(connected_sha256=_sha256(config), gateway_url=spec.gateway_url, model_ref=spec.model_ref)
    _write_atomic(record_path(config), (json.dumps(record, indent=2) + "\n").encode(), mode=0o600)
    cli.validate()
    return Report(config, "connected", changed=sorted(_dotted(s.path) for s in settings), backup=backup_path(config),
                  message=message)


def record_entry(current: dict, setting: Setting) -> dict:
    """What disconnect needs to know of one setting: the value before connect (or that there was none), ours,
    and the branch connect creates for it (removed again when the undo leaves it empty)."""
    before = get_path(current, setting.path)
    return {"path": list(setting.path), "kind": setting.kind, "absent": before is _ABSENT,
            "before": None if before is _ABSENT else before, "ours": setting.value,
            "created": list(_highest_absent(current, setting.path) or ())}


def undo(current: dict, entries: dict) -> tuple[dict, list[str], list[str]]:
    """`current` without what connect added; (result, undone paths, kept paths)."""
    out = copy.deepcopy(current)
    undone, kept, created = [], [], []
    for key, e in entries.items():
        path, now = tuple(e["path"]), get_path(current, tuple(e["path"]))
        if e["kind"] == "append":
            if isinstance(now, list) and e["ours"] in now:
                rest = [x for x in now if x != e["ours"]]
                if rest or not e["absent"]:
                    set_path(out, path, rest)
                else:
                    delete_path(out, path)
                undone.append(key)
        elif now == e["ours"]:
            if e["absent"]:
                delete_path(out, path)
            else:
                set_path(out, path, copy.deepcopy(e["before"]))
            undone.append(key)
        elif now is not _ABSENT:
            kept.append(key)
        if e["created"]:
            created.append(tuple(e["created"]))
    for branch in sorted(set(created), key=len, reverse=True):  # branches connect made, left empty by the undo
        if get_path(out, branch) is not _ABSENT and _is_hollow(get_path(out, branch)):
            delete_path(out, branch)
    return out, sorted(undone), sorted(kept)


def disconnect(cli: OpenClawCLI) -> Report:
    config = cli.active_config()
    record = _load_record(config)
    if record is None:
        return Report(config, "not-connected", message=f"no {record_path(config).name} beside {config}: "
                                                       "`connect` did not write this config, nothing to undo")
    backup = backup_path(config)
    if _sha256(config) == record["connected_sha256"] and backup.exists():
        if record["original_existed"]:
            _write_atomic(config, backup.read_bytes(), mode=config.stat().st_mode & 0o777)
            cli.validate()
        else:
            config.unlink()
        backup.unlink()
        record_path(config).unlink()
        return Report(config, "restored", changed=sorted(record["entries"]),
                      message="the config is back to what it was before connect, byte for byte")
    current = cli.read(config)
    desired, undone, kept = undo(current, record["entries"])
    patch = merge_patch(current, desired)
    message = cli.patch(patch) if patch else "nothing of ours was left"
    cli.validate()
    record_path(config).unlink()
    return Report(config, "undone", changed=undone, kept=kept, backup=backup if backup.exists() else None,
                  message=message)


# ----------------------------------------------------------------------------- CLI


def connect_command(gateway_url: str, model_id: str, context_window: int, max_tokens: int,
                    api_key_env: str | None = None) -> str:
    """The one command that connects a person's OpenClaw to this gateway (what a live run prints)."""
    cmd = f"bash scripts/openclaw.sh connect --gateway {gateway_url} --model-id {model_id} " \
          f"--context-window {context_window} --max-tokens {max_tokens}"
    if context_window < MINIMAL_PROFILE_BELOW:
        cmd += " --profile minimal"
    if api_key_env:
        cmd += f' --api-key "${api_key_env}"'
    return cmd


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/openclaw.sh", description=(
        "Connect your OpenClaw to the openclaw_jax gateway (our provider and plugin merged into your openclaw.json, "
        "everything else kept, a backup first), or disconnect it (the original back)."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  bash scripts/openclaw.sh connect --gateway http://127.0.0.1:8000 --model-id smollm2 "
               "--profile minimal\n  bash scripts/openclaw.sh disconnect")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("connect", "disconnect"):
        s = sub.add_parser(name, help=f"{name} your OpenClaw")
        s.add_argument("--openclaw-config", type=Path, default=None,
                       help="the openclaw.json to change (default: the one OpenClaw uses, `openclaw config file`)")
        if name == "connect":
            s.add_argument("--gateway", required=True, help="the gateway's URL, e.g. http://127.0.0.1:8000")
            s.add_argument("--model-id", default="smollm2", help="the model name the gateway serves (default smollm2)")
            s.add_argument("--api-key", default=os.environ.get("OPENCLAW_GATEWAY_API_KEY") or "none",
                           help="the gateway's key (default $OPENCLAW_GATEWAY_API_KEY, else none)")
            s.add_argument("--context-window", type=int, default=8192,
                           help="the context OpenClaw is told the model has (default 8192)")
            s.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply (default 256)")
            s.add_argument("--profile", choices=["keep", "minimal"], default="keep",
                           help="minimal: OpenClaw's minimal tools profile, no skills, no bootstrap files (for "
                                "small models); keep (default): your tools as they are")
            s.add_argument("--person-id", default="",
                           help="who uses this OpenClaw, when several people share the gateway (e.g. alice): "
                                "1 to 64 letters, digits and . _ @ + -; sent as X-Person-Id on every request, so "
                                "the gateway keeps and scores each person's turns apart (docs/household.md). "
                                "Default: nobody named (the gateway's default person, or the person of your key)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        cli = OpenClawCLI(args.openclaw_config)
        if args.command == "connect":
            spec = ConnectSpec(gateway_url=args.gateway, model_id=args.model_id, api_key=args.api_key,
                               context_window=args.context_window, max_tokens=args.max_tokens, profile=args.profile,
                               person_id=args.person_id)
            report = connect(spec, cli)
        else:
            report = disconnect(cli)
    except (OpenClawError, ValueError, OSError, subprocess.TimeoutExpired) as err:
        logger.error("openclaw.sh %s: %s", args.command, err)
        return 1
    logger.info("%s: %s (%s)", report.config, report.action, report.message)
    if report.changed:
        logger.info("  %s: %s", "set" if report.action == "connected" else "undone", ", ".join(report.changed))
    if report.kept:
        logger.info("  kept, changed by you since connect: %s", ", ".join(report.kept))
    if report.backup is not None:
        logger.info("  your config from before connect: %s", report.backup)
    return 0 if report.action != "not-connected" else 1


if __name__ == "__main__":
    sys.exit(main())
