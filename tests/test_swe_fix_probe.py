"""scripts/swe_fix_probe.py: its success criteria agree with the SWE table's own tests."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_jax.envs.agentic.swe_repos import FUNCTIONS, repositories

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "swe_fix_probe.py"


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


def test_the_reference_fix_passes_and_no_edit_or_a_wrong_one_does_not(probe_module):
    for repo in repositories("train") + repositories("heldout"):
        tests, source = repo.function.tests, repo.buggy_source
        assert probe_module._passes(source, repo.bug.bad, repo.bug.good, tests), repo.key
        assert not probe_module._passes(source, repo.bug.bad, repo.bug.bad, tests), repo.key   # copies the line
        assert not probe_module._passes(source, "not in the file", repo.bug.good, tests), repo.key
        assert not probe_module._passes(source, repo.bug.bad, "return (", tests), repo.key      # a syntax error
    # the correct source itself, as a whole-file replacement, passes: the criterion is the tests, not the text
    fn = FUNCTIONS[0]
    repo = next(r for r in repositories("train") if r.function is fn)
    assert probe_module._passes(repo.buggy_source, repo.buggy_source, fn.source, fn.tests)


def test_json_string_prefix_decodes_escapes_and_stops_at_the_closing_quote(probe_module):
    assert probe_module._json_string_prefix('return s[::-1]"}}\n</tool_call>') == "return s[::-1]"
    assert probe_module._json_string_prefix("if ch in 'aeiou':\\tx") == "if ch in 'aeiou':\tx"
    assert probe_module._json_string_prefix("never closed") == "never closed"


def test_help():
    res = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--checkpoint" in res.stdout
