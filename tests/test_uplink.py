"""The agent's uplink against a real analyzer on localhost: spool, backoff, replay, trim.

The analyzer is down for a while and then comes up on the same port: every window must be stored
exactly once. A full spool keeps the oldest windows. A poison window is dropped, not retried
forever.
"""
from __future__ import annotations

import logging
import time

import pytest
from test_server import free_port, start_server, stop_server

from hypertrace.daemon.uplink import Backoff, Spool, Uplink, idle_close_for
from hypertrace.sim.simulate import SimConfig, generate

FAST = Backoff(base=0.05, cap=0.3)


def node_windows(n: int, node: str = "node-0000"):
    cfg = SimConfig(gpus=8, gpus_per_node=8, windows=n, seed=21)
    return [w for w in generate(cfg) if w.node == node]


def wait_for(pred, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_analyzer_down_then_up_every_window_stored_exactly_once(tmp_path):
    port = free_port()
    target = f"127.0.0.1:{port}"
    up = Uplink(Spool(tmp_path / "spool"), target, backoff=FAST, idle_close=0.3, seed=1).start()
    windows = node_windows(6)
    try:
        for w in windows[:3]:
            assert up.submit(w)
        assert wait_for(lambda: up.connect_failures >= 2)   # retrying with backoff, nothing lost
        assert len(up.spool) == 3
        server, _ = start_server(tmp_path / "analyzer.db", listen=target)
        try:
            for w in windows[3:]:
                assert up.submit(w)
            assert up.wait_drained(30)
            stored = [(s.agent_id, s.seq) for s in server.analyzer.storage.iter_windows()]
            assert sorted(stored) == sorted((w.agent_id, w.seq) for w in windows)
            assert len(up.spool) == 0 and list((tmp_path / "spool").glob("*.pb")) == []
        finally:
            stop_server(server)
    finally:
        up.close()


def test_restarted_agent_replays_its_spool_without_duplicates(tmp_path):
    server, target = start_server(tmp_path / "analyzer.db")
    try:
        windows = node_windows(4)
        spool = Spool(tmp_path / "spool")
        for w in windows:                       # spooled by an agent that died before sending
            spool.put(w.seq, w.SerializeToString())
        server.analyzer.ingest(windows[0])      # ...one of them had already arrived
        spool2 = Spool(tmp_path / "spool")      # the restarted agent finds them on disk
        assert spool2.seqs() == [1, 2, 3, 4] and spool2.last_seq == 4
        up = Uplink(spool2, target, backoff=FAST, idle_close=0.3).start()
        try:
            assert up.wait_drained(30)
        finally:
            up.close()
        assert up.duplicates == 1
        assert server.analyzer.storage.count_windows() == 4
        assert up.next_seq() == 5               # seqs are never reused after a restart
    finally:
        stop_server(server)


def test_full_spool_keeps_the_oldest_windows(tmp_path, caplog):
    windows = node_windows(10)
    size = max(len(w.SerializeToString()) for w in windows)
    spool = Spool(tmp_path / "spool", max_bytes=int(size * 3.5))
    with caplog.at_level(logging.WARNING, logger="hypertrace.daemon.uplink"):
        kept = [spool.put(w.seq, w.SerializeToString()) for w in windows]
    assert kept == [True] * 3 + [False] * 7
    assert spool.seqs() == [1, 2, 3] and spool.dropped == 7
    assert "keep the oldest" in caplog.text
    spool.remove(1)                              # an ack frees room for new data again
    assert spool.put(11, windows[0].SerializeToString())


def test_poison_window_is_dropped_and_does_not_wedge_the_agent(tmp_path, caplog):
    server, target = start_server(tmp_path / "analyzer.db")
    try:
        windows = node_windows(4)
        windows[1].version = 9                   # the window itself is bad: refused whole
        spool = Spool(tmp_path / "spool")
        for w in windows:                        # bypass submit()'s check: a buggy old agent
            spool.put(w.seq, w.SerializeToString())
        up = Uplink(spool, target, backoff=FAST, idle_close=0.3)
        with caplog.at_level(logging.ERROR, logger="hypertrace.daemon.uplink"):
            up.start()
            try:
                assert up.wait_drained(30)
            finally:
                up.close()
        assert up.rejected == 1 and "rejected window seq 2" in caplog.text
        stored = sorted(s.seq for s in server.analyzer.storage.iter_windows())
        assert stored == [1, 3, 4]
    finally:
        stop_server(server)


def test_a_bad_process_entry_costs_only_itself(tmp_path, caplog):
    """A process whose environment names a 300-character job: its entry is left out, the node's
    other processes are still sent (this once cost the whole node its windows)."""
    server, target = start_server(tmp_path / "analyzer.db")
    try:
        w = node_windows(1)[0]
        others = len(w.processes) - 1
        w.processes[0].job_id = "j" * 300
        up = Uplink(Spool(tmp_path / "spool"), target, backoff=FAST, idle_close=0.3)
        with caplog.at_level(logging.ERROR, logger="hypertrace.daemon.uplink"):
            assert up.submit(w)
            up.start()
            try:
                assert up.wait_drained(30)
            finally:
                up.close()
        assert "leaving out an invalid process entry" in caplog.text and "300 characters" in caplog.text
        stored = [s.message() for s in server.analyzer.storage.iter_windows()]
        assert len(stored) == 1 and len(stored[0].processes) == others
    finally:
        stop_server(server)


def test_submit_refuses_invalid_window_locally(tmp_path):
    up = Uplink(Spool(tmp_path / "spool"), "127.0.0.1:1")
    w = node_windows(1)[0]
    w.version = 7
    assert not up.submit(w)
    assert len(up.spool) == 0 and up.rejected == 1
    up.close()


def test_backoff_grows_exponentially_with_jitter_and_is_capped():
    import random
    b = Backoff(base=1.0, cap=8.0)
    rng = random.Random(0)
    delays = [b.delay(n, rng) for n in range(8)]
    for n, d in enumerate(delays):
        nominal = min(8.0, 2.0 ** n)
        assert 0.5 * nominal <= d <= nominal
    assert len(set(round(d, 6) for d in delays)) == len(delays)   # jittered, not lockstep


def test_a_wiped_spool_never_reuses_seqs(tmp_path):
    """The analyzer dedups on (agent id, seq): an agent whose spool was lost must not start
    again at 1, or its new windows would be acked as duplicates and dropped."""
    import shutil
    import time as _time

    from hypertrace.daemon.uplink import Spool
    before_ms = _time.time_ns() // 1_000_000
    spool = Spool(tmp_path / "spool", 1 << 20)
    first = spool.last_seq + 1
    assert first > before_ms
    assert spool.put(first, b"x")
    shutil.rmtree(tmp_path / "spool")                 # node reimaged, spool_dir moved...
    _time.sleep(0.002)
    again = Spool(tmp_path / "spool", 1 << 20)
    assert again.last_seq + 1 > first


@pytest.mark.parametrize("content", [str(2 ** 64 + 5), "garbage", str(2 ** 63 - 10)])
def test_a_spool_whose_last_seq_is_out_of_range_starts_again_from_the_clock(tmp_path, content):
    """A last_seq of 2**64 once stopped an agent sending (the analyzer cannot store such a seq)
    while it kept pinging the watchdog."""
    import os
    import time
    d = tmp_path / "spool"
    d.mkdir()
    (d / "last_seq").write_text(content)
    spool = Spool(d)
    assert 0 < spool.last_seq < 2 ** 63 - 2 ** 32
    assert abs(spool.last_seq - time.time_ns() // 1_000_000) < 60_000
    assert spool.put(spool.last_seq + 1, b"x")
    assert os.stat(d / "last_seq").st_mode & 0o777 == 0o600
    assert all(os.stat(f).st_mode & 0o777 == 0o600 for f in d.glob("*.pb"))


def test_windows_reuse_the_open_stream_until_it_idles_out(tmp_path):
    """A working agent keeps one stream: windows a pause apart go on it while the pause is
    shorter than ``idle_close``; after a longer pause the stream was closed and a new one opens."""
    server, target = start_server(tmp_path / "analyzer.db", listen="127.0.0.1:0")
    windows = node_windows(4)
    try:
        for idle_close, want in ((30.0, 1), (0.2, 2)):
            spool = Spool(tmp_path / f"spool-{idle_close}")
            up = Uplink(spool, target, backoff=FAST, idle_close=idle_close).start()
            try:
                for w in windows[:2] if want == 1 else windows[2:]:
                    assert up.submit(w)
                    assert up.wait_drained(30)
                    time.sleep(0.8)              # between windows: over 0.2 s, under 30 s
                assert up.streams_opened == want, (idle_close, up.streams_opened)
            finally:
                up.close()
    finally:
        stop_server(server)


@pytest.mark.parametrize("window_s", [1.0, 10.0, 60.0, 3600.0])
def test_an_agents_stream_outlasts_the_pause_between_its_windows(window_s):
    assert idle_close_for(window_s) > window_s
