"""The suite's shared fixtures (a section each) and its machinery: one compilation cache per session,
XLA and PyTorch settings, and which tests share a pytest-xdist worker. A fixture that only one folder
uses lives in that folder's conftest.py (tests/sglang/conftest.py: the SGLang workers)."""

from __future__ import annotations

import json
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
# Most of the suite's CPU time is XLA compiling small programs, and of a compile most is LLVM
# optimising the generated code. LLVM at -O0 without its expensive passes: the same HLO programs
# (XLA's own passes unchanged, no fast-math), compiled in about half the CPU time (the hybrid train
# step of test_precision_microbatch: 17.0 -> 9.1 s CPU, the same loss to the last bit); the tests'
# arithmetic is small. Processes the tests start inherit it (tests/helpers/xla_flags.py keeps it when a
# test changes the device count). XLA reads XLA_FLAGS when its CPU backend starts, after this.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
if _OWNS_SESSION_DIR:  # the controller (or a lone process); xdist workers inherit its environment
    os.environ["XLA_FLAGS"] = " ".join(
        [f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=")[0] not in
         {t.split("=")[0] for t in TEST_XLA_FLAGS}] + list(TEST_XLA_FLAGS))
# PyTorch (the transformers references, tiny checkpoints) on one thread: the suite runs two workers on
# two cores, and torch's OpenMP threads then wait on each other at every op while the other worker
# holds a core (SmolLM2's 20-token greedy decode in transformers: 16.4 CPU s with torch's default
# two threads beside a busy core, 1.9 s with one). Processes the tests start inherit it, as SGLang's
# workers already do (scripts/sglang_cpu.sh); XLA's CPU thread pool does not read it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported by a plugin before this file
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
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


def make_tiny_smollm2_checkpoint(out_dir, *, seed: int = 0, max_positions: int = 8192):
    """A random 2-layer Qwen3ForCausalLM over SmolLM2's vocabulary, with SmolLM2's tokenizer: OpenClaw's
    minimal-profile prompt is ~2.2 k tokens with it (~8.7 k with the tiny test tokenizer)."""
    import torch
    import transformers

    from openclaw_jax.models.tokenizer import smollm2_tokenizer

    tok = smollm2_tokenizer()
    config = transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, eos_token_id=list(tok.eos_token_ids), bos_token_id=None,
        pad_token_id=tok.pad_token_id, torch_dtype="float32")
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(1.0 + 0.2 * torch.randn(param.shape) if name.endswith("norm.weight")
                        else 0.15 * torch.randn(param.shape))
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def require_gui_tools():
    """The GUI environment's programs (Debian's xvfb and xdotool; scripts/test.sh installs them): under CI
    (env CI set) a test that needs them FAILS without them, elsewhere it skips with the install command."""
    from openclaw_jax.envs.agentic.gui_desktop import INSTALL_HINT, missing_tools

    missing = missing_tools()
    if missing:
        message = f"the GUI environment needs {', '.join(missing)}; install with `{INSTALL_HINT}` (or run scripts/test.sh)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """A tiny random Qwen3 HF checkpoint directory (seed 0) with tokenizer files."""
    return make_tiny_qwen3_checkpoint(tmp_path_factory.mktemp("tiny_qwen3") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_smollm2_dir(tmp_path_factory):
    """A tiny random model with SmolLM2's tokenizer and chat template (seed 0): a SmolLM2 config's prompts,
    shapes and template, at a tiny model's cost."""
    return make_tiny_smollm2_checkpoint(tmp_path_factory.mktemp("tiny_smollm2") / "model", seed=0)


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
# pytest-xdist (scripts/test.sh runs `-n 2 --dist loadgroup`): which tests share a worker, and
# which go first
# ==============================================================================================
# A worker builds session and module fixtures for itself. Tests that share an expensive one stay on
# one worker (a group): all of a module whose tests use a module- or session-scoped fixture that the
# module defines (a started server, a compiled engine, a model), every sglang-marked test (one pair
# of SGLang workers for the session), every user of the shared tiny training run. The rest go one
# test at a time to whichever worker is free. Heavy work goes first (the slow- and sglang-marked
# tests, then the larger groups) so that no long test starts last while the other worker idles;
# a group keeps its module's order.
#
# xdist's own `xdist_group` marks are not used: with pytest 9.2 they are silently ignored (xdist
# 3.8 marks a group by rewriting `item._nodeid`, which pytest 9.2 no longer reads:
# https://github.com/pytest-dev/pytest-xdist/issues/1386). Instead each worker writes the groups it
# collected to the session directory, and the controller's scheduler below (a LoadScopeScheduling
# whose scope is that group) reads them.
_SHARED_SESSION_GROUPS = {"tiny_run_dir": "tiny_run"}
_GROUPS_FILE = "xdist-groups-{}.json"


def _xdist_group(item) -> str | None:
    if item.get_closest_marker("sglang") is not None:
        return "sglang"
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name, group in _SHARED_SESSION_GROUPS.items():
        if name in defs:
            return group
    module_id = item.nodeid.split("::", 1)[0]
    for fixturedefs in defs.values():
        for fixturedef in fixturedefs:
            if fixturedef.scope != "function" and fixturedef.baseid == module_id:
                return module_id
    return None


def _weight(item) -> int:
    return 60 if item.get_closest_marker("slow") or item.get_closest_marker("sglang") else 1


@pytest.hookimpl(trylast=True)  # after deselection (-m, -k)
def pytest_collection_modifyitems(config, items):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    scopes: dict[str, list] = {}
    for item in items:
        scopes.setdefault(_xdist_group(item) or item.nodeid, []).append(item)
    # heaviest first; a stable sort, so equal weights keep the collection order
    order = sorted(scopes.items(), key=lambda kv: -sum(_weight(i) for i in kv[1]))
    items[:] = [item for _, its in order for item in its]
    groups = {item.nodeid: scope for scope, its in order for item in its}
    path = os.path.join(_SESSION_DIR, _GROUPS_FILE.format(worker))
    with open(path + ".tmp", "w") as f:
        json.dump(groups, f)
    os.replace(path + ".tmp", path)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: fine without it (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """One work unit per group the workers wrote (a test of no group is a unit of its own), in
        the workers' order (they put the heaviest first)."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self._groups: dict[str, str] | None = None

        def schedule(self):
            # called once every worker has collected (and so written its groups file)
            self.config.option.loadscopereorder = False
            return super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = {}
                for name in sorted(os.listdir(_SESSION_DIR)):
                    if name.startswith("xdist-groups-") and name.endswith(".json"):
                        with open(os.path.join(_SESSION_DIR, name)) as f:
                            self._groups.update(json.load(f))
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)
