"""The retention pass in its own process, on a real SQLite file under a real server on localhost.

The worker compacts and summarises what the in-thread pass did, the analyzer's verdict cache
follows a prune made by another connection, stop() leaves no process behind, a dead worker is
replaced at the next pass, and where the worker cannot run (or is turned off) the pass runs in
the analyzer's thread as before.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.retention_process import PassFailed, RetentionPlan, RetentionProcess
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.epoch_scoring import EpochResult
from hypertrace.analyzer.store import summaries
from hypertrace.analyzer.store.storage import Storage
from hypertrace.sim.simulate import SimConfig, Straggler, generate

WIN_NS = 10 * 10**9
JOB = "sim-job"


def _history(db: Path | str, minutes: int = 13) -> tuple[Storage, Analyzer]:
    """``minutes`` of a 32-GPU job's windows, the last ending a few seconds ago, stored and
    scored as the server does."""
    windows = minutes * 6
    start = (time.time_ns() // WIN_NS - windows - 1) * WIN_NS
    cfg = SimConfig(gpus=32, gpus_per_node=8, windows=windows, seed=6, start_ns=start,
                    stragglers=(Straggler("node-0002", 1.3),))
    st = Storage.open(db, synchronous="NORMAL")
    a = Analyzer(st, ScoringConfig())
    last = None
    for w in generate(cfg):
        a.ingest(w)
        end = w.end.ToNanoseconds()
        if last is None or end - last >= WIN_NS:
            a.flush(end)
            last = end
    a.flush(last + 60 * 10**9)
    return st, a


def _server(a: Analyzer, **options) -> AnalyzerServer:
    """A server whose retention pass runs every 0.2 s: raw windows kept 4 minutes, windows
    compacted 1 minute after they ended."""
    opts = dict(listen="127.0.0.1:0", flush_interval=0.0, shutdown_grace_s=0.2, insecure=True,
                retention_hours=240 / 3600, retention_every_s=0.2, compact_after_s=60.0)
    opts.update(options)
    server = AnalyzerServer(a, ServerOptions(**opts))
    server.start()
    return server


def _compacted_and_summarised(st: Storage) -> bool:
    with st._lock:                      # the connection is the server's too
        compacted = st._conn.execute("SELECT COUNT(*) FROM compacted").fetchone()[0]
    return compacted > 0 and bool(st.summaries(JOB))


def _wait(what, timeout: float = 60.0) -> bool:
    """Poll ``what`` until true (the passes run in the background), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.1)
    return False


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def _latest_verdicts(st: Storage) -> dict:
    """Each GPU's newest stored verdict, read from the file: what the cache must hold."""
    out: dict = {}
    for job, epoch, node, gpu, verdict in st.verdicts():
        out[(job, node, gpu)] = (epoch, verdict)          # oldest epoch first
    return out


def test_the_worker_compacts_summarises_and_the_verdict_cache_follows_its_prune(tmp_path):
    st, a = _history(tmp_path / "a.db")
    server = _server(a)
    try:
        assert _wait(lambda: _compacted_and_summarised(st))
        worker = server._retention_worker
        assert worker is not None and worker.pid is not None and worker.pid != os.getpid()
        pid = worker.pid
        # windows older than the raw retention are in summaries, gone from the tables
        assert _wait(lambda: min(w.end_ns for w in st.iter_windows()) >= st.summarized_until())
        assert st.summarized_until() > 0
        assert _wait(lambda: server.analyzer.metrics.retention_cpu._value.get() > 0)
        # the prune removed verdict changes; this process's cache is what the file holds now
        assert st._last_verdict == _latest_verdicts(st)
    finally:
        server.stop()
    assert _gone(pid)
    st.close()


def test_stop_ends_the_worker_at_once_and_leaves_the_file_whole(tmp_path):
    st, a = _history(tmp_path / "a.db")
    server = _server(a)
    # the first pass starts as soon as the worker is up (most likely under way at the stop)
    assert _wait(lambda: server._retention_worker.started_once)
    pid = server._retention_worker.pid
    server.stop()
    assert _gone(pid)
    check = st._conn.execute("PRAGMA integrity_check").fetchone()[0]
    assert check == "ok"
    st.close()


