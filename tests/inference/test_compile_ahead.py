"""Shapes compiled in the engine's idle time (inference/compile_ahead.py): the recompute's chunk calls predicted
exactly, and a weight swap's recompute and the next turns then run without an XLA compilation of a prefill or
an extend on the request path, with the same results as a cold engine."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from openclaw_jax.inference import weight_swap
from openclaw_jax.inference.engine import spec_for
from openclaw_jax.inference.prefill import ShapeLog
from openclaw_jax.inference.prefix_cache import PrefixCache
from openclaw_jax.models.weights import load_hf_checkpoint
from tests.conftest import make_tiny_qwen3_checkpoint
from tests.inference.test_prefix_cache import BLOCK, make_engine, tokens

NEW = 6


def spec(prompt):
    return spec_for(prompt, max_new_tokens=NEW, temperature=0, ignore_eos=True, return_logprob=True)


class RecordingLog(ShapeLog):
    """The engine's shape log, keeping the order of the calls too."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def ran(self, shape, served):
        self.calls.append(shape)
        return super().ran(shape, served)


def test_chunks_take_the_remainder_first():
    assert weight_swap.chunk_ends(160, 0, 64) == [32, 96, 160]
    assert weight_swap.chunk_ends(128, 0, 64) == [64, 128]
    assert weight_swap.chunk_ends(160, 48, 64) == [96, 160]
    assert weight_swap.chunk_ends(48, 48, 64) == []


@pytest.mark.parametrize("chunk", [32, 8192])
def test_refresh_shapes_are_the_calls_the_recompute_makes(tiny_qwen3_dir, chunk):
    """Three prefixes, two sharing their first blocks: the predicted calls are the ones the recompute runs,
    in order (cold chunks, extends over the shared blocks and over earlier chunks)."""
    engine = make_engine(tiny_qwen3_dir, compile_ahead=False)
    try:
        system = tokens(1, 3 * BLOCK)
        prefixes = [system + tokens(2, 6 * BLOCK), system + tokens(3, 2 * BLOCK), tokens(4, 5 * BLOCK)]
        config = engine.config
        predicted = weight_swap.refresh_shapes(prefixes, config, BLOCK, chunk)
        log = RecordingLog()
        fresh = PrefixCache(block=BLOCK, budget_bytes=config.prefix_cache_bytes,
                            kv_bytes_per_token=engine._kv_bytes_per_token, slot_shape=engine._prefix._slot_shape,
                            dtype=engine._prefix._dtype)
        done = weight_swap.refresh_prefixes(prefixes, graphdef=engine._graphdef, state=engine.params, config=config,
                                            vocab_size=engine.vocab_size, fresh=fresh, generation=0,
                                            chunk_tokens=chunk, shapes=log)
        assert log.calls == predicted
        assert done.tokens == 9 * BLOCK + 2 * BLOCK + 5 * BLOCK  # the shared blocks once
        if chunk == 32:  # 9 blocks in 2-block chunks: one block cold, then 4 extends; then 1 extend; 3 chunks
            assert [s.extend for s in predicted] == [False] + [True] * 5 + [False, True, True]
            assert [s.blocks for s in predicted[:6]] == [0, 1, 4, 8, 8, 4]
    finally:
        engine.shutdown()


def xla_compilations(records):
    """(function, thread) of each XLA compilation of a prefill or an extend in the captured log records."""
    return [(r.getMessage().split("(")[1].split(")")[0], r.threadName) for r in records
            if r.getMessage().startswith("Finished XLA compilation of jit(_")
            and any(f in r.getMessage() for f in ("_prefill_impl", "_extend_impl"))]


def run_session(engine, cold, state_b, caplog):
    """Two turns, a weight swap with 2-block recompute chunks, two more turns (the last one's cached prefix
    past a power of two of blocks). Returns the compilations on the request path and the swap's thread (the
    compile-ahead thread's excluded) from the swap on, and the last turn's output and a cold engine's."""
    prompt = tokens(20, 120)
    for _ in range(2):
        out, = engine.generate_sync([spec(prompt)])
        prompt = prompt + out.output_ids + tokens(len(prompt), 9)
    engine.wait_compiled_ahead(timeout=300)
    with caplog.at_level(logging.DEBUG, logger="jax._src.dispatch"):
        caplog.clear()
        engine.swap_weights(state_b, "v2")
        for turn in range(2):
            out, = engine.generate_sync([spec(prompt)])
            assert out.weight_version == "v2" and out.cached_tokens >= 7 * BLOCK
            if turn == 0:
                prompt = prompt + out.output_ids + tokens(len(prompt), 9)
                engine.wait_compiled_ahead(timeout=300)  # a person's next turn comes seconds later
        compiled = [c for c in xla_compilations(caplog.records) if c[1] != "jax-compile-ahead"]
    ref, = cold.generate_sync([spec(prompt)])
    assert engine.prefix_cache_stats()["refreshes"] == 1
    return compiled, out, ref


