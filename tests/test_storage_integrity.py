"""A damaged database file, found at start and while running, over the real CLI, real gRPC
(mutual TLS) and real SQLite files.

The attack these replay: pages of the database overwritten under a running analyzer, which went
on acking windows, and every restart after it died with a traceback (a TypeError reading the
verdicts) that systemd restarted in a loop.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage, integrity_problem
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.transport import channel_credentials
from hypertrace.proto.wire import INGEST_SERVICE
from hypertrace.sim.simulate import SimConfig, Straggler, generate

SIM = SimConfig(gpus=32, gpus_per_node=8, windows=12, seed=5,
                stragglers=(Straggler("node-0002", 1.4),))


def _scored_db(db: Path) -> None:
    """A database with windows, scores and verdicts (a straggler's), checkpointed into the file."""
    st = Storage.open(db)
    a = Analyzer(st, ScoringConfig())
    for w in generate(SIM):
        a.ingest(w)
    a.flush(now_ns=2**62)
    assert st.verdicts(), "the simulated straggler left no verdicts to damage"
    a.close()
    st._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    st.close()


def _damage_table(db: Path, table: str) -> None:
    """Overwrite the root page of ``table`` (not the file's header) with garbage."""
    import sqlite3
    conn = sqlite3.connect(db)
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    conn.close()
    with open(db, "r+b") as fh:
        fh.seek((root - 1) * page)
        fh.write(b"\x5a" * page)


@pytest.mark.parametrize("table", ["verdicts", "windows"])
def test_a_corrupt_database_exits_2_with_the_recovery_steps(tmp_path, table):
    """The real CLI in a process of its own: exit 2 (the shipped unit does not restart on 2),
    the three steps in the message, no traceback."""
    db = tmp_path / "a.db"
    _scored_db(db)
    _damage_table(db, table)
    proc = subprocess.run([sys.executable, "-m", "hypertrace.cli.main", "analyzer", "--listen",
                           "127.0.0.1:0", "--db", str(db), "--insecure", "--no-engine-process",
                           "--checker-processes", "0"],
                          capture_output=True, text=True, timeout=120)
    err = proc.stderr
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "is corrupt" in err
    assert f"mv {db} {db}.corrupt" in err                       # move it aside
    assert "creates a fresh file" in err                        # start fresh
    assert f"hypertrace export --db {db}.corrupt" in err and ".recover" in err   # what can be read
    if table == "verdicts":          # the windows are whole: the export step gets them all
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{db}{suffix}").exists():
                Path(f"{db}{suffix}").rename(f"{db}.corrupt{suffix}")
        out = tmp_path / "job.jsonl"
        done = subprocess.run([sys.executable, "-m", "hypertrace.cli.main", "export", "--db",
                               f"{db}.corrupt", "--job", "sim-job", "-o", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert len(out.read_text().splitlines()) == len(list(generate(SIM)))


def test_the_shipped_unit_does_not_restart_on_exit_2():
    unit = (Path(__file__).parent.parent / "deploy" / "hypertrace-analyzer.service").read_text()
    assert "Restart=on-failure" in unit
    assert any(line.strip().split("=", 1) == ["RestartPreventExitStatus", "2"]
               for line in unit.splitlines())


def _health(target: str, files, service: str) -> int:
    with grpc.secure_channel(target, channel_credentials(files)) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10).status


def test_corruption_under_a_running_analyzer_stops_ingest_and_says_so(tmp_path, pki):
    """Pages overwritten while the analyzer runs: the scheduled quick_check finds it; health
    says NOT_SERVING, the gauge is 1, and the next window is refused (the agent keeps it)."""
    db = tmp_path / "a.db"
    storage = Storage.open(db, synchronous="NORMAL")
    analyzer = Analyzer(storage, ScoringConfig())
    server = AnalyzerServer(analyzer, ServerOptions(
        listen="127.0.0.1:0", flush_interval=0.0, shutdown_grace_s=0.5, tls=pki.server(),
        integrity_check_s=0.2))
    target = f"127.0.0.1:{server.start()}"
    try:
        files = pki.files("agent", "node-0001")
        reader = pki.files("reader", "ops")
        windows = [w for w in generate(SIM) if w.node == "node-0001"]
        for w in windows:
            w.agent_id = "node-0001"
        with grpc.secure_channel(target, channel_credentials(files)) as ch:
            acks = list(pb_grpc.IngestStub(ch).Stream(iter(windows[:6]), timeout=30))
        assert len(acks) == 6
        assert _health(target, reader, INGEST_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        assert analyzer.metrics.database_corrupt._value.get() == 0
        storage._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _damage_table(db, "windows")
        assert integrity_problem(db) is not None
        deadline = time.monotonic() + 60
        while not analyzer.broken and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "is corrupt" in analyzer.broken and "mv " in analyzer.broken
        assert _health(target, reader, INGEST_SERVICE) == \
            health_pb2.HealthCheckResponse.NOT_SERVING
        assert _health(target, reader, "") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert analyzer.metrics.database_corrupt._value.get() == 1
        from prometheus_client import generate_latest
        assert b"hypertrace_database_corrupt 1.0" in generate_latest(analyzer.metrics.registry)
        with pytest.raises(grpc.RpcError) as err:           # no more acks: the agent keeps it
            with grpc.secure_channel(target, channel_credentials(files)) as ch:
                list(pb_grpc.IngestStub(ch).Stream(iter(windows[6:7]), timeout=30))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "corrupt" in err.value.details()
    finally:
        server.stop()
        storage.close()


def test_a_read_that_meets_damage_reports_it_once(tmp_path):
    """Without the scheduled check: a read of the damaged table raises StorageCorrupt and the
    store's listener hears of it once."""
    from hypertrace.analyzer.store.storage import StorageCorrupt
    db = tmp_path / "a.db"
    _scored_db(db)
    st = Storage.open(db)
    heard: list[str] = []
    st.on_corrupt = lambda exc: heard.append(str(exc))
    _damage_table(db, "windows")
    st._conn.execute("PRAGMA cache_size = 0")   # read the page from the file again
    try:
        for _ in range(2):
            with pytest.raises(StorageCorrupt, match="hypertrace export"):
                list(st.iter_windows())
        assert len(heard) == 1 and "is corrupt" in heard[0]
    finally:
        st.close()
