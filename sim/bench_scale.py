"""`make bench-scale`: one analyzer ingesting a 16,384-GPU job (2,048 nodes x 8) over real gRPC.

What runs:

1. ``hypertrace analyzer`` as a **subprocess** on a free localhost port, with a fresh SQLite
   database (``synchronous=FULL`` by default: every acked window survives power loss). Being a
   separate process, its CPU time and memory are read from ``/proc/PID/stat`` and ``status``:
   cores used = CPU seconds / wall seconds over the measured epochs (ingest, storage, scoring and
   storing verdicts, everything the analyzer does).
2. A cheap load generator in this process. Node windows come from the simulator
   (:mod:`hypertrace.sim.simulate`, one node 30% slow), generated **once** for a pool of at
   most 2,048 nodes x a few windows and serialized without their header. Per send only the header
   (agent id, node, seq, start, end: a few dozen bytes) is serialized and prepended: protobuf
   concatenation is field merge, so ``header + body`` is exactly the bytes of the whole window.
   Jobs larger than the pool reuse the pool's bodies under new node names (the analyzer's cost
   does not depend on which histogram a row holds).
3. **Real pacing, no time compression.** Agents align windows on wall-clock multiples of the
   window length (daemon/agent.py), so every node's window of epoch k ends at the same instant
   and all of them arrive in a burst just after it. Each simulated node sends its window at
   ``boundary + d_i``, ``d_i`` fixed per node and uniform in ``[0, spread)`` (clock skew plus the
   agent's read time). The analyzer scores an epoch ``grace_seconds`` after its end: to keep up it
   must ingest the whole burst within the grace, and score and store it before the next one.
4. Windows travel on ``streams`` long-lived gRPC streams (over ``channels`` connections), each
   carrying many nodes' windows: that keeps the generator cheap on a 2-core machine. With
   ``--agent-streams`` they travel as real agents send them instead: every simulated node has its
   own connection and one stream on it, which it closes after ``--idle-close-s`` with nothing to
   send (default ``IDLE_CLOSE_S``, the uplink's value, longer than a window: one open stream per
   node; a value under the window length opens a new stream for every window, as agents did
   before). grpc.aio in the generator keeps its side cheap; the analyzer's grpc.aio server holds
   no thread per stream. The generator runs in ``--generator-procs`` processes
   (:mod:`hypertrace.sim.scale_load`), each sending for an interleaved slice of the nodes and
   pinned to ``--generator-cores``, while ``--analyzer-cores`` pins the analyzer; the open-file
   limit is raised to its hard limit (a connection per agent is a descriptor on each side).
5. After the paced run, a **blast**: two further epochs' windows sent as fast as the generator
   can, which measures the maximum ingest rate (each window fully stored and ingested).
6. A **ramp** of larger jobs (fewer epochs each) until one does not keep up.

Figures (from the database after the analyzer stopped, so nothing is estimated from the client):

* latency ``window received -> its epoch's verdicts stored``: ``windows.received_ns`` against the
  ``created_ns`` of the epoch's row in ``epochs`` (stored with its verdicts). It includes the grace by design; the part beyond
  ``epoch end + grace`` is reported separately (the analyzer's own delay);
* late windows: received after their epoch was scored (counted, never scored: a miss);
* exactly once: windows stored == sent == acked, no duplicate acks (a window whose stream failed
  before its ack is sent again on a new stream, as the uplink does, and counted as resent; only
  its ack may say duplicate);
* SQLite bytes per hour: database size after a WAL checkpoint / epochs covered x epochs per hour.
* the CPU of the analyzer's child processes (its retention process, below multiprocessing's
  forkserver), read from /proc apart from the analyzer's own: what the retention costs the host
  off the analyzer's interpreter lock. ``--analyzer-args`` passes further analyzer flags (a
  shorter ``--retention-every-s`` / ``--compact-after-s`` puts a short run in compaction's
  steady state); ``--base-analyzer-args`` runs this tree with and without further flags side
  by side (``--base-analyzer-args=--no-retention-process``: the pass in the analyzer's thread).

Acks are timed at the generator (wall clock, per window): write -> ack, and the ack against its
epoch's ``end + grace`` (the goal below), and the generator's own lag behind its schedule.

"Keeps up" means: every window acked and stored once, no late window, the analyzer's delay
beyond the grace under one window length at p99, at most ``--goal-cores`` cores (default 1; the
analyzer's process and its child processes together) and,
with ``--goal-ack-beyond-grace S``, the p99 ack at most S seconds after ``end + grace``. Each
check is printed; the exit status is 1 when one fails.

The one-analyzer goal, 131,072 GPUs (16,384 agents, one stream each, 10 s windows), on a 16-core
host: the analyzer on 4 cores, the generator in 12 processes on the other 12::

    python -m hypertrace.sim.bench_scale --nodes 16384 --agent-streams --ramp "" \\
        --epochs 6 --warmup 2 --generator-procs 12 --generator-cores 4-15 \\
        --analyzer-cores 0-3 --goal-cores 1.5 --goal-ack-beyond-grace 2

(It needs an open-file hard limit above 16,384 plus a few hundred: ``ulimit -Hn``. The run
prints the limit in force and the generator's lag behind its schedule; a lag of more than a
few hundred ms means the generator, not the analyzer, is the bottleneck: add processes.)
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hypertrace.daemon.uplink import IDLE_CLOSE_S
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.demo import stop_process
from hypertrace.sim.machine import cpu_model
from hypertrace.sim.proc_memory import TreeMemory, descendants, tree_pss
from hypertrace.sim.scale_load import LoadProcesses, Plan, WindowPool, WorkerResult, raise_fd_limit
from hypertrace.sim.simulate import SimConfig, Straggler, generate

CLI = [sys.executable, "-m", "hypertrace.cli.main"]
JOB_ID = "scale-job"
SLOW_NODE = "node-0001"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- configuration and results ------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleConfig:
    """One paced run of ``nodes`` simulated agents against one fresh analyzer."""

    nodes: int = 2048
    gpus_per_node: int = 8
    window_seconds: float = 10.0
    grace_seconds: float = 5.0
    flush_interval: float = 1.0
    warmup_epochs: int = 2
    epochs: int = 10                  # measured epochs after the warm-up
    spread_seconds: float = 2.0       # arrival spread of one epoch's windows after its end
    streams: int = 32
    channels: int = 4
    agent_streams: bool = False       # one connection per node, one stream per window
    idle_close_s: float = IDLE_CLOSE_S  # agent-streams: a stream closes this long after its ack
    pool_nodes: int = 2048            # distinct simulated node bodies (reused beyond)
    pool_windows: int = 3
    slow_factor: float = 1.30
    seed: int = 7
    synchronous: str = "FULL"
    blast_epochs: int = 2             # 0: no max-rate phase
    generator_procs: int = 1          # load generator processes, each a slice of the nodes
    generator_cores: tuple[int, ...] = ()   # CPUs for the generators (one each when enough)
    analyzer_cores: tuple[int, ...] = ()    # CPUs the analyzer is pinned to (empty: any)
    goal_cores: float = 1.0           # keeps up: the analyzer's cores at most this
    #: keeps up: p99 of (ack time - (epoch end + grace)) at the generator at most this (None:
    #: not checked)
    goal_ack_beyond_grace_s: float | None = None
    #: where the analyzer subprocess imports ``hypertrace`` from (PYTHONPATH; a directory that
    #: holds a ``hypertrace`` source tree): another commit, measured side by side with this one
    analyzer_path: str = ""
    #: further flags of ``hypertrace analyzer`` (e.g. a shorter retention interval)
    analyzer_args: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def __post_init__(self) -> None:
        if self.nodes < 4:
            raise ValueError("--nodes must be >= 4 (the analyzer needs a cross-section)")
        if self.spread_seconds >= self.window_seconds:
            raise ValueError("--spread must be shorter than the window")
        if self.epochs < 1 or self.warmup_epochs < 0:
            raise ValueError("--epochs must be >= 1 and --warmup >= 0")
        if self.generator_procs < 1:
            raise ValueError("--generator-procs must be >= 1")


@dataclass
class ScaleResult:
    nodes: int
    gpus: int
    windows_sent: int = 0
    windows_acked: int = 0
    duplicate_acks: int = 0           # of windows sent once (a resend's may say duplicate)
    resent_windows: int = 0           # sent again after their stream failed before the ack
    streams_opened: int = 0           # agent streams opened (--agent-streams)
    windows_stored: int = 0
    epochs_scored: int = 0
    late_windows: int = 0
    stream_errors: list[str] = field(default_factory=list)
    measured_wall_s: float = 0.0
    cpu_cores: float = 0.0
    child_cpu_cores: float = 0.0      # the analyzer's child processes (Engine, checkers, retention)
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    #: PSS of the analyzer's processes together (sim/proc_memory.py), at the end of the
    #: measured epochs, and the most any sample read (one after each measured epoch and one
    #: after the generators finished)
    pss_mb: float = 0.0
    peak_pss_mb: float = 0.0
    pss_main_mb: float = 0.0          # of which the main process
    pss_processes: int = 0            # how many processes (main + every one below it)
    sustained_wps: float = 0.0        # offered paced load: nodes / window length
    max_wps: float | None = None
    latency_p50_s: float = float("nan")
    latency_p99_s: float = float("nan")
    latency_max_s: float = float("nan")
    beyond_grace_p99_s: float = float("nan")
    db_bytes: int = 0
    db_bytes_per_hour: float = 0.0
    window_payload_bytes: float = 0.0
    verdict_rows_per_epoch: float = 0.0
    stragglers: list[str] = field(default_factory=list)
    #: the stragglers as of each scored epoch, keyed by the epoch's place after the first
    #: measured epoch (so runs that started at different times compare)
    stragglers_at: dict[int, list[str]] = field(default_factory=dict)
    window_seconds: float = 10.0
    measured_windows: int = 0         # windows of the measured epochs (CPU per window)
    # at the generator, over the measured epochs' windows
    ack_p50_s: float = float("nan")   # write -> ack
    ack_p99_s: float = float("nan")
    ack_max_s: float = float("nan")
    ack_beyond_grace_p99_s: float = float("nan")   # ack - (epoch end + grace)
    send_lag_p99_s: float = float("nan")   # the generator's lag behind its schedule
    generator_cpu_s: float = 0.0
    generator_procs: int = 1
    fd_limit: int = 0
    goal_cores: float = 1.0
    goal_ack_beyond_grace_s: float | None = None

    @property
    def cpu_ms_per_window(self) -> float:
        """The analyzer's CPU per window over the measured epochs: ingest, storage, scoring and
        storing verdicts, everything it did, divided by the windows it received."""
        if not self.measured_windows:
            return float("nan")
        return self.cpu_cores * self.measured_wall_s / self.measured_windows * 1e3

    @property
    def child_cpu_ms_per_window(self) -> float:
        """The CPU per window of the analyzer's child processes (its retention process and
        multiprocessing's forkserver), over the same epochs: spent on the host, off the
        analyzer process's interpreter lock."""
        if not self.measured_windows:
            return float("nan")
        return self.child_cpu_cores * self.measured_wall_s / self.measured_windows * 1e3

    @property
    def total_cores(self) -> float:
        """The analyzer's process and its child processes (the Engine's worker, the window
        checkers, the retention process): what the host spends on it."""
        return self.cpu_cores + self.child_cpu_cores

    @property
    def exactly_once(self) -> bool:
        return (self.windows_sent == self.windows_acked == self.windows_stored
                and self.duplicate_acks == 0 and not self.stream_errors)

    def checks(self) -> list[tuple[str, bool]]:
        """(what, passed) for every condition of "keeps up"."""
        out = [("exactly once", self.exactly_once),
               ("no late window", self.late_windows == 0),
               (f"analyzer cores, its child processes included, {self.total_cores:.3f} <= "
                f"{self.goal_cores:g}", self.total_cores <= self.goal_cores),
               (f"verdicts p99 beyond end+grace {self.beyond_grace_p99_s:.2f} s < one window",
                bool(np.isfinite(self.beyond_grace_p99_s))
                and self.beyond_grace_p99_s < self.window_seconds)]
        if self.goal_ack_beyond_grace_s is not None:
            out.append((f"ack p99 beyond end+grace {self.ack_beyond_grace_p99_s:.2f} s <= "
                        f"{self.goal_ack_beyond_grace_s:g} s",
                        bool(np.isfinite(self.ack_beyond_grace_p99_s))
                        and self.ack_beyond_grace_p99_s <= self.goal_ack_beyond_grace_s))
        return out

    @property
    def keeps_up(self) -> bool:
        return all(ok for _, ok in self.checks())


