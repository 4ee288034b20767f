"""The in-process CUPTI backend (collector/cupti), on a machine without CUDA.

What cannot exist here is libcupti itself (it needs the CUDA driver), so it is the one stand-in:
tests/fakecupti/fakecupti.c implements the Callback API calls the backend makes, with CUPTI's
signatures and result codes, and fires the enter/exit callbacks of the calls a test worker plays
(tests/cupti_worker.py). Everything else is real: the recorder library compiled from
collector/cupti/recorder.c, the backend's thread in a separate worker process, the node-local
socket with its peer credentials, a real `hypertrace agent` process (``--backend cupti``), a real
`hypertrace analyzer` (gRPC on localhost, a SQLite file). The recorder against the real libcupti
runs on the GPU machine (tests/gpu/cupti_checks.py; results in docs/gpu-runs/).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb

HERE = Path(__file__).resolve().parent
WORKER = HERE / "cupti_worker.py"
WINDOW_S = 2.0
LAUNCH_US = 20.0


def hypertrace(*args: str) -> list[str]:
    return [sys.executable, "-m", "hypertrace.cli.main", *args]


@pytest.fixture(scope="session")
def fakecupti() -> Path:
    """The stand-in libcupti, built once per session."""
    out = HERE / ".build" / "fakecupti" / "libcupti.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    src = HERE / "fakecupti" / "fakecupti.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in reversed(started):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _recorder(fakecupti: Path):
    """A fresh recorder process-wide is impossible (one library per process), so the unit tests
    load a private copy of the recorder library under another name each time."""
    import shutil
    import tempfile

    from hypertrace.collector.cupti import native
    lib = native.library_path()
    private = Path(tempfile.mkdtemp()) / lib.name
    shutil.copy2(lib, private)
    r = native.Recorder(private)
    r.open(str(fakecupti))
    return r


def _fake(fakecupti: Path):
    f = ctypes.CDLL(str(fakecupti))
    f.fakecupti_call.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32]
    return f


class _Intervals:
    """One API's intervals in a read, summed as the tests compare them (count, waits, busy)."""

    def __init__(self, snap, api: str) -> None:
        iv = snap.boundaries.intervals(api)
        self.count = iv.count
        self.interval_sum_ns = int(iv.durations_ns.sum())
        self.sync_wait_ns = int(iv.sync_wait_ns.sum())
        wo = np.minimum(iv.offcpu_wait_ns, np.maximum(iv.durations_ns - iv.sync_wait_ns, 0))
        self.offcpu_wait_ns = int(wo.sum())
        self.busy = buckets.histogram_of_ns(
            np.maximum(iv.durations_ns - iv.sync_wait_ns - wo, 0))


def _syncing(fakecupti: Path, *apis: str):
    """A subscribed recorder with the synchronize ``apis`` on, and the stand-in to call."""
    r = _recorder(fakecupti)
    fake = _fake(fakecupti)
    for api in apis:
        r.add_api(api, "sync")
    assert r.subscribe() is None
    r.enable(list(apis), True)
    return r, fake


# -- the recorder -------------------------------------------------------------------------------
def test_recorder_buckets_are_the_wire_scheme(fakecupti):
    """A call of N ns lands in the bucket proto/buckets.py puts N in: one scheme everywhere."""
    r = _recorder(fakecupti)
    r.add_api("cudaLaunchKernel", "launch")
    values = [100, 256, 257, 1000, 4095, 4096, 123_456, 10**9, 2**36 + 5]
    for v in values:
        r.test_record("cudaLaunchKernel", v, 10**12)
    s = r.read(1).samples["cudaLaunchKernel"]
    assert s.count == len(values) and s.min_ns == 100 and s.max_ns == 2**36 + 5
    assert np.array_equal(s.counts, buckets.histogram_of_ns(np.array(values)))


def test_a_driver_call_inside_a_runtime_call_counts_once(fakecupti):
    """cudaLaunchKernel calls cuLaunchKernel: one sample (the runtime call), one nested hit."""
    r = _recorder(fakecupti)
    fake = _fake(fakecupti)
    for name, kind in (("cudaLaunchKernel", "launch"), ("cuLaunchKernel", "launch")):
        assert r.add_api(name, kind)
    assert r.subscribe() is None
    r.enable(["cudaLaunchKernel", "cuLaunchKernel"], True)
    for _ in range(50):
        fake.fakecupti_call(2, 211, 30_000, 307)
    snap = r.read(1)
    r.unsubscribe()
    assert set(snap.samples) == {"cudaLaunchKernel"}
    s = snap.samples["cudaLaunchKernel"]
    assert s.count == 50 and s.nested == 50 and s.probe_hits == 100
    assert s.min_ns >= 30_000                    # the whole outer call, inner one included


