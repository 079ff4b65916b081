"""The trainer's incremental reader of the sample store (openclaw_jax/samples/tail.py).

The trainer reads each window through one `SampleTail` for the run (via `SampleBatcher`): a step
must read only the records appended since the previous step plus its own window, however large the
store has grown. The bytes are counted by the kernel (`rchar` of this thread in /proc), not by the
code under test. Offsets are checked against a fresh full reader of the same directory.
"""

from __future__ import annotations

import os

import pytest

from openclaw_jax.samples import Sample, SampleStore, SampleStoreError, SampleTail
from openclaw_jax.samples.store import encode_record, list_segments, segment_name
from openclaw_jax.samples.sample import encode_sample
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import SampleBatcher

RESPONSE = 200  # tokens per sample: ~3 KB a record, so a rescan of the store is plainly visible


def _sample(i: int) -> Sample:
    return Sample(session_id=f"s{i}", turn_index=i, kind="rl", reward=1.0 if i % 2 else -1.0,
                  prompt_ids=[1 + i % 7, 2, 3], response_ids=[(i + j) % 97 + 1 for j in range(RESPONSE)],
                  rollout_logprobs=[-0.001 * (j + 1) for j in range(RESPONSE)], sample_id=f"id-{i}")


def _thread_bytes_read() -> int:
    with open("/proc/thread-self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/io"), reason="needs Linux per-thread I/O accounting")
def test_each_step_reads_only_new_records_and_its_window(tmp_path):
    """As the store grows to ~1.5 MB over 3 segments, a step's reads stay bounded by what is new
    (a reader that rescans every segment per step reads the whole store, ~40x the bound, each step)."""
    writer = SampleStore(tmp_path, fsync=False, segment_max_bytes=600_000)
    for i in range(100):
        writer.append(_sample(i))
    record_bytes = len(encode_record(encode_sample(_sample(0))))
    window, appended_per_step = 4, 12
    spec = BatchSpec(samples_per_step=window, min_seq_bucket=8, max_seq_len=512, min_response_bucket=8)
    batcher = SampleBatcher(str(tmp_path), spec)
    next_id, offset, per_step = 100, 0, []
    try:
        for step in range(40):
            for _ in range(appended_per_step):
                writer.append(_sample(next_id))
                next_id += 1
            before = _thread_bytes_read()
            assert batcher.tail.refresh() == next_id  # as Trainer.run does each step: count what waits
            batches = list(batcher.batches(offset, offset + window))
            per_step.append(_thread_bytes_read() - before)
            assert [s.sample_id for b in batches for s in b.samples] == [f"id-{i}" for i in range(offset, offset + window)]
            offset += window
        assert len(list_segments(str(tmp_path))) >= 3
        store_bytes = sum(os.path.getsize(tmp_path / segment_name(s)) for s in list_segments(str(tmp_path)))
        # the first step opens the tail (one scan of what exists then); every later step reads what was
        # appended since (12 records) and its window (4 records), plus a little for directory reads
        bound = (appended_per_step + window) * record_bytes + 16_384
        assert max(per_step[1:]) <= bound, (per_step, bound)
        assert store_bytes > 20 * bound
        assert batcher.tail.records_decoded == 40 * window
    finally:
        batcher.close()
        writer.close()


def test_tail_sees_records_once_complete_and_skips_a_torn_tail(tmp_path):
    """A record being written is not read until it is complete; after a crash the torn tail is skipped
    and the offsets continue exactly as a fresh reader of the whole store numbers them."""
    writer = SampleStore(tmp_path, fsync=False)
    for i in range(5):
        writer.append(_sample(i))
    tail = SampleTail(tmp_path, start=2)
    assert tail.refresh() == 5
    assert [s.sample_id for s in tail.read(2, 4)] == ["id-2", "id-3"]

    # the writer is half-way through record 5, then dies (SIGKILL: nothing after the partial bytes)
    record = encode_record(encode_sample(_sample(5)))
    path = tmp_path / segment_name(list_segments(str(tmp_path))[-1])
    writer.close()
    with open(path, "ab") as f:
        f.write(record[: len(record) // 2])
    assert tail.refresh() == 5  # incomplete: not a record (yet)

    # a new writer starts a new segment after the torn tail and appends more
    writer = SampleStore(tmp_path, fsync=False)
    for i in range(6, 9):
        writer.append(_sample(i))
    writer.close()
    assert tail.refresh() == 8
    got = [s.sample_id for s in tail.read(4, 8)]
    with SampleStore(tmp_path, readonly=True) as fresh:
        assert got == [s.sample_id for s in fresh.read(4, 4)] == ["id-4", "id-6", "id-7", "id-8"]
    with pytest.raises(SampleStoreError, match="released"):
        tail.read(3, 5)  # the tail moves forward: what precedes the last window is forgotten
    with pytest.raises(SampleStoreError, match="holds only"):
        tail.read(8, 9)
    tail.close()


def test_tail_picks_up_a_record_finished_after_a_refresh(tmp_path):
    """The last segment's incomplete tail is re-read from its last valid byte once it is complete."""
    writer = SampleStore(tmp_path, fsync=False)
    writer.append(_sample(0))
    path = tmp_path / segment_name(list_segments(str(tmp_path))[-1])
    writer.close()
    tail = SampleTail(tmp_path)
    record = encode_record(encode_sample(_sample(1)))
    with open(path, "ab") as f:
        f.write(record[:20])
        f.flush()
        assert tail.refresh() == 1
        f.write(record[20:])
    assert tail.refresh() == 2
    assert [s.sample_id for s in tail.read(0, 2)] == ["id-0", "id-1"]
    tail.close()
