"""The grain input pipeline (`trainer/input_pipeline.py`) gives exactly the batches of the hand-written
path (`SampleBatcher.batches`) for the same windows: every array, the samples, the staleness, the
counts and the drop counters, window after window (the packer's seen shapes carry over), with and
without the next window prefetched on a host thread."""

from __future__ import annotations

import numpy as np
import pytest

from openclaw_jax.samples import Sample, SampleStore
from openclaw_jax.samples.sample import encode_sample
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import SampleBatcher
from openclaw_jax.trainer.input_pipeline import WindowPipeline, demonstration_batches, sample_dataset

VOCAB = 200


def _samples(n: int, seed: int = 0) -> list[Sample]:
    """A mix: hinted turns (hints before the last message, a common system prompt), hint-only turns,
    RL turns, stale ones, one too long, one at another temperature."""
    rng = np.random.default_rng(seed)
    system = [int(x) for x in rng.integers(1, VOCAB, 40)]

    def ids(k):
        return [int(x) for x in rng.integers(1, VOCAB, k)]

    out = []
    for i in range(n):
        prompt = system + ids(int(rng.integers(3, 30)))
        response = ids(int(rng.integers(2, 40)))
        kind = ["opd+rl", "opd", "rl"][i % 3]
        n_hints = 0 if kind == "rl" else int(rng.integers(1, 4))
        hint_prompts = [prompt[:-1] + ids(int(rng.integers(2, 12))) + prompt[-1:] for _ in range(n_hints)]
        reward = 0.0 if kind == "opd" else float(rng.choice([-1.0, 1.0]))
        version = str(max(0, i // 4 - (6 if i % 11 == 5 else 0)))    # a few stale ones
        temperature = 0.5 if i == 13 else 1.0
        if i == 7:
            response = ids(600)   # too long for max_seq_len
        out.append(Sample(session_id=f"s{i}", turn_index=i, kind=kind, reward=reward, prompt_ids=prompt,
                          response_ids=response, rollout_logprobs=[-0.5] * len(response),
                          hints=[f"hint {j}" for j in range(n_hints)], hint_prompt_ids=hint_prompts,
                          weight_version=version, temperature=temperature))
    return out


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for part in ("student", "teacher"):
            a, b = getattr(g, part), getattr(w, part)
            assert a.keys() == b.keys(), part
            for k in b:
                assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (part, k)
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{part}.{k}")
        assert [s.to_dict() for s in g.samples] == [s.to_dict() for s in w.samples]
        np.testing.assert_array_equal(g.staleness, w.staleness)
        assert g.kinds == w.kinds and g.real_tokens == w.real_tokens


SPECS = {
    "packed_shared_prefix": BatchSpec(samples_per_step=4, max_candidates=3, min_seq_bucket=16, min_response_bucket=8,
                                      max_seq_len=256, packing=True, shared_prefix_teacher=True, batch_prefix_min=16,
                                      temperature=1.0, max_staleness=2, bucket_quantum=32),
    "unpacked_rl": BatchSpec(samples_per_step=3, max_candidates=2, min_seq_bucket=16, min_response_bucket=8,
                             max_seq_len=256, packing=False, uses_hints=False, temperature=1.0, max_staleness=2),
}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("prefetch", [False, True])
def test_pipeline_batches_equal_the_batcher(tmp_path, name, prefetch):
    spec = SPECS[name]
    samples = _samples(40)
    with SampleStore(tmp_path / "s") as store:
        for s in samples:
            store.append(s)
    windows = [(0, 4, 0), (4, 8, 1), (8, 20, 2), (20, 24, 3), (24, 33, 5), (33, 40, 6)]
    batcher = SampleBatcher(tmp_path / "s", spec)
    with WindowPipeline(tmp_path / "s", spec) as pipeline:
        for k, (start, end, version) in enumerate(windows):
            want = list(batcher.batches(start, end, current_version=version))
            got = pipeline.batches(start, end, current_version=version)
            if prefetch and k + 1 < len(windows):
                pipeline.prefetch(*windows[k + 1])
            _assert_same(got, want)
            assert pipeline.dropped == batcher.dropped
        assert pipeline.seen_shapes == batcher.seen_shapes
    batcher.close()
    assert sum(batcher.dropped.values()) > 0   # the windows did exercise the filter


@pytest.mark.parametrize("prefetch", [False, True])
def test_batch_is_the_loops_first_batch_of_a_window(tmp_path, prefetch):
    """`batch` is what the loop takes: `next(iter(batcher.batches(...)), None)` (None: all dropped)."""
    spec = SPECS["packed_shared_prefix"]
    with SampleStore(tmp_path / "s") as store:
        for s in _samples(24):
            store.append(s)
    batcher = SampleBatcher(tmp_path / "s", spec)
    with WindowPipeline(tmp_path / "s", spec) as pipeline:
        for step, start in enumerate(range(0, 24, 4)):
            want = next(iter(batcher.batches(start, start + 4, current_version=step)), None)
            got = pipeline.batch(start, start + 4, step)
            if prefetch and start + 8 <= 24:
                pipeline.prefetch(start + 4, start + 8, step + 1)
            _assert_same([got] if got is not None else [], [want] if want is not None else [])
    batcher.close()


def test_a_prefetch_of_another_window_is_undone(tmp_path):
    spec = SPECS["packed_shared_prefix"]
    with SampleStore(tmp_path / "s") as store:
        for s in _samples(16):
            store.append(s)
    batcher = SampleBatcher(tmp_path / "s", spec)
    with WindowPipeline(tmp_path / "s", spec) as pipeline:
        _assert_same(pipeline.batches(0, 4, current_version=0), list(batcher.batches(0, 4, current_version=0)))
        pipeline.prefetch(4, 16, 2)          # not the window asked for next (it starts where that one does)
        got = pipeline.batches(4, 8, current_version=1)
        _assert_same(got, list(batcher.batches(4, 8, current_version=1)))
        assert pipeline.dropped == batcher.dropped and pipeline.seen_shapes == batcher.seen_shapes
    batcher.close()


def test_sample_dataset_parses_records():
    samples = _samples(5, seed=3)
    ds = sample_dataset([encode_sample(s) for s in samples])
    assert len(ds) == 5
    assert [ds[i].to_dict() for i in range(5)] == [s.to_dict() for s in samples]


def test_group_rollouts_cycle_the_tasks_in_order():
    """`GroupRollouts` reads its task set through grain: the tasks in order, forever (as `itertools.cycle`)."""
    import itertools

    from openclaw_jax.envs.agentic.rollout import GroupRollouts

    tasks = [f"task{i}" for i in range(3)]
    rollouts = GroupRollouts(None, None, None, tasks, group_size=2, temperature=1.0)
    got = list(itertools.islice(rollouts.tasks, 8))
    assert got == list(itertools.islice(itertools.cycle(tasks), 8))


@pytest.mark.parametrize("threads", [0, 2])
def test_demonstration_batches_are_the_warm_ups_draws(threads):
    """The batches the agentic warm-up draws today (np.random.default_rng(seed).choice per step, no
    repeats within a batch, sorted by length), written out here as a plain loop."""
    rng = np.random.default_rng(1)
    pairs = [(list(range(int(rng.integers(1, 9)))), list(range(int(rng.integers(1, 5))))) for _ in range(11)]
    want, ref_rng = [], np.random.default_rng(42)
    for _ in range(6):
        idx = ref_rng.choice(len(pairs), size=4, replace=False)
        want.append(sorted((pairs[i] for i in idx), key=lambda p: len(p[0]) + len(p[1])))
    got = list(demonstration_batches(pairs, steps=6, batch_size=4, seed=42, prefetch_threads=threads))
    assert got == want
    assert len(list(demonstration_batches(pairs[:3], steps=2, batch_size=4, seed=0))[0]) == 3


def test_prefetch_builds_on_a_host_thread_and_batch_takes_its_result(tmp_path):
    import threading

    spec = SPECS["unpacked_rl"]
    with SampleStore(tmp_path / "s") as store:
        for s in _samples(12):
            store.append(s)
    with WindowPipeline(tmp_path / "s", spec) as pipeline:
        built = []
        build = pipeline._build

        def recording(window, *args):
            built.append((window, threading.current_thread().name))
            return build(window, *args)

        pipeline._build = recording
        pipeline.batch(0, 3, 0)
        pipeline.prefetch(3, 6, 1)
        pipeline.batch(3, 6, 1)
        assert built[0] == ((0, 3, 0), threading.current_thread().name)
        assert built[1][0] == (3, 6, 1) and built[1][1].startswith("input-pipeline")
        assert len(built) == 2   # the prefetched window was not built again
