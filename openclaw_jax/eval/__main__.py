"""`python -m openclaw_jax.eval`: the personalisation benchmark from the command line.

Examples:
  # a live server (gateway, SGLang worker or embedded server) with the offline rule evaluator
  python -m openclaw_jax.eval --persona student_prose --questions 20 --seed 0 \\
      --server-url http://127.0.0.1:30000 --evaluator rule --out runs/eval

  # the embedded default model, graded by an LLM judge (3 votes averaged)
  python -m openclaw_jax.eval --persona teacher_friendly --model smollm2 \\
      --evaluator judge --judge-url http://127.0.0.1:30001 --votes 3 --out runs/eval

  # every export of a training run (<run>/export/step_<N>/), plotted against the step
  python -m openclaw_jax.eval --persona student_prose --model smollm2 \\
      --checkpoint runs/demo --evaluator rule --out runs/demo/eval --tb runs/demo/tb

Writes per evaluation `<out>/report_<persona>_<evaluator>_step<N>.json`, for the invocation
`<out>/report.json`, TensorBoard scalars `eval/preference_score`, `eval/satisfied_fraction` and
`eval/accuracy` (the fraction of answers whose final number is the question's answer) at each step (into --tb, default `<out>/tb`), and `<out>/score_vs_step.png` over every report
in `<out>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from openclaw_jax.envs.personas import persona_from_spec, persona_names
from openclaw_jax.envs.questions import SOURCES
from openclaw_jax.eval.benchmark import (
    BenchmarkConfig,
    evaluate_server,
    log_tensorboard,
    plot_score_vs_step,
    write_report,
    write_summary,
)
from openclaw_jax.eval.evaluators import JudgeEvaluator, RuleEvaluator, openai_complete_fn
from openclaw_jax.eval.scoring import step_from_path
from openclaw_jax.eval.server import EmbeddedServer
from openclaw_jax.logs import configure_logging

log = logging.getLogger("openclaw_jax.eval")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m openclaw_jax.eval",
        description="Personalisation benchmark: grade first answers on held-out questions for a persona.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples:", 1)[1] if __doc__ else None,
    )
    g = p.add_argument_group("benchmark")
    g.add_argument("--persona", default="student_prose",
                   help=f"persona spec: NAME or NAME:key=value,...; names: {', '.join(persona_names())}")
    g.add_argument("--questions", type=int, default=20, help="number of held-out questions (default 20)")
    g.add_argument("--seed", type=int, default=0, help="selects the held-out questions and judge vote seeds")
    g.add_argument("--source", choices=SOURCES, default="gsm", help="question source (default gsm)")
    g.add_argument("--max-tokens", type=int, default=256, help="answer token budget (default 256)")
    g.add_argument("--system-prompt", default=None, help="system prompt for every question")
    g.add_argument("--concurrency", type=int, default=1,
                   help="answers generated at once (default 1: batch-independent, reproducible numbers)")

    t = p.add_argument_group("what to evaluate (one of --server-url or --model/--checkpoint)")
    t.add_argument("--server-url", default=None, help="an OpenAI-compatible server to evaluate as it is")
    t.add_argument("--model", default=None, help='"smollm2" or an HF directory; starts the embedded server')
    t.add_argument("--checkpoint", action="append", default=[],
                   help="HF checkpoint dir (e.g. <run>/export/step_<N>) or a run dir whose export/step_* "
                        "are all evaluated; repeatable")
    t.add_argument("--include-base", action="store_true", help="with --checkpoint: also evaluate --model as step 0")
    t.add_argument("--step", type=int, default=None,
                   help="training step to record (default: from the checkpoint path, else 0)")
    t.add_argument("--model-name", default=None, help='OpenAI "model" field (default: first of /v1/models)')
    t.add_argument("--api-key", default=None, help="bearer key of --server-url, if it needs one")
    t.add_argument("--server-arg", action="append", default=[],
                   help="extra argument for the embedded server (repeatable, e.g. --server-arg=--max-batch=4)")
    t.add_argument("--server-startup-timeout", type=float, default=900.0, help="seconds to wait for /health")

    e = p.add_argument_group("evaluator")
    e.add_argument("--evaluator", choices=("rule", "judge"), default="rule",
                   help="rule: the persona's own check (offline); judge: an LLM judge with our rubric")
    e.add_argument("--judge-url", action="append", default=[], help="judge server URL (repeatable; round-robin)")
    e.add_argument("--judge-model", default=None, help='judge "model" field (default: first of its /v1/models)')
    e.add_argument("--votes", type=int, default=3, help="judge votes per answer, averaged (default 3)")
    e.add_argument("--judge-temperature", type=float, default=0.7)
    e.add_argument("--judge-max-tokens", type=int, default=512)

    o = p.add_argument_group("output")
    o.add_argument("--out", required=True, help="output directory (reports, plot, server log)")
    o.add_argument("--tb", default=None, help="TensorBoard directory (default <out>/tb)")
    o.add_argument("--tag", default=None, help="suffix for report file names (to keep several variants)")
    o.add_argument("-v", "--verbose", action="store_true")
    return p


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def expand_checkpoints(paths: Sequence[str]) -> list[Path]:
    """HF checkpoint dirs to evaluate: each path itself, or the `export/step_*` (or `step_*`) HF
    dirs below a run dir, sorted by step."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if _is_hf_dir(path):
            out.append(path)
            continue
        found = [d for pattern in ("export/step_*", "step_*") for d in path.glob(pattern) if _is_hf_dir(d)]
        if not found:
            raise FileNotFoundError(
                f"--checkpoint {raw}: not an HF checkpoint (no config.json) and no export/step_*/ HF dirs below it"
            )
        out.extend(sorted(set(found), key=lambda d: (step_from_path(d) or 0, str(d))))
    return out


