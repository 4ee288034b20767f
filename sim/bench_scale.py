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
   own connection and opens a new stream for each window, closing it ``IDLE_CLOSE_S`` (2 s, the
   uplink's value) after the ack: about one open stream per node around every window boundary
   (grpc.aio in the generator keeps its side cheap; the analyzer's grpc.aio server holds no
   thread per stream).
5. After the paced run, a **blast**: two further epochs' windows sent as fast as the generator
   can, which measures the maximum ingest rate (each window fully stored and ingested).
6. A **ramp** of larger jobs (fewer epochs each) until one does not keep up.

Figures (from the database after the analyzer stopped, so nothing is estimated from the client):

* latency ``window received -> its epoch's verdicts stored``: ``windows.received_ns`` against the
  ``created_ns`` of the epoch's row in ``epochs`` (stored with its verdicts). It includes the grace by design; the part beyond
  ``epoch end + grace`` is reported separately (the analyzer's own delay);
* late windows: received after their epoch was scored (counted, never scored: a miss);
* exactly once: windows stored == sent == acked, no duplicate acks;
* SQLite bytes per hour: database size after a WAL checkpoint / epochs covered x epochs per hour.

"Keeps up" means: every window acked and stored once, no late window, the analyzer's delay
beyond the grace under one window length at p99, and under one core of CPU.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import queue
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from hypertrace.sim.demo import stop_process
from hypertrace.sim.machine import cpu_model
from hypertrace.sim.simulate import SimConfig, Straggler, generate
from hypertrace.daemon.uplink import IDLE_CLOSE_S
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import STREAM_METHOD, WIRE_VERSION

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
    #: where the analyzer subprocess imports ``hypertrace`` from (PYTHONPATH; a directory that
    #: holds a ``hypertrace`` source tree): another commit, measured side by side with this one
    analyzer_path: str = ""

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


@dataclass
class ScaleResult:
    nodes: int
    gpus: int
    windows_sent: int = 0
    windows_acked: int = 0
    duplicate_acks: int = 0
    windows_stored: int = 0
    epochs_scored: int = 0
    late_windows: int = 0
    stream_errors: list[str] = field(default_factory=list)
    measured_wall_s: float = 0.0
    cpu_cores: float = 0.0
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
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
    window_seconds: float = 10.0
    measured_windows: int = 0         # windows of the measured epochs (CPU per window)

    @property
    def cpu_ms_per_window(self) -> float:
        """The analyzer's CPU per window over the measured epochs: ingest, storage, scoring and
        storing verdicts, everything it did, divided by the windows it received."""
        if not self.measured_windows:
            return float("nan")
        return self.cpu_cores * self.measured_wall_s / self.measured_windows * 1e3

    @property
    def exactly_once(self) -> bool:
        return (self.windows_sent == self.windows_acked == self.windows_stored
                and self.duplicate_acks == 0 and not self.stream_errors)

    @property
    def keeps_up(self) -> bool:
        return (self.exactly_once and self.late_windows == 0 and self.cpu_cores < 1.0
                and np.isfinite(self.beyond_grace_p99_s)
                and self.beyond_grace_p99_s < self.window_seconds)


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


def server_workers(cfg: ScaleConfig) -> int:
    """The analyzer's --max-workers for this load: one thread per stream that can be open at
    once, which an analyzer with grpc's sync server (an older tree under ``--compare-with``)
    needs; the grpc.aio one runs only queries on them. Agents' streams outlive their window by
    ``idle_close_s``, so with windows shorter than that a node holds more than one."""
    if cfg.agent_streams:
        return cfg.nodes * (1 + math.ceil(cfg.idle_close_s / cfg.window_seconds)) + 64
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
                   "--max-workers", str(server_workers(cfg))],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
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

class WindowPool:
    """Pre-serialized window bodies; a send costs one small header serialization.

    ``body(node, k)`` is the serialized NodeWindow of pool node ``node % pool`` in pool window
    ``k % windows`` with only ``processes`` set; :meth:`window` prepends the header fields.
    """

    def __init__(self, cfg: ScaleConfig):
        n = min(cfg.pool_nodes, cfg.nodes)
        sim = SimConfig(gpus=n * cfg.gpus_per_node, gpus_per_node=cfg.gpus_per_node,
                        windows=cfg.pool_windows, seed=cfg.seed, job_id=JOB_ID,
                        stragglers=(Straggler(SLOW_NODE, cfg.slow_factor),))
        self.nodes = n
        self.windows = cfg.pool_windows
        self._bodies: list[list[bytes]] = [[] for _ in range(cfg.pool_windows)]
        for w in generate(sim):          # window-major: all nodes of window 0 first
            body = pb.NodeWindow()
            body.processes.extend(w.processes)
            self._bodies[w.seq - 1].append(body.SerializeToString())

    def window(self, node: int, seq: int, start_ns: int, end_ns: int) -> bytes:
        name = f"node-{node:04d}" if node < 10_000 else f"node-{node}"
        head = pb.NodeWindow(version=WIRE_VERSION, agent_id=f"sim-{name}", node=name, seq=seq)
        head.start.FromNanoseconds(start_ns)
        head.end.FromNanoseconds(end_ns)
        return head.SerializeToString() + self._bodies[seq % self.windows][node % self.nodes]


class _Stream:
    """One long-lived Ingest stream fed from a queue; counts acks in its own thread."""

    def __init__(self, channel, name: str):
        import grpc

        self._grpc = grpc
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.acks = 0
        self.duplicates = 0
        self.last_ack = 0.0
        self.error: str | None = None
        self._call = channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                           response_deserializer=pb.Ack.FromString)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _requests(self) -> Iterator[bytes]:
        while True:
            item = self.q.get()
            if item is None:
                return
            yield item

    def _run(self) -> None:
        try:
            for ack in self._call(self._requests()):
                self.acks += 1
                self.duplicates += int(ack.duplicate)
                self.last_ack = time.monotonic()
        except self._grpc.RpcError as exc:
            self.error = f"{exc.code().name}: {exc.details()}"

    def close(self) -> None:
        self.q.put(None)


