"""Group commit in Storage.add_window: windows that arrive during a commit share the next one,
and every caller still learns (after its commit) whether its own window was new."""
from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from hypertrace.analyzer.store.storage import Storage
from hypertrace.sim.simulate import SimConfig, generate

CFG = SimConfig(gpus=64, gpus_per_node=8, windows=2, seed=3)


def _wait_for(cond, what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.005)


def test_windows_queued_during_a_commit_share_one_transaction(tmp_path):
    st = Storage.open(tmp_path / "g.db")
    ws = list(generate(CFG))                 # 16 windows: 8 nodes x 2
    dup = type(ws[1])()
    dup.CopyFrom(ws[1])                      # same (agent_id, seq) as ws[1], in the same group
    results: dict[int, bool] = {}

    def add(i, w):
        results[i] = st.add_window(w)

    st._lock.acquire()                       # hold the database: the first caller's commit stalls
    try:
        leader = threading.Thread(target=add, args=(0, ws[0]))
        leader.start()
        _wait_for(lambda: st._committing, "the first caller to lead a commit")
        followers = [threading.Thread(target=add, args=(i, w)) for i, w in enumerate(ws[1:], 1)]
        followers.append(threading.Thread(target=add, args=(len(ws), dup)))
        for t in followers:
            t.start()
        _wait_for(lambda: len(st._queued) == len(followers), "every follower to queue")
        assert not results                   # nobody is acked before its commit
    finally:
        st._lock.release()
    for t in [leader, *followers]:
        t.join(timeout=30)
    assert st.commits == 2                   # the leader's window, then all the others at once
    assert all(results[i] for i in range(len(ws)))
    assert results[1] + results[len(ws)] == 1    # the duplicate: exactly one of the two is new
    assert st.count_windows() == len(ws)
    st.close()
    n = sqlite3.connect(tmp_path / "g.db").execute("SELECT COUNT(*) FROM windows").fetchone()[0]
    assert n == len(ws)                      # committed, visible to another connection


def test_a_failed_commit_raises_in_every_caller_and_storage_keeps_working(tmp_path):
    st = Storage.open(tmp_path / "g.db")
    ws = list(generate(CFG))
    st._conn.execute("CREATE TRIGGER no_node3 BEFORE INSERT ON windows WHEN NEW.node = "
                     "'node-0003' BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    errors: list[str] = []

    def add(w):
        try:
            st.add_window(w)
        except sqlite3.Error as exc:
            errors.append(str(exc))

    st._lock.acquire()
    try:
        first = threading.Thread(target=add, args=(ws[0],))
        first.start()
        _wait_for(lambda: st._committing, "the first caller to lead a commit")
        group = [threading.Thread(target=add, args=(w,)) for w in ws[1:5]]   # node-0003 in it
        for t in group:
            t.start()
        _wait_for(lambda: len(st._queued) == len(group), "the group to queue")
    finally:
        st._lock.release()
    for t in [first, *group]:
        t.join(timeout=30)
    assert errors == ["disk says no"] * len(group)   # the whole group failed, and said why
    assert st.count_windows() == 1                   # the rolled-back group left nothing
    assert st.add_window(ws[1])                      # and the storage still works (a retry)
    st.close()


def test_add_windows_commits_a_group_once_and_answers_per_window(tmp_path):
    from hypertrace.analyzer.store.storage import ConflictingDuplicate

    st = Storage.open(tmp_path / "m.db")
    ws = list(generate(CFG))
    seen: list[int] = []
    first = st.add_windows([(w, None, seen.append) for w in ws[:4]])
    assert first == [True] * 4 and st.commits == 1      # four windows, one transaction
    assert seen == sorted(seen) and len(seen) == 4      # on_stored after the commit, in order
    other = type(ws[0])()
    other.CopyFrom(ws[0])
    other.processes[0].rank += 1                        # same key, other bytes
    out = st.add_windows([(ws[1], None, None), (ws[4], None, None), (other, None, None)])
    assert out[:2] == [False, True] and isinstance(out[2], ConflictingDuplicate)
    assert st.commits == 2 and st.count_windows() == 5  # the refused window is not stored
    st.close()
