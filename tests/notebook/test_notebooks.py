"""The notebooks under `notebooks/`: committed without outputs, and each executes headless.

One tiny run (the `configs/tiny_cpu.yaml` loop, two steps) is made in a subprocess; every
notebook then runs top to bottom in a fresh `python3` kernel (nbclient) with
`OPENCLAW_RUN_DIR` pointing at it. Besides "no cell raised", each test checks that the notebook
showed what it is for (figures, tables naming the run's own samples and hints).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = ("01_quickstart.ipynb", "02_loss_anatomy.ipynb", "03_run_inspection.ipynb")


def _notebook_paths() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def test_the_expected_notebooks_exist():
    assert {p.name for p in _notebook_paths()} >= set(NOTEBOOKS)


@pytest.mark.parametrize("path", _notebook_paths(), ids=lambda p: p.name)
def test_committed_notebook_has_no_outputs(path):
    """Stale outputs must not be committed: strip them (and execution counts) before committing."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs or execution counts; clear them before committing"
    assert "widgets" not in nb.metadata, f"{path.name}: widget state in the notebook metadata; clear it"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


@pytest.fixture(scope="module")
def tiny_run(tiny_run_dir):
    return tiny_run_dir  # one real 2-step tiny run per session (tests/conftest.py)


def _execute(name: str, run_dir: Path, tmp_path: Path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("OPENCLAW_RUN_DIR", str(run_dir))   # the kernel inherits this environment
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    nb = nbformat.read(str(NOTEBOOK_DIR / name), as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return nb


def _outputs(nb, kind: str) -> list[str]:
    """All outputs of MIME type `kind` ("image/png", "text/markdown") or stream text ("stream")."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if kind == "stream" and out.get("output_type") == "stream":
                found.append(out["text"])
            elif kind in out.get("data", {}):
                found.append(out["data"][kind])
    return found


@pytest.mark.slow
def test_quickstart_executes(tiny_run, tmp_path, monkeypatch):
    from openclaw_jax.samples import SampleStore

    nb = _execute("01_quickstart.ipynb", tiny_run, tmp_path, monkeypatch)
    text = "\n".join(_outputs(nb, "stream") + _outputs(nb, "text/markdown"))
    first = SampleStore(tiny_run / "samples", readonly=True)[0]
    assert str(tiny_run) in text
    assert '"end_step": 2' in text                       # the summary
    assert f"{first.kind} / {first.reward:+g}" in text   # the first sample's table
    assert "trained mean log-prob" in text               # base vs exported model


@pytest.mark.slow
def test_loss_anatomy_executes(tiny_run, tmp_path, monkeypatch):
    """The notebook recomputes step 1 (phases + dense loss) and must match the trainer's TensorBoard log."""
    from openclaw_jax.samples import SampleStore

    nb = _execute("02_loss_anatomy.ipynb", tiny_run, tmp_path, monkeypatch)
    figures = _outputs(nb, "image/png")
    assert len(figures) >= 1, "no overlap / advantage figure was drawn"
    tables = "\n".join(_outputs(nb, "text/markdown"))
    assert "logged at step 1" in tables
    [loss_row] = [line for line in tables.splitlines() if line.startswith("| loss |")]
    recomputed, logged = (cell.strip() for cell in loss_row.strip("|").split("|")[1:])
    assert logged != "—" and float(recomputed) == pytest.approx(float(logged), rel=1e-3, abs=1e-4)
    printed = "\n".join(_outputs(nb, "stream"))
    assert "sequence_optimal" in printed
    first = SampleStore(tiny_run / "samples", readonly=True)[0]
    assert first.hints and f"c0: {first.hints[0]}" in printed   # the hint drawn beside the first figure


@pytest.mark.slow
def test_run_inspection_executes(tiny_run, tmp_path, monkeypatch):
    from openclaw_jax.samples import SampleStore

    nb = _execute("03_run_inspection.ipynb", tiny_run, tmp_path, monkeypatch)
    assert len(_outputs(nb, "image/png")) >= 3   # losses, reward by case, preference/throughput
    tables = "\n".join(_outputs(nb, "text/markdown"))
    store = SampleStore(tiny_run / "samples", readonly=True)
    hints = {h for s in store for h in s.hints}
    assert hints and any(h.replace("|", "\\|")[:60] in tables for h in hints)
    assert "| step | tokens | mean k* | max k* |" in tables
    from openclaw_jax.notebook.run_inspection import case_counts

    lines = tables.splitlines()
    for kind, counts in case_counts(list(store)).items():   # one row per case, ending in its total
        assert any(line.startswith(f"| {kind} |") and line.endswith(f"| {sum(counts.values())} |") for line in lines)