# ---- the analyzer subprocess and /proc ----------------------------------------------------------

@dataclass(frozen=True)
class ProcSample:
    cpu_s: float
    rss_kb: int
    hwm_kb: int


def read_proc(pid: int) -> ProcSample:
    """CPU seconds (user + system, all threads) and RSS / peak RSS of a running process."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        # the command name may contain spaces: fields start after the last ')'
        fields = fh.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK     # utime, stime (fields 14, 15)
    rss = hwm = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return ProcSample(cpu, rss, hwm)


def children_cpu_s(pid: int) -> float:
    """CPU seconds of the processes running below ``pid`` now (a child that already ended is
    not counted: read it before stopping the analyzer)."""
    total = 0.0
    for kid in descendants(pid):
        try:
            total += read_proc(kid).cpu_s
        except (OSError, ValueError, IndexError):
            pass                         # ended between the two reads
    return total


def server_workers(cfg: ScaleConfig) -> int:
    """The analyzer's --max-workers for this load: one thread per stream that can be open at
    once, which an analyzer with grpc's sync server (an older tree under ``--compare-with``)
    needs; the grpc.aio one runs only queries on them. An agent reuses its open stream, so a
    node holds at most one."""
    if cfg.agent_streams:
        return cfg.nodes + 64
    return max(64, cfg.streams * cfg.channels + 16)


def start_analyzer(cfg: ScaleConfig, workdir: Path,
                   timeout: float = 60.0) -> tuple[subprocess.Popen, str, Path]:
    """Start ``hypertrace analyzer`` on a free port; returns (process, target, db path).

    Its output goes to a file, not a pipe: a pipe nobody reads would block a chatty analyzer.
    """
    db = workdir / "analyzer.db"
    log_path = workdir / "analyzer.log"
    env = dict(os.environ)
    if cfg.analyzer_path:
        env["PYTHONPATH"] = os.pathsep.join(
            [cfg.analyzer_path] + [p for p in [env.get("PYTHONPATH", "")] if p])
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            CLI + ["analyzer", "--listen", "127.0.0.1:0", "--db", str(db), "--insecure",
                   "--window-seconds", str(cfg.window_seconds),
                   "--grace-seconds", str(cfg.grace_seconds),
                   "--flush-interval", str(cfg.flush_interval),
                   "--synchronous", cfg.synchronous,
                   "--max-workers", str(server_workers(cfg)), *cfg.analyzer_args],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
            # pinned before it starts: thread pools sized at import (OpenBLAS's) see its CPUs
            preexec_fn=(lambda: os.sched_setaffinity(0, set(cfg.analyzer_cores)))
            if cfg.analyzer_cores else None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"listening on \S+:(\d+)", log_path.read_text())
        if m:
            return proc, f"127.0.0.1:{m.group(1)}", db
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError(f"the analyzer did not start; its output:\n{log_path.read_text()[-2000:]}")


# ---- the load generator -------------------------------------------------------------------------

def make_pool(cfg: ScaleConfig) -> WindowPool:
    """Window bodies of ``min(pool_nodes, nodes)`` simulated nodes (one of them slow) x
    ``pool_windows`` windows, serialized once."""
    n = min(cfg.pool_nodes, cfg.nodes)
    sim = SimConfig(gpus=n * cfg.gpus_per_node, gpus_per_node=cfg.gpus_per_node,
                    windows=cfg.pool_windows, seed=cfg.seed, job_id=JOB_ID,
                    stragglers=(Straggler(SLOW_NODE, cfg.slow_factor),))
    bodies: list[list[bytes]] = [[] for _ in range(cfg.pool_windows)]
    # the bodies are sent as windows of cfg.window_seconds: their time counters are scaled to
    # that length (the analyzer refuses counters longer than the window), their shares kept
    shrink = min(1.0, cfg.window_seconds / sim.window_seconds)
    for w in generate(sim):          # window-major: all nodes of window 0 first
        body = pb.NodeWindow()
        body.processes.extend(w.processes)
        if shrink < 1.0:
            for p in body.processes:
                if p.HasField("sched"):
                    p.sched.window_s *= shrink
                    p.sched.runq_ns = int(p.sched.runq_ns * shrink)
                    p.sched.offcpu_ns = int(p.sched.offcpu_ns * shrink)
                if p.HasField("overhead"):
                    p.overhead.attached_s *= shrink
        bodies[w.seq - 1].append(body.SerializeToString())
    return WindowPool(bodies)


def _sleep_until(t_ns: int) -> None:
    left = (t_ns - time.time_ns()) / 1e9
    if left > 0:
        time.sleep(left)


def _p(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def _from_generators(results: list, cfg: ScaleConfig, plan: Plan, res: ScaleResult) -> None:
    """Counts and ack timing from the generator processes' per-window records."""
    grace_ns = int(round(cfg.grace_seconds * 1e9))
    parts = [r for r in results if isinstance(r, WorkerResult)]
    res.stream_errors = [r for r in results if isinstance(r, str)]
    for r in parts:
        res.stream_errors.extend(r.errors)
    if not parts:
        return
    epoch = np.concatenate([r.epoch for r in parts])
    due = np.concatenate([r.due_ns for r in parts])
    sent = np.concatenate([r.sent_ns for r in parts])
    ack = np.concatenate([r.ack_ns for r in parts])
    res.windows_sent = int((sent > 0).sum())
    res.windows_acked = int((ack > 0).sum())
    res.duplicate_acks = int(sum(int((r.duplicate & (r.resent == 0)).sum()) for r in parts))
    res.resent_windows = int(sum(int((r.resent > 0).sum()) for r in parts))
    res.generator_cpu_s = float(sum(r.cpu_s for r in parts))
    res.streams_opened = int(sum(r.streams_opened for r in parts))
    measured = (epoch >= cfg.warmup_epochs) & (epoch < plan.paced_epochs) & (ack > 0)
    lat = (ack[measured] - sent[measured]) / 1e9
    end = (plan.first_epoch + epoch[measured].astype(np.int64) + 1) * plan.win_ns
    beyond = (ack[measured] - end - grace_ns) / 1e9
    lag = (sent[measured] - due[measured]) / 1e9
    res.ack_p50_s, res.ack_p99_s = _p(lat, 50), _p(lat, 99)
    res.ack_max_s = float(lat.max()) if len(lat) else float("nan")
    res.ack_beyond_grace_p99_s = _p(beyond, 99)
    res.send_lag_p99_s = _p(lag, 99)
    blast = (epoch >= plan.paced_epochs)
    if blast.any() and (ack[blast] > 0).all():
        span = (ack[blast].max() - plan.blast_at_ns) / 1e9
        res.max_wps = int(blast.sum()) / span if span > 0 else None


