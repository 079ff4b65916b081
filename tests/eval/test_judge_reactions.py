"""`python -m openclaw_jax.eval.judge_reactions`: the labelled reactions, the scoring, the CLI for the rule
judge and for an OpenAI-compatible judge (a scripted endpoint that answers with the labels)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_jax.eval.judge_reactions import (DEFAULT_DATA, Reaction, ReactionsError, hint_is_right, load_reactions,
                                               score, select)
from openclaw_jax.gateway.judge import HINT_END, HINT_START, Judgement
from tests.helpers.scripted_openai import ScriptedOpenAIServer

ROOT = Path(__file__).resolve().parents[2]


def _j(score_: int, *hints: str) -> Judgement:
    return Judgement(eval_score=score_, eval_votes=(score_,), hints=hints, hint_votes=())


def test_score_counts_precision_and_recall_per_class_and_for_hints():
    items = [Reaction("a", "r", "thanks", 1, None, ""), Reaction("b", "r", "no, it's 4", -1, "it's 4", ""),
             Reaction("c", "r", "wrong", -1, None, ""), Reaction("d", "r", "ok", 0, None, ""),
             Reaction("e", "r", "use tabs please", -1, "use tabs", "")]
    judged = [_j(1), _j(-1, "It's 4."), _j(0), _j(1), _j(-1, "Please be brief.")]
    report = score(items, judged)
    # +1: judged twice (a right, d wrong), labelled once; -1: judged twice, both right, labelled three times;
    # 0: judged once (c, labelled -1), labelled once (d, judged +1)
    assert report["eval"]["1"] == {"precision": 0.5, "recall": 1.0, "support": 1, "predicted": 2}
    assert report["eval"]["-1"] == {"precision": 1.0, "recall": 2 / 3, "support": 3, "predicted": 2}
    assert report["eval"]["0"] == {"precision": 0.0, "recall": 0.0, "support": 1, "predicted": 1}
    assert report["accuracy"] == 3 / 5
    assert report["confusion"]["-1->0"] == 1 and report["confusion"]["0->1"] == 1
    # hints: two given, one right ("It's 4." contains "it's 4"); two labelled
    assert report["hints"] == {"precision": 0.5, "recall": 0.5, "given": 2, "right": 1, "labelled": 2}
    assert hint_is_right(["Use  TABS, please."], "use tabs.") and not hint_is_right([], "x")


def test_the_packaged_set_is_large_balanced_enough_and_split_by_its_ids():
    items = load_reactions()
    assert len(items) >= 100
    labels = [r.label for r in items]
    assert min(labels.count(c) for c in (1, -1, 0)) >= 30
    assert sum(r.hint is not None for r in items) >= 40
    held = select(items, "heldout")
    assert {r.id for r in held} == {r.id for r in items
                                     if int(hashlib.sha256(r.id.encode()).hexdigest()[:8], 16) % 3 == 0}
    assert 0.25 < len(held) / len(items) < 0.4 and len(held) + len(select(items, "dev")) == len(items)
    assert all(len(r.reason) > 3 for r in items)


@pytest.mark.parametrize("entry, message", [
    ({"label": 2}, "label=2"),
    ({"hint": "not in the text"}, "not a span"),
    ({"extra": 1}, "exactly the fields"),
])
def test_a_malformed_item_is_named(tmp_path, entry, message):
    item = {"id": "x", "assistant": "a", "reaction": "No, it is 4.", "label": -1, "hint": "it is 4", "reason": "r"}
    path = tmp_path / "r.yaml"
    import yaml
    path.write_text(yaml.safe_dump([{**item, **entry}]))
    with pytest.raises(ReactionsError, match=message):
        load_reactions(path)
    path.write_text(yaml.safe_dump([item, item]))
    with pytest.raises(ReactionsError, match="duplicate id"):
        load_reactions(path)


def _cli(*args, env=None):
    proc = subprocess.run([sys.executable, "-m", "openclaw_jax.eval.judge_reactions", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_cli_reports_every_split_for_the_rule_judge():
    out = json.loads(_cli("--json", "--errors"))
    assert set(out["reports"]) == {"all", "dev", "heldout"}
    all_ = out["reports"]["all"]
    assert all_["items"] == len(load_reactions())
    assert sum(all_["eval"][c]["support"] for c in ("1", "-1", "0")) == all_["items"]
    assert len(out["errors"]["all"]) == len(out["errors"]["dev"]) + len(out["errors"]["heldout"])
    text = _cli("--split", "heldout")
    assert "rule judge on" in text and "hints" in text


def test_the_numbers_in_the_docs_are_what_the_cli_measures():
    """docs/live.md's table of the rule judge is this command's output at this commit."""
    reports = json.loads(_cli("--json"))["reports"]
    doc = (ROOT / "docs" / "live.md").read_text()
    rows = re.findall(r"^\| (all|dev|heldout) \| (\d+) \| ([-+]?\w+) \| ([\d.]+) \| ([\d.]+) \|", doc, re.MULTILINE)
    assert len(rows) == 12, "docs/live.md lists precision/recall of +1, -1, 0 and hints for all, dev and heldout"
    for split, n, cls, precision, recall in rows:
        report = reports[split]
        assert report["items"] == int(n)
        got = report["hints"] if cls == "hints" else report["eval"][str(int(cls))]
        assert (f"{got['precision']:.3f}", f"{got['recall']:.3f}") == (precision, recall), (split, cls)


def test_cli_scores_an_openai_compatible_judge():
    """A scripted endpoint that answers each vote with the label (and the labelled hint) scores 1.0 everywhere:
    the CLI's OpenAI path reads the votes as the gateway does."""
    by_reaction = {r.reaction: r for r in load_reactions()}

    def labels(body, headers):
        user = body["messages"][1]["content"]
        seen = re.search(r"## What came next: the user's next message\n(.*)\n\n## Your task", user, re.DOTALL).group(1)
        item = by_reaction[json.loads(seen)]  # the prompt quotes the reaction as a JSON string
        if "HINT_START" in body["messages"][1]["content"]:
            return f"\\boxed{{1}} {HINT_START}{item.hint}{HINT_END}" if item.hint and len(item.hint) > 10 \
                else "\\boxed{-1}"
        return f"The verdict. \\boxed{{{item.label}}}"

    with ScriptedOpenAIServer(labels, model="labels", api_key="sk-l") as server:
        env = {**os.environ, "MY_KEY": "sk-l"}
        out = json.loads(_cli("--judge", "openai", "--base-url", server.url + "/v1", "--model", "labels",
                              "--api-key-env", "MY_KEY", "--votes", "1", "--split", "all", "--json", env=env))
    report = out["reports"]["all"]
    assert report["accuracy"] == 1.0
    assert all(report["eval"][c]["precision"] == 1.0 and report["eval"][c]["recall"] == 1.0 for c in ("1", "-1", "0"))
    assert report["hints"]["precision"] == 1.0
    short = sum(1 for r in load_reactions() if r.hint is not None and len(r.hint) <= 10)
    assert report["hints"]["right"] == report["hints"]["labelled"] - short   # short hints are not accepted
    assert len(server.requests) == 2 * report["items"]
    assert DEFAULT_DATA.name == "reactions.yaml"
