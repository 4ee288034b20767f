"""Windows accumulated in worker processes (``prepare_windows`` there, ``Engine.ingest_prepared``
in the reader, as ``hypertrace analyze`` reads a large ``.pb`` file) leave the Engine in exactly
the state that ingesting them one by one does, and score to the same report. Real windows from
the simulator, real files and real worker processes."""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import pickle

import numpy as np
import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.scale import validate_ahead
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine, PreparedWindows, prepare_windows
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import records
from hypertrace.sim.simulate import SimConfig, generate

CFG = ScoringConfig()


@pytest.fixture(scope="module")
def windows() -> list[pb.NodeWindow]:
    """Two jobs, one of them sharing nodes with the other; a GPU known by its UUID only; a
    node sending two windows in one epoch; a GPU's NVML context changing."""
    ws = list(generate(SimConfig(gpus=256, gpus_per_node=8, windows=6, seed=5)))
    for w in ws[::3]:
        for p in w.processes[5:]:
            p.job_id = "job-b"
    for w in ws:
        if w.node == "node-0003":
            w.processes[2].gpu_index = -1
            w.processes[2].gpu_uuid = "GPU-abc"
    extra = copy.deepcopy(ws[10])
    extra.seq += 1000
    extra.start.FromNanoseconds(extra.start.ToNanoseconds() + 1_000_000)
    extra.end.FromNanoseconds(extra.end.ToNanoseconds() + 1_000_000)
    extra.processes[0].nvml.sm_clock_mhz = 900
    ws.insert(40, extra)
    return ws


def _state(engine: Engine) -> tuple[bytes, list]:
    """The Engine's state: its jobs (without their pending epochs) pickled, and each pending
    epoch's cross-section as it would be scored (the accumulators themselves differ: a
    prepared one holds its histograms decoded)."""
    state = engine.export_state()
    built = []
    for job_id, job in sorted(state["jobs"].items()):
        for epoch, acc in sorted(job.pending.items()):
            built.append((job_id, epoch, acc.windows, _plain(acc.build())))
        state["jobs"][job_id] = copy.copy(job)
        state["jobs"][job_id].pending = {}
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), built


def _plain(value):
    """A cross-section as nested lists and dicts, arrays as (dtype, shape, bytes): comparable
    with ==, NaNs included."""
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _report(engine: Engine) -> bytes:
    engine.flush(None)
    return build_report(engine, now_ns=1).SerializeToString(deterministic=True)


def test_prepared_chunks_give_the_state_of_windows_ingested_one_by_one(windows):
    one_by_one, prepared = Engine(CFG), Engine(CFG)
    for w in windows:
        one_by_one.ingest(w)
    for i in range(0, len(windows), 7):               # chunks that split epochs and nodes
        chunk = prepare_windows(windows[i:i + 7], CFG.window_ns)
        prepared.ingest_prepared(pickle.loads(pickle.dumps(chunk)))   # as from a worker
    assert len(one_by_one.job_ids()) == 2
    state = _state(one_by_one)
    assert len(state[1]) >= 12                          # 2 jobs x 6 or 7 epochs
    assert _state(prepared) == state
    assert _report(prepared) == _report(one_by_one)


def test_prepared_windows_carry_no_measurements(windows):
    chunk = prepare_windows(windows[:5], CFG.window_ns)
    assert isinstance(chunk, PreparedWindows) and len(chunk.windows) == 5
    slim = pb.NodeWindow.FromString(chunk.windows[0])
    assert slim.node == windows[0].node and slim.seq == windows[0].seq
    assert not any(p.apis or p.HasField("steps") or p.HasField("sched") for p in slim.processes)
    assert sum(len(a.rows_present()) for a in chunk.parts.values()) == sum(
        len(w.processes) for w in windows[:5])


def test_windows_of_a_scored_epoch_are_refused(windows):
    engine = Engine(CFG)
    for w in windows[:64]:
        engine.ingest(w)
    engine.flush(None)
    with pytest.raises(ValueError, match="already scored"):
        engine.ingest_prepared(prepare_windows(windows[:8], CFG.window_ns))


def _write(path, ws) -> str:
    with open(path, "wb") as fh:
        records.write_windows(ws, fh, binary=True)
    return str(path)


def test_workers_prepare_valid_chunks_and_hand_the_rest_window_by_window(
        tmp_path, monkeypatch):
    """A chunk with a bad window comes window by window, with the same verdicts as without
    ``prepare``; the valid chunks come prepared; an Engine fed both ways scores the same; the
    files the workers hand their chunks over in are gone afterwards."""
    ws = list(generate(SimConfig(gpus=512, gpus_per_node=8, windows=10, seed=6)))
    assert len(ws) > 2 * validate_ahead.CHUNK
    ws[300].version = 7
    path = _write(tmp_path / "w.pb", ws)
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    monkeypatch.setattr(validate_ahead, "_handoff_dir", lambda: str(handoff))
    prepare = functools.partial(prepare_windows, window_ns=CFG.window_ns)
    fed, plain = Engine(CFG), Engine(CFG)
    kinds, verdicts = [], []
    for item in validate_ahead.validated_windows(path, 2, min_bytes=0, prepare=prepare):
        if isinstance(item, validate_ahead.Prepared):
            kinds.append(("prepared", item.windows))
            fed.ingest_prepared(item.value)
            continue
        w, size, problem = item
        kinds.append("window")
        verdicts.append(None if problem is None else problem.field)
        if problem is None:
            fed.ingest(w)
    chunk = validate_ahead.CHUNK
    assert kinds[0] == ("prepared", chunk)
    assert kinds[1:1 + chunk] == ["window"] * chunk
    assert kinds[1 + chunk:] == [("prepared", len(ws) - 2 * chunk)]
    assert verdicts == [None] * (300 - chunk) + ["version"] + [None] * (2 * chunk - 301)
    for i, w in enumerate(ws):
        if i != 300:
            plain.ingest(w)
    assert _state(fed) == _state(plain)
    assert os.listdir(handoff) == []


