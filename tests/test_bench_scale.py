"""`make bench-scale` in miniature: 64 simulated agents (512 GPUs) stream paced, wall-clock
aligned windows over real gRPC into a real analyzer subprocess with a real SQLite file.

Asserts what the benchmark's figures rest on, not how fast it was: every window is acked and
stored exactly once, every epoch gets verdicts for every GPU, the injected slow node is the only
straggler, and the analyzer's CPU and memory are read from /proc.
"""
from __future__ import annotations

import os
import time

import pytest

from hypertrace.sim.bench_scale import (
    SLOW_NODE,
    ScaleConfig,
    ScaleResult,
    children_cpu_s,
    descendants,
    read_proc,
    run_scale,
    same_stragglers,
    server_workers,
    table_row,
)


def test_stragglers_are_compared_as_of_the_last_epoch_every_run_scored():
    """A run that fell behind scored fewer epochs; its last stragglers are an earlier epoch's."""
    def run(at):
        return ScaleResult(nodes=1, gpus=8, stragglers_at=at)
    ahead = run({0: [], 1: ["a"], 2: ["a", "b"], 3: ["a", "b", "c"]})
    behind = run({0: [], 1: ["a"], 2: ["a", "b"]})
    assert same_stragglers([ahead, behind]) == (True, 2)
    assert same_stragglers([ahead, run({1: ["a"], 2: ["a"]})]) == (False, 2)
    assert same_stragglers([ahead, run({})]) == (False, None)


def test_read_proc_reports_cpu_and_memory_of_a_process():
    s = read_proc(os.getpid())
    assert s.cpu_s > 0
    assert 0 < s.rss_kb <= s.hwm_kb


def test_the_cpu_of_grandchildren_is_counted_apart_from_the_process(tmp_path):
    """A child's child (as the retention process is the forkserver's) is found, and its CPU,
    spent after this test started it, is counted."""
    import subprocess
    import sys
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
           "open(%r, 'w').close()\ntime.sleep(60)" % str(tmp_path / "done")
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{busy!r}])"])
    try:
        for _ in range(200):
            if (tmp_path / "done").exists():
                break
            time.sleep(0.05)
        kids = descendants(parent.pid)
        assert len(kids) == 1 and parent.pid not in kids
        assert children_cpu_s(parent.pid) >= 0.3
    finally:
        for pid in descendants(parent.pid):
            os.kill(pid, 9)
        parent.wait(10)


def test_config_rejects_a_spread_longer_than_the_window():
    with pytest.raises(ValueError, match="spread"):
        ScaleConfig(window_seconds=1.0, spread_seconds=2.0)


def test_64_agents_every_window_exactly_once_and_verdicts(tmp_path):
    cfg = ScaleConfig(nodes=64, window_seconds=1.0, grace_seconds=0.6, flush_interval=0.1,
                      warmup_epochs=1, epochs=3, spread_seconds=0.1, streams=4, channels=1,
                      pool_windows=2, blast_epochs=1)
    r = run_scale(cfg, tmp_path, progress=lambda *_: None)
    assert not r.stream_errors
    assert r.windows_sent == 64 * (1 + 3 + 1)
    assert r.windows_acked == r.windows_sent == r.windows_stored
    assert r.duplicate_acks == 0
    assert r.exactly_once
    assert r.epochs_scored >= 4                       # warm-up + measured epochs got verdicts
    # verdicts are a change log: every GPU's first verdict, then changes only
    assert 512 / r.epochs_scored <= r.verdict_rows_per_epoch < 512
    assert r.stragglers == [SLOW_NODE]                # found, and nothing else
    assert r.cpu_cores > 0 and r.peak_rss_mb > 0      # measured from /proc of the subprocess
    # PSS of the analyzer and every process it started (its Engine worker, checkers, ...)
    assert r.pss_processes > 1 and r.pss_mb > r.pss_main_mb > 0
    assert r.peak_pss_mb >= r.pss_mb
    assert r.window_payload_bytes > 0 and r.db_bytes_per_hour > 0
    assert table_row(r).startswith("| 512 | 64 |")


@pytest.mark.parametrize("idle_close_s", [0.3, 5.0], ids=["stream-per-window", "kept-stream"])
def test_agent_streams_one_connection_per_agent_exactly_once(tmp_path, idle_close_s):
    # As real agents send: each node its own connection and a stream on it, closed after
    # idle_close_s with nothing to send: under the 1-s window every window opens a new one,
    # over it the agent keeps one stream for all its windows (as the uplink does).
    cfg = ScaleConfig(nodes=32, window_seconds=1.0, grace_seconds=0.6, flush_interval=0.1,
                      warmup_epochs=1, epochs=2, spread_seconds=0.1, agent_streams=True,
                      idle_close_s=idle_close_s, pool_windows=2, blast_epochs=1)
    assert server_workers(cfg) >= cfg.nodes             # a thread for every agent's stream
    r = run_scale(cfg, tmp_path, progress=lambda *_: None)
    assert not r.stream_errors
    assert r.windows_sent == 32 * (1 + 2 + 1)
    assert r.windows_acked == r.windows_sent == r.windows_stored
    assert r.exactly_once
    assert 256 / r.epochs_scored <= r.verdict_rows_per_epoch < 256
    assert r.stragglers == [SLOW_NODE]
    # a stream per window, or one per agent for all its windows
    assert r.streams_opened == (r.windows_sent if idle_close_s < 1.0 else cfg.nodes)


