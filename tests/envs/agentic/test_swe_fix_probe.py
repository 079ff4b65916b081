"""scripts/swe_fix_probe.py: its success criterion, run in the SWE environment's sandbox, agrees with the
repository table (the reference fix passes, a copied line, a missing one or a broken file do not)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_jax.envs.agentic.swe_repos import BUG_KINDS, repositories

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "swe_fix_probe.py"


@pytest.fixture(scope="module")
def probe_module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("swe_fix_probe", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_one_task_per_repository_with_its_own_bug(probe_module):
    env = probe_module.SWEEnv()
    for split in ("train", "heldout"):
        tasks = probe_module.tasks_by_repository(env, split)
        assert sorted(t.task_id.split("/")[2] + "/" + t.task_id.split("/")[3] for t in tasks) == \
            sorted(r.key for r in repositories(split))
        by_key = {r.key: r for r in repositories(split)}
        for t in tasks:
            repo = by_key["/".join(t.task_id.split("/")[2:4])]
            assert t.data["bad"] == repo.bug.bad and t.data["files"]["lib.py"] == repo.buggy_source


def test_the_reference_fix_passes_and_no_edit_or_a_wrong_one_does_not(probe_module):
    env = probe_module.SWEEnv()
    tasks = probe_module.tasks_by_repository(env, "train") + probe_module.tasks_by_repository(env, "heldout")
    for task in tasks:
        assert probe_module.edit_passes(env, task, task.data["bad"], task.data["good"]), task.task_id
    one_per_kind = {t.family: t for t in tasks}    # the wrong edits on every bug kind once
    assert sorted(one_per_kind) == sorted(BUG_KINDS)
    for task in one_per_kind.values():
        bad, good = task.data["bad"], task.data["good"]
        assert not probe_module.edit_passes(env, task, bad, bad), task.task_id            # copies the line
        assert not probe_module.edit_passes(env, task, "not in the file", good), task.task_id
        assert not probe_module.edit_passes(env, task, bad, "return ("), task.task_id     # a syntax error


def test_json_string_prefix_decodes_escapes_and_stops_at_the_closing_quote(probe_module):
    assert probe_module._json_string_prefix('return s[::-1]"}}\n</tool_call>') == "return s[::-1]"
    assert probe_module._json_string_prefix("if ch in 'aeiou':\\tx") == "if ch in 'aeiou':\tx"
    assert probe_module._json_string_prefix("never closed") == "never closed"


def test_help():
    res = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--checkpoint" in res.stdout


def test_edit_call_prefixes_cut_the_agents_own_call_where_the_line_and_the_fix_go(probe_module):
    from openclaw_jax.envs.agentic.episode import format_tool_call
    from openclaw_jax.wire.tool_calls import parse_tool_calls
    bad, good = "if x < best:", "if x > best:"
    name_prefix, fix_prefix = probe_module.edit_call_prefixes(bad)
    full = format_tool_call("edit_file", {"path": "lib.py", "old": bad, "new": good})
    assert full.startswith(fix_prefix) and fix_prefix.startswith(name_prefix)
    # what a model writes after each prefix completes the call the environment parses
    _, calls = parse_tool_calls(fix_prefix + good + '"}}\n</tool_call>', None)
    assert calls[0].name == "edit_file" and json.loads(calls[0].arguments) == {"path": "lib.py", "old": bad, "new": good}
    assert name_prefix.endswith('"old": "') and bad not in name_prefix
