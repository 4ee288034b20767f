"""A restarted analyzer reaches the verdicts the live one reached, with bounded memory.

Real gRPC and a real SQLite file: windows are streamed to an analyzer, scored live, the server
is stopped and a new one opens the same database and replays it.
"""
from __future__ import annotations

from test_server import send, start_server, stop_server

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.simulate import SimConfig, Straggler, generate


def _verdicts(report: pb.Report) -> dict[tuple[str, str], str]:
    return {(n.node, g.gpu): g.verdict for j in report.jobs for n in j.nodes for g in n.gpus}


def test_a_late_node_is_reported_as_late_live_and_after_a_restart(tmp_path):
    """Windows that arrive after their epoch was scored are stored and counted, not scored; a
    restart used to replay them into scoring and convict the node."""
    cfg = SimConfig(gpus=64, gpus_per_node=8, windows=6, seed=4,
                    stragglers=(Straggler("node-0002", 1.3), Straggler("node-0003", 1.3)))
    windows = list(generate(cfg))
    on_time = [w for w in windows if w.node != "node-0003"]
    late = [w for w in windows if w.node == "node-0003"]
    db = tmp_path / "a.db"
    server, target = start_server(db)
    try:
        send(target, on_time)
        server.analyzer.flush()                       # every epoch scored
        acks = send(target, late)
        assert len(acks) == len(late) and not any(a.duplicate for a in acks)
        live = server.analyzer.report()
    finally:
        stop_server(server)
    job = live.jobs[0]
    assert job.late_windows == len(late)
    assert [(x.node, x.windows) for x in job.late_nodes] == [("node-0003", len(late))]
    assert "node-0003" not in {n.node for n in job.nodes}
    assert {n.node for n in job.nodes if n.verdict == "straggler"} == {"node-0002"}

    server, target = start_server(db)                 # restart: replay from the database
    try:
        again = server.analyzer.report()
    finally:
        stop_server(server)
    assert _verdicts(again) == _verdicts(live)
    assert again.jobs[0].late_windows == len(late)
    assert list(again.jobs[0].late_nodes) == list(job.late_nodes)


def live_then_restarted(db, cfg: SimConfig, meanwhile=None) -> tuple[pb.Report, pb.Report, int]:
    """(the live report, the restarted analyzer's report, the most epochs its replay held
    pending) for ``cfg``'s windows streamed and scored; ``meanwhile(db)`` runs between."""
    server, target = start_server(db)
    try:
        send(target, list(generate(cfg)))
        server.analyzer.flush()
        live = server.analyzer.report()
    finally:
        stop_server(server)
    if meanwhile is not None:
        meanwhile(db)
    server, _ = start_server(db)
    try:
        return live, server.analyzer.report(), server.analyzer.replay_pending_max
    finally:
        stop_server(server)


def test_replay_holds_a_few_epochs_not_the_history(tmp_path):
    cfg = SimConfig(gpus=16, gpus_per_node=8, windows=40, seed=2,
                    stragglers=(Straggler("node-0001", 1.3),))
    live, again, pending = live_then_restarted(tmp_path / "a.db", cfg)
    assert pending <= 4      # of 40 epochs
    assert _verdicts(again) == _verdicts(live)
    assert again.jobs[0].windows == live.jobs[0].windows == 40


def test_a_database_of_the_previous_schema_is_upgraded_in_place(tmp_path):
    import sqlite3

    from hypertrace.analyzer.store.storage import SCHEMA_VERSION, Storage
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "CREATE TABLE windows (agent_id TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL,"
        " start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, received_ns INTEGER NOT NULL,"
        " payload BLOB NOT NULL, PRIMARY KEY (agent_id, seq)) WITHOUT ROWID;")
    w = next(iter(generate(SimConfig(gpus=8, windows=1, seed=1))))
    conn.execute("INSERT INTO windows VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (w.agent_id, w.seq, w.node, w.start.ToNanoseconds(), w.end.ToNanoseconds(), 0,
                  w.SerializeToString()))
    conn.commit()
    conn.close()
    storage = Storage.open(db)
    try:
        stored = list(storage.iter_windows())
        assert len(stored) == 1 and stored[0].late is False and stored[0].message() == w
        version = storage._conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        assert int(version) == SCHEMA_VERSION
    finally:
        storage.close()


def test_a_schema_2_database_keeps_its_verdicts_as_a_change_log(tmp_path):
    import sqlite3

    from hypertrace.analyzer.store.storage import SCHEMA_VERSION, Storage
    db = tmp_path / "v2.db"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '2');"
        "CREATE TABLE windows (agent_id TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL,"
        " start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, received_ns INTEGER NOT NULL,"
        " payload BLOB NOT NULL, late INTEGER NOT NULL DEFAULT 0,"
        " PRIMARY KEY (agent_id, seq)) WITHOUT ROWID;"
        "CREATE TABLE verdicts (job_id TEXT NOT NULL, epoch INTEGER NOT NULL, node TEXT NOT NULL,"
        " gpu TEXT NOT NULL, verdict TEXT NOT NULL, created_ns INTEGER NOT NULL,"
        " PRIMARY KEY (job_id, epoch, node, gpu));"
        "CREATE INDEX verdicts_created ON verdicts (created_ns);"
        "INSERT INTO verdicts VALUES ('j', 1, 'n1', '0', 'healthy', 5);"
        "INSERT INTO verdicts VALUES ('j', 2, 'n1', '0', 'straggler', 6);")
    conn.commit()
    conn.close()
    storage = Storage.open(db)
    try:
        assert storage.verdicts("j") == [("j", 1, "n1", "0", "healthy"),
                                         ("j", 2, "n1", "0", "straggler")]
        sql = storage._conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'verdicts'").fetchone()[0]
        assert "WITHOUT ROWID" in sql
        assert int(storage._conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]) == SCHEMA_VERSION
        assert storage._last_verdict == {("j", "n1", "0"): (2, "straggler")}
    finally:
        storage.close()


