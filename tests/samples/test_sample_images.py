"""Image blobs of the sample store: content-hashed, written durably before the record is acknowledged,
read back (hash-checked) by a read-only reader (samples/store.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

from openclaw_jax.samples import store as store_mod
from openclaw_jax.samples.sample import Sample
from openclaw_jax.samples.store import SampleStore, SampleStoreError, read_image
from openclaw_jax.samples.tail import SampleTail


def make_sample(images=()):
    return Sample(session_id="s", turn_index=0, kind="rl", reward=1.0, prompt_ids=[1, 2, 3], response_ids=[4, 5],
                  rollout_logprobs=[-0.1, -0.2], image_sha256=[hashlib.sha256(b).hexdigest() for b in images])


def test_images_round_trip_through_the_store_and_the_trainer_reader(tmp_path):
    a, b = b"\x89PNG first image", b"\x89PNG second image"
    with SampleStore(tmp_path) as st:
        off = st.append(make_sample([a, b]), images=[a, b])
        st.append(make_sample([b]))  # stored before: the blob is found, not needed again
        st.append(make_sample())
    tail = SampleTail(tmp_path)
    samples = tail.read(0, 3)
    assert off == 0 and samples[0].image_sha256 == [hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()]
    assert [read_image(tail.directory, h) for h in samples[0].image_sha256] == [a, b]
    assert read_image(tail.directory, samples[1].image_sha256[0]) == b
    assert samples[2].image_sha256 == []
    assert sorted(os.listdir(tmp_path / "images")) == sorted(samples[0].image_sha256)  # no temporary files left
    tail.close()


def test_a_sample_naming_an_image_the_store_lacks_is_refused_and_not_recorded(tmp_path):
    with SampleStore(tmp_path) as st:
        with pytest.raises(SampleStoreError, match="does not hold"):
            st.append(make_sample([b"never written"]))
        assert len(st) == 0


def test_blob_is_fsynced_and_renamed_before_the_record_is_written(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace, real_write = os.fsync, os.replace, store_mod.write_fully

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", os.fspath(dst)))
        return real_replace(src, dst)

    def write_fully(fd, data):
        events.append(("write", os.readlink(f"/proc/self/fd/{fd}")))
        return real_write(fd, data)

    st = SampleStore(tmp_path)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(store_mod, "write_fully", write_fully)
    data = b"\x89PNG pixels"
    st.append(make_sample([data]), images=[data])
    monkeypatch.undo()
    st.close()
    blob = str(tmp_path / "images" / hashlib.sha256(data).hexdigest())
    kinds = [(k, os.path.basename(p)) for k, p in events]
    record_write = next(i for i, (k, p) in enumerate(kinds) if k == "write" and p.startswith("samples-"))
    rename = kinds.index(("rename", os.path.basename(blob)))
    blob_fsync = next(i for i, (k, p) in enumerate(kinds) if k == "fsync" and p.endswith(".tmp"))
    dir_fsync = next(i for i, (k, p) in enumerate(events) if k == "fsync" and p == str(tmp_path / "images")
                     and i > rename)
    assert blob_fsync < rename < dir_fsync < record_write


def test_a_corrupt_or_missing_blob_is_reported(tmp_path):
    data = b"\x89PNG pixels"
    with SampleStore(tmp_path) as st:
        st.append(make_sample([data]), images=[data])
        sha = hashlib.sha256(data).hexdigest()
        (tmp_path / "images" / sha).write_bytes(b"flipped")
        with pytest.raises(SampleStoreError, match="does not match its hash"):
            st.image(sha)
        with pytest.raises(SampleStoreError, match="missing"):
            st.image(hashlib.sha256(b"other").hexdigest())
        with pytest.raises(SampleStoreError, match="not a sha256"):
            st.image("../LOCK")


def test_a_failed_blob_write_leaves_no_blob(tmp_path, monkeypatch):
    st = SampleStore(tmp_path)

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        st.append(make_sample([b"img"]), images=[b"img"])
    monkeypatch.undo()
    assert os.listdir(tmp_path / "images") == [] and len(st) == 0
    st.close()
