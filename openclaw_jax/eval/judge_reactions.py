"""How well a judge reads a person's free-form reactions: precision and recall against hand labels.

`reactions.yaml` (beside this file) holds reactions a person might write after an assistant turn
(thanks, corrections, change requests, rephrased questions, topic changes, mixed and ambiguous ones),
each with the label a careful human gives by the judge's rubric (+1 / -1 / 0), the span of the
person's words that would make a good hint (or none), and the reason. This scores a judge on them:

* **eval**: per class (+1, -1, 0) precision (of the turns the judge put in the class, the share the
  label puts there), recall (of the turns labelled so, the share the judge found), their support,
  and the confusion matrix;
* **hints**: a hint counts as right when the judge accepts one and it contains the labelled span
  (case and spacing aside); precision = right hints / hints given, recall = right hints / labelled
  hints.

**Held-out part**: an item is held out when the first 8 hex digits of sha256(id) are 0 mod 3 (about
a third, fixed by the ids, not chosen by looking at results). Changes to the rule judge are made by
reading the errors of the other part only (`--split dev --errors`); the held-out part measures them.

    python -m openclaw_jax.eval.judge_reactions                      # the rule judge, every part
    python -m openclaw_jax.eval.judge_reactions --split dev --errors # what it gets wrong, dev part
    OPENCLAW_JUDGE_API_KEY=... python -m openclaw_jax.eval.judge_reactions --judge openai \\
        --base-url https://api.openai.com/v1 --model gpt-4.1-mini --votes 3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import yaml

from openclaw_jax.gateway.judge import Judge, Judgement, NextState, RuleJudge
from openclaw_jax.gateway.openai_judge import OpenAIJudge

log = logging.getLogger("openclaw_jax.eval.judge_reactions")

DEFAULT_DATA = Path(__file__).with_name("reactions.yaml")
CLASSES = (1, -1, 0)
SPLITS = ("all", "dev", "heldout")


class ReactionsError(ValueError):
    """The labelled file is malformed: names the item and the field."""


@dataclasses.dataclass(frozen=True)
class Reaction:
    id: str
    assistant: str
    reaction: str
    label: int
    hint: str | None
    reason: str

    @property
    def held_out(self) -> bool:
        return is_held_out(self.id)


def is_held_out(item_id: str) -> bool:
    """The fixed held-out third: the first 8 hex digits of sha256(id) are 0 mod 3."""
    return int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16) % 3 == 0


def load_reactions(path: str | Path = DEFAULT_DATA) -> list[Reaction]:
    """The labelled reactions, validated (unique ids, labels in {1, -1, 0}, hints that are spans)."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, list):
        raise ReactionsError(f"{path}: expected a list of items, got {type(raw).__name__}")
    items, seen = [], set()
    fields = {f.name for f in dataclasses.fields(Reaction)}
    for i, entry in enumerate(raw):
        where = f"{path}: item {i} ({entry.get('id') if isinstance(entry, dict) else entry!r})"
        if not isinstance(entry, dict) or set(entry) != fields:
            raise ReactionsError(f"{where}: needs exactly the fields {sorted(fields)}")
        item = Reaction(**entry)
        if item.id in seen:
            raise ReactionsError(f"{where}: duplicate id")
        seen.add(item.id)
        if item.label not in CLASSES:
            raise ReactionsError(f"{where}: label={item.label!r} must be 1, -1 or 0")
        if item.hint is not None and _norm(item.hint) not in _norm(item.reaction):
            raise ReactionsError(f"{where}: hint {item.hint!r} is not a span of the reaction")
        items.append(item)
    return items


def select(items: Sequence[Reaction], split: str) -> list[Reaction]:
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {SPLITS}")
    return [r for r in items if split == "all" or r.held_out == (split == "heldout")]


# ----------------------------------------------------------------------------- scoring

def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def hint_is_right(hints: Sequence[str], gold: str | None) -> bool:
    """A given hint is right when the labelled span (its end punctuation aside) lies inside it."""
    if not hints or gold is None:
        return False
    span = _norm(gold).rstrip(".!?")
    return any(span in _norm(h) for h in hints)


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def score(items: Sequence[Reaction], judgements: Sequence[Judgement]) -> dict[str, Any]:
    """Per-class precision/recall, the confusion matrix and hint precision/recall."""
    pairs = [(r.label, j.eval_score) for r, j in zip(items, judgements)]
    confusion = Counter(pairs)
    per_class = {}
    for c in CLASSES:
        tp = confusion[(c, c)]
        predicted = sum(n for (_, p), n in confusion.items() if p == c)
        labelled = sum(n for (g, _), n in confusion.items() if g == c)
        per_class[str(c)] = {"precision": _ratio(tp, predicted), "recall": _ratio(tp, labelled),
                             "support": labelled, "predicted": predicted}
    given = sum(bool(j.hints) for j in judgements)
    right = sum(hint_is_right(j.hints, r.hint) for r, j in zip(items, judgements))
    labelled_hints = sum(r.hint is not None for r in items)
    return {
        "items": len(items),
        "accuracy": _ratio(sum(confusion[(c, c)] for c in CLASSES), len(items)),
        "eval": per_class,
        "confusion": {f"{g}->{p}": confusion[(g, p)] for g in CLASSES for p in CLASSES},
        "hints": {"precision": _ratio(right, given), "recall": _ratio(right, labelled_hints), "given": given,
                  "right": right, "labelled": labelled_hints},
    }


