"""Walk the experiment config through `train.build_trainer` and one training step.

Records, with `sys.setprofile`, every call into a file of the `openclaw_jax` package that receives
the config or one of its sections (any nested config dataclass) as an argument, in order, and prints
the sequence of files as *stays* (consecutive calls in one file), how often each file is entered,
and how many stays return to a file already left. The bar: each file of `trainer/` entered at most
twice, with and without `--derived` (`--check` exits 1 otherwise).

  python scripts/trace_cfg_walk.py [--verbose] [--derived] [--check]

`--derived` also follows the settings objects built from the config (`StepSettings`, `BatchSpec`,
`SampleSpec`): the walk of everything the config decides, not only of the config tree itself. The
step is `trainer.train_on` on a window packed by the trainer's own batcher (`pack`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import openclaw_jax  # noqa: E402

PKG = os.path.dirname(os.path.abspath(openclaw_jax.__file__))


def config_nodes(cfg) -> dict[int, str]:
    """id -> dotted name of the config and every nested config dataclass."""
    out: dict[int, str] = {}

    def walk(node, name):
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            out[id(node)] = name
            for f in dataclasses.fields(node):
                walk(getattr(node, f.name), f"{name}.{f.name}" if name != "cfg" else f.name)

    walk(cfg, "cfg")
    return out


def tiny_config(run_dir: str):
    from openclaw_jax.config import load_experiment_config

    root = os.path.dirname(PKG)
    return load_experiment_config([os.path.join(root, "configs", "tiny_cpu.yaml")],
                                  overrides=[f"run_dir={run_dir}", "trainer.max_seq_len=256"])


def tiny_samples(n: int, vocab: int = 200):
    import numpy as np

    from openclaw_jax.samples import Sample

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        prompt = rng.integers(3, vocab, 12).tolist()
        response = rng.integers(3, vocab, 6).tolist()
        hints = ["be brief"] if i % 2 else []
        out.append(Sample(session_id=f"s{i}", turn_index=0, kind="opd+rl" if hints else "rl", reward=1.0 if i % 3 else -1.0,
                          prompt_ids=prompt, response_ids=response, rollout_logprobs=[-1.0] * len(response),
                          hints=hints, hint_prompt_ids=[prompt + [5, 6, 7]] if hints else [], weight_version="0"))
    return out


DERIVED = ("StepSettings", "BatchSpec", "SampleSpec")


def trace(verbose: bool = False, derived: bool = False) -> dict:
    from openclaw_jax import train
    from openclaw_jax.trainer.batcher import pack

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = tiny_config(run_dir)
        base = train.load_base_model(cfg)
        nodes = config_nodes(cfg)
        calls: list[tuple[str, str, str]] = []

        def profile(frame, event, arg):
            if event != "call":
                return
            path = frame.f_code.co_filename
            if not path.startswith(PKG):
                return
            code = frame.f_code
            nargs = code.co_argcount + code.co_kwonlyargcount
            for name in code.co_varnames[:nargs]:
                value = frame.f_locals.get(name)
                if value is None or not dataclasses.is_dataclass(value):
                    continue
                label = nodes.get(id(value))
                if label is None and derived and type(value).__name__ in DERIVED:
                    label = type(value).__name__
                if label is not None:
                    calls.append((os.path.relpath(path, os.path.dirname(PKG)), code.co_name, label))
                    return

        sys.setprofile(profile)
        try:
            trainer = train.build_trainer(cfg, base)
            spec = trainer.train_step.spec
            trainer.train_on(pack(tiny_samples(spec.samples_per_step), spec, current_version=0))
        finally:
            sys.setprofile(None)

    stays: list[tuple[str, list[str]]] = []
    for path, fn, section in calls:
        if stays and stays[-1][0] == path:
            stays[-1][1].append(f"{fn}({section})")
        else:
            stays.append((path, [f"{fn}({section})"]))
    entered: dict[str, int] = {}
    returns = 0
    for path, _ in stays:
        returns += path in entered
        entered[path] = entered.get(path, 0) + 1
    for path, fns in stays:
        print(f"{path}: {', '.join(fns) if verbose else len(fns)}")
    print(f"stays {len(stays)} in {len(entered)} files; returns to a file already left: {returns}")
    for path, n in sorted(entered.items(), key=lambda x: -x[1]):
        print(f"  entered {n}x  {path}")
    return {"stays": len(stays), "files": len(entered), "returns": returns, "entered": entered}


TRAINER_FILE_BAR = 2   # the most times following the config may enter one file of trainer/


def over_the_bar(result: dict) -> dict[str, int]:
    """The trainer files the walk entered more than `TRAINER_FILE_BAR` times."""
    return {path: n for path, n in result["entered"].items()
            if path.startswith("openclaw_jax/trainer/") and n > TRAINER_FILE_BAR}


if __name__ == "__main__":
    result = trace(verbose="--verbose" in sys.argv, derived="--derived" in sys.argv)
    over = over_the_bar(result)
    print(f"trainer files entered more than {TRAINER_FILE_BAR}x: {over or 'none'}")
    sys.exit(1 if over and "--check" in sys.argv else 0)