class _Generator:
    """What run_scale needs of a load generator: ``send``, counters and :meth:`wait_acked`."""

    sent: int
    acked: int
    errors: list[str]

    def wait_acked(self, n: int, timeout: float) -> bool:
        """Block until ``n`` windows are acked; False on timeout or a stream error."""
        deadline = time.monotonic() + timeout
        while self.acked < n:
            if time.monotonic() > deadline or self.errors:
                return False
            time.sleep(0.01)
        return True


class LoadGenerator(_Generator):
    """``streams`` streams over ``channels`` connections; node i always uses the same stream."""

    def __init__(self, target: str, streams: int, channels: int):
        import grpc

        self._channels = [grpc.insecure_channel(
            target, options=[("grpc.max_send_message_length", 16 * 1024 * 1024)])
            for _ in range(channels)]
        for ch in self._channels:
            grpc.channel_ready_future(ch).result(timeout=30)
        self.streams = [_Stream(self._channels[i % channels], f"load-{i}")
                        for i in range(streams)]
        self.sent = 0

    def send(self, node: int, payload: bytes) -> None:
        self.streams[node % len(self.streams)].q.put(payload)
        self.sent += 1

    @property
    def acked(self) -> int:
        return sum(s.acks for s in self.streams)

    @property
    def duplicates(self) -> int:
        return sum(s.duplicates for s in self.streams)

    @property
    def last_ack(self) -> float:
        return max(s.last_ack for s in self.streams)

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.streams if s.error]

    def close(self) -> None:
        for s in self.streams:
            s.close()
        for s in self.streams:
            s.thread.join(timeout=30)
        for ch in self._channels:
            ch.close()


