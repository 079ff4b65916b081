"""The planner's command line (`python -m openclaw_jax.plan --help`; the package doc says what it plans)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from openclaw_jax.configlib import ConfigError
from openclaw_jax.plan.build import build_plan
from openclaw_jax.plan.table import format_table

# JAX, and the package modules that import it, are imported inside `main`, once XLA_FLAGS (the simulated
# device count) and JAX_PLATFORMS are set: JAX reads them once, when it starts.

_REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "models"
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
          "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4}


def parse_bytes(text: str) -> int:
    """'80GiB', '80 GB', '1.5e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 80GiB, 40GB or 1e9")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def find_model_config(model_path: str, explicit: str | None = None) -> Path:
    """The config.json that describes `model_path` (see the package doc for the search order)."""
    tried = []
    candidates = [Path(explicit)] if explicit else []
    candidates += [Path(model_path), _REPO_CONFIGS / Path(model_path).name.lower()]
    for c in candidates:
        path = c / "config.json" if c.suffix != ".json" else c
        tried.append(str(path))
        if path.is_file():
            return path
    raise FileNotFoundError(f"no config.json for model.path={model_path!r}; tried {tried}. Pass --model-config "
                            f"(an HF config.json or its directory)")


OPENCLAW_RESPONSE_LEN = 64   # --prompt-len without --response-len: OpenClaw replies are tens of tokens


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openclaw_jax.plan",
        description="Ahead-of-time memory/FLOP plan of one trainer step on N simulated devices, from config.json "
                    "alone (no weights); with trainer.personalize=per_person, each person's adapter on the trainer "
                    "and in the serving engine too.",
        epilog="Examples: python -m openclaw_jax.plan --config configs/qwen3_4b_gpu.yaml --devices 4 "
               "trainer.max_seq_len=4096; python -m openclaw_jax.plan --config configs/qwen3_4b_gpu.yaml --devices 8 "
               "--people 3 trainer.personalize=per_person model.lora.enabled=true policy.mode=embedded")
    p.add_argument("--config", action="append", default=[], metavar="YAML", required=True,
                   help="experiment YAML (repeatable)")
    p.add_argument("--devices", type=int, required=True, help="number of devices the trainer's mesh spans")
    p.add_argument("--device-memory", type=parse_bytes, default=parse_bytes("80GiB"),
                   help="memory per device, e.g. 80GiB (default) or 141GB")
    p.add_argument("--model-config", default=None, help="HF config.json (or its directory); default: see above")
    p.add_argument("--response-len", type=int, default=None,
                   help="response bucket T (default: trainer.max_seq_len, the largest the batcher makes); with "
                        f"--prompt-len the response's tokens (default {OPENCLAW_RESPONSE_LEN})")
    p.add_argument("--prompt-len", type=int, default=None,
                   help="plan the batch of samples with prompts of this many tokens (e.g. 10534: OpenClaw's default "
                        "profile, 2500: its minimal one) as the batcher packs them, instead of the largest batch")
    p.add_argument("--shared-len", type=int, default=0,
                   help="with --prompt-len: tokens at the start of every prompt common to all samples (a system prompt)")
    p.add_argument("--hint-len", type=int, default=32,
                   help="with --prompt-len: tokens a hint adds to its candidate's prompt (default 32)")
    p.add_argument("--images", type=int, default=1,
                   help="a vision-language model: images (screenshots) per sample (default 1)")
    p.add_argument("--image-size", default="448x336", metavar="WxH",
                   help="a vision-language model: each image's size in pixels (default 448x336, the GUI env's screen)")
    p.add_argument("--people", type=int, default=None,
                   help="trainer.personalize=per_person: people whose adapters and optimizer states the trainer holds "
                        "(default 1)")
    p.add_argument("--serving-memory", type=parse_bytes, default=None,
                   help="trainer.personalize=per_person: memory of the device the serving engine runs on alone "
                        "(default: --device-memory)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    return p


def _device_flags(n: int) -> str:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    return " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)   # key=value overrides may come before or after options
    if args.devices < 1 or (args.people is not None and args.people < 1):
        print(f"--devices={args.devices} and --people={args.people} must be >= 1", file=sys.stderr)
        return 2
    want = _device_flags(args.devices)
    if "jax" in sys.modules and os.environ.get("XLA_FLAGS", "") != want:
        # The device count is fixed when JAX starts: plan in a fresh process.
        env = dict(os.environ, XLA_FLAGS=want, JAX_PLATFORMS="cpu")
        return subprocess.run([sys.executable, "-m", "openclaw_jax.plan"] + list(argv or sys.argv[1:]),
                              env=env).returncode
    os.environ["XLA_FLAGS"] = want
    os.environ["JAX_PLATFORMS"] = "cpu"
    from openclaw_jax.config import load_experiment_config   # imports JAX: only now that XLA_FLAGS is set

    try:
        cfg = load_experiment_config(args.config, args.overrides)
        path = find_model_config(cfg.model.path, args.model_config)
        if cfg.trainer.personalize != "per_person" and (args.people, args.serving_memory) != (None, None):
            raise ConfigError("--people and --serving-memory plan a per-person run: add trainer.personalize=per_person "
                              "(with model.lora.enabled=true)")
    except (ConfigError, FileNotFoundError) as err:
        print(f"plan error: {err}", file=sys.stderr)
        return 2
    import jax

    if jax.device_count() != args.devices:
        print(f"plan error: JAX sees {jax.device_count()} devices, not {args.devices}", file=sys.stderr)
        return 2
    lengths = None
    if args.prompt_len is not None:
        lengths = {"prompt": args.prompt_len, "response": args.response_len or OPENCLAW_RESPONSE_LEN,
                   "hint": args.hint_len, "shared": args.shared_len}
    try:
        width, _, height = args.image_size.lower().partition("x")
        plan = build_plan(cfg, json.loads(path.read_text()), response_len=args.response_len,
                          device_memory=args.device_memory, lengths=lengths,
                          images=(args.images, int(width), int(height)), people=args.people or 1,
                          serving_memory=args.serving_memory or args.device_memory)
    except ValueError as err:  # lengths the config cannot batch (longer than trainer.max_seq_len, ...)
        print(f"plan error: {err}", file=sys.stderr)
        return 2
    plan["model_config"] = str(path)
    if args.json:
        print(json.dumps(plan))
    else:
        print(format_table(plan))
    return 0

