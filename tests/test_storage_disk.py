"""The disk the store takes, as ``du`` counts it: pages freed by compaction and retention go
back to the file system, and the WAL stays within its bound. Real SQLite files."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from hypertrace.analyzer.store import storage as st
from hypertrace.analyzer.store.storage import Storage
from hypertrace.sim import scenarios
from hypertrace.sim.simulate import generate


def du(path: Path) -> int:
    """Bytes on disk of a file (0: absent)."""
    return os.stat(path).st_blocks * 512 if path.exists() else 0


def wal(path: Path) -> Path:
    return Path(f"{path}-wal")


def fill(storage: Storage, gpus: int = 256, windows: int = 12) -> int:
    """Store a simulated job's windows as received (no compression); returns the newest end."""
    storage.compress_at_ingest = False
    last = 0
    for w in generate(scenarios.get("host-10").config(gpus, windows=windows, seed=3)):
        storage.add_window(w)
        last = max(last, w.end.ToNanoseconds())
    return last


def test_a_new_file_gives_back_pages_and_bounds_its_wal(tmp_path):
    db = tmp_path / "a.db"
    storage = Storage.open(db, synchronous="NORMAL")
    conn = storage._conn
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2          # incremental
    assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == st.WAL_LIMIT_BYTES
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == st.WAL_CHECKPOINT_PAGES
    storage.close()


def test_the_file_shrinks_after_compaction_and_retention_and_the_wal_stays_bounded(tmp_path):
    db = tmp_path / "a.db"
    storage = Storage.open(db, synchronous="NORMAL")
    last = fill(storage)
    n = storage.count_windows()
    loaded = du(db)
    # one transaction the size of all windows went through the WAL's checkpoints: the WAL is
    # cut back to its limit, not kept at its high-water mark
    assert du(wal(db)) <= st.WAL_LIMIT_BYTES + 64 * st.PAGE_SIZE
    assert storage.compact(last + 1) == n
    freed = storage.give_back_free_pages()
    assert freed > 0
    compacted = du(db)
    assert compacted < loaded / 3                 # raw windows at 7-9 KB, blocks about 1 KB
    assert storage.count_windows() == n           # nothing lost
    assert du(wal(db)) <= st.WAL_LIMIT_BYTES
    assert storage.prune(0, now_ns=last + 1) >= n
    storage.give_back_free_pages()
    assert du(db) < compacted                     # the pruned blocks' pages given back
    assert storage.count_windows() == 0
    assert du(wal(db)) <= st.WAL_LIMIT_BYTES
    assert storage._conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
    storage.close()


def test_the_retention_pass_gives_the_pages_back_within_its_bound_per_pass(tmp_path,
                                                                           monkeypatch):
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.store.summaries import apply_retention
    db = tmp_path / "a.db"
    storage = Storage.open(db, synchronous="NORMAL")
    last = fill(storage)
    storage.compact(last + 1)
    free = storage._conn.execute("PRAGMA freelist_count").fetchone()[0]
    assert free > 8
    # a pass gives back at most RECLAIM_PER_PASS pages; the next pass goes on
    monkeypatch.setattr(st, "RECLAIM_PER_PASS", 4)
    before = du(db)
    apply_retention(storage, ScoringConfig(), raw_hours=1.0, summary_days=0, now_ns=last + 1)
    assert storage._conn.execute("PRAGMA freelist_count").fetchone()[0] == free - 4
    assert du(db) == before - 4 * st.PAGE_SIZE
    monkeypatch.setattr(st, "RECLAIM_PER_PASS", 10**9)
    apply_retention(storage, ScoringConfig(), raw_hours=1.0, summary_days=0, now_ns=last + 1)
    assert storage._conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
    storage.close()


def test_an_existing_file_without_incremental_vacuum_is_converted_when_opened(tmp_path):
    db = tmp_path / "old.db"
    storage = Storage.open(db, synchronous="NORMAL")
    last = fill(storage, windows=4)
    storage.close()
    # a file as written before incremental vacuum was set
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    storage = Storage.open(db, synchronous="NORMAL")
    assert storage._conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    n = storage.count_windows()
    assert n and storage.compact(last + 1) == n    # its windows all there, and readable
    assert len(list(storage.iter_windows())) == n
    before = du(db)
    assert storage.give_back_free_pages() > 0
    assert du(db) < before
    storage.close()


def test_a_large_old_file_is_left_as_it_is_with_the_command_that_converts_it(
        tmp_path, monkeypatch, caplog):
    db = tmp_path / "old.db"
    storage = Storage.open(db, synchronous="NORMAL")
    fill(storage, windows=2)
    storage.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    conn.close()
    monkeypatch.setattr(st, "CONVERT_MAX_BYTES", 1)
    # the module's own logger: a bench run earlier in the session may have raised the level of
    # "hypertrace" (the fuzz and flood benches silence it)
    with caplog.at_level("WARNING", logger=st.log.name):
        storage = Storage.open(db, synchronous="NORMAL")
    assert storage._conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    assert "PRAGMA auto_vacuum=INCREMENTAL; VACUUM" in caplog.text
    assert storage.give_back_free_pages() == 0
    storage.close()


def test_a_live_analyzer_stores_windows_compressed_until_compaction(tmp_path):
    """A server with retention on keeps the store's compression at ingest: the windows not yet
    compacted take about 2.9 KB each on disk, not 7-9 KB."""
    from hypertrace.analyzer.ingest.server import Analyzer
    from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
    storage = Storage.open(tmp_path / "a.db", synchronous="NORMAL")
    AnalyzerServer(Analyzer(storage), ServerOptions(retention_hours=6.0))
    assert storage.compress_at_ingest is True
    storage.close()