class AgentStreamsGenerator(_Generator):
    """Sends like real agents: one connection per node, a new stream per window, closed
    ``idle_close`` seconds after its ack (daemon/uplink.py). Same interface as
    :class:`LoadGenerator`. One asyncio loop (grpc.aio) in a background thread drives all of
    them, so thousands of concurrent streams cost the generator no thread each."""

    def __init__(self, target: str, idle_close: float):
        import asyncio

        self._asyncio = asyncio
        self._target = target
        self._idle_close = idle_close
        self._channels: dict[int, object] = {}
        self.sent = self.acked = self.duplicates = 0
        self.last_ack = 0.0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-streams",
                                        daemon=True)
        self._thread.start()
        self._pending: set = set()

    def _channel(self, node: int):
        from grpc import aio

        ch = self._channels.get(node)
        if ch is None:
            ch = self._channels[node] = aio.insecure_channel(self._target)
        return ch

    async def _one(self, node: int, payload: bytes) -> None:
        import grpc

        call = self._channel(node).stream_stream(
            STREAM_METHOD, request_serializer=None, response_deserializer=pb.Ack.FromString)()
        try:
            await call.write(payload)
            ack = await call.read()
            with self._lock:
                self.acked += 1
                self.duplicates += int(ack.duplicate)
                self.last_ack = time.monotonic()
            await self._asyncio.sleep(self._idle_close)
            await call.done_writing()
            await call
        except grpc.RpcError as exc:
            with self._lock:
                self.errors.append(f"node {node}: {exc.code().name}: {exc.details()}")

    def send(self, node: int, payload: bytes) -> None:
        fut = self._asyncio.run_coroutine_threadsafe(self._one(node, payload), self._loop)
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        self.sent += 1

    def close(self) -> None:
        for fut in list(self._pending):
            try:
                fut.result(timeout=self._idle_close + 30)
            except Exception as exc:          # noqa: BLE001 - recorded, the run reports it
                self.errors.append(f"stream did not finish: {exc!r}")

        async def _close_all() -> None:
            for ch in self._channels.values():
                await ch.close()

        self._asyncio.run_coroutine_threadsafe(_close_all(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def _sleep_until(t_ns: int) -> None:
    left = (t_ns - time.time_ns()) / 1e9
    if left > 0:
        time.sleep(left)


def send_epoch(gen: "LoadGenerator | AgentStreamsGenerator", pool: WindowPool, nodes: Sequence[int], delays_ns: np.ndarray,
               epoch: int, seq: int, win_ns: int, paced: bool) -> None:
    """Every node's window of ``epoch``; paced: node i at ``epoch end + delays_ns[i]``."""
    start, end = epoch * win_ns, (epoch + 1) * win_ns
    for node in nodes:                       # ``nodes`` is sorted by delay
        if paced:
            _sleep_until(end + int(delays_ns[node]))
        gen.send(node, pool.window(node, seq, start, end))


# ---- one run ------------------------------------------------------------------------------------

def run_scale(cfg: ScaleConfig, workdir: Path, pool: WindowPool | None = None,
              progress=print) -> ScaleResult:
    """Run one paced load against a fresh analyzer; see the module docstring."""
    pool = pool or WindowPool(cfg)
    res = ScaleResult(nodes=cfg.nodes, gpus=cfg.gpus, window_seconds=cfg.window_seconds)
    win_ns = int(round(cfg.window_seconds * 1e9))
    rng = np.random.default_rng(cfg.seed)
    delays = rng.uniform(0.0, cfg.spread_seconds * 1e9, cfg.nodes)
    order = [int(i) for i in np.argsort(delays, kind="stable")]
    proc, target, db = start_analyzer(cfg, workdir)
    gen: LoadGenerator | AgentStreamsGenerator | None = None
    try:
        gen = (AgentStreamsGenerator(target, cfg.idle_close_s) if cfg.agent_streams
               else LoadGenerator(target, cfg.streams, cfg.channels))
        # first epoch: the next one that ends at least half a window from now
        first = (time.time_ns() + win_ns // 2) // win_ns
        measured = range(first + cfg.warmup_epochs, first + cfg.warmup_epochs + cfg.epochs)
        seq = 0
        before: ProcSample | None = None
        t0 = 0.0
        for k in range(cfg.warmup_epochs + cfg.epochs):
            epoch = first + k
            seq += 1
            if epoch == measured.start:
                # epoch e's work (its burst at its end, scoring at end + grace) lies in
                # [(e+1) W, (e+2) W): measure exactly the measured epochs' periods
                _sleep_until((epoch + 1) * win_ns)
                before, t0 = read_proc(proc.pid), time.monotonic()
            send_epoch(gen, pool, order, delays, epoch, seq, win_ns, paced=True)
            progress(f"  epoch {k + 1}/{cfg.warmup_epochs + cfg.epochs}: {gen.sent} sent, "
                     f"{gen.acked} acked")
        _sleep_until((measured.stop + 1) * win_ns)
        after = read_proc(proc.pid)
        res.measured_wall_s = time.monotonic() - t0
        gen.wait_acked(gen.sent, timeout=30)
        assert before is not None
        res.cpu_cores = (after.cpu_s - before.cpu_s) / res.measured_wall_s
        res.sustained_wps = cfg.nodes / cfg.window_seconds
        res.measured_windows = cfg.nodes * cfg.epochs

        if cfg.blast_epochs:
            n0 = gen.acked
            t_blast = time.monotonic()
            for b in range(cfg.blast_epochs):
                seq += 1
                send_epoch(gen, pool, order, delays, measured.stop + 1 + b, seq, win_ns,
                           paced=False)
            ok = gen.wait_acked(gen.sent, timeout=120)
            last = gen.last_ack
            if ok and last > t_blast:
                res.max_wps = (gen.acked - n0) / (last - t_blast)
        final = read_proc(proc.pid)
        res.rss_mb, res.peak_rss_mb = final.rss_kb / 1024, final.hwm_kb / 1024
        res.windows_sent, res.windows_acked = gen.sent, gen.acked
        res.duplicate_acks = gen.duplicates
        res.stream_errors = list(gen.errors)
    finally:
        if gen is not None:
            gen.close()
        stop_process(proc, timeout=60)
    _from_database(db, cfg, measured, res)
    return res


def _from_database(db: Path, cfg: ScaleConfig, measured: range, res: ScaleResult) -> None:
    """Latency, late windows, size and verdicts, read from the stopped analyzer's database."""
    win_ns = int(round(cfg.window_seconds * 1e9))
    grace_ns = int(round(cfg.grace_seconds * 1e9))
    conn = sqlite3.connect(str(db))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        res.windows_stored = int(conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0])
        res.window_payload_bytes = float(conn.execute(
            "SELECT AVG(LENGTH(payload)) FROM windows").fetchone()[0] or 0.0)
        scored = dict(conn.execute("SELECT epoch, created_ns FROM epochs WHERE job_id = ?",
                                   (JOB_ID,)).fetchall())
        res.epochs_scored = len(scored)
        n_verdicts = int(conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])
        res.verdict_rows_per_epoch = n_verdicts / max(1, len(scored))
        rows = np.array(conn.execute("SELECT start_ns, end_ns, received_ns FROM windows")
                        .fetchall(), dtype=np.int64).reshape(-1, 3)
        last = max(scored) if scored else None
        if last is not None:
            res.stragglers = sorted({r[0] for r in conn.execute(   # the latest change by then
                "SELECT node, verdict, MAX(epoch) FROM verdicts WHERE job_id = ? AND epoch <= ? "
                "GROUP BY node, gpu", (JOB_ID, last)) if r[1] == "straggler"})
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
        f"{r.windows_stored:,}, duplicate acks {r.duplicate_acks}, late {r.late_windows}"
        + (f", stream errors {r.stream_errors[:3]}" if r.stream_errors else "")
        + f" -> exactly once: {'yes' if r.exactly_once else 'NO'}",
        f"ingest: {r.sustained_wps:,.1f} windows/s offered (paced, in bursts"
        f" after each window end), max {mx} windows/s",
        f"analyzer CPU: {r.cpu_cores:.3f} cores over {r.measured_wall_s:.0f} s; RSS "
        f"{r.rss_mb:,.0f} MB, peak {r.peak_rss_mb:,.0f} MB",
        f"window received -> epoch verdicts stored: p50 {r.latency_p50_s:.2f} s, p99 "
        f"{r.latency_p99_s:.2f} s, max {r.latency_max_s:.2f} s (includes the grace); "
        f"beyond end+grace p99 {r.beyond_grace_p99_s:.2f} s",
        f"SQLite: {r.db_bytes / 1e6:,.1f} MB for {r.epochs_scored} scored epochs, "
        f"{r.window_payload_bytes:,.0f} B per window payload, {r.verdict_rows_per_epoch:,.0f} "
        f"verdict rows (changes) per epoch -> {r.db_bytes_per_hour / 1e9:,.2f} GB per hour",
        f"stragglers in the last epoch: {', '.join(r.stragglers[:10]) or 'none'}",
        f"keeps up (< 1 core, no late window, exactly once): {'YES' if r.keeps_up else 'NO'}",
    ])