def _update_weights(url: str, model_path: Path, version: str) -> None:
    body = json.dumps({"model_path": str(model_path), "weight_version": version, "flush_cache": True}).encode()
    req = urllib.request.Request(f"{url}/update_weights_from_disk", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=3600) as resp:
            result = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        result = {"success": False, "message": e.read().decode(errors="replace")}
    if not result.get("success", False):
        raise RuntimeError(f"loading {model_path} into the inference server failed: {result.get('message')}")


def _make_evaluator(args) -> tuple[Any, Any]:
    """(evaluator, async closer or None)."""
    if args.evaluator == "rule":
        return RuleEvaluator(), None
    if not args.judge_url:
        raise SystemExit("--evaluator judge needs at least one --judge-url (an OpenAI-compatible judge server)")
    complete, aclose = openai_complete_fn(
        args.judge_url, model=args.judge_model, temperature=args.judge_temperature,
        max_tokens=args.judge_max_tokens, api_key=None,
    )
    desc = {"judge_model": args.judge_model, "temperature": args.judge_temperature, "max_tokens": args.judge_max_tokens}
    return JudgeEvaluator(complete, votes=args.votes, seed=args.seed, description=desc), aclose


async def _evaluate_all(args, config: BenchmarkConfig, checkpoints: list[Path], out: Path) -> list[dict[str, Any]]:
    """All evaluations of one invocation, in one event loop (the judge clients live in it)."""
    evaluator, aclose = _make_evaluator(args)
    reports: list[dict[str, Any]] = []

    async def evaluate(url: str, target: dict[str, Any], step: int) -> None:
        reports.append(await evaluate_server(url, config, evaluator, target=target, step=step, api_key=args.api_key))

    try:
        if args.server_url:
            await evaluate(args.server_url, {"kind": "server", "server_url": args.server_url}, args.step or 0)
            return reports
        first = args.model or str(checkpoints[0])
        # later checkpoints are swapped in over HTTP, which the server allows only from its weight directories
        server = EmbeddedServer(first, extra_args=args.server_arg, weight_dirs=[c.parent for c in checkpoints],
                                log_path=out / "inference_server.log",
                                startup_timeout_s=args.server_startup_timeout)
        await asyncio.to_thread(server.start)
        try:
            if args.model and (args.include_base or not checkpoints):
                await evaluate(server.url, {"kind": "model", "model": args.model}, args.step or 0)
            for ckpt in checkpoints:
                step = args.step if args.step is not None else (step_from_path(ckpt) or 0)
                if str(ckpt) != first:
                    # One server for all checkpoints: swap weights instead of paying start-up again.
                    await asyncio.to_thread(_update_weights, server.url, ckpt, f"step_{step}")
                await evaluate(server.url, {"kind": "checkpoint", "model": args.model, "checkpoint": str(ckpt)}, step)
        finally:
            await asyncio.to_thread(server.stop)
        return reports
    finally:
        if aclose is not None:
            await aclose()


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    persona_from_spec(args.persona)  # fail fast on a bad persona spec, before starting servers
    if bool(args.server_url) == bool(args.model or args.checkpoint):
        raise SystemExit("give exactly one of --server-url, or --model / --checkpoint")
    if args.include_base and not (args.model and args.checkpoint):
        raise SystemExit("--include-base needs both --model and --checkpoint")
    checkpoints = expand_checkpoints(args.checkpoint)
    n_targets = len(checkpoints) + (args.include_base or not checkpoints)
    if args.step is not None and n_targets > 1:
        raise SystemExit(f"--step names one step but {n_targets} models are evaluated; leave it out")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = BenchmarkConfig(
        persona=args.persona, num_questions=args.questions, seed=args.seed, source=args.source,
        max_tokens=args.max_tokens, system_prompt=args.system_prompt, concurrency=args.concurrency,
        model_name=args.model_name,
    )
    reports = asyncio.run(_evaluate_all(args, config, checkpoints, out))
    paths = [write_report(r, out, args.tag) for r in reports]
    invocation = {k: v for k, v in vars(args).items() if k not in ("api_key", "verbose")}
    write_summary(reports, paths, out, invocation)
    log_tensorboard(reports, args.tb or out / "tb")
    plot = plot_score_vs_step(out)
    for r, p in zip(reports, paths):
        res = r["results"]
        log.info("step %d: preference score %s, satisfied fraction %s, accuracy %s -> %s", r["step"],
                 res["mean_score"], res["satisfied_fraction"], res["accuracy"], p)
    log.info("plot: %s", plot)
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
