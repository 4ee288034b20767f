"""A restarted analyzer reaches the verdicts the live one reached, with bounded memory.

Real gRPC and a real SQLite file: windows are streamed to an analyzer, scored live, the server
is stopped and a new one opens the same database and replays it.
"""
from __future__ import annotations

import pytest
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


@pytest.mark.parametrize("meta", [("schema_version", str(v)) for v in range(1, 7)]
                         + [("schema", "2"), None])
def test_a_database_of_another_storage_schema_is_refused_and_left_as_it_is(tmp_path, meta):
    """0.1.0 has one storage schema: a file of a development build before it (meta
    schema_version 1-6), of another schema, or not an analyzer's at all is refused with the
    fix, by the analyzer and by a read-only reader, and its bytes are left as they were."""
    import sqlite3

    from hypertrace.analyzer.store.storage import Storage, StorageError
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE windows (agent_id TEXT NOT NULL, seq INTEGER NOT NULL)")
    if meta is not None:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES (?, ?)", meta)
    conn.commit()
    conn.close()
    before = db.read_bytes()
    for opener in (Storage.open, Storage.open_read_only):
        with pytest.raises(StorageError) as err:
            opener(db)
        assert str(db) in str(err.value) and "pass another --db" in str(err.value)
        if meta is not None and meta[0] == "schema_version":
            assert "development build before 0.1.0" in str(err.value)
    assert db.read_bytes() == before


def test_a_new_database_has_the_one_storage_schema(tmp_path):
    from hypertrace.analyzer.store.storage import SCHEMA_VERSION, Storage
    storage = Storage.open(tmp_path / "new.db")
    try:
        assert storage._conn.execute(
            "SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == str(SCHEMA_VERSION)
    finally:
        storage.close()
    Storage.open(tmp_path / "new.db").close()              # and it opens again


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