def table_row(r: ScaleResult) -> str:
    mx = f"{r.max_wps:,.0f}" if r.max_wps else "-"
    return (f"| {r.gpus:,} | {r.nodes:,} | {r.sustained_wps:,.0f} | {mx} | {r.cpu_cores:.2f} | "
            f"{r.latency_p99_s:.1f} ({r.beyond_grace_p99_s:+.1f}) | {r.peak_rss_mb:,.0f} | "
            f"{r.db_bytes_per_hour / 1e9:,.2f} | {r.late_windows} | "
            f"{'yes' if r.keeps_up else 'no'} |")


TABLE_HEAD = ("| GPUs | nodes | windows/s sustained | windows/s max | analyzer cores | "
              "p99 latency s (beyond grace) | peak RSS MB | SQLite GB/hour | late | keeps up |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|")


def compare(cfg: ScaleConfig, base_path: str, rounds: int, workdir: Path,
            pool: WindowPool) -> int:
    """The same paced run against the analyzer of ``base_path`` and of this tree, alternating
    (base, head, base, head, ...) so that both meet the same machine noise; prints the CPU per
    window of each and the ratio of their medians. Exit status 1 when a run lost a window or the
    two found different stragglers."""
    runs: dict[str, list[ScaleResult]] = {"base": [], "head": []}
    for k in range(rounds):
        for label, path in (("base", base_path), ("head", "")):
            (workdir / f"{label}-{k}").mkdir()
            r = run_scale(replace(cfg, analyzer_path=path), workdir / f"{label}-{k}", pool,
                          progress=lambda *_: None)
            runs[label].append(r)
            mx = f"{r.max_wps:,.0f}" if r.max_wps else "-"
            print(f"{label} round {k + 1}: {r.cpu_ms_per_window:.3f} ms CPU per window "
                  f"({r.cpu_cores:.3f} cores), peak RSS {r.peak_rss_mb:,.0f} MB, max {mx} "
                  f"windows/s, p99 beyond grace "
                  f"{r.beyond_grace_p99_s:+.2f} s, late {r.late_windows}, exactly once "
                  f"{'yes' if r.exactly_once else 'NO'} (sent {r.windows_sent:,}, acked "
                  f"{r.windows_acked:,}, stored {r.windows_stored:,}), stragglers "
                  f"{r.stragglers}", flush=True)
    med = {k: float(np.median([r.cpu_ms_per_window for r in v])) for k, v in runs.items()}
    mx = {k: float(np.median([r.max_wps or np.nan for r in v])) for k, v in runs.items()}
    print(f"\nmedian CPU per window: base {med['base']:.3f} ms, head {med['head']:.3f} ms -> "
          f"head/base {med['head'] / med['base']:.3f}")
    print(f"median max rate: base {mx['base']:,.0f}, head {mx['head']:,.0f} windows/s -> "
          f"head/base {mx['head'] / mx['base']:.3f}")
    rss = {k: float(np.median([r.peak_rss_mb for r in v])) for k, v in runs.items()}
    print(f"median peak RSS: base {rss['base']:,.0f} MB, head {rss['head']:,.0f} MB")
    all_runs = runs["base"] + runs["head"]
    ok = (all(r.exactly_once for r in all_runs)
          and len({tuple(r.stragglers) for r in all_runs}) == 1)
    print(f"every run exactly once, same stragglers: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


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
                    help="send as real agents do: one connection per node, a new stream per "
                    "window closed 2 s after its ack")
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
    ap.add_argument("--rounds", type=int, default=2, help="--compare-with: runs of each side")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up epochs of the main run (default 2)")
    args = ap.parse_args(argv)

    if args.quick:
        cfg = ScaleConfig(nodes=256, window_seconds=2.0, grace_seconds=1.0, flush_interval=0.25,
                          warmup_epochs=1, epochs=4, spread_seconds=0.5, pool_windows=2,
                          streams=min(args.streams, 16), synchronous=args.synchronous,
                          agent_streams=args.agent_streams)
        ramp: list[int] = []
    else:
        cfg = ScaleConfig(nodes=args.nodes, epochs=args.epochs, streams=args.streams,
                          spread_seconds=args.spread, synchronous=args.synchronous,
                          agent_streams=args.agent_streams,
                          # every agent opening a second stream at once is not what agents do
                          # (they send one window per window length): no max-rate phase
                          blast_epochs=0 if args.agent_streams else 2)
        if args.warmup is not None:
            cfg = replace(cfg, warmup_epochs=args.warmup)
        ramp = [int(x) for x in args.ramp.split(",") if x.strip()]
    if args.compare_with:
        ramp = []
    print(f"== machine: {machine_info()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="hypertrace-scale-"))
    results: list[ScaleResult] = []
    try:
        t = time.monotonic()
        pool = WindowPool(replace(cfg, nodes=max([cfg.nodes] + ramp)))
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
            return compare(cfg, str(Path(args.compare_with).resolve()), args.rounds, tmp, pool)
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
