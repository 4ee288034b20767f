"""Engine snapshots: a restart loads the stored snapshot and replays only the windows stored
after it, reaching the live verdicts; a snapshot of another version, a damaged one, or one that
names a foreign global is ignored with a log line and the full replay runs instead.

Real gRPC and a real SQLite file, as in tests/test_restart_consistency.py.
"""
from __future__ import annotations

import logging
import pickle
import zlib

import pytest
from test_server import send, start_server, stop_server

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.store import snapshot
from hypertrace.analyzer.store.storage import StoredSnapshot
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim import scenarios
from hypertrace.sim.simulate import SimConfig, Straggler, generate

CFG = SimConfig(gpus=64, gpus_per_node=8, windows=12, seed=6,
                stragglers=(Straggler("node-0002", 1.3),))


def _verdicts(report: pb.Report) -> dict[tuple[str, str], str]:
    return {(n.node, g.gpu): g.verdict for j in report.jobs for n in j.nodes for g in n.gpus}


def _live_run(db, late_node: str | None = None) -> tuple[pb.Report, int]:
    """Windows streamed in two halves with a scoring pass after each (the first stores a
    snapshot), then a node's windows that arrive late; returns (report, windows sent)."""
    windows = list(generate(CFG))
    on_time = [w for w in windows if w.node != late_node]
    late = [w for w in windows if w.node == late_node]
    half = len(on_time) // 2 + 3                      # some of an epoch: left pending
    server, target = start_server(db)
    try:
        send(target, on_time[:half])
        end = max(w.end.ToNanoseconds() for w in on_time[:half])
        server.analyzer.flush(end - 2 * 10**9)           # scored up to here: a snapshot
        server.analyzer.snapshot_seconds = 0             # and no later one
        send(target, on_time[half:])
        server.analyzer.flush()                          # every epoch scored
        send(target, late)
        report = server.analyzer.report()
    finally:
        stop_server(server)
    return report, len(windows)


def test_a_restart_from_the_snapshot_reaches_the_live_verdicts_replaying_only_the_rest(tmp_path):
    db = tmp_path / "a.db"
    live, sent = _live_run(db, late_node="node-0005")
    server, _ = start_server(db)
    try:
        a = server.analyzer
        assert a.resumed_from_snapshot
        snap = a.storage.snapshot()
        after = sum(1 for _ in a.storage.iter_windows(after_id=snap.upto))
        assert 0 < after < sent                           # only what came after it
        held = Engine(ScoringConfig())
        snapshot.restore(held, snap)
        assert held.pending_epochs() > 0                  # epochs the later windows completed
        again = a.report()
    finally:
        stop_server(server)
    assert _verdicts(again) == _verdicts(live)
    assert {n.node for n in again.jobs[0].nodes if n.verdict == "straggler"} == {"node-0002"}
    # not only the verdicts: every number of the report (ratios, z, the what-if) is the live one
    assert _without_time(again) == _without_time(live)
    assert again.jobs[0].windows == live.jobs[0].windows
    assert again.jobs[0].late_windows == live.jobs[0].late_windows > 0
    assert list(again.jobs[0].late_nodes) == list(live.jobs[0].late_nodes)


def _without_time(report: pb.Report) -> pb.Report:
    out = pb.Report()
    out.CopyFrom(report)
    out.ClearField("generated")
    return out


def _tamper(db, **cols) -> None:
    import sqlite3
    conn = sqlite3.connect(db)
    for col, value in cols.items():
        conn.execute(f"UPDATE snapshot SET {col} = ? WHERE id = 0", (value,))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("damage, logged", [
    ({"version": "0" * 32 + "-other"}, "another version"),
    ({"state": b"\x78\x01 not zlib at all"}, "damaged"),
    ({"state": zlib.compress(b"\x80\x05truncated pickle")}, "damaged"),
    # a pickle that would call os.system: refused before anything is called
    ({"state": zlib.compress(pickle.dumps(
        type("Evil", (), {"__reduce__": lambda self: (__import__("os").system, ("true",))})()))},
     "system, which an Engine's state never holds"),
])
def test_an_unusable_snapshot_falls_back_to_the_full_replay(tmp_path, caplog, damage, logged):
    db = tmp_path / "a.db"
    live, _ = _live_run(db)
    _tamper(db, **damage)
    with caplog.at_level(logging.WARNING, logger="hypertrace.analyzer"):   # replay's and server's
        server, _ = start_server(db)
    try:
        assert not server.analyzer.resumed_from_snapshot
        again = server.analyzer.report()
    finally:
        stop_server(server)
    assert logged in caplog.text and "replaying every stored window" in caplog.text
    assert _verdicts(again) == _verdicts(live)
    assert again.jobs[0].windows == live.jobs[0].windows


def test_a_later_scoring_pass_does_not_replace_a_newer_snapshot_with_an_older_one(tmp_path):
    from hypertrace.analyzer.store.storage import Storage
    st = Storage.open(tmp_path / "a.db")
    newer = StoredSnapshot("v", 20, 2, b"new")
    st.add_results([_result()], snapshot=newer)
    st.add_results([_result()], snapshot=StoredSnapshot("v", 10, 3, b"old"))
    assert st.snapshot() == newer
    st.close()


def _result():
    from hypertrace.analyzer.score.epoch_scoring import EpochResult
    return EpochResult("j", 1, [], {("n", "0"): "healthy"})


def test_the_version_names_the_scoring_settings_too():
    assert snapshot.engine_version(ScoringConfig()) == snapshot.engine_version(ScoringConfig())
    assert (snapshot.engine_version(ScoringConfig())
            != snapshot.engine_version(ScoringConfig(z_threshold=4.5)))


@pytest.mark.parametrize("name", sorted(scenarios.CATALOG))
def test_every_scenarios_engine_state_goes_through_a_snapshot_unchanged(name):
    """Whatever a scenario puts in the Engine (groups, NVML readings, intermittent flags)
    is among what the restricted unpickler builds, and scoring goes on from the restored
    Engine exactly as from the original."""
    cfg = scenarios.get(name).config(64, windows=14, seed=3)
    windows = list(generate(cfg))
    cut = len(windows) * 2 // 3
    cfg_s = ScoringConfig()
    live = Engine(cfg_s)
    for w in windows[:cut]:
        live.ingest(w)
    live.flush(windows[cut].end.ToNanoseconds() - 2 * cfg_s.window_ns)
    restored = Engine(cfg_s)
    snapshot.restore(restored, snapshot.pack(snapshot.capture(live), cfg_s, 1, 0))
    for e in (live, restored):
        for w in windows[cut:]:
            e.ingest(w)
        e.flush()
    assert build_report(restored, now_ns=0) == build_report(live, now_ns=0)
