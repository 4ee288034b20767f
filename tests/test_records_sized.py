"""Recorded windows come with their encoded size, which the wire size check takes in place of a
``ByteSize()`` walk: the record's length for binary files, None for JSON lines."""
from __future__ import annotations

import gzip

from hypertrace.proto import records, wire
from hypertrace.sim.simulate import SimConfig, generate


def _windows():
    return list(generate(SimConfig(gpus=16, gpus_per_node=8, windows=2, seed=3)))


def test_binary_records_give_each_window_its_encoded_size(tmp_path):
    ws = _windows()
    path = tmp_path / "w.pb.gz"
    with records.open_for_write(str(path)) as fh:
        records.write_windows(ws, fh, binary=True)
    got = list(records.read_windows_sized(path))
    assert [w for w, _ in got] == ws
    assert [n for _, n in got] == [w.ByteSize() for w in ws] == [len(w.SerializeToString())
                                                                  for w in ws]
    assert list(records.read_windows(path)) == ws


def test_json_lines_give_no_size_and_validation_measures_the_window(tmp_path):
    ws = _windows()
    path = tmp_path / "w.jsonl"
    with open(path, "wb") as fh:
        records.write_windows(ws, fh, binary=False)
    got = list(records.read_windows_sized(path))
    assert [w for w, _ in got] == ws and {n for _, n in got} == {None}
    for w, n in got:
        wire.validate_window(w, encoded_size=n)


def test_the_size_is_the_record_length_unknown_fields_included(tmp_path):
    """The size checked is the record's, as the server checks the bytes it received."""
    w = _windows()[0]
    data = w.SerializeToString() + b"\xfa\x3f\x00"      # field 1023, empty bytes: unknown
    path = tmp_path / "w.pb"
    with gzip.open(path.with_suffix(".pb.gz"), "wb") as fh:
        fh.write(records._varint_bytes(len(data)) + data)
    (got, size), = records.read_windows_sized(path.with_suffix(".pb.gz"))
    assert size == len(data)
    assert got.seq == w.seq