# ---- one run ------------------------------------------------------------------------------------

def run_scale(cfg: ScaleConfig, workdir: Path, pool: WindowPool | None = None,
              progress=print) -> ScaleResult:
    """Run one paced load against a fresh analyzer; see the module docstring."""
    pool = pool or make_pool(cfg)
    pool_file = workdir / "pool.pickle"
    pool.save(str(pool_file))
    res = ScaleResult(nodes=cfg.nodes, gpus=cfg.gpus, window_seconds=cfg.window_seconds,
                      goal_cores=cfg.goal_cores,
                      goal_ack_beyond_grace_s=cfg.goal_ack_beyond_grace_s,
                      generator_procs=cfg.generator_procs, fd_limit=raise_fd_limit())
    win_ns = int(round(cfg.window_seconds * 1e9))
    rng = np.random.default_rng(cfg.seed)
    delays = rng.uniform(0.0, cfg.spread_seconds * 1e9, cfg.nodes).astype(np.int64)
    order = [int(i) for i in np.argsort(delays, kind="stable")]
    if res.fd_limit < cfg.nodes + 512:
        progress(f"  WARNING: open-file limit {res.fd_limit:,} is below {cfg.nodes:,} agents' "
                 "connections; raise the hard limit (ulimit -Hn) or expect refused connections")
    proc, target, db = start_analyzer(cfg, workdir)
    gen: LoadProcesses | None = None
    try:
        gen = LoadProcesses(target, str(pool_file), order, delays, cfg.generator_procs,
                            cfg.agent_streams, cfg.streams, cfg.idle_close_s, cfg.channels,
                            cfg.generator_cores)
        paced = cfg.warmup_epochs + cfg.epochs
        plan = Plan(0, paced, cfg.blast_epochs, win_ns, 0)
        t = time.monotonic()
        gen.connect(plan)
        progress(f"  {gen.procs} generator processes connected in {time.monotonic() - t:.1f} s")
        # first epoch: the next one that ends at least half a window from now
        first = (time.time_ns() + win_ns // 2) // win_ns
        measured = range(first + cfg.warmup_epochs, first + paced)
        # the blast starts once the measured epochs' work is over (see below)
        plan = replace(plan, first_epoch=first, blast_at_ns=(measured.stop + 1) * win_ns,
                       ack_timeout_s=60.0 + (120.0 if cfg.blast_epochs else 0.0))
        gen.start(plan)
        # epoch e's work (its burst at its end, scoring at end + grace) lies in
        # [(e+1) W, (e+2) W): measure exactly the measured epochs' periods
        _sleep_until((measured.start + 1) * win_ns)
        before, t0 = read_proc(proc.pid), time.monotonic()
        kids_before = children_cpu_s(proc.pid)
        memory: list[TreeMemory] = []
        for k in range(cfg.epochs):
            _sleep_until((measured.start + 2 + k) * win_ns)
            memory.append(tree_pss(proc.pid))
            progress(f"  measured epoch {k + 1}/{cfg.epochs} done")
        after = read_proc(proc.pid)
        kids_after = children_cpu_s(proc.pid)
        res.measured_wall_s = time.monotonic() - t0
        res.cpu_cores = (after.cpu_s - before.cpu_s) / res.measured_wall_s
        res.child_cpu_cores = max(0.0, kids_after - kids_before) / res.measured_wall_s
        res.sustained_wps = cfg.nodes / cfg.window_seconds
        res.measured_windows = cfg.nodes * cfg.epochs
        _from_generators(gen.results(timeout=plan.ack_timeout_s + cfg.idle_close_s + 120.0),
                         cfg, plan, res)
        final = read_proc(proc.pid)
        res.rss_mb, res.peak_rss_mb = final.rss_kb / 1024, final.hwm_kb / 1024
        last = memory[-1] if memory else tree_pss(proc.pid)
        memory.append(tree_pss(proc.pid))
        res.pss_mb, res.pss_main_mb = last.total_mb, last.main_mb
        res.pss_processes = last.processes
        res.peak_pss_mb = max(m.total_mb for m in memory)
    finally:
        if gen is not None:
            gen.close()
        stop_process(proc, timeout=60)
    _from_database(db, cfg, measured, res)
    return res


def _compacted_rows(conn: sqlite3.Connection, win_ns: int) -> np.ndarray:
    """(start, end, received) of the windows a retention pass moved into blocks during a long
    run (their rows are in ``compacted``, which keeps the end and the time received, and in
    older files the start too)."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(compacted)")}
    if "start_ns" in cols and "received_ns" in cols:
        sql = "SELECT start_ns, end_ns, received_ns FROM compacted"
    elif "received_after_ns" in cols:
        sql = f"SELECT end_ns - {win_ns}, end_ns, end_ns + received_after_ns FROM compacted"
    else:
        return np.zeros((0, 3), np.int64)
    return np.array(conn.execute(sql).fetchall(), dtype=np.int64).reshape(-1, 3)


def _from_database(db: Path, cfg: ScaleConfig, measured: range, res: ScaleResult) -> None:
    """Latency, late windows, size and verdicts, read from the stopped analyzer's database."""
    win_ns = int(round(cfg.window_seconds * 1e9))
    grace_ns = int(round(cfg.grace_seconds * 1e9))
    conn = sqlite3.connect(str(db))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = np.array(conn.execute("SELECT start_ns, end_ns, received_ns FROM windows")
                        .fetchall(), dtype=np.int64).reshape(-1, 3)
        rows = np.concatenate([rows, _compacted_rows(conn, win_ns)])
        res.windows_stored = len(rows)
        res.window_payload_bytes = float(conn.execute(
            "SELECT AVG(LENGTH(payload)) FROM windows").fetchone()[0] or 0.0)
        scored = dict(conn.execute("SELECT epoch, created_ns FROM epochs WHERE job_id = ?",
                                   (JOB_ID,)).fetchall())
        res.epochs_scored = len(scored)
        n_verdicts = int(conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])
        res.verdict_rows_per_epoch = n_verdicts / max(1, len(scored))
        for e in sorted(scored):
            res.stragglers_at[e - measured.start] = sorted({r[0] for r in conn.execute(
                "SELECT node, verdict, MAX(epoch) FROM verdicts WHERE job_id = ? AND epoch <= ? "
                "GROUP BY node, gpu", (JOB_ID, e)) if r[1] == "straggler"})  # latest change by e
        if scored:
            res.stragglers = res.stragglers_at[max(scored) - measured.start]
    finally:
        conn.close()
    res.db_bytes = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    # all paced and blast epochs are in the file: scale its size by the epochs it covers
    covered = cfg.warmup_epochs + cfg.epochs + cfg.blast_epochs
    res.db_bytes_per_hour = res.db_bytes / covered * (3600.0 / cfg.window_seconds)
    epoch = (rows[:, 0] + rows[:, 1]) // 2 // win_ns
    in_measured = (epoch >= measured.start) & (epoch < measured.stop)
    ep, recv = epoch[in_measured], rows[in_measured, 2]
    scored_at = np.array([scored.get(int(e), -1) for e in ep], dtype=np.int64)
    res.late_windows = int(((scored_at < 0) | (recv > scored_at)).sum())
    ok = scored_at > 0
    if ok.any():
        lat = (scored_at[ok] - recv[ok]) / 1e9
        res.latency_p50_s = float(np.percentile(lat, 50))
        res.latency_p99_s = float(np.percentile(lat, 99))
        res.latency_max_s = float(lat.max())
        beyond = (scored_at[ok] - ((ep[ok] + 1) * win_ns + grace_ns)) / 1e9
        res.beyond_grace_p99_s = float(np.percentile(beyond, 99))


