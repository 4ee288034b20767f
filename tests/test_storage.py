"""SQLite storage on a real file: dedup on (agent_id, seq), replay order, results, retention."""
from __future__ import annotations

import hashlib
import sqlite3
import zlib
from pathlib import Path

import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.store.storage import (
    CODEC_RAW,
    CODEC_ZLIB,
    CODEC_ZLIB_DICT1,
    ConflictingDuplicate,
    Storage,
    StorageError,
)
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.simulate import SimConfig, Straggler, generate

CFG = SimConfig(gpus=32, gpus_per_node=8, windows=4, seed=5,
                stragglers=(Straggler("node-0001", 1.3),))


def test_dedup_on_agent_and_seq_and_wal_mode(tmp_path):
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    assert all(st.add_window(w) for w in ws)
    assert not st.add_window(ws[0])                # same (agent_id, seq): ignored
    other = type(ws[0])()
    other.CopyFrom(ws[0])
    other.agent_id = "another-agent"
    assert st.add_window(other)                    # same seq, other agent: new
    assert st.count_windows() == len(ws) + 1
    st.close()
    mode = sqlite3.connect(tmp_path / "a.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_windows_survive_reopen_in_replay_order(tmp_path):
    ws = list(generate(CFG))
    st = Storage.open(tmp_path / "a.db")
    for w in reversed(ws):
        st.add_window(w)
    st.close()
    st = Storage.open(tmp_path / "a.db")
    back = list(st.iter_windows())
    assert [b.end_ns for b in back] == sorted(b.end_ns for b in back)
    assert {(b.agent_id, b.seq) for b in back} == {(w.agent_id, w.seq) for w in ws}
    assert back[0].message() in ws                 # the payload round-trips the protobuf
    st.close()


def test_replay_pages_through_every_window_exactly_once(tmp_path, monkeypatch):
    import hypertrace.analyzer.store.storage as storage_mod
    monkeypatch.setattr(storage_mod, "REPLAY_PAGE", 3)   # 16 windows -> 6 pages
    ws = list(generate(CFG))
    st = Storage.open(tmp_path / "a.db")
    for w in ws:
        st.add_window(w)
    back = [(b.agent_id, b.seq) for b in st.iter_windows()]
    assert sorted(back) == sorted((w.agent_id, w.seq) for w in ws)
    assert len(back) == len(set(back)) == len(ws)
    st.close()


def test_scores_and_verdicts_are_stored_and_replaced_not_duplicated(tmp_path):
    st = Storage.open(tmp_path / "a.db")
    engine = Engine(ScoringConfig())
    for w in generate(CFG):
        engine.ingest(w)
    results = engine.flush(None)
    n = st.add_results(results)
    assert n == sum(len(r.rows) for r in results) and n > 0
    assert st.add_results(results) == n            # re-storing replaces the same keys
    assert st.count_scores() == n
    verdicts = st.verdicts("sim-job")
    # a change log: every GPU's first verdict, then only the epochs where it changed
    first_epoch = min(e for _, e, *_ in verdicts)
    assert len({(n, g) for _, e, n, g, _ in verdicts if e == first_epoch}) == CFG.gpus
    by_gpu: dict[tuple[str, str], list[str]] = {}
    for _, _, node, gpu, v in verdicts:
        by_gpu.setdefault((node, gpu), []).append(v)
    assert all(a != b for vs in by_gpu.values() for a, b in zip(vs, vs[1:]))
    assert {n for (n, _), vs in by_gpu.items() if vs[-1] == "straggler"} == {"node-0001"}
    assert all(vs == ["healthy"] for (n, _), vs in by_gpu.items() if n != "node-0001")
    assert len(verdicts) < CFG.windows * CFG.gpus                  # not one row per epoch
    epochs = st.epochs("sim-job")                                  # one row per scored epoch
    assert [e for e, *_ in epochs] == sorted(r.epoch for r in results)
    assert all(g == CFG.gpus for _, g, *_ in epochs) and epochs[-1][3] == 8   # node-0001's 8
    st.add_results(results)
    assert st.verdicts("sim-job") == verdicts                      # nothing changed: no rows
    st.close()
    reopened = Storage.open(tmp_path / "a.db")                     # the last verdicts are read
    reopened.add_results(results)
    assert reopened.verdicts("sim-job") == verdicts
    reopened.close()


def test_retention_prunes_old_windows_and_results(tmp_path):
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))                       # windows end in 2023
    for w in ws:
        st.add_window(w)
    engine = Engine(ScoringConfig())
    for w in ws:
        engine.ingest(w)
    st.add_results(engine.flush(None), created_ns=ws[0].end.ToNanoseconds())
    last_end = max(w.end.ToNanoseconds() for w in ws)
    # keep exactly the last epoch's windows: cutoff = last_end - 1 s
    st.prune(retention_seconds=1.0, now_ns=last_end + 10**9 - 1)
    left = list(st.iter_windows())
    assert left and all(b.end_ns == last_end for b in left)
    assert st.count_scores() == 0 and st.verdicts() == []
    # the WAL gives its pages back after a prune instead of staying at its high-water mark
    assert (tmp_path / "a.db-wal").stat().st_size == 0
    # the verdicts are a change log: after a prune the next epoch's verdicts are stored anew
    st.add_results([_one_epoch(engine)])
    assert len(st.verdicts()) == CFG.gpus
    st.close()