def test_a_finished_job_is_forgotten_after_job_expiry_seconds():
    import pytest

    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.score.engine import Engine, UnknownJobError
    e = Engine(ScoringConfig(job_expiry_seconds=600))
    ws = list(generate(SimConfig(gpus=16, gpus_per_node=8, windows=3, seed=1)))
    for w in ws:
        e.ingest(w)
    last_end = max(w.end.ToNanoseconds() for w in ws)
    e.flush(last_end + 60 * 10**9, expire=True)      # scored, a minute later: kept
    assert e.job_ids() == ["sim-job"]
    e.flush(last_end + 601 * 10**9, expire=True)     # ten minutes without a window: forgotten
    assert e.job_ids() == [] and e.expired_jobs == 1
    with pytest.raises(UnknownJobError, match="job_expiry_seconds"):
        build_report(e, "sim-job")
    keep = Engine(ScoringConfig(job_expiry_seconds=0))
    for w in ws:
        keep.ingest(w)
    keep.flush(last_end + 10**15, expire=True)
    assert keep.job_ids() == ["sim-job"]
    offline = Engine(ScoringConfig(job_expiry_seconds=600))   # flush without expire: kept
    for w in ws:
        offline.ingest(w)
    offline.flush(2**62)
    assert offline.job_ids() == ["sim-job"]


def test_a_gpu_that_left_a_running_job_is_retired_and_its_row_reused():
    """A node replaced mid-job: after job_expiry_seconds without its windows its GPUs leave the
    report and their rows (state reset) go to the next new GPUs, so memory does not grow."""

    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.score.engine import Engine
    e = Engine(ScoringConfig(job_expiry_seconds=60))
    base = SimConfig(gpus=64, gpus_per_node=8, windows=20, seed=5,
                     stragglers=(Straggler("node-0007", 1.3),))
    ws = list(generate(base))
    rows_before = None
    for w in ws:
        end = w.end.ToNanoseconds()
        if w.node == "node-0007" and end > ws[0].end.ToNanoseconds() + 50 * 10**9:
            continue                                   # node-0007 leaves after 5 windows
        if w.node == "node-0006" and end > ws[0].end.ToNanoseconds() + 120 * 10**9:
            w = pb.NodeWindow.FromString(w.SerializeToString())
            w.node = w.agent_id = "node-0008"          # ... and node-0006 is replaced later
        e.ingest(w)
        e.flush(end, expire=True)
    job = e._jobs["sim-job"]
    rows_before = len(job.keys)
    report = build_report(e, "sim-job")
    nodes = {n.node for n in report.jobs[0].nodes}
    assert "node-0007" not in nodes and "node-0006" not in nodes and "node-0008" in nodes
    assert report.jobs[0].gpus == 56 and e.retired_gpus == 16
    assert rows_before == 64                           # node-0008 took node-0007's rows
    assert "node-0007" not in {k[0] for k in job.keys if k is not None}


def test_a_schema_3_database_moves_its_windows_into_the_rowid_table(tmp_path):
    """Schema 3 kept windows in a WITHOUT ROWID table (4.7 KB per window at rest); the upgrade
    moves them, in replay order, into the rowid table, keeping every column and the dedup."""
    import sqlite3
    import zlib

    from hypertrace.analyzer.store.storage import CODEC_ZLIB, SCHEMA_VERSION, Storage
    db = tmp_path / "v3.db"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '3');"
        "CREATE TABLE windows (agent_id TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL,"
        " start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, received_ns INTEGER NOT NULL,"
        " payload BLOB NOT NULL, late INTEGER NOT NULL DEFAULT 0,"
        " codec INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (agent_id, seq)) WITHOUT ROWID;"
        "CREATE INDEX windows_end ON windows (end_ns);")
    ws = list(generate(SimConfig(gpus=16, gpus_per_node=8, windows=3, seed=1)))
    for i, w in enumerate(reversed(ws)):              # stored out of replay order
        conn.execute("INSERT INTO windows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (w.agent_id, w.seq, w.node, w.start.ToNanoseconds(),
                      w.end.ToNanoseconds(), 1000 + i, zlib.compress(w.SerializeToString()),
                      int(i == 0), CODEC_ZLIB))
    conn.commit()
    conn.close()
    storage = Storage.open(db)
    try:
        assert int(storage._conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]) == SCHEMA_VERSION
        sql = storage._conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'windows'").fetchone()[0]
        assert "WITHOUT ROWID" not in sql
        names = {r[0] for r in storage._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'windows'")}
        assert {"windows_end", "windows_key"} <= names
        stored = list(storage.iter_windows())
        order = sorted(ws, key=lambda w: (w.end.ToNanoseconds(), w.agent_id, w.seq))
        assert [s.message() for s in stored] == order
        assert [s.id for s in stored] == list(range(1, len(ws) + 1))    # ids in replay order
        assert [s.late for s in stored].count(True) == 1
        assert stored[-1].late and stored[-1].received_ns == 1000       # columns kept
        assert storage.add_window(ws[0]) is False                       # dedup still holds
        assert storage.add_window(ws[0], received_ns=1) is False
    finally:
        storage.close()