# ---- report -------------------------------------------------------------------------------------

def machine_info() -> str:
    cpu = cpu_model()
    import grpc
    return (f"{cpu}; {os.cpu_count()} CPUs; {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}; grpcio {grpc.__version__}; "
            f"SQLite {sqlite3.sqlite_version}")


def describe(r: ScaleResult) -> str:
    mx = f"{r.max_wps:,.0f}" if r.max_wps else "-"
    return "\n".join([
        f"job: {r.gpus:,} GPUs ({r.nodes:,} nodes x {r.gpus // r.nodes}), "
        f"{r.window_seconds:g} s windows",
        f"windows: sent {r.windows_sent:,}, acked {r.windows_acked:,}, stored "
        f"{r.windows_stored:,}, duplicate acks {r.duplicate_acks}, resent after a failed "
        f"stream {r.resent_windows}, late {r.late_windows}"
        + (f", agent streams opened {r.streams_opened:,}" if r.streams_opened else "")
        + (f", stream errors {r.stream_errors[:3]}" if r.stream_errors else "")
        + f" -> exactly once: {'yes' if r.exactly_once else 'NO'}",
        f"ingest: {r.sustained_wps:,.1f} windows/s offered (paced, in bursts"
        f" after each window end), max {mx} windows/s",
        f"analyzer CPU: {r.cpu_cores:.3f} cores over {r.measured_wall_s:.0f} s "
        f"({r.cpu_ms_per_window:.3f} ms per window); RSS "
        f"{r.rss_mb:,.0f} MB, peak {r.peak_rss_mb:,.0f} MB (main process); PSS of all "
        f"{r.pss_processes} processes {r.pss_mb:,.0f} MB (main {r.pss_main_mb:,.0f} MB), peak "
        f"sampled {r.peak_pss_mb:,.0f} MB; its child processes (Engine, checkers, retention): "
        f"{r.child_cpu_cores:.3f} cores ({r.child_cpu_ms_per_window:.3f} ms per window)",
        f"acks at the generator ({r.generator_procs} processes, {r.generator_cpu_s:.0f} CPU s, "
        f"fd limit {r.fd_limit:,}): write -> ack p50 {r.ack_p50_s:.3f} s, p99 "
        f"{r.ack_p99_s:.3f} s, max {r.ack_max_s:.3f} s; ack beyond end+grace p99 "
        f"{r.ack_beyond_grace_p99_s:+.2f} s; generator lag behind schedule p99 "
        f"{r.send_lag_p99_s:.3f} s",
        f"window received -> epoch verdicts stored: p50 {r.latency_p50_s:.2f} s, p99 "
        f"{r.latency_p99_s:.2f} s, max {r.latency_max_s:.2f} s (includes the grace); "
        f"beyond end+grace p99 {r.beyond_grace_p99_s:.2f} s",
        f"SQLite: {r.db_bytes / 1e6:,.1f} MB for {r.epochs_scored} scored epochs, "
        f"{r.window_payload_bytes:,.0f} B per window payload, {r.verdict_rows_per_epoch:,.0f} "
        f"verdict rows (changes) per epoch -> {r.db_bytes_per_hour / 1e9:,.2f} GB per hour",
        f"stragglers in the last epoch: {', '.join(r.stragglers[:10]) or 'none'}",
        *(f"check: {what}: {'ok' if ok else 'FAILED'}" for what, ok in r.checks()),
        f"keeps up: {'YES' if r.keeps_up else 'NO'}",
    ])


