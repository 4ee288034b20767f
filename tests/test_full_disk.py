"""A full disk is backpressure, not loss: agents keep their windows while the database cannot
commit, and the windows they send again within the catch-up are scored on time.

Real parts: four agents' uplinks (their spools on disk, their backoff) streaming in real time
over mutual TLS to the analyzer's gRPC server, and its SQLite file. The disk is made full for
real for SQLite: ``PRAGMA max_page_count`` on the analyzer's own connection, set to the file's
size, so every commit that needs a new page fails with SQLite's "database or disk is full", as
on a full filesystem. The attack this replays: 8.5 s of full disk left 804 of 960 windows late,
never scored (20 of 960 on a normal disk).
"""
from __future__ import annotations

import threading
import time

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.daemon.uplink import Backoff, Spool, Uplink
from hypertrace.proto.transport import channel_credentials
from hypertrace.sim.simulate import SimConfig, generate

WINDOW_S = 1.0
WINDOWS = 24
FULL_FROM, FULL_FOR = 6, 8.5       # the disk is full from window 6, for 8.5 s


def test_a_full_disk_loses_nothing_and_leaves_at_most_5_percent_late(tmp_path, pki):
    config = ScoringConfig(window_seconds=WINDOW_S, grace_seconds=0.5)
    storage = Storage.open(tmp_path / "a.db", synchronous="NORMAL")
    analyzer = Analyzer(storage, config, catch_up_s=6.0)
    server = AnalyzerServer(analyzer, ServerOptions(
        listen="127.0.0.1:0", flush_interval=0.2, shutdown_grace_s=0.5, tls=pki.server(),
        retention_hours=0))
    target = f"127.0.0.1:{server.start()}"
    start = (time.time_ns() // 10**9 + 1) * 10**9
    windows = list(generate(SimConfig(gpus=32, gpus_per_node=8, windows=WINDOWS, seed=7,
                                      window_seconds=WINDOW_S, start_ns=start)))
    nodes = sorted({w.node for w in windows})
    uplinks = {}
    for k, node in enumerate(nodes):      # agents back off differently: they come back apart
        files = pki.files("agent", node)
        uplinks[node] = Uplink(Spool(tmp_path / f"spool-{node}"), target,
                               backoff=Backoff(base=0.1, cap=0.5 + k), seed=k,
                               credentials=channel_credentials(files), tls_files=files).start()
    full_seen = threading.Event()
    refused_during = []
    try:
        for i in range(WINDOWS):
            end = start + (i + 1) * 10**9
            while time.time_ns() < end:                      # each window at its end, live
                time.sleep(0.01)
            if i == FULL_FROM:
                pages = storage._conn.execute("PRAGMA page_count").fetchone()[0]
                storage._conn.execute(f"PRAGMA max_page_count = {pages}")
                full_at = time.monotonic()
            if i > FULL_FROM and not full_seen.is_set() and analyzer.hold.since_ns is not None:
                full_seen.set()
            if FULL_FROM <= i and time.monotonic() - full_at >= FULL_FOR \
                    and refused_during == []:
                refused_during.append(analyzer.metrics.rejected.labels("storage")._value.get())
                storage._conn.execute("PRAGMA max_page_count = 1073741823")   # freed
            for w in windows:
                if w.end.ToNanoseconds() == end:
                    w.agent_id = w.node
                    assert uplinks[w.node].submit(w)
        for up in uplinks.values():
            assert up.wait_drained(120)
        time.sleep(6.0 + 1.5)                               # the catch-up, then the last epoch
        report = analyzer.report()
    finally:
        for up in uplinks.values():
            up.close()
        server.stop()
    assert full_seen.is_set(), "the disk never filled: no commit failed"
    assert refused_during and refused_during[0] > 0         # windows were refused meanwhile
    stored = {(s.agent_id, s.seq) for s in storage.iter_windows()}
    storage.close()
    assert stored == {(w.agent_id, w.seq) for w in windows}   # 0 lost
    job = report.jobs[0]
    assert job.late_windows <= 0.05 * len(windows), (job.late_windows, len(windows))
