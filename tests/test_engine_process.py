"""The Engine in a worker process of its own (analyzer/scale/engine_process.py), on real SQLite files.

Scored in the worker, windows give the same results, reports, job lists, late marks and
snapshots as with the Engine in the analyzer's process; a worker killed mid-run (with windows
stored but not yet fed) is replaced, and every stored window reaches the new Engine exactly
once; an error in the worker comes back as itself; over real gRPC the server acks, scores and
reports the same, also across a worker killed between two streams; and closing the analyzer leaves no worker behind.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.engine_process import EngineProcess, WorkerUnavailable
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions, make_analyzer
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.sim.simulate import SimConfig, Straggler, generate

WIN_NS = 10 * 10**9
CFG = SimConfig(gpus=32, gpus_per_node=8, windows=8, seed=11,
                stragglers=(Straggler("node-0002", 1.3),))


def _epochs() -> list[list[pb.NodeWindow]]:
    """The job's windows, epoch by epoch (every node's window of one epoch)."""
    by_end: dict[int, list[pb.NodeWindow]] = {}
    for w in generate(CFG):
        by_end.setdefault(w.end.ToNanoseconds(), []).append(w)
    return [by_end[k] for k in sorted(by_end)]


def _due(epoch: list[pb.NodeWindow]) -> int:
    """A time at which that epoch is complete (its end + grace passed)."""
    return epoch[0].end.ToNanoseconds() + 2 * WIN_NS


def _plain(report: pb.Report) -> bytes:
    r = pb.Report()
    r.CopyFrom(report)
    r.ClearField("generated")
    return r.SerializeToString(deterministic=True)


def _run(db: Path, engine_process: bool, kill_before_epoch: int | None = None) -> dict:
    """Every epoch ingested then scored, one window of epoch 1 sent after epoch 1 was scored
    (late); with ``kill_before_epoch`` the worker is SIGKILLed after that epoch's windows were
    stored and queued, before they reach it."""
    st = Storage.open(db, synchronous="NORMAL")
    a = make_analyzer(st, ScoringConfig(), engine_process=engine_process)
    try:
        assert isinstance(a.engine, EngineProcess) == engine_process
        a.resume()
        epochs = _epochs()
        held = epochs[1].pop()
        for k, epoch in enumerate(epochs):
            for w in epoch:
                a.ingest(w)
            if k == kill_before_epoch:
                os.kill(a.engine.pid, signal.SIGKILL)
            a.flush(_due(epoch))
            if k == 1:
                a.ingest(held)              # its epoch is scored: late
                a.drain()
        return {"report": _plain(a.report()), "jobs": a.list_jobs().SerializeToString(),
                "late": sorted((sw.agent_id, sw.seq) for sw in st.iter_windows() if sw.late),
                "restarts": a.engine.restarts if isinstance(a.engine, EngineProcess) else 0,
                "counted": a.metrics.registry.get_sample_value(
                    "hypertrace_worker_restarts_total", {"worker": "engine"})}
    finally:
        a.close()
        st.close()


def _ends(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_the_worker_scores_as_the_engine_in_this_process(tmp_path):
    here = _run(tmp_path / "here.db", engine_process=False)
    there = _run(tmp_path / "there.db", engine_process=True)
    assert there["report"] == here["report"]
    assert there["jobs"] == here["jobs"]
    assert there["late"] == here["late"] and len(here["late"]) == 1
    report = pb.Report.FromString(here["report"])
    assert [n.node for n in report.jobs[0].nodes if n.verdict == "straggler"] == ["node-0002"]


def test_a_killed_worker_is_replaced_and_each_window_reaches_it_once(tmp_path):
    """Killed with epoch 4's windows stored and queued: the new worker replays the stored
    windows up to the newest (those included) and the queue leaves them out, so the job's
    window count, its scores and its late window are those of a run without the kill."""
    here = _run(tmp_path / "here.db", engine_process=False)
    killed = _run(tmp_path / "killed.db", engine_process=True, kill_before_epoch=4)
    assert killed["restarts"] == 1 and killed["counted"] == 1      # and the metric says so
    assert here["counted"] == 0
    assert killed["jobs"] == here["jobs"]
    assert killed["report"] == here["report"]
    assert killed["late"] == here["late"]


def test_a_snapshot_made_in_the_worker_resumes_an_engine_here(tmp_path):
    db = tmp_path / "a.db"
    live = _run(db, engine_process=True)
    st = Storage.open(db, synchronous="NORMAL")
    a = Analyzer(st, ScoringConfig())
    try:
        a.resume()
        assert a.resumed_from_snapshot
        assert _plain(a.report()) == live["report"]
    finally:
        st.close()


def test_an_error_in_the_worker_comes_back_as_itself(tmp_path):
    st = Storage.open(tmp_path / "a.db", synchronous="NORMAL")
    a = make_analyzer(st, ScoringConfig(), engine_process=True)
    try:
        with pytest.raises(KeyError, match="unknown job 'nope'"):
            a.report("nope")
        assert a.list_jobs().jobs == []          # the worker goes on
        assert a.engine.restarts == 0
    finally:
        a.close()
        st.close()


def test_no_worker_for_a_database_in_memory():
    with pytest.raises(WorkerUnavailable, match="in memory"):
        EngineProcess(ScoringConfig(), ":memory:", lambda: 0)


def test_over_grpc_the_server_acks_and_reports_as_with_the_engine_here(tmp_path):
    reports = {}
    for mode in (False, True):
        st = Storage.open(tmp_path / f"{mode}.db", synchronous="NORMAL")
        a = make_analyzer(st, ScoringConfig(), engine_process=mode)
        a.resume()
        server = AnalyzerServer(a, ServerOptions(listen="127.0.0.1:0", flush_interval=0.0,
                                                 shutdown_grace_s=0.5, insecure=True))
        port = server.start()
        pid = a.engine.pid if mode else None
        try:
            windows = [w for epoch in _epochs() for w in epoch]
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                acks = list(pb_grpc.IngestStub(ch).Stream(iter(windows), timeout=60))
                assert [(k.seq, k.duplicate) for k in acks] == [(w.seq, False) for w in windows]
                again = list(pb_grpc.IngestStub(ch).Stream(iter(windows[:3]), timeout=60))
                assert all(k.duplicate for k in again)
                reports[mode] = _plain(pb_grpc.QueryStub(ch).GetReport(
                    pb.ReportRequest(all_nodes=True), timeout=60))
        finally:
            server.stop()
            a.close()
            st.close()
        if mode:
            assert _ends(pid), "the Engine's worker outlived the analyzer"
    assert reports[True] == reports[False]


def test_over_grpc_a_worker_killed_between_streams_is_replaced_and_reports_the_same(tmp_path):
    """The whole live path (window checkers, the store, the Engine's worker) under real gRPC:
    the worker is SIGKILLed after half the epochs were scored and the next windows were acked
    (stored, queued, not yet fed). The report that follows, built by the replacement, equals
    that of a server whose worker was never killed, and each window was acked once."""
    epochs = _epochs()
    first = [w for epoch in epochs[:4] for w in epoch]
    rest = [w for epoch in epochs[4:] for w in epoch]
    reports, restarts = {}, {}
    for kill in (False, True):
        st = Storage.open(tmp_path / f"{kill}.db", synchronous="NORMAL")
        a = make_analyzer(st, ScoringConfig(), engine_process=True)
        a.resume()
        server = AnalyzerServer(a, ServerOptions(listen="127.0.0.1:0", flush_interval=0.0,
                                                 shutdown_grace_s=0.5, insecure=True,
                                                 checker_processes=2))
        port = server.start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                ingest, query = pb_grpc.IngestStub(ch), pb_grpc.QueryStub(ch)
                acks = list(ingest.Stream(iter(first), timeout=60))
                query.GetReport(pb.ReportRequest(), timeout=60)        # epochs 0-3 scored
                acks += list(ingest.Stream(iter(rest), timeout=60))
                if kill:
                    old = a.engine.pid
                    os.kill(old, signal.SIGKILL)
                    assert _ends(old)
                reports[kill] = _plain(query.GetReport(pb.ReportRequest(all_nodes=True),
                                                       timeout=60))
                assert [(k.seq, k.duplicate) for k in acks] == [(w.seq, False)
                                                                for w in first + rest]
            restarts[kill] = a.engine.restarts
        finally:
            server.stop()
            a.close()
            st.close()
    assert restarts == {False: 0, True: 1}
    assert reports[True] == reports[False]
    report = pb.Report.FromString(reports[True])
    assert [n.node for n in report.jobs[0].nodes if n.verdict == "straggler"] == ["node-0002"]
