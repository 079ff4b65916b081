"""Shared pytest fixtures. Each engineer keeps their fixtures in a clearly named section."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

# ==============================================================================================
# session-wide JAX persistent compilation cache (set before anything imports jax)
# ==============================================================================================
# Much of the suite is XLA compilation of the same tiny programs: by fresh jitted closures in this
# process, by pytest-xdist workers, and by the subprocesses tests start (python -m openclaw_jax.train,
# the inference server, ...), which inherit this environment. They all share one cache directory
# that is created empty for this test session and removed at its end, never one that outlives the
# run: every run compiles each program from nothing at least once, as a fresh machine would.
# pytest-xdist workers inherit _SESSION_DIR_VAR from the controller and join its directory.
_SESSION_DIR_VAR = "OPENCLAW_JAX_TEST_SESSION_DIR"
_OWNS_SESSION_DIR = _SESSION_DIR_VAR not in os.environ
if _OWNS_SESSION_DIR:
    os.environ[_SESSION_DIR_VAR] = tempfile.mkdtemp(prefix="openclaw-jax-test-session-")
_SESSION_DIR = os.environ[_SESSION_DIR_VAR]
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_SESSION_DIR, "xla-cache")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
if "jax" in sys.modules:  # imported by a plugin before this file: its config has read the environment
    import jax

    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if _OWNS_SESSION_DIR:
        shutil.rmtree(os.environ.pop(_SESSION_DIR_VAR), ignore_errors=True)


# ==============================================================================================
# inference / rollout: tiny random HF checkpoints (config.json + safetensors + tokenizer files)
# ==============================================================================================
TINY_VOCAB = 320  # tiny_test_tokenizer(320): bytes, merges, then 7 specials (ChatML, <tool_call>, ...)


def make_tiny_qwen3_checkpoint(out_dir, *, seed: int = 0, vocab: int = TINY_VOCAB, hidden: int = 32,
                               layers: int = 2, max_positions: int = 512, weight_scale: float = 0.15):
    """Write a random Qwen3ForCausalLM (transformers, float32) + the tiny test tokenizer to `out_dir`.

    Every weight is redrawn with a sizeable scale so next-token distributions are peaked (greedy
    decisions are not near-ties) and different seeds give clearly different models.
    """
    import torch
    import transformers

    from openclaw_jax.models.tokenizer import tiny_test_tokenizer

    tok = tiny_test_tokenizer(vocab)
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, attn_implementation="eager",
        eos_token_id=list(tok.eos_token_ids), bos_token_id=None, pad_token_id=tok.pad_token_id,
        torch_dtype="float32")
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else weight_scale * noise)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """A tiny random Qwen3 HF checkpoint directory (seed 0) with tokenizer files."""
    return make_tiny_qwen3_checkpoint(tmp_path_factory.mktemp("tiny_qwen3") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_dir_b(tmp_path_factory):
    """Same architecture as `tiny_qwen3_dir`, different random weights (seed 1): for weight updates."""
    return make_tiny_qwen3_checkpoint(tmp_path_factory.mktemp("tiny_qwen3_b") / "model", seed=1)


# ==============================================================================================
# trainer: one real tiny training run (configs/tiny_cpu.yaml, 2 steps), shared by the notebook
# and benchmark-CLI tests
# ==============================================================================================


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory):
    """Run directory of `python -m openclaw_jax.train --config configs/tiny_cpu.yaml` for 2 steps."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    run_dir = tmp_path_factory.mktemp("tiny_run") / "run"
    cmd = [sys.executable, "-m", "openclaw_jax.train", "--config", str(repo / "configs" / "tiny_cpu.yaml"),
           f"run_dir={run_dir}", "trainer.max_steps=2", "progress=false", "gateway.port=0",
           "env.heldout_questions=2"]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"tiny run failed:\n{proc.stderr[-4000:]}"
    assert (run_dir / "summary.json").is_file()
    return run_dir


# ==============================================================================================
# sglang (pytest -m sglang): real SGLang 0.5.23 workers on CPU, started by scripts/sglang_cpu.sh
# (its venv: `bash scripts/sglang_cpu.sh setup`). Two workers serve sglang_model_dir for the whole
# session; a test that kills one restarts it; a test that changes weights loads what it needs first.
# ==============================================================================================


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
    """Manager of the two SGLang workers (tests/_sglang.py `WorkerPair`); fails under CI without the venv."""
    from _sglang import WorkerPair, require_sglang_venv

    require_sglang_venv()
    pair = WorkerPair(sglang_model_dir, tmp_path_factory.mktemp("sglang_logs"))
    _SGLANG_PAIRS.append(pair)
    yield pair
    pair.stop()
    _SGLANG_PAIRS.remove(pair)


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
