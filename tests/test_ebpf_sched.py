"""Real scheduler evidence (sched_switch / sched_wakeup tracepoints) of a process the agent
tracks: a CPU hog sharing its core shows as run-queue wait; alone it does not; untracked
processes give no scheduler stats."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import fakecuda_build
import pytest


@pytest.fixture(scope="module")
def fakecuda(tmp_path_factory):
    """A private build of the stand-ins (overrides conftest's shared one): a probe that another
    tool holds on the shared files with a different USDT semaphore offset makes the kernel refuse
    ours there (see collector/ebpf.py), and that must not fail these tests."""
    return fakecuda_build.private_build(tmp_path_factory)


@pytest.fixture
def cpu() -> int:
    """The CPU the contention tests pin to: the last one this test may use."""
    return max(os.sched_getaffinity(0))


@pytest.fixture
def hog_on(cpu):
    """Start a pure real-time busy loop pinned to ``cpu``; stopped afterwards."""
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        procs.append(p)
        os.sched_setaffinity(p.pid, {cpu})
        # Real-time: the kernel's RT throttling leaves the worker about 5% of the CPU whatever
        # the fair scheduler would grant it, so the effect does not depend on other load.
        os.sched_setscheduler(p.pid, os.SCHED_FIFO, os.sched_param(1))
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _run_pinned(session, fakecuda, run_worker, cpu: int, seconds: float = 1.5):
    """A CPU-bound training loop pinned to ``cpu``, tracked; returns (its stats, wall ns)."""
    w = run_worker("--api", "step", "--duration", str(seconds), wait=True,
                   env={"FAKECUDA_RT_LAUNCH_NS": "20000", "FAKECUDA_RT_SYNC_NS": "50000"})
    os.sched_setaffinity(w.pid, {cpu})
    session.attach(str(fakecuda.cudart), pid=w.pid)
    session.track_pids([w.pid])
    try:
        session.read_process_stats()
        t0 = time.monotonic_ns()
        w.go()
        w.finish()
        wall = time.monotonic_ns() - t0
        stats = session.read_process_stats()[w.pid]
    finally:
        session.detach(str(fakecuda.cudart), pid=w.pid)
        session.forget_pids([w.pid])
    return stats, wall


def test_a_cpu_hog_on_the_core_shows_as_run_queue_wait(uprobe_session, fakecuda, run_worker,
                                                       cpu, hog_on):
    alone, wall_alone = _run_pinned(uprobe_session, fakecuda, run_worker, cpu)
    hog_on()
    time.sleep(0.2)
    shared, wall_shared = _run_pinned(uprobe_session, fakecuda, run_worker, cpu)
    share_alone = alone.sched.runq_ns / wall_alone
    share_shared = shared.sched.runq_ns / wall_shared
    # Sharing the core with a busy loop halves the worker's CPU: about half its wall time in the
    # run queue. Alone it waits only for whatever else runs on this machine (other test runs, on
    # a shared VM), so the hog's effect is judged as the difference.
    assert share_shared > 0.2, f"run-queue share with a hog {share_shared:.1%}"
    assert share_shared - share_alone > 0.15, (share_alone, share_shared)
    assert shared.sched.involuntary > 0            # preempted by the hog
    assert int(shared.sched.runq_hist.sum()) > 0
    # A busy loop between calls is not off-CPU.
    assert shared.sched.offcpu_ns < 0.1 * wall_shared


def test_untracked_processes_give_no_scheduler_stats(uprobe_session, fakecuda, run_worker):
    tracked = run_worker("--api", "sync", "--rate", "200", "--calls", "40", wait=True)
    other = run_worker("--api", "sync", "--rate", "200", "--calls", "40", wait=True)
    uprobe_session.attach(str(fakecuda.cudart))           # every process
    uprobe_session.track_pids([tracked.pid])
    try:
        uprobe_session.read_process_stats()
        for w in (tracked, other):
            w.go()
        for w in (tracked, other):
            w.finish()
        got = uprobe_session.read_process_stats()
    finally:
        uprobe_session.forget_pids([tracked.pid, other.pid])
    assert got[tracked.pid].sched is not None
    assert got[tracked.pid].sched.voluntary > 0            # it sleeps between paced calls
    assert got[tracked.pid].sched.offcpu_ns > 0
    # The other process still has its step boundaries, but no scheduler evidence.
    assert got[other.pid].sched is None
    syncs = got[other.pid].boundaries.intervals("cudaStreamSynchronize")
    assert syncs.count == 39 and int(syncs.offcpu_wait_ns.sum()) == 0


def test_untrack_stops_the_accounting(uprobe_session, fakecuda, run_worker):
    w = run_worker("--api", "sync", "--rate", "200", "--calls", "40", wait=True)
    uprobe_session.attach(str(fakecuda.cudart), pid=w.pid)
    uprobe_session.track_pids([w.pid])
    uprobe_session.untrack_pids([w.pid])
    try:
        uprobe_session.read_process_stats()
        w.go()
        w.finish()
        got = uprobe_session.read_process_stats()
    finally:
        uprobe_session.forget_pids([w.pid])
    assert got[w.pid].sched is None