def test_callbacks_fire_only_while_enabled(fakecupti):
    r = _recorder(fakecupti)
    fake = _fake(fakecupti)
    r.add_api("cudaLaunchKernel", "launch")
    r.add_api("cudaStreamSynchronize", "sync")
    assert r.subscribe() is None
    r.enable(["cudaStreamSynchronize"], True)    # the always tier only
    for _ in range(10):
        fake.fakecupti_call(2, 211, 1000, 0)
        fake.fakecupti_call(2, 131, 1_000_000, 0)
    snap = r.read(1)
    assert set(snap.samples) == {"cudaStreamSynchronize"}
    # nine intervals between ten syncs, each a 1-ms wait and ~10 us of other work
    p = _Intervals(snap, "cudaStreamSynchronize")
    assert p.count == 9 and p.sync_wait_ns >= 9 * 1_000_000
    r.unsubscribe()
    fake.fakecupti_call(2, 131, 1000, 0)
    assert r.read(1).samples == {}


def test_blocked_time_outside_calls_is_a_wait_not_busy(fakecupti):
    """Between a sync's exit and the next sync's entry the thread sleeps 30 ms (blocked, as a
    rank waiting for its peers): the interval's busy part excludes it, as the eBPF split does."""
    r, fake = _syncing(fakecupti, "cudaStreamSynchronize")
    for _ in range(6):
        fake.fakecupti_call(2, 131, 1_000_000, 0)
        time.sleep(0.03)
    snap = r.read(1)
    r.unsubscribe()
    p = _Intervals(snap, "cudaStreamSynchronize")
    assert p.count == 5
    assert p.offcpu_wait_ns >= 5 * 25_000_000            # the sleeps, less scheduling slack
    assert p.offcpu_wait_ns <= p.interval_sum_ns - p.sync_wait_ns
    busy_p50 = buckets.quantiles_us(p.busy[None, :], [0.5])[0][0]
    assert busy_p50 < 15_000    # us: the 30-ms sleep is not busy (a wake-up may wait for a CPU)
    assert snap.sched_reads == 12 and snap.offcpu_ns == p.offcpu_wait_ns


def test_another_threads_sleep_is_not_this_steps_wait(fakecupti):
    """A second thread that syncs and then sleeps long (a loader, a communication thread) must
    not turn the main thread's steps into waits: the process is idle only while every thread
    that makes synchronize calls is blocked, and the main thread never is.

    The main thread's step work runs in C, off the interpreter lock, as a real step's launches
    do (a call the recorder does not time), and the bound is half the step. Why: in a full test
    run on a 2-core VM the main thread once read a third of its steps as waits, with its step
    a busy loop in Python. Such a loop holds the lock, so each of the sleeper's wake-ups leaves
    the main thread blocked until the lock comes back, which is real blocked time; and time a
    hypervisor takes the CPU away (steal) probably reads as blocked too (schedstat's run time
    and run delay leave it out). Counting the sleeper's sleeps
    would make nearly all of the step a wait."""
    import threading
    r, fake = _syncing(fakecupti, "cudaStreamSynchronize", "cudaEventSynchronize")
    stop = threading.Event()

    def sleeper():                                       # syncs on an event, then sleeps
        while not stop.is_set():
            fake.fakecupti_call(2, 166, 100_000, 0)
            time.sleep(0.05)
    th = threading.Thread(target=sleeper)
    fake.fakecupti_call(2, 131, 200_000, 0)              # the main thread's first step begins
    th.start()
    try:
        for _ in range(12):                              # the main thread: busy 20-ms steps
            fake.fakecupti_call(2, 131, 200_000, 0)
            fake.fakecupti_call(2, 211, 20_000_000, 0)   # cudaLaunchKernel, not recorded here
    finally:
        stop.set()
        th.join()
    snap = r.read(1)
    r.unsubscribe()
    main = _Intervals(snap, "cudaStreamSynchronize")
    assert main.count == 12
    assert main.offcpu_wait_ns < 0.5 * main.interval_sum_ns     # the sleeper's are not its
    assert buckets.quantiles_us(main.busy[None, :], [0.5])[0][0] > 10_000
    # nor the sleeper's own steps: the process was busy while it slept
    other = _Intervals(snap, "cudaEventSynchronize")
    assert other.count >= 3
    assert other.offcpu_wait_ns < 0.5 * other.interval_sum_ns