def _one_epoch(engine: Engine):
    """An EpochResult with every GPU's current verdict (what the next scoring pass stores)."""
    from hypertrace.analyzer.score.epoch_scoring import EpochResult
    job = build_report(engine, now_ns=0).jobs[0]
    return EpochResult(job.job_id, 1, [], {(n.node, g.gpu): g.verdict for n in job.nodes
                                          for g in n.gpus})


def test_payloads_are_stored_compressed_and_read_back_as_the_wire_bytes(tmp_path):
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(SimConfig(gpus=64, gpus_per_node=8, windows=2, seed=4)))
    for w in ws:
        st.add_window(w)
    stored, wire_bytes = st._conn.execute(
        "SELECT SUM(LENGTH(payload)), COUNT(*) FROM windows WHERE codec = ?",
        (CODEC_ZLIB_DICT1,)).fetchone()
    assert wire_bytes == len(ws)
    # the preset dictionary gains on plain zlib of the same bytes
    assert stored < 0.95 * sum(len(zlib.compress(w.SerializeToString(), 1)) for w in ws)
    # rows an older analyzer wrote raw or plain zlib still read back
    st._conn.execute("UPDATE windows SET payload = ?, codec = ? WHERE seq = ? AND agent_id = ?",
                     (zlib.compress(ws[1].SerializeToString()), CODEC_ZLIB, ws[1].seq,
                      ws[1].agent_id))
    st._conn.execute("UPDATE windows SET payload = ?, codec = ? WHERE seq = ? AND agent_id = ?",
                     (ws[2].SerializeToString(), CODEC_RAW, ws[2].seq, ws[2].agent_id))
    assert [sw.payload for sw in st.iter_windows()] == [
        w.SerializeToString() for w in sorted(ws, key=lambda w: (w.end.ToNanoseconds(),
                                                                 w.agent_id, w.seq))]
    assert st.add_window(ws[0]) is False                    # a replay of the same bytes
    other = pb.NodeWindow()
    other.CopyFrom(ws[0])
    other.processes[0].rank += 1
    with pytest.raises(ConflictingDuplicate):
        st.add_window(other)
    # a codec this analyzer does not know is named, not misread
    st._conn.execute("UPDATE windows SET codec = 9 WHERE seq = ?", (ws[0].seq,))
    with pytest.raises(StorageError, match="unknown payload codec 9"):
        [sw.payload for sw in st.iter_windows()]
    st.close()


def _store_with_first_payload_damaged(tmp_path: Path, damage: bytes,
                                      compress_at_ingest: bool = True):
    """(store, its windows, the first of them, whose stored payload is now ``damage``)."""
    st = Storage.open(tmp_path / "a.db")
    st.compress_at_ingest = compress_at_ingest
    ws = list(generate(SimConfig(gpus=16, gpus_per_node=8, windows=2, seed=4)))
    for w in ws:
        st.add_window(w)
    bad = ws[0]
    st._conn.execute("UPDATE windows SET payload = ? WHERE agent_id = ? AND seq = ?",
                     (damage, bad.agent_id, bad.seq))
    return st, ws, bad


def test_a_damaged_payload_costs_its_window_and_the_agents_replay_heals_it(tmp_path):
    st, ws, bad = _store_with_first_payload_damaged(tmp_path, b"\x78\x01garbage")
    readable, damaged = [], []
    for sw in st.iter_windows():
        try:
            readable.append(sw.message())
        except StorageError as exc:
            damaged.append(str(exc))
    assert len(readable) == len(ws) - 1 and len(damaged) == 1
    assert "does not decompress" in damaged[0] and f"seq {bad.seq}" in damaged[0]
    # the agent sends it again (no ack reached it): not a conflict, and the store is whole again
    assert st.add_window(bad) is False
    assert sorted(sw.message().SerializeToString() for sw in st.iter_windows()) == sorted(
        w.SerializeToString() for w in ws)
    st.close()