def test_a_dead_worker_is_replaced_at_the_next_pass(tmp_path, caplog):
    st, a = _history(tmp_path / "a.db")
    server = _server(a, compact_after_s=600.0)    # nothing to compact yet
    try:
        assert _wait(lambda: server._retention_worker.started_once)
        first = server._retention_worker.pid
        os.kill(first, signal.SIGKILL)
        # not given up for the thread: a new worker, and the metric counts it
        assert _wait(lambda: server._retention_worker.pid not in (None, first))
        assert a.metrics.registry.get_sample_value(
            "hypertrace_worker_restarts_total", {"worker": "retention"}) == 1
    finally:
        server.stop()
    st.close()


def test_with_the_option_off_the_pass_runs_in_this_process(tmp_path):
    st, a = _history(tmp_path / "a.db")
    server = _server(a, retention_process=False)
    try:
        assert _wait(lambda: _compacted_and_summarised(st))
        assert server._retention_worker is None
    finally:
        server.stop()
    st.close()


def test_an_in_memory_database_falls_back_to_the_thread_with_a_warning(caplog):
    st, a = _history(":memory:")
    with caplog.at_level(logging.WARNING, logger="hypertrace.analyzer.ingest.server"):
        server = _server(a)
        try:
            assert _wait(lambda: _compacted_and_summarised(st))
            assert server._retention_worker is None
        finally:
            server.stop()
    warned = [r for r in caplog.records if "retention passes run in this process" in r.message]
    assert len(warned) == 1
    st.close()


def test_a_prune_by_another_connection_is_seen_before_the_next_verdicts_are_stored(tmp_path):
    """The worker's prune deletes verdict changes this connection has cached as the last ones;
    the next epoch's verdicts must then be stored again, not skipped as "unchanged"."""
    st, a = _history(tmp_path / "a.db", minutes=2)
    assert st.verdicts(JOB)
    cached = dict(st._last_verdict)
    other = Storage.open(tmp_path / "a.db", synchronous="NORMAL")
    # 31 days on: every verdict change goes (the job is no longer scored)
    summaries.apply_retention(other, a.config, raw_hours=120 / 3600, summary_days=30,
                              now_ns=time.time_ns() + 31 * 86400 * 10**9)
    assert other.verdicts(JOB) == [] and st.verdicts(JOB) == []
    other.close()
    assert st._last_verdict == cached            # not seen yet: another connection pruned
    # the same verdicts again, stored by this connection: each GPU's is its first now
    epoch = max(e for e, _ in cached.values())
    res = EpochResult(job_id=JOB, epoch=epoch + 1, rows=[],
                      verdicts={(n, g): v for (_, n, g), (_, v) in cached.items()})
    st.add_results([res])
    assert len(st.verdicts(JOB)) == len(cached)
    st.close()


def test_an_exception_in_the_pass_comes_back_and_the_same_worker_goes_on(tmp_path):
    st, a = _history(tmp_path / "a.db")
    # no scoring config: summarising the first slot raises in the worker
    worker = RetentionProcess(str(tmp_path / "a.db"), "NORMAL", None,
                              RetentionPlan(240 / 3600, 30.0, 60.0))
    stop = threading.Event()
    try:
        with pytest.raises(PassFailed, match="AttributeError"):
            worker.run(stop)
        pid = worker.pid
        with pytest.raises(PassFailed, match="AttributeError"):
            worker.run(stop)
        assert worker.pid == pid
    finally:
        worker.close()
    assert _gone(pid)
    st.close()


def test_a_worker_killed_between_passes_is_replaced_counted_and_logged(tmp_path, caplog):
    """Killed while idle, not during a pass: the next pass finds it gone, says so in the log,
    counts the replacement once and runs in a new worker."""
    st, a = _history(tmp_path / "a.db", minutes=2)
    replaced: list[int] = []
    worker = RetentionProcess(str(tmp_path / "a.db"), "NORMAL", ScoringConfig(),
                              RetentionPlan(240 / 3600, 30.0, 600.0),
                              on_replaced=lambda: replaced.append(1))
    stop = threading.Event()
    try:
        assert worker.run(stop) is not None            # one pass, then it waits for the next
        first = worker.pid
        os.kill(first, signal.SIGKILL)
        assert _wait(lambda: _gone(first))
        with caplog.at_level(logging.ERROR):
            assert worker.run(stop) is not None        # the next pass, in a new worker
        assert worker.pid not in (None, first) and replaced == [1]
        assert any("ended between passes" in r.getMessage() and str(first) in r.getMessage()
                   for r in caplog.records)
        assert worker.run(stop) is not None and replaced == [1]   # a live one: not counted
    finally:
        worker.close()
    st.close()
