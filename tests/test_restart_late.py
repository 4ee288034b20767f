"""Late windows are counted the same on every restart path after a kill -9: from the stored
Engine snapshot and from a full replay of the stored windows.

Real parts: the analyzer's command line in a process of its own, over mutual TLS, killed with
SIGKILL; its SQLite file opened again by two analyzers, one from the snapshot, one replaying
everything. The attack this replays: late counts after kill -9 were 195 from the snapshot and
138 from a full replay (windows acked after their epoch was scored, whose late marks the kill
lost, were scored on time by the full replay).
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time

import grpc

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.transport import channel_credentials
from hypertrace.sim.simulate import SimConfig, Straggler, generate


def _restarted(db, use_snapshot: bool) -> tuple[int, dict[str, int], bool]:
    """(late windows, late per node, whether it started from the snapshot) of an analyzer
    that opens ``db`` and replays it."""
    st = Storage.open(db)
    try:
        a = Analyzer(st, ScoringConfig())
        a.resume(use_snapshot=use_snapshot)
        job = a.report().jobs[0]
        a.close()
        return job.late_windows, {x.node: x.windows for x in job.late_nodes}, \
            a.resumed_from_snapshot
    finally:
        st.close()


def test_late_counts_after_kill_9_are_the_same_from_the_snapshot_and_a_full_replay(
        tmp_path, pki):
    db = tmp_path / "a.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hypertrace.cli.main", "analyzer", "--listen", "127.0.0.1:0",
         "--db", str(db), *pki.args("analyzer", "test", "127.0.0.1", "localhost"),
         "--flush-interval", "3600", "--no-engine-process", "--checker-processes", "0",
         "--no-retention-process"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on [^\s]*:(\d+)", line)
        assert m, line + proc.stdout.read() if proc.poll() is not None else line
        target = f"127.0.0.1:{m.group(1)}"
        start = (time.time_ns() // 10**10 - 30) * 10**10
        windows = list(generate(SimConfig(gpus=32, gpus_per_node=8, windows=8, seed=6,
                                          start_ns=start,
                                          stragglers=(Straggler("node-0002", 1.3),))))
        for w in windows:
            w.agent_id = w.node

        def send(node: str) -> int:
            mine = [w for w in windows if w.node == node]
            with grpc.secure_channel(target, channel_credentials(pki.files("agent", node))) as ch:
                return len(list(pb_grpc.IngestStub(ch).Stream(iter(mine), timeout=60)))
        for node in ("node-0000", "node-0001", "node-0002"):
            send(node)
        reader = pki.files("reader", "ops")
        with grpc.secure_channel(target, channel_credentials(reader)) as ch:
            live = pb_grpc.QueryStub(ch).GetReport(pb.ReportRequest(), timeout=120)
        assert live.jobs and live.jobs[0].late_windows == 0   # scored, snapshot stored
        late = send("node-0003")          # acked after their epochs were scored ...
        assert late == 8
        proc.send_signal(signal.SIGKILL)  # ... and the analyzer dies before it marks them
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
    full = tmp_path / "full.db"
    for suffix in ("", "-wal", "-shm"):
        if (tmp_path / f"a.db{suffix}").exists():
            shutil.copy(tmp_path / f"a.db{suffix}", tmp_path / f"full.db{suffix}")
    from_snapshot = _restarted(db, use_snapshot=True)
    replayed = _restarted(full, use_snapshot=False)
    assert from_snapshot[2] and not replayed[2]
    assert from_snapshot[:2] == replayed[:2] == (late, {"node-0003": late})
    # and a second restart of either reads the same (the decided marks were stored)
    assert _restarted(full, use_snapshot=True)[:2] == _restarted(db, use_snapshot=False)[:2] \
        == (late, {"node-0003": late})
