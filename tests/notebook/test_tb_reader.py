"""TensorBoard event reading (`openclaw_jax.notebook.tb_reader`) against files tensorboardX writes.

The expected values are what each test hands to tensorboardX's own `SummaryWriter` /
`RecordWriter`; the CRC check uses the published CRC-32C check value of b"123456789".
"""

from __future__ import annotations

import logging
import struct
import time

import numpy as np
import pytest

from openclaw_jax.notebook import tb_reader


def _write(logdir, fn, filename_suffix=""):
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(logdir), filename_suffix=filename_suffix)
    fn(writer)
    writer.close()


def _record_offsets(data: bytes) -> list[tuple[int, int]]:
    """(start, payload length) of every TFRecord in `data`, parsed by hand."""
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, length))
        pos += 8 + 4 + length + 4
    return out


def test_masked_crc_matches_the_crc32c_check_value():
    crc = 0xE3069283  # CRC-32C of b"123456789" (RFC 3720 test vector)
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert tb_reader._masked_crc32c(b"123456789") == masked


def test_scalars_texts_histograms_round_trip(tmp_path):
    values = np.array([0.0, 0.0, 1.0, 1.0, 1.0, 2.0])

    def write(w):
        for step, v in [(3, 0.5), (1, -1.25), (2, 7.0)]:   # logged out of step order
            w.add_scalar("loss", v, step)
        w.add_scalar("samples/per_step", 4.0, 1)
        w.add_text("hints", "- Please begin with Sure.", 1)
        w.add_text("hints", "- Use metric units.", 2)
        w.add_histogram("sel_k_star", values, 2)

    _write(tmp_path, write)
    scalars = tb_reader.read_scalars(tmp_path)
    assert scalars["loss"] == [(1, -1.25), (2, 7.0), (3, 0.5)]
    assert scalars["samples/per_step"] == [(1, 4.0)]
    assert "hints" not in scalars and "sel_k_star" not in scalars

    assert tb_reader.read_texts(tmp_path) == {"hints": [(1, "- Please begin with Sure."), (2, "- Use metric units.")]}

    [(step, hist)] = tb_reader.read_histograms(tmp_path)["sel_k_star"]
    assert step == 2
    assert (hist.num, hist.min, hist.max) == (6, 0.0, 2.0)
    assert hist.sum == pytest.approx(values.sum()) and hist.sum_squares == pytest.approx((values ** 2).sum())
    assert hist.mean == pytest.approx(values.mean())
    assert hist.bucket_counts.sum() == 6
    assert len(hist.bucket_limits) == len(hist.bucket_counts)


def test_tensor_encoded_scalar_is_read(tmp_path):
    """Writers that store scalars as tensors (plugin "scalars") are understood too."""
    from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2
    from tensorboardX.record_writer import RecordWriter

    path = tmp_path / f"events.out.tfevents.{int(time.time())}.test"
    writer = RecordWriter(str(path))
    for step, number in [(5, 0.25), (6, 1.5)]:
        value = summary_pb2.Summary.Value(tag="lr", tensor=tensor_pb2.TensorProto(dtype=1, float_val=[number]))
        value.metadata.plugin_data.plugin_name = "scalars"
        event = event_pb2.Event(step=step, wall_time=time.time(), summary=summary_pb2.Summary(value=[value]))
        writer.write(event.SerializeToString())
    writer.close()
    assert tb_reader.read_scalars(tmp_path) == {"lr": [(5, 0.25), (6, 1.5)]}


def test_torn_last_record_is_ignored(tmp_path):
    _write(tmp_path, lambda w: [w.add_scalar("loss", float(s), s) for s in range(1, 5)])
    [path] = tb_reader.event_files(tmp_path)
    data = path.read_bytes()
    last_start, _ = _record_offsets(data)[-1]
    for cut in (last_start + 3, last_start + 14, len(data) - 1):   # inside header, payload, trailing crc
        path.write_bytes(data[:cut])
        assert tb_reader.read_scalars(tmp_path)["loss"] == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_corrupt_record_is_skipped_with_a_warning(tmp_path, caplog):
    _write(tmp_path, lambda w: [w.add_scalar("loss", float(s), s) for s in range(1, 5)])
    [path] = tb_reader.event_files(tmp_path)
    data = bytearray(path.read_bytes())
    records = _record_offsets(bytes(data))
    # records[0] is the file_version event; records[2] holds step 2. Flip a payload byte.
    start, length = records[2]
    data[start + 12 + length // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=tb_reader.__name__):
        assert tb_reader.read_scalars(tmp_path)["loss"] == [(1, 1.0), (3, 3.0), (4, 4.0)]
    assert "checksum" in caplog.text


def test_corrupt_length_ends_the_file(tmp_path, caplog):
    _write(tmp_path, lambda w: [w.add_scalar("loss", float(s), s) for s in range(1, 5)])
    [path] = tb_reader.event_files(tmp_path)
    data = bytearray(path.read_bytes())
    start, _ = _record_offsets(bytes(data))[3]   # step 3's length field
    data[start] ^= 0x01
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=tb_reader.__name__):
        assert tb_reader.read_scalars(tmp_path)["loss"] == [(1, 1.0), (2, 2.0)]
    assert "corrupt record header" in caplog.text


def test_resumed_run_files_merge_in_creation_order(tmp_path):
    """A resumed run opens a second event file; a step logged again keeps both values, oldest first."""
    _write(tmp_path, lambda w: [w.add_scalar("loss", v, s) for s, v in [(1, 1.0), (2, 2.0), (3, 3.0)]], ".a")
    time.sleep(1.1)   # the creation time in the file name has one-second resolution
    _write(tmp_path, lambda w: [w.add_scalar("loss", v, s) for s, v in [(3, 30.0), (4, 40.0)]], ".b")
    files = tb_reader.event_files(tmp_path)
    assert len(files) == 2 and files[0].name.endswith(".a")
    assert tb_reader.read_scalars(tmp_path)["loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (3, 30.0), (4, 40.0)]


def test_missing_logdir_says_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_run"):
        tb_reader.read_scalars(tmp_path / "no_such_run" / "tb")


def test_empty_logdir_reads_empty(tmp_path):
    assert tb_reader.read_scalars(tmp_path) == {}
    assert tb_reader.read_texts(tmp_path) == {}
    assert tb_reader.read_histograms(tmp_path) == {}