def _alternating_workers(fakecupti, gpu_wait_ns: int, peer_wait_s: float, steps: int = 40):
    """A collective as gloo runs it: the main thread waits for the step's collective, which one
    of two worker threads runs, taking turns. A worker first syncs on its own GPU (``gpu_wait_ns``
    inside cudaStreamSynchronize), then waits for its peers (``peer_wait_s`` blocked outside any
    call); the main thread syncs its device at the end of the step."""
    import threading
    r, fake = _syncing(fakecupti, "cudaStreamSynchronize", "cudaDeviceSynchronize")
    go = [threading.Semaphore(0), threading.Semaphore(0)]
    done = threading.Semaphore(0)
    slept_ns: list[int] = []                             # each peer wait as it really lasted

    def worker(k):
        for _ in range(steps // 2):
            go[k].acquire()
            fake.fakecupti_call(2, 131, gpu_wait_ns, 0)
            t0 = time.monotonic_ns()
            time.sleep(peer_wait_s)
            slept_ns.append(time.monotonic_ns() - t0)
            done.release()
    ths = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    [t.start() for t in ths]
    for i in range(steps):
        t_end = time.monotonic() + 0.008                 # the step's own CPU work
        while time.monotonic() < t_end:
            pass
        go[i % 2].release()
        done.acquire()                                   # blocked: the collective
        fake.fakecupti_call(2, 165, 100_000, 0)          # cudaDeviceSynchronize
    [t.join() for t in ths]
    snap = r.read(1)
    r.unsubscribe()
    return _Intervals(snap, "cudaStreamSynchronize"), sum(slept_ns) / len(slept_ns)


def test_peer_waits_of_a_collective_run_by_worker_threads_are_waits(fakecupti):
    """The workers take turns at the step's synchronize call: the step's peer wait (15 ms
    blocked outside calls while nothing else runs) still counts as a wait, not as busy time,
    and the 8 ms the worker spent inside the call on its own GPU does not.

    The bounds are relative to how long the sleeps really lasted: on a loaded machine a 15-ms
    sleep may overshoot by a few milliseconds."""
    gpu_wait_ms = 8.0
    p, slept_ns = _alternating_workers(fakecupti, gpu_wait_ns=int(gpu_wait_ms * 1e6),
                                       peer_wait_s=0.015)
    assert p.count >= 30
    per_step_ms = p.offcpu_wait_ns / p.count / 1e6
    slept_ms = slept_ns / 1e6
    assert 0.66 * slept_ms <= per_step_ms <= slept_ms + gpu_wait_ms / 2, (per_step_ms, slept_ms)


def test_a_wait_on_the_own_gpu_is_not_a_peer_wait(fakecupti):
    """The slow-GPU rank of the same collective: its worker waits 15 ms on its own GPU (inside
    the synchronize call) and not for peers; the main thread, blocked meanwhile, waits for its
    own process. No peer wait is counted."""
    p, _ = _alternating_workers(fakecupti, gpu_wait_ns=15_000_000, peer_wait_s=0.0)
    assert p.count >= 30
    assert p.offcpu_wait_ns / p.count / 1e6 < 3, p.offcpu_wait_ns / p.count / 1e6


def test_a_lost_exit_does_not_end_the_idle_time(fakecupti):
    """CUPTI reports no exit of a callback disabled during the call (a slice ending while a
    thread waits in a synchronize call). That thread must not count as inside a call for ever:
    the main thread's later idle steps (0.1-ms sync, 20 ms asleep) still read as waits."""
    import threading
    r, fake = _syncing(fakecupti, "cudaStreamSynchronize", "cudaDeviceSynchronize")
    th = threading.Thread(target=fake.fakecupti_call, args=(2, 131, 100_000_000, 0))
    th.start()
    time.sleep(0.03)
    r.enable(["cudaStreamSynchronize"], False)          # its exit will never be reported
    th.join()
    r.read(1)
    for _ in range(12):
        fake.fakecupti_call(2, 165, 100_000, 0)
        time.sleep(0.02)
    p = _Intervals(r.read(1), "cudaDeviceSynchronize")
    r.unsubscribe()
    assert p.count == 11
    assert p.offcpu_wait_ns / p.count > 15_000_000, p.offcpu_wait_ns / p.count


def test_idle_time_survives_many_short_lived_threads(fakecupti):
    """Thread indexes are reused when threads exit: after 300 short-lived threads have made a
    synchronize call (more than the recorder has places for), a new thread's idle steps still
    read as waits."""
    import threading
    r, fake = _syncing(fakecupti, "cudaStreamSynchronize")
    for _ in range(300):
        t = threading.Thread(target=fake.fakecupti_call, args=(2, 131, 10_000, 0))
        t.start()
        t.join()
    r.read(1)

    def steps():
        for _ in range(12):
            fake.fakecupti_call(2, 131, 100_000, 0)
            time.sleep(0.02)
    t = threading.Thread(target=steps)
    t.start()
    t.join()
    p = _Intervals(r.read(1), "cudaStreamSynchronize")
    r.unsubscribe()
    assert p.count >= 11
    assert p.offcpu_wait_ns / p.count > 15_000_000, p.offcpu_wait_ns / p.count


def test_the_calibration_loop_times_exactly_the_calls_it_makes(fakecupti):
    """The calibration times cudaGetDevice in C (no interpreter lock in the timed loop): it
    makes exactly the calls asked for, through the function it was given, and reports a
    positive cost per call."""
    r = _recorder(fakecupti)
    fake = _fake(fakecupti)
    fake.fakecupti_get_device_calls.restype = ctypes.c_long
    fn = fake.fakecupti_get_device
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    before = fake.fakecupti_get_device_calls()
    per_call = r.time_calls(fn, 5000)
    assert fake.fakecupti_get_device_calls() - before == 5000
    assert 0 < per_call < 1e6


def test_another_subscriber_is_named(fakecupti, monkeypatch):
    monkeypatch.setenv("FAKECUPTI_HELD_BY", "Nsight Systems")
    r = _recorder(fakecupti)
    assert r.subscribe() == "Nsight Systems"
    assert not r.subscribed()


def test_no_libcupti_says_what_to_install(tmp_path):
    from hypertrace.collector.cupti import native
    r = native.Recorder()
    with pytest.raises(native.CuptiUnavailable, match="HYPERTRACE_CUPTI_LIB"):
        r.open(str(tmp_path / "libcupti.so.13"))
    plain = tmp_path / "libplain.so"
    src = tmp_path / "plain.c"
    src.write_text("int nothing(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plain), str(src)], check=True)
    with pytest.raises(native.CuptiUnavailable, match="lacks the Callback API"):
        native.Recorder(_private_copy(native.library_path(), tmp_path)).open(str(plain))


def _private_copy(lib: Path, tmp_path: Path) -> Path:
    import shutil
    out = tmp_path / "rec" / lib.name
    out.parent.mkdir(exist_ok=True)
    shutil.copy2(lib, out)
    return out


# -- end to end: worker -> agent -> analyzer ----------------------------------------------------
def _wait_for(pred, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}"
                         + (f"; log:\n{log.read_text()[-3000:]}" if log and log.exists() else ""))


def _analyzer(tmp_path: Path, procs: list) -> tuple[int, Path]:
    import re
    log = tmp_path / "analyzer.log"
    db = tmp_path / "a.db"
    p = subprocess.Popen(hypertrace("analyzer", "--listen", "127.0.0.1:0", "--db", str(db),
                                    "--window-seconds", str(WINDOW_S), "--grace-seconds", "1",
                                    "--flush-interval", "0.5", "--insecure"),
                         stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    port = _wait_for(lambda: (m := re.search(r"listening on [^\s]*:(\d+)", log.read_text()))
                     and int(m.group(1)), 30, "the analyzer", log)
    return port, db


def _agent(tmp_path: Path, procs: list, port: int, sock: Path, *extra: str) -> Path:
    cfg = tmp_path / "agent.toml"
    cfg.write_text("# all settings from flags\n")
    log = tmp_path / "agent.log"
    p = subprocess.Popen(hypertrace("agent", "--analyzer", f"127.0.0.1:{port}", "--insecure",
                                    "--window", str(WINDOW_S), "--spool-dir",
                                    str(tmp_path / "spool"), "--node", "cupti-node", "--no-nvml",
                                    "--backend", "cupti", "--cupti-socket", str(sock),
                                    "--job-env", "HYPERTRACE_JOB", "--max-slice-s", "0.5",
                                    "--slice-guard-s", "0.25", "--min-samples", "100",
                                    "--config", str(cfg), *extra),
                         stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    _wait_for(lambda: sock.exists(), 30, "the agent's socket", log)
    return log


def _worker(tmp_path: Path, procs: list, fakecupti: Path, rank: int, sock: Path | None,
            *extra: str, env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    state = tmp_path / f"state-{rank}.json"
    log = tmp_path / f"worker-{rank}.log"
    e = dict(os.environ, HYPERTRACE_JOB="cj", RANK=str(rank), LOCAL_RANK=str(rank),
             HYPERTRACE_CUPTI_RETRY_S="1", **(env or {}))
    if sock is not None:
        e["HYPERTRACE_CUPTI_SOCKET"] = str(sock)
    p = subprocess.Popen([sys.executable, str(WORKER), "--fakecupti", str(fakecupti), "--state",
                          str(state), "--launch-us", str(LAUNCH_US), *extra],
                         env=e, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p, state


def _state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stored(db: Path) -> list[pb.NodeWindow]:
    from hypertrace.analyzer.store.storage import Storage
    st = Storage.open(db)
    try:
        return [s.message() for s in st.iter_windows()]
    finally:
        st.close()


def _cupti_processes(db: Path) -> list[tuple[pb.NodeWindow, pb.ProcessWindow]]:
    return [(w, p) for w in _stored(db) for p in w.processes if p.backend == "cupti"]


def test_windows_reach_the_analyzer_through_the_agent(fakecupti, tmp_path, procs):
    """Two ranks with the backend, an agent that has no eBPF (backend cupti): the analyzer
    stores one window per node with both ranks, measured in process, under the budget."""
    port, db = _analyzer(tmp_path, procs)
    sock = tmp_path / "cupti.sock"
    prom = tmp_path / "hypertrace.prom"
    agent_log = _agent(tmp_path, procs, port, sock, "--metrics-textfile", str(prom))
    workers = [_worker(tmp_path, procs, fakecupti, rank, sock, "--seconds", "60")
               for rank in (0, 1)]

    def enough():
        rows = _cupti_processes(db)
        sampled = [p for _, p in rows if p.overhead.sampled]
        return len({p.rank for p in sampled}) == 2 and len(sampled) >= 4 and rows
    rows = _wait_for(enough, 45, "sampled CUPTI windows of both ranks", agent_log)

    for w, p in rows:
        assert w.node == "cupti-node" and w.agent_id == "cupti-node"   # the agent's window
        assert p.job_id == "cj" and p.rank in (0, 1)
        assert p.pid in {wp.pid for wp, _ in workers}                  # from SO_PEERCRED
        assert p.overhead.budget == pytest.approx(0.005)
        # steps come from the sync; a window whose sleeps jittered on this busy VM may refuse it
        assert p.steps.source == "inferred:cudaStreamSynchronize" or p.steps.refused
    assert sum(p.steps.source == "inferred:cudaStreamSynchronize" for _, p in rows) >= 2
    sampled = [p for _, p in rows if p.overhead.sampled]
    for p in sampled:
        launch = next(a for a in p.apis if a.api == "cudaLaunchKernel")
        p50 = buckets.quantiles_us(np.array([_dense(launch.histogram)]), [0.5])[0][0]
        assert LAUNCH_US * 0.9 < p50 < LAUNCH_US * 3          # played 20 us (+ callback cost)
        assert 0 < p.overhead.duty < 1                         # the launch tier is sliced
        assert not any(a.api == "cuLaunchKernel" and a.count > 2 for a in p.apis)  # nested once
    # the account: what the callbacks cost each window stays near the budget (the first,
    # measuring slice is repaid later)
    fractions = [p.overhead.estimated_fraction for _, p in rows]
    assert float(np.median(fractions)) <= 0.005 * 1.5, fractions
    # in-process scheduler evidence: each rank's probed threads, the step's blocked gap
    for _, p in rows[2:]:
        assert p.HasField("sched") and p.sched.window_s > 0
        assert p.sched.voluntary_switches > 0          # the worker sleeps between steps
    for p in sampled:
        if not p.steps.steps:
            continue
        busy = buckets.quantiles_us(np.array([_dense(p.steps.busy_time)]), [0.5])[0][0]
        assert busy < 0.5 * p.steps.step_sum_us / p.steps.steps   # 20-ms sleep is a wait
    # the agent's own metrics say what it runs and who is connected
    text = prom.read_text()
    assert 'hypertrace_agent_backend{Hostname="cupti-node",backend="cupti"} 1.0' in text
    assert 'hypertrace_agent_inprocess_connected{Hostname="cupti-node"} 2.0' in text
    for _wp, state in workers:
        assert _state(state)["mode"] == "active"


def _dense(h: pb.Histogram) -> np.ndarray:
    from hypertrace.proto.wire import unpack_histogram
    return unpack_histogram(h)


def test_backs_off_while_another_tool_holds_cupti(fakecupti, tmp_path, procs):
    """CUPTI held by another tool: windows still flow, unsampled, naming the holder; once it
    lets go, the backend subscribes and samples."""
    port, db = _analyzer(tmp_path, procs)
    sock = tmp_path / "cupti.sock"
    agent_log = _agent(tmp_path, procs, port, sock)
    _, state = _worker(tmp_path, procs, fakecupti, 0, sock, "--seconds", "60",
                       "--release-after", "7", env={"FAKECUPTI_HELD_BY": "torch.profiler"})
    busy = _wait_for(lambda: [p for _, p in _cupti_processes(db)
                              if p.overhead.unsampled_reason == "cupti_busy"],
                     30, "a cupti_busy window", agent_log)
    assert busy[0].overhead.blocked_by == "torch.profiler"
    assert not busy[0].apis                       # nothing probed while backed off
    _wait_for(lambda: any(p.overhead.sampled for _, p in _cupti_processes(db)), 40,
              "a sampled window after the holder let go", agent_log)
    assert "CUPTI is held by torch.profiler" in (tmp_path / "worker-0.log").read_text()
    assert _state(state)["blocked_by"] == ""


def test_pause_and_resume_through_the_agent(fakecupti, tmp_path, procs):
    port, db = _analyzer(tmp_path, procs)
    sock = tmp_path / "cupti.sock"
    agent_log = _agent(tmp_path, procs, port, sock)
    w, state = _worker(tmp_path, procs, fakecupti, 0, sock, "--seconds", "60")
    _wait_for(lambda: _state(state).get("fake_subscribed") == 1, 20, "subscribed", agent_log)
    out = subprocess.run(hypertrace("cupti", "pause", "--socket", str(sock), "--pid", str(w.pid)),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and f"pid {w.pid}" in out.stdout, out.stderr
    _wait_for(lambda: _state(state).get("paused") and _state(state).get("fake_subscribed") == 0,
              10, "unsubscribed after pause")
    _wait_for(lambda: any(p.overhead.unsampled_reason == "paused"
                          for _, p in _cupti_processes(db)), 20, "a paused window", agent_log)
    out = subprocess.run(hypertrace("cupti", "resume", "--socket", str(sock)),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    _wait_for(lambda: not _state(state).get("paused") and _state(state).get("fake_subscribed"),
              10, "subscribed again after resume")
    # a pid that is not connected: exit 2 and why
    out = subprocess.run(hypertrace("cupti", "pause", "--socket", str(sock), "--pid", "1"),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "no connected process 1" in out.stderr


def test_standby_where_ebpf_probes_counts_each_process_once(fakecupti, tmp_path, procs):
    """An agent that probes with eBPF answers standby: the process subscribes to nothing."""
    from hypertrace.daemon.inprocess import InProcessHub
    sock = tmp_path / "cupti.sock"
    hub = InProcessHub(str(sock), pb.LocalConfig(window_s=WINDOW_S, overhead_budget=0.005),
                       standby=True).start()
    try:
        _, state = _worker(tmp_path, procs, fakecupti, 0, sock, "--seconds", "30")
        _wait_for(lambda: _state(state).get("mode") == "standby", 20, "standby")
        time.sleep(WINDOW_S * 1.5)
        assert _state(state)["fake_subscribed"] == 0 and not _state(state)["subscribed"]
        assert _state(state)["windows_sent"] == 0
    finally:
        hub.close()


def test_the_first_window_follows_the_agents_window_length(fakecupti, tmp_path, procs):
    """The agent's config sets the window: the process's first window ends at the agent's next
    boundary, not at the next boundary of the backend's own default (10 s; a first window that
    long reached the agent too late to be merged)."""
    from hypertrace.daemon.inprocess import InProcessHub
    sock = tmp_path / "cupti.sock"
    window_s = 1.0
    hub = InProcessHub(str(sock), pb.LocalConfig(window_s=window_s, overhead_budget=0.005),
                       standby=False).start()
    try:
        w_ns = int(window_s * 1e9)
        # start just after a 10-s boundary, the worst case for a 10-s first window
        while time.time_ns() % 10_000_000_000 > 500_000_000:
            time.sleep(0.05)
        started = time.time_ns()
        _worker(tmp_path, procs, fakecupti, 0, sock, "--seconds", "20")
        first_end = None
        end = (started // w_ns + 1) * w_ns
        while first_end is None and end < started + 8 * w_ns:
            time.sleep(max(0.0, (end - time.time_ns()) / 1e9))
            taken = hub.take(end - w_ns, end)
            if taken:
                first_end = taken[0].frame.end_ns
            end += w_ns
        # (a 10-s first window would end 9.5-10 s after the start; the worker's own start-up
        # takes a second or two on a busy machine)
        assert first_end is not None, "no window within 8 agent windows of the start"
        assert first_end - started <= 7 * w_ns
    finally:
        hub.close()


def test_the_step_marker_reaches_the_window_without_uprobes(fakecupti, tmp_path, procs):
    """hypertrace.step() in a process probed by CUPTI: its steps come from the marker."""
    from hypertrace.daemon.inprocess import InProcessHub
    sock = tmp_path / "cupti.sock"
    hub = InProcessHub(str(sock), pb.LocalConfig(window_s=WINDOW_S, overhead_budget=0.005,
                                                 max_slice_s=0.5, slice_guard_s=0.25),
                       standby=False).start()
    try:
        _worker(tmp_path, procs, fakecupti, 0, sock, "--seconds", "30", "--marker")
        w_ns = int(WINDOW_S * 1e9)

        def marker_window():
            end = time.time_ns() // w_ns * w_ns
            taken = hub.take(end - w_ns, end, wait=False)
            return [t.frame for t in taken if t.frame.window.steps.source == "marker"]
        got = _wait_for(marker_window, 20, "a window whose steps come from the marker")
        assert got[0].window.steps.steps >= 10
    finally:
        hub.close()


def test_bad_frames_are_dropped_and_the_agent_lives(fakecupti, tmp_path, procs):
    """Garbage on the socket, a frame with NaN latencies, a wrong version: each refused with
    a log line naming it; a well-behaved rank's windows still arrive."""
    port, db = _analyzer(tmp_path, procs)
    sock = tmp_path / "cupti.sock"
    agent_log = _agent(tmp_path, procs, port, sock)
    _worker(tmp_path, procs, fakecupti, 0, sock, "--seconds", "60")

    def raw() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(str(sock))
        return s

    s = raw()
    s.send(pb.LocalMessage(hello=pb.LocalHello(version=7)).SerializeToString())
    assert s.recv(100) == b""                     # refused and closed
    s.close()
    s = raw()
    s.send(pb.LocalMessage(hello=pb.LocalHello(version=1)).SerializeToString())
    assert pb.LocalMessage.FromString(s.recv(10000)).config.mode == "active"
    s.send(b"\xff\xff not protobuf")
    now = time.time_ns()
    nan = pb.ProcessWindow(job_id="cj", rank=9, apis=[pb.ApiStats(
        api="cudaLaunchKernel", count=1, sum_us=float("nan"),
        histogram=pb.Histogram(scheme=1, counts=[1]))])
    s.send(pb.LocalMessage(frame=pb.LocalFrame(start_ns=now - 10**9, end_ns=now,
                                               window=nan)).SerializeToString())
    s.send(pb.LocalMessage(frame=pb.LocalFrame(start_ns=now, end_ns=now - 1,
                                               window=nan)).SerializeToString())
    _wait_for(lambda: "3 bad frames" in agent_log.read_text(), 10, "the bad peer dropped",
              agent_log)
    text = agent_log.read_text()
    assert "version 7 is not 1" in text and "not a LocalMessage" in text and "sum_us" in text
    _wait_for(lambda: len(_cupti_processes(db)) >= 2, 30, "the good rank's windows", agent_log)
    assert all(p.rank == 0 for _, p in _cupti_processes(db))
    s.close()


def test_direct_to_the_analyzer_without_an_agent(fakecupti, tmp_path, procs):
    port, db = _analyzer(tmp_path, procs)
    _, state = _worker(tmp_path, procs, fakecupti, 3, tmp_path / "nobody.sock", "--seconds",
                       "60", env={"HYPERTRACE_ANALYZER": f"127.0.0.1:{port}",
                                  "HYPERTRACE_INSECURE": "1", "HYPERTRACE_NODE": "pod-7",
                                  "HYPERTRACE_WINDOW": str(WINDOW_S),
                                  "HYPERTRACE_SPOOL_DIR": str(tmp_path / "spool")})
    rows = _wait_for(lambda: [r for r in _cupti_processes(db) if r[1].overhead.sampled], 40,
                     "a sampled window sent directly", tmp_path / "worker-3.log")
    w, p = rows[0]
    assert w.node == "pod-7" and w.agent_id.startswith("pod-7/cupti-") and p.rank == 3
    assert _state(state)["mode"] == "direct"


def test_run_starts_the_backend_in_the_child(fakecupti, fakecuda, tmp_path, procs):
    """`hypertrace cupti run -- python ...` starts the backend at interpreter start, lazily:
    nothing is loaded until the process loads the CUDA driver (here the stand-in
    libcuda.so.1), so a launcher or a data-loader worker that never uses CUDA is left alone."""
    state = tmp_path / "state.json"
    out = subprocess.run(
        hypertrace("cupti", "run", "--socket", str(tmp_path / "none.sock"), "--",
                   sys.executable, str(WORKER), "--fakecupti", str(fakecupti), "--state",
                   str(state), "--seconds", "6", "--no-start", "--load-after", "1.5",
                   str(fakecuda.cuda)),
        env=dict(os.environ, HYPERTRACE_CUPTI_LIB=str(fakecupti)), capture_output=True,
        text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = _state(state)
    assert doc["modes_seen"][0] == "waiting_for_cuda", doc
    assert doc["mode"] == "no_agent" and "cudaLaunchKernel" in doc["apis"], doc
    assert "no agent at" in out.stderr


def test_a_forked_child_has_no_backend(fakecupti, monkeypatch):
    """A data-loader worker forked from a probed process has no backend thread; it must not
    think it has one (state() None, start() possible)."""
    from hypertrace.daemon import cupti
    monkeypatch.setenv("HYPERTRACE_CUPTI_LIB", str(fakecupti))
    monkeypatch.setenv("HYPERTRACE_CUPTI_SOCKET", "/nonexistent/cupti.sock")
    cupti.start()
    try:
        assert cupti.state() is not None
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"none" if cupti.state() is None else b"some")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 10) == b"none"
    finally:
        cupti.stop()


# -- the agent's socket, against misbehaving local processes ------------------------------------
def _hub_for(tmp_path, grace_s: float = 1.0):
    from hypertrace.daemon.inprocess import InProcessHub
    sock = tmp_path / "hub.sock"
    return InProcessHub(str(sock), pb.LocalConfig(window_s=WINDOW_S), standby=False,
                        grace_s=grace_s).start(), sock


def _raw(sock: Path, hello: bool = True) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(str(sock))
    if hello:
        s.send(pb.LocalMessage(hello=pb.LocalHello(version=1, pid=os.getpid()))
               .SerializeToString())
        assert pb.LocalMessage.FromString(s.recv(10000)).config.mode == "active"
    return s


def _frame(job: str, end_ns: int) -> bytes:
    from hypertrace.proto.wire import api_stats_from_ns
    pw = pb.ProcessWindow(job_id=job, rank=0, local_rank=0, gpu_index=0,
                          apis=[api_stats_from_ns("cudaLaunchKernel", np.full(50, 9000.0))])
    return pb.LocalMessage(frame=pb.LocalFrame(start_ns=end_ns - int(WINDOW_S * 1e9),
                                               end_ns=end_ns, window=pw)).SerializeToString()


def _wait_peers(hub, n: int) -> None:
    _wait_for(lambda: len(hub.peers()) >= n, 5, f"{n} connected peers")


def _peer_and_window(hub, sock: Path) -> tuple[socket.socket, int, int]:
    """A connected backend (this process), and the window that just ended: (socket, end, len)."""
    s = _raw(sock)
    _wait_peers(hub, 1)
    w_ns = int(WINDOW_S * 1e9)
    return s, time.time_ns() // w_ns * w_ns, w_ns


def test_a_process_that_stops_reading_cannot_block_the_agent(tmp_path):
    """Pause requests pile up on a process that never reads its socket: the agent is told
    'not reached' and goes on; it never waits on that process."""
    import threading
    hub, sock = _hub_for(tmp_path)
    try:
        s = _raw(sock)
        _wait_peers(hub, 1)
        done = threading.Event()
        results: list[list[int]] = []

        def spam():
            for _ in range(5000):
                results.append(hub.control(pause=True))
            done.set()
        threading.Thread(target=spam, daemon=True).start()
        assert done.wait(20), "control() blocked on a peer that does not read"
        assert results[0] == [os.getpid()] and results[-1] == []   # its buffer filled up
        s.close()
    finally:
        hub.close()


def test_silent_connections_do_not_delay_the_others(tmp_path):
    hub, sock = _hub_for(tmp_path, grace_s=3.0)
    try:
        silent = [_raw(sock, hello=False) for _ in range(8)]      # never say hello
        good, end, w_ns = _peer_and_window(hub, sock)
        good.send(_frame("cj", end))
        t0 = time.monotonic()
        taken = hub.take(end - w_ns, end)
        assert [t.frame.window.job_id for t in taken] == ["cj"]
        assert time.monotonic() - t0 < 2.0
        for s in silent + [good]:
            s.close()
    finally:
        hub.close()


def test_a_process_cannot_report_itself_into_another_job(tmp_path):
    """The frame says job 'victim'; the agent sees the sender and attributes it from its own
    /proc/PID/environ reading, which names no job: the frame's claim is not used."""
    from hypertrace.collector.attribution import attribute_pid
    hub, sock = _hub_for(tmp_path)
    try:
        s, end, w_ns = _peer_and_window(hub, sock)
        s.send(_frame("victim", end))
        taken = hub.take(end - w_ns, end)
        assert taken and taken[0].visible and taken[0].pid == os.getpid()
        window = pb.NodeWindow()
        hub.merge(window, taken, lambda pid: attribute_pid(pid, "n1", ("HT_TEST_NO_SUCH_JOB",)))
        assert window.processes[0].job_id == f"unattributed:n1:{os.getpid()}"
        s.close()
    finally:
        hub.close()


def test_the_last_window_of_a_process_that_exits_is_kept(tmp_path):
    hub, sock = _hub_for(tmp_path)
    try:
        s, end, w_ns = _peer_and_window(hub, sock)
        s.send(_frame("cj", end))
        s.close()                                   # sent its final window and exited
        _wait_for(lambda: not hub.peers(), 5, "the disconnect")
        taken = hub.take(end - w_ns, end, wait=False)
        assert [t.frame.window.job_id for t in taken] == ["cj"]
    finally:
        hub.close()


def test_a_restarted_backend_reuses_its_slots(fakecupti):
    """stop(); start() in one process maps the same APIs again: the recorder (loaded once per
    process) must give back the slots it had, not run out of them."""
    r = _recorder(fakecupti)
    for _ in range(5):
        for name, kind in (("cudaLaunchKernel", "launch"), ("cudaStreamSynchronize", "sync"),
                           ("cuLaunchKernelEx", "launch"), ("hypertrace_step", "marker")):
            r.add_api(name, kind)
    assert r.slots == {"cudaLaunchKernel": 0, "cudaStreamSynchronize": 1, "hypertrace_step": 3}
    assert not r.add_api("cuLaunchKernelEx", "launch")      # still unknown to this CUPTI