def test_a_damaged_raw_payload_is_healed_by_the_replay_and_a_different_window_conflicts(tmp_path):
    # payloads stored as received (the blocks compress them later) carry no checksum: a copy
    # that no longer parses as its key's window is damage, healed by the agent's replay
    st, ws, bad = _store_with_first_payload_damaged(tmp_path, b"\xff\xffgarbage",
                                                     compress_at_ingest=False)
    assert st.add_window(bad) is False
    assert sorted(sw.message().SerializeToString() for sw in st.iter_windows()) == sorted(
        w.SerializeToString() for w in ws)
    other = pb.NodeWindow()
    other.CopyFrom(ws[1])
    other.processes[0].rank += 1
    with pytest.raises(ConflictingDuplicate):
        st.add_window(other)
    st.close()


def test_a_prune_keeps_each_gpus_current_verdict_while_its_job_is_scored(tmp_path):
    from hypertrace.analyzer.score.epoch_scoring import EpochResult
    st = Storage.open(tmp_path / "a.db")
    old, recent, cutoff_age = 1_000 * 10**9, 5_000 * 10**9, 2_000
    k = ("node-0001", "0")
    st.add_results([EpochResult("live", 1, [], {k: "straggler"}),
                    EpochResult("gone", 1, [], {k: "straggler"})], created_ns=old)
    st.add_results([EpochResult("live", 2, [], {k: "healthy"})], created_ns=old + 1)
    st.add_results([EpochResult("live", 3, [], {k: "healthy"})], created_ns=recent)
    assert [(e, v) for _, e, *_, v in st.verdicts("live")] == [(1, "straggler"), (2, "healthy")]
    st.prune(retention_seconds=cutoff_age, now_ns=recent + 10**9)   # cutoff between old, recent
    # "live" is still scored: its GPU keeps its current verdict (healthy since epoch 2), not the
    # change before it; "gone" has not been scored since the cutoff and is forgotten
    assert [(e, v) for _, e, *_, v in st.verdicts("live")] == [(2, "healthy")]
    assert st.verdicts("gone") == []
    assert [e for e, *_ in st.epochs("live")] == [3]
    st.close()


def test_verdicts_stored_out_of_epoch_order_keep_every_change(tmp_path):
    """Two scoring passes may store their epochs in either order; no change may be skipped."""
    from hypertrace.analyzer.score.epoch_scoring import EpochResult
    st = Storage.open(tmp_path / "a.db")
    k = ("node-0001", "0")
    for epoch, v in ((5, "healthy"), (7, "straggler"), (6, "healthy"), (8, "healthy")):
        st.add_results([EpochResult("j", epoch, [], {k: v})])
    log = [(e, v) for _, e, _, _, v in st.verdicts("j")]
    assert log == [(5, "healthy"), (7, "straggler"), (8, "healthy")]
    st.add_results([EpochResult("j", 6, [], {k: "suspect"})])          # a real change, late
    log = [(e, v) for _, e, _, _, v in st.verdicts("j")]
    assert log == [(5, "healthy"), (6, "suspect"), (7, "straggler"), (8, "healthy")]

    def as_of(epoch: int) -> str:
        return max((e, v) for e, v in log if e <= epoch)[1]
    assert [as_of(e) for e in (5, 6, 7, 8)] == ["healthy", "suspect", "straggler", "healthy"]
    st.close()


def test_unwritable_or_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(StorageError, match="does not exist"):
        Storage.open(tmp_path / "nope" / "a.db")
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "a.db").mkdir()                          # a directory where the file should be
    with pytest.raises(StorageError, match="cannot open database"):
        Storage.open(ro / "a.db")


def test_a_full_database_reports_its_real_error_and_keeps_what_was_stored(tmp_path):
    """A full disk used to surface as "cannot rollback - no transaction is active". The limit
    here is SQLite's page count, which fails the same way (SQLITE_FULL) without filling a disk."""
    import os
    st = Storage.open(tmp_path / "a.db")
    try:
        assert os.stat(tmp_path / "a.db").st_mode & 0o777 == 0o600
        ws = list(generate(SimConfig(gpus=64, gpus_per_node=8, windows=20, seed=1)))
        pages = st._conn.execute("PRAGMA page_count").fetchone()[0]
        st._conn.execute(f"PRAGMA max_page_count = {pages + 10}")   # 16-KB pages
        stored = 0
        with pytest.raises(sqlite3.Error) as err:
            for w in ws:
                st.add_window(w)
                stored += 1
        assert "full" in str(err.value) and "no transaction" not in str(err.value)
        assert 0 < stored < len(ws) and st.count_windows() == stored
    finally:
        st.close()


