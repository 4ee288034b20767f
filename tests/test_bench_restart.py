"""``make bench-restart`` with an older history written straight into the file: the restart from
the snapshot still reaches the live verdicts, and the file holds every older window's row."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from hypertrace.sim import bench_restart


def test_an_older_history_written_as_blocks_restarts_to_the_live_verdicts(capsys):
    assert bench_restart.main(["--gpus", "64", "--windows", "12", "--older-windows", "6",
                               "--snapshot-seconds", "30"]) == 0
    out = capsys.readouterr().out
    assert "older history: 6 windows per node (48 node-windows" in out
    assert "from the snapshot" in out and "same as live" in out


def test_the_older_history_has_the_rows_and_ids_of_stored_windows(tmp_path):
    from hypertrace.analyzer.store.storage import Storage
    from hypertrace.sim import scenarios
    cfg = scenarios.get("host-10").config(64, windows=3, seed=7)
    db = tmp_path / "h.db"
    n, _ = bench_restart._older_history(db, cfg, 4)
    assert n == 4 * 8
    st = Storage.open(db)
    got = list(st.iter_windows())
    assert sorted(w.id for w in got) == list(range(1, n + 1))
    seqs: dict[str, list[int]] = {}
    for w in got:                                   # in end-time order
        seqs.setdefault(w.agent_id, []).append(w.seq)
    assert len(seqs) == 8 and all(s == [1, 2, 3, 4] for s in seqs.values())
    assert all(w.payload for w in got)              # every row's block holds its window
    # a live window stored next takes the next id
    for w in bench_restart._history(cfg, 3, skip=4):
        st.add_window(w)
        break
    assert max(w.id for w in st.iter_windows()) == n + 1
    st.close()
    conn = sqlite3.connect(Path(db))
    assert conn.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 4
    conn.close()
