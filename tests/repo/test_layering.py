"""The package's import layering, checked by `scripts/check_layering.py`: no import cycle
between files or packages (`__main__` blocks and imports inside functions included, and none closed
by a `TYPE_CHECKING` import), `envs/` imports neither `trainer/`, `gateway/` nor the experiment config,
`trainer/` neither `gateway/` nor `pool/`, the trainer's batcher no JAX (not even through another
module); and, a separate check of the same script, no function longer than 80 lines."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layering.py"


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True,
                          timeout=120)


def test_the_package_is_layered():
    proc = _check(ROOT / "openclaw_jax")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "layering ok" in proc.stdout and "function lengths ok (<= 80 lines)" in proc.stdout, proc.stdout
    assert "NumPy-only (no JAX imported): openclaw_jax.trainer.batcher" in proc.stdout, proc.stdout


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "openclaw_jax"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_checker_finds_cycles_and_forbidden_imports(tmp_path):
    """The checker itself: a cycle through a `__main__` block, a function-level import that closes
    a package cycle, and each layer rule are reported; a cycle a TYPE_CHECKING import closes is reported
    as a type-only one."""
    root = _package(tmp_path, {
        "__init__.py": "",
        "inference/__init__.py": "",
        "inference/server.py": 'if __name__ == "__main__":\n    from openclaw_jax.inference.cli import main\n',
        "inference/cli.py": "from openclaw_jax.inference.server import *\n",
        "envs/__init__.py": "",
        "envs/run.py": "def f():\n    from openclaw_jax.trainer import sft\n    from openclaw_jax.gateway.judge import J\n",
        "trainer/__init__.py": "",
        "trainer/sft.py": "from openclaw_jax.envs import run\nfrom openclaw_jax.pool import client\n",
        "gateway/__init__.py": "",
        "gateway/judge.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from openclaw_jax.models import m\n",
        "models/__init__.py": "",
        "models/m.py": "from openclaw_jax.gateway import judge\n",
        "pool/__init__.py": "",
        "pool/client.py": "",
    })
    proc = _check(root)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "file-level import cycle: openclaw_jax.inference.cli <-> openclaw_jax.inference.server" in out
    assert "package-level import cycle: envs <-> trainer" in out
    assert "envs/ must not import trainer" in out and "envs/ must not import gateway" in out
    assert "trainer/ must not import pool" in out
    assert "package-level import cycle: gateway <-> models" not in out  # the TYPE_CHECKING import never runs...
    assert "package-level type-only import cycle: gateway <-> models" in out   # ...but closes a cycle all the same
    assert "file-level type-only import cycle: openclaw_jax.gateway.judge <-> openclaw_jax.models.m" in out
    assert "openclaw_jax.gateway.judge:3 -> openclaw_jax.models.m (TYPE_CHECKING)" in out


def test_the_checker_finds_jax_reached_from_the_batcher(tmp_path):
    """The NumPy-only rule follows our imports (a package's `__init__` too) to the first JAX import;
    a TYPE_CHECKING import of a jitted module is allowed."""
    files = {"__init__.py": "", "models/__init__.py": "", "models/segments.py": "SHARED = -1\n",
             "models/attention.py": "import jax.numpy as jnp\nSHARED = -1\n",
             "trainer/__init__.py": "",
             "trainer/batcher.py": "from typing import TYPE_CHECKING\nfrom openclaw_jax.trainer import batch\n"
                                   "if TYPE_CHECKING:\n    from openclaw_jax.trainer import step\n",
             "trainer/step.py": "import jax\n",
             "trainer/batch.py": "import numpy as np\nfrom openclaw_jax.models.segments import SHARED\n"}
    proc = _check(_package(tmp_path / "ok", files))
    assert proc.returncode == 0 and "layering ok" in proc.stdout, proc.stdout
    files["trainer/batch.py"] = "import numpy as np\nfrom openclaw_jax.models.attention import SHARED\n"
    proc = _check(_package(tmp_path / "direct", files))
    assert proc.returncode == 1
    chain = "openclaw_jax.trainer.batcher -> openclaw_jax.trainer.batch -> openclaw_jax.models.attention"
    assert f"NumPy-only rule: openclaw_jax.trainer.batcher must not import JAX, but imports jax through {chain}" \
        in proc.stdout
    files["trainer/batch.py"] = "import numpy as np\n"
    files["trainer/__init__.py"] = "import optax\n"   # the package's __init__ runs before the batcher
    proc = _check(_package(tmp_path / "init", files))
    assert "imports optax through openclaw_jax.trainer.batcher -> openclaw_jax.trainer" in proc.stdout, proc.stdout


def test_a_layered_package_passes(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "envs/__init__.py": "from . import a\n", "envs/a.py": "import json\n",
                               "trainer/__init__.py": "from openclaw_jax.envs import a\n"})
    proc = _check(root)
    assert proc.returncode == 0 and "layering ok" in proc.stdout, proc.stdout


def test_the_checker_finds_long_functions(tmp_path):
    """Methods and nested functions are measured on their own, from `def` to the last line."""

    def lines(n: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    root = _package(tmp_path, {
        "__init__.py": "",
        # ok: def + 79 lines = 80, the limit; C.long: 81 lines, from line 84
        "a.py": "def ok():\n" + lines(79, "    ") + "\n\nclass C:\n    def long(self):\n" + lines(80, "        "),
        # outer.inner: 81 lines, so outer: 82
        "b.py": "def outer():\n    def inner():\n" + lines(80, "        "),
    })
    proc = _check(root)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "layering ok" in out
    assert "openclaw_jax/a.py:84 C.long (81 lines)" in out
    assert "openclaw_jax/b.py:2 outer.inner (81 lines)" in out and "openclaw_jax/b.py:1 outer (82 lines)" in out
    assert " ok (" not in out and "3 function(s) over 80 lines" in out
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--max-function-lines", "82"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "function lengths ok (<= 82 lines)" in proc.stdout, proc.stdout