def test_a_corrupt_database_stops_the_analyzer_with_exit_2_and_the_recovery(tmp_path, capsys):
    """It used to die with a traceback, which systemd restarts in a loop."""
    from hypertrace.cli.main import main
    db = tmp_path / "a.db"
    st = Storage.open(db)
    for w in generate(SimConfig(gpus=64, gpus_per_node=8, windows=12, seed=2)):
        st.add_window(w)
    st._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = st._conn.execute("PRAGMA page_size").fetchone()[0]
    root = st._conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'windows'"
                            ).fetchone()[0]
    st.close()
    with open(db, "r+b") as fh:          # damage the windows table's root page, not the header
        fh.seek((root - 1) * page)
        fh.write(b"\xa5" * page)
    rc = main(["analyzer", "--listen", "127.0.0.1:0", "--db", str(db), "--insecure"])
    err = capsys.readouterr().err
    assert rc == 2 and "is corrupt" in err and ".recover" in err and "Traceback" not in err


def test_a_database_whose_header_is_damaged_is_named_corrupt_not_unwritable(tmp_path):
    db = tmp_path / "a.db"
    Storage.open(db).close()
    with open(db, "r+b") as fh:
        fh.write(b"\xa5" * 4096)
    with pytest.raises(StorageError, match="is corrupt .*not a database.*\\.recover"):
        Storage.open(db)


def test_the_payload_dictionary_is_frozen():
    """Stored payloads need these exact bytes to decompress: a better dictionary is a new file
    and a new codec number, never an edit of this one."""
    import hypertrace.analyzer.store as pkg
    data = (Path(pkg.__file__).parent / "payload_dict_v1.bin").read_bytes()
    assert hashlib.sha256(data).hexdigest() == (
        "6768ffd1d7146635dd455ab61d3575b2e8c25f133c4d8a20cc5e039c831441c7")


def test_a_new_database_stores_windows_in_a_rowid_table_with_16k_pages(tmp_path):
    """Rows of about 3 KB waste most of a 4-KB page, and a WITHOUT ROWID table puts each row's
    tail on an overflow page of its own; the rowid is also the order windows were stored in."""
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    for w in ws:
        st.add_window(w)
    assert st._conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    sql = st._conn.execute("SELECT sql FROM sqlite_master WHERE name = 'windows'").fetchone()[0]
    assert "WITHOUT ROWID" not in sql
    ids = [r[0] for r in st._conn.execute("SELECT id FROM windows ORDER BY id")]
    assert ids == list(range(1, len(ws) + 1))
    with st.commits_held() as upto:
        assert upto == len(ws)
    # ids are never reused, even once every window was pruned
    st.prune(retention_seconds=1.0, now_ns=2**62)
    assert st.count_windows() == 0
    assert st.add_window(ws[0])
    assert st._conn.execute("SELECT id FROM windows").fetchone()[0] == len(ws) + 1
    st.close()


def test_on_stored_is_told_each_new_windows_id_in_commit_order(tmp_path):
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    seen: list[tuple[int, int]] = []
    for w in ws:
        st.add_window(w, on_stored=lambda i, seq=w.seq: seen.append((i, seq)))
    st.add_window(ws[0], on_stored=lambda i: seen.append((i, -1)))   # a duplicate: not told
    assert [i for i, _ in seen] == list(range(1, len(ws) + 1))
    assert [s for _, s in seen] == [w.seq for w in ws]
    st.close()


def test_windows_stored_as_received_when_compaction_follows_read_back_and_compact(tmp_path):
    # An analyzer whose retention pass compacts windows skips the per-window compression:
    # rows hold the wire bytes (CODEC_RAW), read back, dedup and compact like compressed ones.
    st = Storage.open(tmp_path / "raw.db")
    st.compress_at_ingest = False
    ws = list(generate(SimConfig(gpus=32, gpus_per_node=8, windows=2, seed=5)))
    assert all(st.add_windows([(w, None, None) for w in ws]))
    codecs = {c for (c,) in st._conn.execute("SELECT codec FROM windows")}
    assert codecs == {CODEC_RAW}
    by_key = {(w.agent_id, w.seq): w.SerializeToString() for w in ws}
    assert {(sw.agent_id, sw.seq): sw.payload for sw in st.iter_windows()} == by_key
    assert st.add_window(ws[0]) is False                    # a replay of the same bytes
    assert st.compact(2**62) == len(ws)                      # into blocks, decoded from raw
    assert {(sw.agent_id, sw.seq): sw.payload for sw in st.iter_windows()} == by_key
    assert st.add_window(ws[1]) is False                    # dedup against the block's digest
    st.close()