def test_two_generator_processes_split_the_agents_and_time_every_ack(tmp_path):
    # The 131k-GPU run needs several generator processes: each sends for an interleaved
    # slice of the nodes and times every ack; the run adds them up exactly once.
    cfg = ScaleConfig(nodes=32, window_seconds=1.0, grace_seconds=0.6, flush_interval=0.1,
                      warmup_epochs=1, epochs=2, spread_seconds=0.1, agent_streams=True,
                      idle_close_s=0.3, pool_windows=2, blast_epochs=0, generator_procs=2,
                      goal_cores=50.0, goal_ack_beyond_grace_s=30.0)
    r = run_scale(cfg, tmp_path, progress=lambda *_: None)
    assert not r.stream_errors
    assert r.windows_sent == r.windows_acked == r.windows_stored == 32 * 3
    assert r.exactly_once and r.late_windows == 0
    assert r.generator_procs == 2 and r.generator_cpu_s > 0
    assert r.fd_limit > 0
    # acks are timed at the generator: a measured window's ack follows its write
    assert 0 < r.ack_p50_s <= r.ack_p99_s <= r.ack_max_s
    assert dict(r.checks())  # every check is named
    assert any(what.startswith("ack p99 beyond end+grace") for what, _ in r.checks())


def test_a_failed_goal_check_says_the_run_did_not_keep_up():
    from hypertrace.sim.bench_scale import ScaleResult

    r = ScaleResult(nodes=4, gpus=32, windows_sent=4, windows_acked=4, windows_stored=4,
                    cpu_cores=2.0, beyond_grace_p99_s=0.1, ack_beyond_grace_p99_s=3.0,
                    goal_cores=1.5, goal_ack_beyond_grace_s=2.0)
    failed = [what for what, ok in r.checks() if not ok]
    assert len(failed) == 2 and not r.keeps_up
    assert any("cores" in w for w in failed) and any("ack p99" in w for w in failed)


def test_only_a_resent_windows_ack_may_say_duplicate():
    # A window whose stream failed before its ack is sent again (as the uplink resends from
    # its spool); if the first copy was stored after all, its ack says duplicate: not a fault.
    import numpy as np

    from hypertrace.sim.bench_scale import ScaleResult, _from_generators
    from hypertrace.sim.scale_load import Plan, WorkerResult

    cfg = ScaleConfig(nodes=4, warmup_epochs=0, epochs=1, blast_epochs=0)
    plan = Plan(first_epoch=10, paced_epochs=1, blast_epochs=0, win_ns=10**10, blast_at_ns=0)
    one = np.ones(4, np.int64)
    part = WorkerResult(epoch=np.zeros(4, np.int32), due_ns=one, sent_ns=one * 2,
                        ack_ns=one * 3, duplicate=np.array([False, True, False, False]),
                        resent=np.array([0, 1, 0, 0], np.int16))
    r = ScaleResult(nodes=4, gpus=32)
    _from_generators([part], cfg, plan, r)
    assert (r.windows_sent, r.windows_acked, r.duplicate_acks, r.resent_windows) == (4, 4, 0, 1)
    part.duplicate[0] = True                       # a window sent once acked as a duplicate
    _from_generators([part], cfg, plan, r)
    assert r.duplicate_acks == 1


def test_every_simulated_agent_has_a_connection_of_its_own():
    # grpc's global subchannel pool would put every channel of a process to one target on one
    # TCP connection: real agents each hold their own.
    from hypertrace.sim.scale_load import CHANNEL_OPTIONS

    assert ("grpc.use_local_subchannel_pool", 1) in CHANNEL_OPTIONS


def test_windows_moved_into_blocks_still_count_as_stored(tmp_path):
    # A run longer than the compaction delay finds part of its windows in blocks: the harness
    # reads their (start, end, received) from the compacted rows, so none is missed.
    import sqlite3

    from hypertrace.analyzer.store.storage import Storage
    from hypertrace.sim.bench_scale import _compacted_rows
    from hypertrace.sim.simulate import SimConfig, generate

    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(SimConfig(gpus=32, gpus_per_node=8, windows=3, seed=5)))
    assert all(st.add_windows([(w, None, None) for w in ws]))
    last_end = max(w.end.ToNanoseconds() for w in ws)
    moved = st.compact(last_end - 1)              # every window but the last epoch's
    st.close()
    assert 0 < moved < len(ws)
    conn = sqlite3.connect(str(tmp_path / "a.db"))
    rows = _compacted_rows(conn, 10**10)
    conn.close()
    assert len(rows) == moved
    ends = sorted(w.end.ToNanoseconds() for w in ws)[:moved]
    assert sorted(rows[:, 1].tolist()) == ends
    assert (rows[:, 2] > 0).all() and (rows[:, 0] < rows[:, 1]).all()
