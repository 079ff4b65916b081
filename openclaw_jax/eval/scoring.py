"""Pure scoring logic of the personalisation benchmark: rubric prompt, vote parsing and
averaging, per-item records, the report dict and reading reports back for plots.

No I/O besides `load_reports` (which only reads JSON files); the CLI and the evaluators call
these functions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from openclaw_jax.envs.personas import RUBRIC_LEVELS, Persona
from openclaw_jax.gateway.judge import last_boxed_content

REPORT_VERSION = 1
REPORT_PREFIX = "report_"  # per-evaluation reports: report_<persona>_<evaluator>_step<N>[_<tag>].json

# ----------------------------------------------------------------------------- rubric prompt

_RUBRIC_SYSTEM = (
    "You grade replies of an AI assistant against one particular user's preferences about how "
    "answers should be written. You do not grade whether the maths is right; you grade only "
    "how well the reply respects what this user asked for. Use this scale:\n"
    "1    - the reply respects every part of the preference;\n"
    "0.75 - it respects the preference except for one small slip;\n"
    "0.5  - it respects some parts of the preference and clearly breaks others;\n"
    "0.25 - it mostly ignores the preference, respecting only a small part of it;\n"
    "0    - it ignores the preference completely, or there is no usable reply.\n"
    "Think briefly about each part of the preference, then give your grade as the last thing "
    "you write, inside \\boxed{}, using one of 0, 0.25, 0.5, 0.75, 1 (for example \\boxed{0.75})."
)


def rubric_messages(persona: Persona, question: str, answer: str) -> list[dict[str, str]]:
    """Chat messages asking a judge model to grade `answer` for `persona` on the 5-level rubric."""
    preference = persona.preference or persona.description
    if not preference:
        raise ValueError(f"persona {persona.name!r} states no preference; an LLM judge needs one")
    user = (
        f"The user's preference, in their own words:\n{preference}\n\n"
        f"The user's question:\n{question}\n\n"
        f"The assistant's reply:\n<reply>\n{answer}\n</reply>\n\n"
        "How well does the reply respect the user's preference? End with \\boxed{grade}."
    )
    return [{"role": "system", "content": _RUBRIC_SYSTEM}, {"role": "user", "content": user}]


_NUMBER_TEXT = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)$")


def parse_rubric_score(text: str | None) -> float | None:
    """The grade in the last `\\boxed{}` when it is one of 0, 0.25, 0.5, 0.75, 1; else None.

    Accepts equivalent spellings ("1.0", ".5", "0.50"); rejects anything off the rubric ("0.3",
    "-1", "good"), so a malformed vote is no vote rather than a wrong number.
    """
    if not text:
        return None
    content = last_boxed_content(text)
    if content is None:
        return None
    content = content.strip()
    if not _NUMBER_TEXT.match(content):
        return None
    value = float(content)
    for level in RUBRIC_LEVELS:
        if math.isclose(value, level, abs_tol=1e-9):
            return level
    return None


def average_votes(votes: Sequence[float | None]) -> float | None:
    """Mean of the valid votes; None when no vote is valid (the item then counts as unscored)."""
    valid = [v for v in votes if v is not None]
    return sum(valid) / len(valid) if valid else None


# ----------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class ItemScore:
    """One held-out question's first answer and its grade."""

    question_id: str
    question: str
    answer: str
    finish_reason: str | None
    score: float | None  # evaluator's grade in [0, 1]; None when the judge gave no valid vote
    votes: tuple[float | None, ...] = ()
    rule_score: float | None = None  # the persona's own check, always recorded for comparison
    satisfied: bool | None = None  # the persona's own check
    violations: tuple[str, ...] = ()
    correct: bool | None = None  # the final number equals the question's answer (None: not gradable)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["votes"] = list(self.votes)
        d["violations"] = list(self.violations)
        return d


