"""Fixtures of the `sglang`-marked tests: real SGLang 0.5.23 workers on CPU, started by scripts/sglang_cpu.sh
(its venv: `bash scripts/sglang_cpu.sh setup`). Two workers serve sglang_model_dir for the whole session; a
test that kills one restarts it; a test that changes weights loads what it needs first. (tests/conftest.py
keeps every sglang-marked test on one pytest-xdist worker, so one pair serves them all.)"""

from __future__ import annotations

import pytest

from tests.conftest import make_tiny_qwen3_checkpoint


@pytest.fixture(scope="session")
def sglang_model_dir(tmp_path_factory):
    """The tiny random Qwen3 (seed 0) with a 2048-token context: the judge's prompts are ~700 tokens."""
    return make_tiny_qwen3_checkpoint(tmp_path_factory.mktemp("sglang_model") / "model", seed=0, max_positions=2048)


@pytest.fixture(scope="session")
def sglang_model_dir_b(tmp_path_factory):
    """Same shape as `sglang_model_dir`, other random weights (seed 1): for weight updates."""
    return make_tiny_qwen3_checkpoint(tmp_path_factory.mktemp("sglang_model_b") / "model", seed=1, max_positions=2048)


_SGLANG_PAIRS: list = []


@pytest.fixture(scope="session")
def sglang_pair(sglang_model_dir, tmp_path_factory):
    """Manager of the two SGLang workers (tests/helpers/sglang_workers.py `WorkerPair`); fails under CI
    without the venv."""
    from tests.helpers.sglang_workers import WorkerPair, require_sglang_venv

    require_sglang_venv()
    pair = WorkerPair(sglang_model_dir, tmp_path_factory.mktemp("sglang_logs"))
    _SGLANG_PAIRS.append(pair)
    yield pair
    pair.stop()
    _SGLANG_PAIRS.remove(pair)


# What a worker needs to serve our adapters (docs/household.md, "With SGLang workers"): rank and targets of
# model.lora (rank 4, all seven projections); torch_native is the LoRA backend that runs without a GPU (the
# default, csgmv, is Triton).
LORA_FLAGS = ("--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", "q_proj", "k_proj", "v_proj",
              "o_proj", "gate_proj", "up_proj", "down_proj", "--max-loras-per-batch", "3",
              "--lora-backend", "torch_native")


@pytest.fixture(scope="module")
def sglang_lora_worker(sglang_model_dir, tmp_path_factory):
    """One SGLang worker with LoRA enabled (`LORA_FLAGS`) serving `sglang_model_dir`, no adapter loaded; a fresh
    one per test module."""
    from tests.helpers.sglang_workers import SGLangProcess, require_sglang_venv

    require_sglang_venv()
    worker = SGLangProcess.worker(sglang_model_dir, log_dir=tmp_path_factory.mktemp("sglang_lora_logs"),
                                  name="lora-worker", extra=LORA_FLAGS).launch()
    try:
        yield worker.wait_healthy()
    finally:
        worker.kill()


@pytest.fixture
def sglang_workers(sglang_pair):
    """[worker0, worker1], both healthy, serving `sglang_model_dir` (weights: whatever the last test left)."""
    return sglang_pair.ensure()


def pytest_runtest_teardown(item, nextitem):
    # Idle SGLang workers still burn CPU: stop them as soon as the sglang tests are over.
    if _SGLANG_PAIRS and item.get_closest_marker("sglang") is not None and (
            nextitem is None or nextitem.get_closest_marker("sglang") is None):
        for pair in _SGLANG_PAIRS:
            pair.stop()