def test_a_reader_that_stops_early_leaves_no_handoff_files(tmp_path, monkeypatch):
    ws = list(generate(SimConfig(gpus=512, gpus_per_node=8, windows=10, seed=6)))
    path = _write(tmp_path / "w.pb", ws)
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    monkeypatch.setattr(validate_ahead, "_handoff_dir", lambda: str(handoff))
    prepare = functools.partial(prepare_windows, window_ns=CFG.window_ns)
    items = validate_ahead.validated_windows(path, 2, min_bytes=0, prepare=prepare)
    first = next(items)
    assert isinstance(first, validate_ahead.Prepared)
    items.close()                                  # as `analyze` does at a bad window
    assert os.listdir(handoff) == []


def test_histograms_come_out_in_the_order_added_decoded_ahead_or_not():
    """An accumulator fed window by window and by decoded chunks in turn gives its histograms
    back in the order they came (what merges several windows of a GPU rely on)."""
    from hypertrace.analyzer.score.cross_section import _Flat
    hist = lambda first, *counts: pb.Histogram(first_bucket=first, counts=counts)  # noqa: E731
    mine, theirs = _Flat(), _Flat()
    mine.add(0, hist(3, 1, 2))
    theirs.add(0, hist(5, 7))
    theirs.add(1, hist(6, 8, 9))
    theirs.seal()
    mine.extend(theirs, np.array([10, 11], dtype=np.int64))
    mine.add(2, hist(4, 5))
    rows, firsts, lens, vals, totals = mine.raw()
    assert rows.tolist() == [0, 10, 11, 2]
    assert firsts.tolist() == [3, 5, 6, 4] and lens.tolist() == [2, 1, 2, 1]
    assert vals.tolist() == [1, 2, 7, 8, 9, 5] and totals.tolist() == [3, 7, 17, 5]


def test_a_windows_midpoint_is_read_as_parsing_the_window_gives_it(windows):
    """From the top-level fields alone, whatever their order or repetition."""
    for w in windows[:50]:
        data = w.SerializeToString()
        assert validate_ahead.midpoint_ns(data) == (
            w.start.ToNanoseconds() + w.end.ToNanoseconds()) // 2
    w = windows[0]
    late_start = pb.NodeWindow(start=pb.NodeWindow().start)
    late_start.start.FromNanoseconds(w.start.ToNanoseconds() - 7_000_000_123)
    odd = [
        w.SerializeToString() + late_start.SerializeToString(),     # start again, after all
        pb.NodeWindow(end=w.end).SerializeToString()
        + pb.NodeWindow(processes=w.processes).SerializeToString()
        + pb.NodeWindow(start=w.start).SerializeToString(),         # end, processes, start
        pb.NodeWindow(node="n").SerializeToString(),                # no times at all
    ]
    for data in odd:
        parsed = pb.NodeWindow.FromString(data)
        assert validate_ahead.midpoint_ns(data) == (
            parsed.start.ToNanoseconds() + parsed.end.ToNanoseconds()) // 2
    assert validate_ahead.midpoint_ns(b"\x2a\x05\x08") is None      # cut short


def test_analyze_scores_epochs_as_the_workers_read_and_prints_the_same(tmp_path):
    """`hypertrace analyze` of a file large enough for workers: epochs that no later window
    belongs to are scored while the workers read on, and the report is the one of a run
    without workers (everything but its time of generation). 125 nodes: chunks of 256 windows
    end inside epochs, so scoring an epoch too early would make its last windows late."""
    import contextlib
    import io
    import json

    from hypertrace.cli.main import main
    from hypertrace.sim.simulate import Straggler

    ws = list(generate(SimConfig(gpus=1000, gpus_per_node=8, windows=6, seed=8,
                                 stragglers=(Straggler("node-0042", 1.3),))))
    path = _write(tmp_path / "w.pb", ws)
    assert os.path.getsize(path) >= validate_ahead.MIN_PARALLEL_BYTES
    spans = validate_ahead._spans(path)
    later = validate_ahead._later_midpoints(path, spans)
    assert len(later) > 2 and later[0] is not None and later[-1] is None

    def report(workers: str) -> dict:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["analyze", path, "--format", "json", "--workers", workers])
        assert rc == 3                                    # the straggler is found
        got = json.loads(out.getvalue())
        got.pop("generated")
        return got

    assert report("2") == report("0")