def table_row(r: ScaleResult) -> str:
    mx = f"{r.max_wps:,.0f}" if r.max_wps else "-"
    return (f"| {r.gpus:,} | {r.nodes:,} | {r.sustained_wps:,.0f} | {mx} | {r.cpu_cores:.2f} + "
            f"{r.child_cpu_cores:.2f} | "
            f"{r.latency_p99_s:.1f} ({r.beyond_grace_p99_s:+.1f}) | {r.peak_rss_mb:,.0f} | "
            f"{r.pss_mb:,.0f} ({r.pss_processes}) | "
            f"{r.db_bytes_per_hour / 1e9:,.2f} | {r.late_windows} | "
            f"{'yes' if r.keeps_up else 'no'} |")


TABLE_HEAD = ("| GPUs | nodes | windows/s sustained | windows/s max | analyzer cores (+ children) | "
              "p99 latency s (beyond grace) | peak RSS MB (main) | PSS MB, all processes (how many) | "
              "SQLite GB/hour | late | keeps up |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|")


def compare(base: ScaleConfig, head: ScaleConfig, rounds: int, workdir: Path,
            pool: WindowPool) -> int:
    """The same paced run against two analyzers, alternating (base, head, base, head, ...) so
    that both meet the same machine noise: another tree's (``analyzer_path``) or this one with
    other flags (``analyzer_args``) as the base, and this tree as the head; prints the CPU per
    window of each (the analyzer's process, and its child processes apart) and the ratio of their
    medians. Exit status 1 when a run lost a window or the two found different stragglers, or
    when a run of the head failed a check of "keeps up" (the goal flags)."""
    runs: dict[str, list[ScaleResult]] = {"base": [], "head": []}
    for k in range(rounds):
        for label, cfg in (("base", base), ("head", head)):
            (workdir / f"{label}-{k}").mkdir()
            r = run_scale(cfg, workdir / f"{label}-{k}", pool, progress=lambda *_: None)
            runs[label].append(r)
            mx = f"{r.max_wps:,.0f}" if r.max_wps else "-"
            print(f"{label} round {k + 1}: {r.cpu_ms_per_window:.3f} ms CPU per window "
                  f"({r.cpu_cores:.3f} cores; child processes {r.child_cpu_ms_per_window:.3f} "
                  f"ms per window), ack p50 {r.ack_p50_s:.3f} s, peak RSS "
                  f"{r.peak_rss_mb:,.0f} MB, PSS of all {r.pss_processes} processes "
                  f"{r.pss_mb:,.0f} MB, max {mx} windows/s, verdicts p99 beyond grace "
                  f"{r.beyond_grace_p99_s:+.2f} s, ack "
                  f"p99 {r.ack_p99_s:.3f} s ({r.ack_beyond_grace_p99_s:+.2f} s beyond grace), "
                  f"late {r.late_windows}, exactly once "
                  f"{'yes' if r.exactly_once else 'NO'} (sent {r.windows_sent:,}, acked "
                  f"{r.windows_acked:,}, stored {r.windows_stored:,}, resent "
                  f"{r.resent_windows:,}), stragglers {r.stragglers}", flush=True)
            failed = [what for what, ok in r.checks() if not ok]
            if failed:
                print(f"  {label} round {k + 1} failed: {'; '.join(failed)}", flush=True)
    med = {k: float(np.median([r.cpu_ms_per_window for r in v])) for k, v in runs.items()}
    mx = {k: float(np.median([r.max_wps or np.nan for r in v])) for k, v in runs.items()}
    print(f"\nmedian CPU per window: base {med['base']:.3f} ms, head {med['head']:.3f} ms -> "
          f"head/base {med['head'] / med['base']:.3f}")
    kids = {k: float(np.median([r.child_cpu_ms_per_window for r in v])) for k, v in runs.items()}
    print(f"median CPU per window of the child processes: base {kids['base']:.3f} ms, head "
          f"{kids['head']:.3f} ms; both together: base {med['base'] + kids['base']:.3f} ms, head "
          f"{med['head'] + kids['head']:.3f} ms")
    print(f"median max rate: base {mx['base']:,.0f}, head {mx['head']:,.0f} windows/s -> "
          f"head/base {mx['head'] / mx['base']:.3f}")
    ack = {k: float(np.median([r.ack_p99_s for r in v])) for k, v in runs.items()}
    ack50 = {k: float(np.median([r.ack_p50_s for r in v])) for k, v in runs.items()}
    print(f"median ack p50 / p99 at the generator: base {ack50['base']:.3f} / {ack['base']:.3f} "
          f"s, head {ack50['head']:.3f} / {ack['head']:.3f} s")
    late = {k: sum(r.late_windows for r in v) for k, v in runs.items()}
    print(f"late windows in all rounds: base {late['base']}, head {late['head']}")
    rss = {k: float(np.median([r.peak_rss_mb for r in v])) for k, v in runs.items()}
    print(f"median peak RSS (main process): base {rss['base']:,.0f} MB, head "
          f"{rss['head']:,.0f} MB")
    pss = {k: float(np.median([r.pss_mb for r in v])) for k, v in runs.items()}
    print(f"median PSS of all the analyzer's processes: base {pss['base']:,.0f} MB, head "
          f"{pss['head']:,.0f} MB -> head/base {pss['head'] / pss['base']:.3f}")
    all_runs = runs["base"] + runs["head"]
    once = all(r.exactly_once for r in all_runs)
    print(f"every run exactly once: {'yes' if once else 'NO'}")
    same, epoch = same_stragglers(all_runs)
    print(f"same stragglers in every run as of measured epoch {epoch} (the last every run "
          f"scored): {'yes' if same else 'NO'}")
    head_ok = all(r.keeps_up for r in runs["head"])
    print(f"head keeps up (every check, every round): {'YES' if head_ok else 'NO'}")
    return 0 if once and same and head_ok else 1