def summarize(items: Sequence[ItemScore]) -> dict[str, Any]:
    """Aggregate numbers of a report.

    mean_score: mean evaluator grade over items with a grade (the benchmark's preference score);
    satisfied_fraction: fraction of items the persona's rule check is fully satisfied with;
    rule_mean_score: mean rule grade (equals mean_score for the rule evaluator);
    accuracy: fraction of the gradable items (question with a numeric answer) whose final number
    is that answer (envs.grading), `accuracy_graded` of them.
    """
    graded = [i.score for i in items if i.score is not None]
    correct = [i.correct for i in items if i.correct is not None]
    rule = [i.rule_score for i in items if i.rule_score is not None]
    sat = [i.satisfied for i in items if i.satisfied is not None]
    nan = float("nan")
    return {
        "n": len(items),
        "graded": len(graded),
        "mean_score": sum(graded) / len(graded) if graded else nan,
        "satisfied_fraction": sum(sat) / len(sat) if sat else nan,
        "rule_mean_score": sum(rule) / len(rule) if rule else nan,
        "accuracy": sum(correct) / len(correct) if correct else nan,
        "accuracy_graded": len(correct),
        "score_histogram": {str(level): sum(1 for s in graded if s == level) for level in RUBRIC_LEVELS},
    }


def _json_safe(x: Any) -> Any:
    """NaN is not JSON; reports store it as null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def build_report(
    *,
    persona: Persona,
    persona_spec: str,
    evaluator: dict[str, Any],
    seed: int,
    source: str,
    target: dict[str, Any],
    step: int,
    generation: dict[str, Any],
    items: Sequence[ItemScore],
) -> dict[str, Any]:
    """The report of one evaluation (one model or checkpoint). Deterministic: no timestamps."""
    return _json_safe({
        "version": REPORT_VERSION,
        "benchmark": "personalisation",
        "persona": {**persona.describe(), "spec": persona_spec},
        "evaluator": evaluator,
        "seed": seed,
        "source": source,
        "num_questions": len(items),
        "target": target,
        "step": step,
        "generation": generation,
        "results": summarize(items),
        "items": [i.to_dict() for i in items],
    })


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def report_filename(report: dict[str, Any], tag: str | None = None) -> str:
    """File name for a per-evaluation report, unique per (persona spec, evaluator, step, tag)."""
    persona = _SAFE.sub("-", report["persona"]["spec"]).strip("-")
    name = f"{REPORT_PREFIX}{persona}_{report['evaluator']['kind']}_step{int(report['step']):08d}"
    if tag:
        name += "_" + _SAFE.sub("-", tag).strip("-")
    return name + ".json"


_STEP_RE = re.compile(r"(?:^|[^A-Za-z0-9])step[_-]?(\d+)(?:$|[^0-9])")


def step_from_path(path: str | Path) -> int | None:
    """Training step named by a checkpoint path (".../export/step_120" -> 120), else None.

    The last path component that names a step wins, so "runs/step_5/export/step_120" is 120.
    """
    for part in reversed(Path(path).parts):
        m = _STEP_RE.search(part)
        if m:
            return int(m.group(1))
    return None


# ----------------------------------------------------------------------------- reading reports back


def accuracy_series(reports: Iterable[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """{series label: [(step, accuracy), ...]} like `score_series` (NaN where a report has none)."""
    by_label: dict[str, dict[int, float]] = {}
    for r in reports:
        label = f"{r['persona']['spec']} ({r['evaluator']['kind']})"
        acc = r["results"].get("accuracy")
        by_label.setdefault(label, {})[int(r["step"])] = float("nan") if acc is None else acc
    return {label: [(s, pts[s]) for s in sorted(pts)] for label, pts in sorted(by_label.items())}


def load_reports(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every per-evaluation report in `out_dir` (files `report_*.json`), sorted by step."""
    reports = []
    for path in sorted(Path(out_dir).glob(f"{REPORT_PREFIX}*.json")):
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and data.get("benchmark") == "personalisation":
            data["_path"] = str(path)
            reports.append(data)
    reports.sort(key=lambda r: r["step"])
    return reports


def score_series(reports: Iterable[dict[str, Any]]) -> dict[str, list[tuple[int, float, float]]]:
    """{series label: [(step, mean_score, satisfied_fraction), ...]} sorted by step.

    One series per (persona spec, evaluator kind); if several reports share a step the last one
    read wins (a re-evaluation replaces the earlier number).
    """
    by_label: dict[str, dict[int, tuple[float, float]]] = {}
    for r in reports:
        label = f"{r['persona']['spec']} ({r['evaluator']['kind']})"
        res = r["results"]
        mean = res.get("mean_score")
        sat = res.get("satisfied_fraction")
        by_label.setdefault(label, {})[int(r["step"])] = (
            float("nan") if mean is None else mean,
            float("nan") if sat is None else sat,
        )
    return {label: [(s, *pts[s]) for s in sorted(pts)] for label, pts in sorted(by_label.items())}
