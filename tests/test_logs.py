"""The CLIs' log records reach the console even after a library has configured the root logger."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import logging
import openclaw_jax.train   # imports grain, which puts a handler on the root logger on import
from openclaw_jax.logs import configure_logging
configure_logging("INFO")
logging.getLogger("openclaw_jax.probe").info("probe record")
logging.getLogger("httpx").info("third-party noise")
"""


def test_configure_logging_prints_our_records_once_and_hides_noise():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "probe record" in line]
    assert len(lines) == 1 and " INFO openclaw_jax.probe: probe record" in lines[0], proc.stderr
    assert "third-party noise" not in proc.stderr
