"""Windows validated in worker processes ahead of the reader (analyzer/scale/validate_ahead.py) come out
exactly as validating them in the reader does: the same windows in the same order, the same
verdict (error field and text) on each, and the same error for a damaged file. Real files of
simulated windows, real worker processes."""
from __future__ import annotations

import math

import pytest

from hypertrace.analyzer.scale import validate_ahead
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import records, wire
from hypertrace.sim.simulate import SimConfig, generate


@pytest.fixture(scope="module")
def windows() -> list[pb.NodeWindow]:
    """More than two chunks of windows, a few of them broken in different ways."""
    ws = list(generate(SimConfig(gpus=1024, gpus_per_node=8, windows=5, seed=4)))
    assert len(ws) > 2 * validate_ahead.CHUNK
    ws[3].processes[1].apis[0].sum_us = math.nan
    ws[300].processes[0].apis[1].count += 1
    ws[301].version = 7
    ws[-1].processes[2].steps.source = "x" * (wire.MAX_TEXT_LEN + 1)
    return ws


def _write(path, ws: list[pb.NodeWindow], tail: bytes = b"") -> str:
    with open(path, "wb") as fh:
        records.write_windows(ws, fh, binary=True)
        fh.write(tail)
    return str(path)


def _outcome(path: str, workers: int) -> list:
    """Everything the caller sees: each window's bytes, size and verdict; then the file's
    error, if any."""
    seen: list = []
    try:
        for w, size, problem in validate_ahead.validated_windows(path, workers, min_bytes=0):
            seen.append((w.SerializeToString(), size,
                         None if problem is None else (problem.field, problem.problem)))
    except wire.WireError as exc:
        seen.append(("raised", exc.field, exc.problem))
    return seen


def test_workers_give_the_readers_windows_and_verdicts(tmp_path, windows):
    path = _write(tmp_path / "w.pb", windows)
    assert len(validate_ahead._spans(path)) == len(windows)     # every record goes to a worker
    here = _outcome(path, 0)
    fields = {i: v[0] for i, (_, _, v) in enumerate(here) if v}
    assert fields == {3: "processes[1].apis[0].sum_us", 300: "processes[0].apis[1].count",
                      301: "version", len(windows) - 1: "processes[2].steps.source"}
    for workers in (1, 3):
        assert _outcome(path, workers) == here


@pytest.mark.parametrize("tail", [b"\x80\x80", b"\x05ab", b"\x03\xff\xff\xff",
                                  b"\xff" * 11, b"\x00"])
def test_a_damaged_end_raises_the_readers_error_after_the_same_windows(tmp_path, windows, tail):
    path = _write(tmp_path / "w.pb", windows, tail)
    here = _outcome(path, 0)
    assert here[-1][0] == "raised"
    assert _outcome(path, 2) == here


def test_an_unparseable_record_in_the_middle_is_left_to_the_reader(tmp_path, windows):
    path = _write(tmp_path / "w.pb", windows[:270] + windows[280:])
    with open(path, "r+b") as fh:                 # bytes of record 100 that are no NodeWindow
        offset = sum(len(records._varint_bytes(w.ByteSize())) + w.ByteSize()
                     for w in windows[:99])
        fh.seek(offset + len(records._varint_bytes(windows[99].ByteSize())))
        fh.write(b"\xff\xff\xff\xff")
    here = _outcome(path, 0)
    assert here[-1][0] == "raised" and "record 100" in here[-1][1]
    assert _outcome(path, 2) == here


def test_small_gzipped_and_json_files_are_validated_here(tmp_path, windows):
    """Not plain binary or too small: no workers, the same outcome."""
    for name in ("w.pb.gz", "w.jsonl"):
        path = str(tmp_path / name)
        with records.open_for_write(path) as fh:
            records.write_windows(windows[:300], fh, binary=name.endswith(".pb.gz"))
        assert not validate_ahead._plain_binary(path, 0)
        assert _outcome(path, 2) == _outcome(path, 0)
    path = _write(tmp_path / "small.pb", windows[:300])
    assert not validate_ahead._plain_binary(path, 10 ** 9)
