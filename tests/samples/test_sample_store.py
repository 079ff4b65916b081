"""Durability tests for the append-only sample store (openclaw_jax/samples/)."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import grain
import pytest

from openclaw_jax.samples import (
    Sample,
    SampleError,
    SampleStore,
    SampleStoreDataSource,
    SampleStoreError,
    SampleStoreLockedError,
    SampleTail,
    decode_sample,
    encode_sample,
)
from openclaw_jax.samples.store import RECORD_MAGIC, segment_name


def make_sample(i: int, *, size: int = 8) -> Sample:
    """A deterministic sample whose content is a function of ``i`` (so a reader can check it)."""
    kind = ("opd+rl", "opd", "rl")[i % 3]
    hints = [] if kind == "rl" else [f"hint number {i} for the model", f"a longer hint number {i} for it"]
    return Sample(
        session_id=f"s{i % 5}", turn_index=i, kind=kind,
        reward={"opd+rl": -1, "opd": 0, "rl": 1}[kind],
        prompt_ids=[(i * 7 + j) % 500 for j in range(size)],
        response_ids=[(i + j) % 500 for j in range(size // 2 + 1)],
        rollout_logprobs=[-0.1 * (j + 1) / (i + 1) for j in range(size // 2 + 1)],
        hints=hints, hint_prompt_ids=[[1, 2, 3, i]] * len(hints),
        weight_version=str(i // 4), sample_id=f"id-{i}", created_at=1000.0 + i,
    )


def write_samples(store: SampleStore, indices) -> list[int]:
    return [store.append(make_sample(i)) for i in indices]


def test_sample_codec_round_trips_exact_floats_and_unicode():
    s = make_sample(3)
    s = Sample(**{**s.__dict__, "rollout_logprobs": [-1e-300, -0.1 + 1e-17, float("-inf"), -123.456789012345678],
                  "response_ids": [1, 2, 3, 4], "response_text": "héllo ✓ \x00 nul"})
    back = decode_sample(encode_sample(s))
    assert back == s
    assert back.rollout_logprobs[2] == float("-inf")


@pytest.mark.parametrize("kind,reward,hints", [
    ("opd+rl", 0, ["a hint that is long"]),   # opd+rl needs reward +-1
    ("opd+rl", 1, []),                        # and a hint
    ("opd", 1, ["a hint that is long"]),      # opd needs reward 0
    ("opd", 0, []),
    ("rl", 0, []),                            # rl needs reward +-1
    ("rl", 1, ["a hint that is long"]),       # and no hints
    ("sft", 1, []),
])
def test_sample_rejects_inconsistent_kind(kind, reward, hints):
    with pytest.raises(SampleError):
        Sample(session_id="s", turn_index=0, kind=kind, reward=reward, prompt_ids=[1], response_ids=[2],
               rollout_logprobs=[-0.5], hints=hints, hint_prompt_ids=[[1]] * len(hints))


def test_records_written_with_loss_mask_read_as_response_mask():
    """Stores on disk hold records from before the field was renamed: `loss_mask` reads as `response_mask`."""
    s = Sample(**{**make_sample(2).__dict__, "response_mask": [1, 0, 1, 1, 0]})
    old = encode_sample(s).replace(b'"response_mask":', b'"loss_mask":')
    assert b'"response_mask"' not in old
    back = decode_sample(old)
    assert back == s and back.response_mask == [1, 0, 1, 1, 0]
    with pytest.raises(SampleError, match="response_mask"):
        decode_sample(old.replace(b'"loss_mask":[1,0,1,1,0]', b'"loss_mask":[1,0]'))

def test_stores_written_before_samples_had_a_person_still_read(tmp_path):
    """Records without the field (older stores) and with ``"person": ""`` (what the code wrote for a turn with
    no person before ``default`` was the default) read as the default person, beside people's own records, in
    every reader: the store, the trainer's tail and the grain source. Writing again records ``default``. Records
    written before samples named the adapter that served them read as served by the base (None)."""
    records = [make_sample(i) for i in range(3)]
    without = json.loads(encode_sample(records[0]))
    for field in ("person", "adapter", "adapter_steps"):
        without.pop(field)
    empty = {**json.loads(encode_sample(records[1])), "person": ""}
    with SampleStore(tmp_path / "store") as store:
        store.append_payload(json.dumps(without).encode())
        store.append_payload(json.dumps(empty).encode())
        store.append(dataclasses.replace(records[2], person="bob@home", adapter="bob@home", adapter_steps=3))
    with SampleStore(tmp_path / "store", readonly=True) as store:
        read = store.read(0)
    tail = SampleTail(tmp_path / "store")
    tail.refresh()
    people = ["default", "default", "bob@home"]
    assert [s.person for s in read] == [s.person for s in tail.read(0, 3)] == people
    assert [s.person for s in SampleStoreDataSource(str(tmp_path / "store"))] == people
    tail.close()
    assert read[:2] == [dataclasses.replace(r, person="default") for r in records[:2]]   # nothing else changed
    assert json.loads(encode_sample(read[0]))["person"] == "default"
    assert [(s.adapter, s.adapter_steps) for s in read] == [(None, None), (None, None), ("bob@home", 3)]


@pytest.mark.parametrize("person", ["", " alice", "two words", "-lead", "x" * 65, "a/b", "é"])
def test_sample_rejects_a_malformed_person(person):
    with pytest.raises(SampleError, match="person id: 1 to 64 letters"):
        dataclasses.replace(make_sample(0), person=person)
    record = json.loads(encode_sample(make_sample(0)))
    if person:   # on disk, "" is a record from before people (read above); anything else malformed is refused
        with pytest.raises(SampleError, match="person id"):
            decode_sample(json.dumps({**record, "person": person}).encode())


def test_sample_rejects_length_mismatch():
    with pytest.raises(SampleError, match="log-probs"):
        Sample(session_id="s", turn_index=0, kind="rl", reward=1, prompt_ids=[1], response_ids=[2, 3],
               rollout_logprobs=[-0.5])


def test_append_read_reopen(tmp_path):
    with SampleStore(tmp_path) as store:
        offsets = write_samples(store, range(10))
        assert offsets == list(range(10))
        assert len(store) == 10
        assert store.read(3, 4) == [make_sample(i) for i in range(3, 7)]
        assert store.read(8) == [make_sample(8), make_sample(9)]
        assert store.read(10) == []
    with SampleStore(tmp_path) as store:
        assert len(store) == 10
        assert list(store) == [make_sample(i) for i in range(10)]
        assert store.append(make_sample(10)) == 10
        assert store[10] == make_sample(10)
    # Appends after the reopen continue in the same (clean) segment.
    assert sorted(os.listdir(tmp_path)) == ["LOCK", segment_name(0)]


def test_second_writer_is_refused_but_readers_are_fine(tmp_path):
    with SampleStore(tmp_path) as store:
        store.append(make_sample(0))
        with pytest.raises(SampleStoreLockedError, match="already open for writing"):
            SampleStore(tmp_path)
        reader = SampleStore(tmp_path, readonly=True)
        assert len(reader) == 1
        store.append(make_sample(1))
        assert len(reader) == 1 and reader.refresh() == 2
        assert reader[1] == make_sample(1)
        with pytest.raises(SampleStoreError, match="read-only"):
            reader.append(make_sample(2))
        reader.close()
    # After the writer closes, another writer may open it.
    SampleStore(tmp_path).close()


def test_readonly_store_requires_existing_directory(tmp_path):
    with pytest.raises(SampleStoreError, match="does not exist"):
        SampleStore(tmp_path / "nope", readonly=True)


@pytest.mark.parametrize("cut", [1, 5, 12, 13, 40])
def test_torn_tail_by_truncation_is_skipped_and_appends_read_on(tmp_path, cut):
    with SampleStore(tmp_path) as store:
        write_samples(store, range(5))
    path = tmp_path / segment_name(0)
    size = path.stat().st_size
    last_record = len(encode_sample(make_sample(4))) + 12
    assert cut < last_record
    # Keep the first `last_record - cut` bytes of the final record: a write torn by a crash.
    os.truncate(path, size - cut)
    with SampleStore(tmp_path) as store:
        assert len(store) == 4
        assert segment_name(0) in store.torn_segments
        assert write_samples(store, [100, 101]) == [4, 5]
        assert store.read(0) == [make_sample(i) for i in (0, 1, 2, 3, 100, 101)]
    # The torn bytes are kept (append-only) and the appends went into a new segment.
    assert path.stat().st_size == size - cut
    assert (tmp_path / segment_name(1)).exists()
    reader = SampleStore(tmp_path, readonly=True)
    assert reader.read(0) == [make_sample(i) for i in (0, 1, 2, 3, 100, 101)]
    # Reopening again changes nothing.
    with SampleStore(tmp_path) as store:
        assert len(store) == 6
        assert store.append(make_sample(102)) == 6
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".log")) == [segment_name(0), segment_name(1)]


def test_garbage_tail_is_skipped(tmp_path):
    with SampleStore(tmp_path) as store:
        write_samples(store, range(3))
    with open(tmp_path / segment_name(0), "ab") as f:
        f.write(os.urandom(100) + RECORD_MAGIC + struct.pack("<II", 50, 1234) + b"x" * 10)
    with SampleStore(tmp_path) as store:
        assert len(store) == 3
        assert store.append(make_sample(3)) == 3
    with SampleStore(tmp_path, readonly=True) as reader:
        assert reader.read(0) == [make_sample(i) for i in range(4)]


def test_corrupt_middle_record_is_skipped_and_later_records_kept(tmp_path):
    with SampleStore(tmp_path) as store:
        write_samples(store, range(5))
    path = tmp_path / segment_name(0)
    data = bytearray(path.read_bytes())
    sizes = [len(encode_sample(make_sample(i))) + 12 for i in range(5)]
    start_of_2 = sizes[0] + sizes[1]
    data[start_of_2 + 30] ^= 0xFF  # flip a payload byte of record 2: CRC mismatch
    path.write_bytes(bytes(data))
    with SampleStore(tmp_path, readonly=True) as reader:
        assert [s.turn_index for s in reader.read(0)] == [0, 1, 3, 4]


def test_header_with_wrong_crc_is_rejected(tmp_path):
    payload = encode_sample(make_sample(0))
    with SampleStore(tmp_path) as store:
        store.append(make_sample(1))
    with open(tmp_path / segment_name(0), "ab") as f:
        f.write(RECORD_MAGIC + struct.pack("<II", len(payload), zlib.crc32(payload) ^ 1) + payload)
    with SampleStore(tmp_path, readonly=True) as reader:
        assert len(reader) == 1


def test_reader_waits_for_in_progress_tail_of_last_segment(tmp_path):
    """A reader must not give up on a record that the writer is still writing."""
    with SampleStore(tmp_path) as store:
        write_samples(store, range(2))
    payload = encode_sample(make_sample(2))
    record = RECORD_MAGIC + struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    path = tmp_path / segment_name(0)
    reader = SampleStore(tmp_path, readonly=True)
    with open(path, "ab") as f:
        f.write(record[:20])
        f.flush()
        assert reader.refresh() == 2
        f.write(record[20:])
        f.flush()
    assert reader.refresh() == 3
    assert reader[2] == make_sample(2)
    reader.close()


def test_segment_rollover(tmp_path):
    one = len(encode_sample(make_sample(0))) + 12
    with SampleStore(tmp_path, segment_max_bytes=3 * one + 10) as store:
        write_samples(store, range(10))
        assert len(store) == 10
    segments = sorted(p for p in os.listdir(tmp_path) if p.endswith(".log"))
    assert len(segments) >= 3
    with SampleStore(tmp_path, readonly=True) as reader:
        assert reader.read(0) == [make_sample(i) for i in range(10)]


def test_grain_data_source_from_offset(tmp_path):
    with SampleStore(tmp_path) as store:
        write_samples(store, range(7))
        source = SampleStoreDataSource(tmp_path, start=2)
        store.append(make_sample(7))  # after the source was made: not part of it
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    assert len(source) == 5
    assert [source[i] for i in range(5)] == [make_sample(i) for i in range(2, 7)]
    with pytest.raises(IndexError):
        source[5]
    clone = pickle.loads(pickle.dumps(source))
    assert clone[4] == make_sample(6)
    ds = grain.MapDataset.source(SampleStoreDataSource(tmp_path, start=1, stop=4, as_dict=True))
    assert [d["turn_index"] for d in ds] == [1, 2, 3]
    assert "start=2" in repr(source)


WRITER_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from openclaw_jax.samples import SampleStore
    from tests.samples.test_sample_store import make_sample
    store = SampleStore(sys.argv[1])
    start = len(store)
    i = start
    while True:
        offset = store.append(make_sample(i, size=int(sys.argv[2])))
        print(f"ACK {{offset}} {{i}}", flush=True)
        i += 1
""")


@pytest.mark.parametrize("size", [16, 20000])
def test_sigkill_writer_keeps_every_acknowledged_sample(tmp_path, size):
    script = tmp_path / "writer.py"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script.write_text(WRITER_SCRIPT.format(repo=repo))
    store_dir = tmp_path / "store"
    acked: dict[int, int] = {}
    for round_no in range(2):
        proc = subprocess.Popen([sys.executable, str(script), str(store_dir), str(size)],
                                stdout=subprocess.PIPE, text=True)
        target = len(acked) + 40
        deadline = time.time() + 60
        while len(acked) < target and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            _, offset, i = line.split()
            acked[int(offset)] = int(i)
        os.kill(proc.pid, signal.SIGKILL)  # while it is in the middle of further appends
        proc.wait()
        proc.stdout.close()
        assert len(acked) >= target, "the writer subprocess did not acknowledge enough samples"
    with SampleStore(store_dir, readonly=True) as reader:
        assert len(reader) >= len(acked)
        for offset, i in acked.items():
            assert reader[offset] == make_sample(i, size=size)
        # Offsets are dense and each record is the one the writer meant for it.
        assert [s.turn_index for s in reader.read(0)] == list(range(len(reader)))