def errors(items: Sequence[Reaction], judgements: Sequence[Judgement]) -> list[dict[str, Any]]:
    """The items the judge got wrong (label or hint), for reading."""
    out = []
    for r, j in zip(items, judgements):
        label_wrong = r.label != j.eval_score
        hint_wrong = (bool(j.hints) != (r.hint is not None)
                      or (r.hint is not None and not hint_is_right(j.hints, r.hint)))
        if label_wrong or hint_wrong:
            out.append({"id": r.id, "reaction": r.reaction, "label": r.label, "judged": j.eval_score,
                        "hint": r.hint, "judged_hints": list(j.hints), "reason": r.reason})
    return out


async def judge_all(judge: Judge, items: Sequence[Reaction], concurrency: int = 8) -> list[Judgement]:
    """Every reaction as the next state (role user) of its assistant reply, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, r: Reaction) -> Judgement:
        async with gate:
            return await judge.judge(r.assistant, NextState("user", r.reaction), seed=1000 * i)

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(items))))


# ----------------------------------------------------------------------------- CLI

def _fmt(x: float | None) -> str:
    return "  -  " if x is None else f"{x:.3f}"


def format_report(name: str, split: str, report: dict[str, Any]) -> str:
    lines = [f"{name} on {report['items']} reactions ({split}): accuracy {_fmt(report['accuracy'])}",
             "class  precision  recall  support  predicted"]
    for c in CLASSES:
        e = report["eval"][str(c)]
        name = f"{c:+d}" if c else "0"
        lines.append(f"{name:>5}  {_fmt(e['precision']):>9}  {_fmt(e['recall']):>6}  {e['support']:>7}  "
                     f"{e['predicted']:>9}")
    h = report["hints"]
    lines.append(f"hints  {_fmt(h['precision']):>9}  {_fmt(h['recall']):>6}  {h['labelled']:>7}  {h['given']:>9}"
                 f"   ({h['right']} right)")
    lines.append("confusion (label->judged): " + ", ".join(f"{k} {v}" for k, v in report["confusion"].items() if v))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openclaw_jax.eval.judge_reactions",
                                description="Score a judge against hand-labelled reactions: per-class precision and "
                                            "recall of its eval votes (+1, -1, 0) and of its hints.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n")[-1])
    p.add_argument("--data", default=str(DEFAULT_DATA), help="the labelled YAML file (default: the packaged set)")
    p.add_argument("--split", choices=SPLITS, default=None,
                   help="which items (default: every split reported: all, dev, heldout)")
    p.add_argument("--judge", choices=["rule", "openai"], default="rule", help="rule (default) or an OpenAI-compatible "
                   "endpoint casting the PRM votes")
    p.add_argument("--base-url", help="openai: the endpoint's base URL (e.g. http://127.0.0.1:8080/v1)")
    p.add_argument("--model", help="openai: the model id")
    p.add_argument("--api-key-env", default="OPENCLAW_JUDGE_API_KEY",
                   help="openai: the environment variable holding the key (default OPENCLAW_JUDGE_API_KEY)")
    p.add_argument("--votes", type=int, default=3, help="openai: m, votes of each kind per reaction (default 3)")
    p.add_argument("--temperature", type=float, default=0.6, help="openai: sampling temperature (default 0.6)")
    p.add_argument("--concurrency", type=int, default=8, help="reactions judged at once (default 8)")
    p.add_argument("--errors", action="store_true", help="also list the items the judge got wrong")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    return p


def _make_judge(args: argparse.Namespace) -> Judge:
    if args.judge == "rule":
        return RuleJudge()
    if not args.base_url or not args.model:
        raise SystemExit("--judge openai needs --base-url and --model")
    return OpenAIJudge(args.base_url, args.model, api_key=os.environ.get(args.api_key_env) or None,
                       votes=args.votes, temperature=args.temperature)


async def _run(args: argparse.Namespace, items: list[Reaction]) -> list[Judgement]:
    judge = _make_judge(args)
    try:
        if isinstance(judge, OpenAIJudge):
            await judge.check()
        return await judge_all(judge, items, args.concurrency)
    finally:
        if isinstance(judge, OpenAIJudge):
            await judge.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        items = load_reactions(args.data)
    except (OSError, ReactionsError, yaml.YAMLError) as err:
        print(f"judge_reactions: {err}", file=sys.stderr)
        return 2
    judgements = asyncio.run(_run(args, items))
    by_id = {r.id: j for r, j in zip(items, judgements)}
    name = "rule judge" if args.judge == "rule" else f"openai judge {args.model} ({args.votes} votes)"
    out: dict[str, Any] = {"judge": name, "data": args.data, "reports": {}}
    for split in ([args.split] if args.split else SPLITS):
        part = select(items, split)
        part_judgements = [by_id[r.id] for r in part]
        out["reports"][split] = score(part, part_judgements)
        if args.errors:
            out.setdefault("errors", {})[split] = errors(part, part_judgements)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for split, report in out["reports"].items():
        print(format_report(name, split, report) + "\n")
    for split, wrong in out.get("errors", {}).items():
        print(f"errors ({split}, {len(wrong)}):")
        for e in wrong:
            print(f"  {e['id']}: {e['reaction']!r} label {e['label']:+d} judged {e['judged']:+d}; hint {e['hint']!r} "
                  f"judged {e['judged_hints']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