def test_a_swap_and_the_next_turns_run_programs_compiled_ahead(tmp_path, caplog):
    """A model of its own (no other test compiled its programs): after two turns and the engine's idle time,
    the swap's recompute (cold chunk, extends over 2 / 4 / 8 blocks) and two more turns (the last one extending
    over 16 blocks) make no XLA compilation of a prefill or an extend, and the last turn equals a cold engine's
    with the new weights. Without compile-ahead, the same session compiles them on the way (the capture works)."""
    for hidden, ahead in ((48, True), (40, False)):
        dir_a = make_tiny_qwen3_checkpoint(tmp_path / f"a{hidden}", seed=0, hidden=hidden)
        dir_b = make_tiny_qwen3_checkpoint(tmp_path / f"b{hidden}", seed=1, hidden=hidden)
        from flax import nnx
        state_b = nnx.split(load_hf_checkpoint(dir_b)[0])[1]
        engine = make_engine(dir_a, compile_ahead=ahead, prefix_refresh_chunk_tokens=2 * BLOCK)
        cold = make_engine(dir_b, prefix_cache_bytes=0, compile_ahead=False)
        try:
            compiled, out, ref = run_session(engine, cold, state_b, caplog)
        finally:
            engine.shutdown()
            cold.shutdown()
        assert out.output_ids == ref.output_ids
        np.testing.assert_allclose(out.output_logprobs, ref.output_logprobs, atol=1e-4, rtol=0)
        if ahead:
            assert compiled == []
            assert engine._shapes.ahead_hits >= 4 and engine.ahead_stats.compiled >= 4
        else:
            functions = {f for f, _ in compiled}
            assert functions == {"_prefill_impl", "_extend_impl"} and len(compiled) >= 4, compiled


def test_next_turns_are_predicted_from_the_turns_served(tiny_qwen3_dir):
    """After one cold turn, the next turn is guessed at FIRST_EXTEND_GUESS new tokens (then half and twice as
    many) over the session's cached blocks and over a turn more; after a warm turn, at that turn's new-token
    bucket and its neighbours instead."""
    from openclaw_jax.inference.compile_ahead import FIRST_EXTEND_GUESS
    from openclaw_jax.inference.prefill import CallShape

    engine = make_engine(tiny_qwen3_dir, compile_ahead=False, prefix_refresh_tokens=0)
    try:
        prompt = tokens(30, 120)
        out, = engine.generate_sync([spec(prompt)])  # 125 tokens of K/V: 7 cached blocks
        guess = FIRST_EXTEND_GUESS  # 128: a power of two, its own bucket; a turn more: 7 + 8 + 1 blocks -> 16
        assert guess == 128
        assert engine._call_in_engine(engine._predicted_shapes) == [
            CallShape(True, 1, 128, 8), CallShape(True, 1, 128, 16), CallShape(True, 1, 64, 8),
            CallShape(True, 1, 64, 16), CallShape(True, 1, 256, 8), CallShape(True, 1, 256, 32)]
        prompt = prompt + out.output_ids + tokens(31, 9)  # 23 new tokens over 7 blocks: bucket 32
        engine.generate_sync([spec(prompt)])  # 140 tokens of K/V: 8 blocks; a turn more: 8 + 2 + 1 -> 16
        assert engine._call_in_engine(engine._predicted_shapes) == [
            CallShape(True, 1, 32, 8), CallShape(True, 1, 32, 16), CallShape(True, 1, 16, 8),
            CallShape(True, 1, 16, 16), CallShape(True, 1, 64, 8), CallShape(True, 1, 64, 16)]
    finally:
        engine.shutdown()


EXIT_WHILE_COMPILING = """
import threading
import time
from openclaw_jax.inference import prefill
from openclaw_jax.inference.engine import Engine, EngineConfig, spec_for
from openclaw_jax.models.hub import load_pretrained

entered, real = threading.Event(), prefill.Prefiller.compile
def compile_and_tell(self, shape, state):
    entered.set()
    return real(self, shape, state)
prefill.Prefiller.compile = compile_and_tell
pre = load_pretrained("smollm2", dtype="float32")  # a real model's compilation takes seconds
engine = Engine(pre.model, pre.tokenizer, seed=0, config=EngineConfig(min_prompt_bucket=512))
engine.generate_sync([spec_for(list(range(100, 700)), max_new_tokens=2, temperature=0)])
assert entered.wait(120), "nothing was compiled ahead"
time.sleep(1.0)  # past the Python tracing, inside XLA's compiler (2-4 s for this model on a small CPU)
print("exiting while a compilation runs", flush=True)
"""


def test_the_process_exits_cleanly_while_a_compilation_runs_ahead(tmp_path):
    """A program that ends (without shutting its engine down) while the compile-ahead thread is inside a
    compilation exits with 0: the exit waits for the compilation instead of aborting ("FATAL: exception not
    rethrown", a daemon thread inside XLA's compiler at interpreter finalization)."""
    import subprocess
    import sys

    script = tmp_path / "exit_while_compiling.py"
    script.write_text(EXIT_WHILE_COMPILING)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert "exiting while a compilation runs" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