def same_stragglers(runs: list[ScaleResult]) -> tuple[bool, int | None]:
    """Whether every run named the same stragglers as of the last epoch all of them scored, and
    that epoch (its place after the first measured one). Why that epoch and not each run's last:
    a run that falls behind scores fewer epochs before it is stopped, and the stragglers it names
    then are those of an earlier epoch (persistence convicts over several). No common epoch:
    (False, None)."""
    common = set.intersection(*(set(r.stragglers_at) for r in runs)) if runs else set()
    if not common:
        return False, None
    epoch = max(common)
    return len({tuple(r.stragglers_at[epoch]) for r in runs}) == 1, epoch


def _cpu_list(text: str) -> tuple[int, ...]:
    """``0-3,8`` -> (0, 1, 2, 3, 8), as taskset writes CPU lists."""
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_scale",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048, help="main run (default 2048 = 16,384 GPUs)")
    ap.add_argument("--epochs", type=int, default=10, help="measured epochs of the main run")
    ap.add_argument("--ramp", default="3072,4096,8192",
                    help="node counts tried after the main run, until one does not keep up "
                    "(empty: no ramp)")
    ap.add_argument("--ramp-epochs", type=int, default=4)
    ap.add_argument("--streams", type=int, default=32,
                    help="shared long-lived streams carrying all nodes' windows (default 32)")
    ap.add_argument("--agent-streams", action="store_true",
                    help="send as real agents do: one connection per node, one stream on it, "
                    "closed when idle for --idle-close-s")
    ap.add_argument("--idle-close-s", type=float, default=IDLE_CLOSE_S,
                    help="--agent-streams: an agent's stream closes after this many seconds "
                    f"with nothing to send (default {IDLE_CLOSE_S:g}, the agent's)")
    ap.add_argument("--spread", type=float, default=2.0,
                    help="seconds over which one epoch's windows arrive after its end")
    ap.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    ap.add_argument("--quick", action="store_true",
                    help="256 nodes, 2 s windows, 4 epochs, no ramp: a smoke run in ~30 s")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--compare-with", metavar="DIR", default="",
                    help="side by side: alternate the main run between the analyzer imported "
                    "from DIR (a directory holding a hypertrace source tree, e.g. `git archive` "
                    "of another commit) and this one; prints CPU per window and their ratio "
                    "(no ramp)")
    ap.add_argument("--base-analyzer-args", default="", metavar="FLAGS",
                    help="side by side as --compare-with, the base being this tree's analyzer "
                    "with these further flags, e.g. --base-analyzer-args=--no-retention-process "
                    "(with =: the value starts with a dash; no ramp)")
    ap.add_argument("--analyzer-args", default="", metavar="FLAGS",
                    help="further flags of every analyzer run, e.g. "
                    "--analyzer-args=\"--retention-every-s 10 --compact-after-s 20\" for the "
                    "retention's steady state in a short run")
    ap.add_argument("--rounds", type=int, default=2,
                    help="--compare-with, --base-analyzer-args: runs of each side")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up epochs of the main run (default 2)")
    ap.add_argument("--generator-procs", type=int, default=1,
                    help="load generator processes, each sending for a slice of the nodes")
    ap.add_argument("--generator-cores", type=_cpu_list, default=(),
                    help="CPUs for the generator processes, e.g. 4-15 (one each when there are "
                    "enough)")
    ap.add_argument("--analyzer-cores", type=_cpu_list, default=(),
                    help="CPUs the analyzer process is pinned to, e.g. 0-3")
    ap.add_argument("--goal-cores", type=float, default=1.0,
                    help="keeps up only with at most this many analyzer cores (default 1)")
    ap.add_argument("--goal-ack-beyond-grace", type=float, default=None, metavar="S",
                    help="keeps up only when the p99 ack, measured at the generator, comes at "
                    "most S seconds after its epoch's end + grace")
    args = ap.parse_args(argv)
    load = dict(idle_close_s=args.idle_close_s, generator_procs=args.generator_procs,
                analyzer_args=tuple(shlex.split(args.analyzer_args)),
                generator_cores=args.generator_cores,
                analyzer_cores=args.analyzer_cores, goal_cores=args.goal_cores,
                goal_ack_beyond_grace_s=args.goal_ack_beyond_grace)

    if args.quick:
        cfg = ScaleConfig(nodes=256, window_seconds=2.0, grace_seconds=1.0, flush_interval=0.25,
                          warmup_epochs=1, epochs=4, spread_seconds=0.5, pool_windows=2,
                          streams=min(args.streams, 16), synchronous=args.synchronous,
                          agent_streams=args.agent_streams, **load)
        ramp: list[int] = []
    else:
        cfg = ScaleConfig(nodes=args.nodes, epochs=args.epochs, streams=args.streams,
                          spread_seconds=args.spread, synchronous=args.synchronous,
                          agent_streams=args.agent_streams,
                          # every agent opening a second stream at once is not what agents do
                          # (they send one window per window length): no max-rate phase
                          blast_epochs=0 if args.agent_streams else 2, **load)
        if args.warmup is not None:
            cfg = replace(cfg, warmup_epochs=args.warmup)
        ramp = [int(x) for x in args.ramp.split(",") if x.strip()]
    if args.compare_with or args.base_analyzer_args:
        ramp = []
    print(f"== machine: {machine_info()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="hypertrace-scale-"))
    results: list[ScaleResult] = []
    try:
        t = time.monotonic()
        pool = make_pool(replace(cfg, nodes=max([cfg.nodes] + ramp)))
        print(f"== pool: {pool.nodes} nodes x {pool.windows} windows generated and serialized in "
              f"{time.monotonic() - t:.1f} s", flush=True)
        print(f"== main run: {cfg.gpus:,} GPUs, {cfg.warmup_epochs} warm-up + {cfg.epochs} "
              f"measured epochs of {cfg.window_seconds:g} s, SQLite synchronous="
              f"{cfg.synchronous}; transport: "
              + ("one connection and one stream per agent (--agent-streams)"
                 if cfg.agent_streams else f"{cfg.streams} shared streams"), flush=True)
        if args.compare_with:
            print(f"== side by side: base = the analyzer from {args.compare_with}, head = this "
                  f"tree; {args.rounds} rounds, alternating", flush=True)
            base = replace(cfg, analyzer_path=str(Path(args.compare_with).resolve()))
            return compare(base, cfg, args.rounds, tmp, pool)
        if args.base_analyzer_args:
            extra = tuple(shlex.split(args.base_analyzer_args))
            print(f"== side by side: base = this tree with {' '.join(extra)}, head = this tree; "
                  f"{args.rounds} rounds, alternating", flush=True)
            return compare(replace(cfg, analyzer_args=cfg.analyzer_args + extra), cfg,
                           args.rounds, tmp, pool)
        (tmp / "main").mkdir()
        main_res = run_scale(cfg, tmp / "main", pool)
        results.append(main_res)
        print(describe(main_res), flush=True)
        for n in ramp:
            rc = replace(cfg, nodes=n, warmup_epochs=1, epochs=args.ramp_epochs, blast_epochs=0)
            print(f"\n== ramp: {rc.gpus:,} GPUs ({n:,} nodes), {rc.epochs} measured epochs",
                  flush=True)
            (tmp / f"ramp-{n}").mkdir()
            r = run_scale(rc, tmp / f"ramp-{n}", pool, progress=lambda *_: None)
            results.append(r)
            print(describe(r), flush=True)
            if not r.keeps_up:
                break
        largest = max((r.gpus for r in results if r.keeps_up), default=0)
        print("\n" + TABLE_HEAD)
        for r in results:
            print(table_row(r))
        print(f"\nlargest job kept up with: {largest:,} GPUs "
              f"(tried up to {max(r.gpus for r in results):,})")
        return 0 if main_res.keeps_up else 1
    except KeyboardInterrupt:
        print("bench-scale: interrupted", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"work directory kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
