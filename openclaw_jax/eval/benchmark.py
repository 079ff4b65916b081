"""Orchestration of the personalisation benchmark: collect greedy first answers from a server,
grade them, and write the report, TensorBoard scalars and the score-vs-step plot.

The numbers are reproducible for a fixed seed: the held-out questions are a function of
(source, n, seed), answers are greedy (temperature 0), the rule evaluator is deterministic and
judge votes carry seeds derived from the seed. Reports hold no timestamps or ports, so two runs
give byte-identical per-evaluation reports.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import uuid
from pathlib import Path
from typing import Any

from openclaw_jax.envs.personas import persona_from_spec
from openclaw_jax.envs.questions import heldout_questions
from openclaw_jax.envs.simulated_user import (
    METRIC_ACCURACY,
    METRIC_PREFERENCE_SCORE,
    METRIC_SATISFIED_FRACTION,
    collect_first_answers,
    make_client,
)
from openclaw_jax.eval.evaluators import Evaluator
from openclaw_jax.eval.scoring import accuracy_series, build_report, load_reports, report_filename, score_series

log = logging.getLogger(__name__)

PLOT_NAME = "score_vs_step.png"
SUMMARY_NAME = "report.json"


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """What to evaluate on: persona, held-out questions and how answers are generated."""

    persona: str = "student_prose"  # a persona spec, e.g. "starts_with:prefix=Sure"
    num_questions: int = 20
    seed: int = 0
    source: str = "gsm"  # "gsm" | "arithmetic"
    max_tokens: int = 256
    system_prompt: str | None = None
    # One request at a time by default: batched decoding can change float rounding and hence a
    # greedy near-tie, and the benchmark promises identical numbers for a fixed seed.
    concurrency: int = 1
    grade_concurrency: int = 8
    model_name: str | None = None  # OpenAI "model" field; None = the server's first listed model

    def __post_init__(self) -> None:
        if self.num_questions < 1:
            raise ValueError(f"num_questions must be >= 1, got {self.num_questions}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


async def evaluate_server(
    base_url: str,
    config: BenchmarkConfig,
    evaluator: Evaluator,
    *,
    target: dict[str, Any],
    step: int,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Evaluate the model served at `base_url`; returns the report dict (nothing written)."""
    persona = persona_from_spec(config.persona)
    questions = heldout_questions(config.source, config.num_questions, config.seed)
    client = make_client(base_url, api_key=api_key)
    try:
        answers = await collect_first_answers(
            client, questions, model=config.model_name, max_tokens=config.max_tokens,
            system_prompt=config.system_prompt, concurrency=config.concurrency,
            session_prefix=f"eval-{config.seed}",
        )
    finally:
        await client.close()
    sem = asyncio.Semaphore(config.grade_concurrency)

    async def grade(a):
        async with sem:
            return await evaluator.grade(persona, a)

    items = await asyncio.gather(*(grade(a) for a in answers))
    report = build_report(
        persona=persona, persona_spec=config.persona, evaluator=evaluator.describe(), seed=config.seed,
        source=config.source, target=target, step=step,
        generation={"max_tokens": config.max_tokens, "temperature": 0.0, "system_prompt": config.system_prompt},
        items=items,
    )
    res = report["results"]
    if res["graded"] < res["n"]:
        log.warning("%d of %d answers got no valid grade (every judge vote failed or was off the rubric); "
                    "they are left out of the mean. Check the judge server and --judge-max-tokens.",
                    res["n"] - res["graded"], res["n"])
    log.info("eval %s step %d (%s): preference score %s, satisfied %s, accuracy %s over %d questions",
             config.persona, step, evaluator.describe()["kind"], res["mean_score"], res["satisfied_fraction"],
             res["accuracy"], res["n"])
    return report


def write_report(report: dict[str, Any], out_dir: str | Path, tag: str | None = None) -> Path:
    """Write one evaluation's report as `<out>/report_<persona>_<evaluator>_step<N>.json`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / report_filename(report, tag)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # atomic: a reader (the plot, a notebook) never sees half a report
    return path


def write_summary(reports: list[dict[str, Any]], paths: list[Path], out_dir: str | Path, invocation: dict[str, Any]) -> Path:
    """`<out>/report.json`: this invocation's evaluations (each a full report) and their files."""
    path = Path(out_dir) / SUMMARY_NAME
    summary = {
        "benchmark": "personalisation",
        "invocation": invocation,
        "evaluations": reports,
        "files": [p.name for p in paths],
    }
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


def log_tensorboard(reports: list[dict[str, Any]], tb_dir: str | Path) -> None:
    """`eval/preference_score` (mean grade), `eval/satisfied_fraction` and `eval/accuracy` at each
    report's step."""
    from tensorboardX import SummaryWriter  # only when asked for TensorBoard (a slow import)

    # A unique suffix: two invocations within one second would otherwise share (and clobber)
    # one event file name.
    writer = SummaryWriter(str(tb_dir), filename_suffix=f".eval.{uuid.uuid4().hex[:8]}")
    try:
        for r in reports:
            for tag, value in ((METRIC_PREFERENCE_SCORE, r["results"]["mean_score"]),
                               (METRIC_SATISFIED_FRACTION, r["results"]["satisfied_fraction"]),
                               (METRIC_ACCURACY, r["results"].get("accuracy"))):
                if value is not None and not math.isnan(value):
                    writer.add_scalar(tag, float(value), int(r["step"]))
    finally:
        writer.close()


def plot_score_vs_step(out_dir: str | Path) -> Path:
    """Plot mean grade (solid), satisfied fraction (dashed) and accuracy (dotted) against step for
    every report in `out_dir`, one colour per (persona, evaluator). Returns the PNG path."""
    import matplotlib  # only for plots; the Agg backend must be chosen before pyplot is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = load_reports(out_dir)
    series = score_series(reports)
    accuracies = accuracy_series(reports)
    if not series:
        raise FileNotFoundError(f"no report_*.json in {out_dir}; run an evaluation first")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for k, (label, pts) in enumerate(series.items()):
            color = f"C{k % 10}"
            steps = [p[0] for p in pts]
            ax.plot(steps, [p[1] for p in pts], "o-", color=color, label=f"{label}: preference score")
            ax.plot(steps, [p[2] for p in pts], "s--", color=color, alpha=0.6, label=f"{label}: satisfied fraction")
            acc = accuracies.get(label, [])
            if any(a == a for _, a in acc):  # NaN-only (no gradable question): nothing to draw
                ax.plot([p[0] for p in acc], [p[1] for p in acc], "^:", color=color, alpha=0.8,
                        label=f"{label}: accuracy")
        ax.set_xlabel("training step")
        ax.set_ylabel("score on held-out questions")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title("Personalisation benchmark")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        path = Path(out_dir) / PLOT_NAME
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
