"""The analyzer's gRPC server: Ingest.Stream, Query.GetReport/ListJobs and the health service.

Why the ingest handler takes raw bytes: a window that is not even valid protobuf must end the
stream with INVALID_ARGUMENT and a message saying so. grpc's own deserializer would turn that into
an opaque INTERNAL error, so Ingest is registered with an identity deserializer and the bytes are
parsed, size-checked and validated (``proto.wire.accept_window``: a bad process entry is
dropped and counted, the rest of the window kept) here, or in the window checkers' processes
(``checker_processes``, analyzer/scale/check_process.py), which answer the same.

Per window: validate -> store durably in SQLite -> Ack(seq); the Engine is fed from the queue of
stored windows. The server is grpc.aio: every Ingest stream is a coroutine on one event loop
(validation runs there), so one stream per agent costs no thread (sim/bench_transport.py
measures why). Accepted windows of all streams wait on the loop and go to the store's thread
together, one commit per group (:class:`_StoreQueue`): one hop between the loop and a thread per
group, not per window.

A window whose ``(agent_id, seq)`` is already stored is acked with ``duplicate=true`` and not fed
again, so agents may replay their spool freely. An invalid window aborts only that stream; the server keeps
serving everything else.

Who may call what (:class:`Access`, proto/transport.py): on a TLS listener every client presents
a certificate; an ``agent/<node>`` certificate may stream windows of ``<node>`` only, and reports
need ``reader`` or ``admin``. A window for another node ends the stream with PERMISSION_DENIED
before anything is stored. A plaintext listener (``insecure``) identifies nobody and says so in
its log.

The Engine is not thread-safe: :class:`Analyzer` guards it with one lock, which ingest never
waits for (a stored window is queued and fed to the Engine by the background pass). A background
thread scores complete epochs every ``flush_interval`` seconds (and GetReport flushes first)
and stores the results; another has the retention pass run in a worker process
(analyzer/scale/retention_process.py). The Engine itself may run in a worker process of its own
(``engine_process``, analyzer/scale/engine_process.py): the queue then goes there as stored bytes, and
scoring and reports hold that process's interpreter lock, not the event loop's. On start the
stored windows are replayed into a fresh Engine (analyzer/store/replay.py), so a restarted analyzer
resumes with the history it had.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque
from concurrent import futures
from typing import Any, AsyncIterator, Callable, Protocol

import grpc

from hypertrace.analyzer.ingest.checks import Access, Refused, authorize, check_window
from hypertrace.analyzer.ingest.commit_hold import CATCH_UP_S, CommitHold
from hypertrace.analyzer.ingest.engines import Engine, LocalEngine
from hypertrace.analyzer.ingest.loop_groups import LoopGroups
from hypertrace.analyzer.ingest.nodes import SEED_SPAN_S, NodeTable
from hypertrace.analyzer.ingest.quotas import AgentQuotas
from hypertrace.analyzer.ingest.roster import SlurmRoster
from hypertrace.analyzer.report.metrics import AnalyzerMetrics, JobCollector
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import (
    ConflictingDuplicate,
    Storage,
    StorageCorrupt,
    StorageError,
)
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.window_parts import WindowHeader
from hypertrace.proto.wire import INGEST_SERVICE, MAX_CLOCK_SKEW_S

log = logging.getLogger(__name__)

QUERY_SERVICE = pb.DESCRIPTOR.services_by_name["Query"].full_name


class ServerError(RuntimeError):
    """The server cannot start (port taken, bad address); the message says how to fix it."""


#: Windows handed to the Engine in one call (to its worker process: one message, about 3.4 KB
#: a window).
FEED_BATCH = 512
#: The interpreter's switch interval in the analyzer (s; Python's default 0.005): how long the
#: event loop may wait for the GIL while another thread scores or feeds the Engine.
SWITCH_INTERVAL_S = 0.0005
#: A scoring pass longer than this is logged with where its time went (s).
SLOW_PASS_S = 1.0
#: How long /healthz waits for the gRPC event loop to answer (s).
LIVE_TIMEOUT_S = 5.0
#: How often the evictor re-reviews a job whose convicted GPUs did not change (ns).
REVIEW_EVERY_NS = 60 * 10**9
#: Default retention of the raw windows (hours) and of their 5-minute summaries (days): about
#: 6.7 GB at rest in all for a 16,384-GPU job, raw windows compacted into epoch blocks
#: (BENCHMARKS.md, "Storage at rest, schema 6").
RETENTION_HOURS = 6.0
SUMMARY_RETENTION_DAYS = 30.0
#: Seconds between retention passes.
RETENTION_EVERY_S = 60.0
#: Default seconds between Engine snapshots (analyzer/store/snapshot.py): a restart replays at most
#: this much of the windows stored before it went down.
SNAPSHOT_SECONDS = 30.0


class Backend(Protocol):
    """What the gRPC server serves: an :class:`Analyzer`, or the cluster mode's edge
    (analyzer/scale/cluster/edge.py), which publishes windows and asks the workers for reports."""

    config: ScoringConfig
    metrics: AnalyzerMetrics
    storage: Any                 # what the server's retention and metrics read (files, prune)
    evictor: Any
    broken: str                  # why ingest stopped, once it did
    #: each node's newest window, for ListNodes and the last-window series (None: not kept)
    nodes: NodeTable | None
    #: whether windows are stored in groups, one commit each (:meth:`ingest_many`)
    groups_commits: bool
    #: whether the event loop must parse whole windows (False: their headers suffice)
    needs_whole_windows: bool

    def ingest(self, w: pb.NodeWindow, payload: bytes | None = None) -> bool: ...

    def ingest_many(self, windows: list[tuple[pb.NodeWindow, bytes | None]]
                    ) -> list[bool | BaseException]: ...

    def flush(self, now_ns: int | None = None) -> int: ...

    def drain(self) -> int: ...

    def report(self, job_id: str | None = None) -> pb.Report: ...

    def list_jobs(self) -> pb.ListJobsResponse: ...

    def job_collector(self) -> Any: ...


class Analyzer:
    """Engine + Storage behind one lock: the state the gRPC handlers share."""

    groups_commits = True

    def __init__(self, storage: Storage, config: ScoringConfig | None = None,
                 engine: Engine | None = None, evictor: Any = None,
                 metrics: AnalyzerMetrics | None = None,
                 snapshot_seconds: float = SNAPSHOT_SECONDS,
                 catch_up_s: float = CATCH_UP_S):
        config = config if config is not None else ScoringConfig()
        self.config = config
        self.storage = storage
        self.evictor = evictor           # analyzer/evict: reviews jobs whose scoring convicted
        self.metrics = metrics or AnalyzerMetrics()   # analyzer/report/metrics.py (served or not)
        #: the scoring, in this process (LocalEngine) or in a worker process (analyzer/scale)
        self.engine: Engine = engine if engine is not None else LocalEngine(config, storage)
        #: what the event loop parses of a checked window (ingest/engines.py)
        self.needs_whole_windows = self.engine.needs_whole_windows
        self._lock = threading.Lock()
        #: stored windows not yet in the Engine: (window, its stored bytes, its id, arrival ns)
        self._inbox: deque[tuple[pb.NodeWindow, bytes, int, int]] = deque()
        #: the id of the newest window fed to the Engine (every one before it was fed too)
        self._fed_upto = 0
        #: scoring waits while the database cannot commit (ingest/commit_hold.py)
        self.hold = CommitHold(int(catch_up_s * 1e9))
        self.replay_pending_max = 0      # most epochs held in memory during the last resume()
        #: seconds between Engine snapshots stored with the results (0: never; analyzer/store/snapshot.py)
        self.snapshot_seconds = snapshot_seconds
        self._snapshot_ns: int | None = None   # the scoring time of the last snapshot taken
        self.resumed_from_snapshot = False   # whether the last resume() started from one
        self.broken = ""                 # why ingest stopped (a corrupt database), once it did
        #: job -> (its convicted GPUs, when the evictor last reviewed it)
        self._reviewed: dict[str, tuple[frozenset, int]] = {}
        #: each node's newest window (analyzer/ingest/nodes.py: `hypertrace nodes`, the last-window series)
        self.nodes = NodeTable(config.window_seconds)

    def resume(self, use_snapshot: bool = True) -> int:
        """Load the stored Engine snapshot, if there is a usable one (and ``use_snapshot``), then
        replay every window stored after it (all of them without one) into the Engine, epoch by
        epoch (analyzer/store/replay.py); returns how many were replayed. So the restarted analyzer
        reaches the verdicts the live one reached."""
        self.nodes.seed(self.storage.newest_by_node(time.time_ns() - int(SEED_SPAN_S * 1e9)))
        with self._lock:
            done = self.engine.replay(use_snapshot)
        self.replay_pending_max = done.pending_max
        self.resumed_from_snapshot = done.from_snapshot
        if done.windows:
            log.info("resumed %d stored windows from %s (at most %d epochs pending)",
                     done.windows, self.storage.path, done.pending_max)
        return done.windows

    def close(self) -> None:
        """End the Engine's worker process, if it has one (its state is all stored)."""
        self.engine.close()

    def ingest(self, w: pb.NodeWindow, payload: bytes | None = None) -> bool:
        """Store a validated window, then queue it for the Engine; False if it was a duplicate.

        The ack waits for the store only, never for the Engine's lock: a report of a 16k-GPU
        job or a scoring pass holds that lock for a second, and every agent's ack would wait
        behind it. The queue is drained (in arrival order) by the background pass, and before
        every flush, report and job list, so they see every window acked before them."""
        out = self.ingest_many([(w, payload)])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def ingest_many(self, windows: list[tuple[pb.NodeWindow, bytes | None]]
                    ) -> list[bool | BaseException]:
        """:meth:`ingest` for a group of windows stored in one commit; per window True (new),
        False (a duplicate) or the exception that refused it."""
        inbox = self._inbox

        def queue(w: pb.NodeWindow, raw: bytes) -> Callable[[int], None]:
            # queued when its commit is done, under the store's lock (deque.append: atomic),
            # so an Engine snapshot can name the newest window the Engine holds (_capture)
            return lambda _id: inbox.append((w, raw, _id, time.time_ns()))

        payloads = [(w, raw if raw is not None else w.SerializeToString()) for w, raw in windows]
        out = self.storage.add_windows([(w, raw, queue(w, raw)) for w, raw in payloads])
        if any(isinstance(o, BaseException)
               and not isinstance(o, (ConflictingDuplicate, StorageCorrupt)) for o in out):
            self.hold.failed(time.time_ns())      # the commit failed: a full disk, I/O
        elif out:
            self.hold.committed(time.time_ns())
        new = sum(1 for o in out if o is True)
        if new:
            self.metrics.received.inc(new)
        if new < len(out):
            dups = sum(1 for o in out if o is False)
            if dups:
                self.metrics.duplicates.inc(dups)
        return out

    def drain(self) -> int:
        """Feed the queued windows to the Engine; a window that turns out late (its epoch was
        scored already) is marked so in the store. Returns how many were fed."""
        late: list[tuple[str, int]] = []
        with self._lock:
            n = self._feed(late)
            self._mark_late(late)
        return n

    def _feed(self, late: list[tuple[str, int]]) -> int:
        """Feed the queue to the Engine in batches (lock held); the late windows go on
        ``late``. An Engine in a worker process takes each batch's bytes while this thread
        waits for its answer without the interpreter lock."""
        n = 0
        inbox = self._inbox
        while inbox:
            batch = [inbox.popleft() for _ in range(min(len(inbox), FEED_BATCH))]
            n += len(batch)
            for i in self.engine.feed(batch):
                late.append((batch[i][0].agent_id, batch[i][0].seq))
            self._fed_upto = max(self._fed_upto, batch[-1][2])
        return n

    def _mark_late(self, late: list[tuple[str, int]]) -> None:
        """Store which fed windows were late; called with the Engine's lock held, so no
        scoring pass can store results between a window's feed and its mark (a replay after a
        kill -9 trusts the marks of every window up to the ``late_marked_upto`` stored with
        the results: analyzer/store/replay.py)."""
        self.storage.mark_late_many(late)
        if late:
            self.metrics.late.inc(len(late))

    def flush(self, now_ns: int | None = None) -> int:
        """Score complete epochs and store the results; returns the number of epochs scored."""
        marks = [time.perf_counter()]             # start, fed, scored, stored, reviewed
        self.drain()
        now = self.hold.scoring_time(now_ns if now_ns is not None else time.time_ns())
        marks.append(time.perf_counter())
        late: list[tuple[str, int]] = []
        captured = None
        with self._lock:
            results = self.engine.flush(now, expire=True) or []
            if results and self._snapshot_due(now):
                captured = self._capture(late)
            self._mark_late(late)
            fed_upto = self._fed_upto
        marks.append(time.perf_counter())
        if results:
            self.metrics.scoring_seconds.observe(marks[2] - marks[1])
            self.metrics.scored.inc(len(results))
            snap = None
            if captured is not None:
                from hypertrace.analyzer.store import snapshot
                snap = snapshot.pack(captured[1], self.config, captured[0], now,
                                     compressed=self.engine.captures_compressed)
            self.storage.add_results(results, created_ns=now, snapshot=snap,
                                     late_marked_upto=fed_upto)
        marks.append(time.perf_counter())
        if self.evictor is not None:
            self._review(results, now)
        marks.append(time.perf_counter())
        if results and marks[-1] - marks[0] > SLOW_PASS_S:
            feed, score, store, review = (b - a for a, b in zip(marks, marks[1:]))
            log.info("scoring pass of %d epochs took %.1f s: feeding the Engine %.1f s, "
                     "scoring%s %.1f s, storing %.1f s, the evictor's review %.1f s",
                     len(results), marks[-1] - marks[0], feed,
                     " and the snapshot" if captured is not None else "", score, store, review)
        return len(results)

    def _snapshot_due(self, now: int) -> bool:
        if self.snapshot_seconds <= 0:
            return False
        last = self._snapshot_ns
        if last is not None and now - last < self.snapshot_seconds * 1e9:
            return False
        self._snapshot_ns = now
        return True

    def _capture(self, late: list[tuple[str, int]]) -> tuple[int, bytes] | None:
        """(id of the newest window the Engine holds, its pickled state); lock held. Commits
        are held off while the queue is fed, so every window up to that id is in the Engine
        and none after it is (Storage.add_window's on_stored)."""
        try:
            # most of the queue is fed while commits go on (a burst still arriving during
            # scoring can leave thousands); held, only what was committed since is fed
            self._feed(late)
            with self.storage.commits_held() as upto:
                self._feed(late)
            return upto, self.engine.capture()
        except Exception:   # a snapshot is an optimisation: never stop scoring for it
            log.exception("Engine snapshot failed; the next one is tried in %g s",
                          self.snapshot_seconds)
            return None

    def _review(self, results: list, now: int) -> None:
        """Hand the report of every job that has a straggler after this pass to the evictor
        (which records its decisions, and acts only under its policy)."""
        convicted: dict[str, frozenset] = {}
        for r in results:                       # the latest epoch of a job counts
            convicted[r.job_id] = frozenset(k for k, v in r.verdicts.items() if v == "straggler")
        jobs = []
        for job_id, nodes in sorted(convicted.items()):
            last = self._reviewed.get(job_id)
            # a job report of 16k GPUs takes about a second under the Engine's lock: build it
            # when the convicted set changed, or once a minute while it stays the same
            if nodes and (last is None or last[0] != nodes or now - last[1] >= REVIEW_EVERY_NS):
                jobs.append(job_id)
                self._reviewed[job_id] = (nodes, now)
            elif not nodes:
                self._reviewed.pop(job_id, None)
        for job_id in jobs:
            with self._lock:     # brief: the evictor reads the flagged nodes and the counts
                report = self.engine.report(job_id, brief=True)
            for job in report.jobs:
                try:
                    self.evictor.review(job, now)
                except Exception:   # the evictor must never stop scoring
                    log.exception("evict: review of job %.64r failed", job_id)
        try:
            self.evictor.act(now)
        except Exception:
            log.exception("evict: acting on approved proposals failed")

    def report(self, job_id: str | None = None) -> pb.Report:
        self.flush()
        with self._lock:
            report = self.engine.report(job_id or None)
        if self.evictor is not None:              # its convictions name the lemon nodes
            try:
                lemons = self.evictor.lemons()
            except Exception:                     # the report goes out without them
                log.exception("evict: lemon nodes unreadable")
                lemons = {}
            for job in report.jobs:
                for node in job.nodes:
                    node.lemon_jobs = lemons.get(node.node, 0)
        return report

    def list_jobs(self) -> pb.ListJobsResponse:
        self.drain()
        with self._lock:
            return self.engine.list_jobs()

    def job_collector(self, refresh_s: float = 15.0, max_gpus: int = 64) -> JobCollector:
        """The per-job and per-GPU series (analyzer/report/metrics.py), read from this analyzer."""
        def jobs() -> list[tuple[str, int]]:
            self.drain()
            with self._lock:
                return self.engine.scored_windows()

        def report(job_id: str) -> pb.JobReport | None:
            with self._lock:     # brief: the series come from the flagged GPUs and the job's
                try:
                    jobs = self.engine.report(job_id, brief=True).jobs
                except KeyError:               # expired between the two looks
                    return None
            return jobs[0] if jobs else None

        def uuids(job_id: str) -> dict[tuple[str, str], str]:
            with self._lock:
                try:
                    return self.engine.gpu_uuids(job_id)
                except KeyError:
                    return {}
        return JobCollector(jobs, report, uuids, refresh_s, max_gpus)


#: Healthy nodes a report lists per job unless all are asked for (nodes come worst first, so
#: the cut only drops healthy ones): a 16k-GPU job's full report runs to megabytes.
HEALTHY_NODES_SHOWN = 100


def cap_healthy_nodes(report: pb.Report, keep: int) -> None:
    """Keep every node that is not healthy and the first ``keep`` healthy ones, per job."""
    for job in report.jobs:
        healthy = [i for i, n in enumerate(job.nodes) if n.verdict == "healthy"]
        drop = healthy[keep:]
        for i in reversed(drop):
            del job.nodes[i]
        job.healthy_nodes_omitted = len(drop)


class _QueryServicer(pb_grpc.QueryServicer):
    def __init__(self, analyzer: Backend, access: Access | None):
        self._a = analyzer
        self._access = access

    def GetReport(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.Report:
        if self._access is not None:
            self._access.require_reader(context)
        try:
            report = self._a.report(request.job_id or None)
            if not request.all_nodes:
                cap_healthy_nodes(report, HEALTHY_NODES_SHOWN)
            return report
        except KeyError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{exc}; list jobs with ListJobs")
        except Exception as exc:
            log.exception("GetReport failed")
            context.abort(grpc.StatusCode.INTERNAL, f"report failed: {exc}")
        raise AssertionError("unreachable")

    def ListNodes(self, request: pb.ListNodesRequest,
                  context: grpc.ServicerContext) -> pb.ListNodesResponse:
        if self._access is not None:
            self._access.require_reader(context)
        nodes = self._a.nodes
        if nodes is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server keeps no table of nodes "
                          "(a cluster edge); ask the analyzer, or watch "
                          "hypertrace_agent_last_window_timestamp_seconds")
        return nodes.listing()

    def ListJobs(self, request: pb.ListJobsRequest,
                 context: grpc.ServicerContext) -> pb.ListJobsResponse:
        if self._access is not None:
            self._access.require_reader(context)
        try:
            return self._a.list_jobs()
        except Exception as exc:
            log.exception("ListJobs failed")
            context.abort(grpc.StatusCode.INTERNAL, f"list jobs failed: {exc}")
        raise AssertionError("unreachable")


def _refusal(analyzer: Analyzer, exc: BaseException, w: pb.NodeWindow,
             on_broken: Callable[[StorageCorrupt], None] | None) -> Refused:
    """How a window the store did not take ends its stream."""
    if isinstance(exc, ConflictingDuplicate):
        log.error("%s", exc)
        return Refused(grpc.StatusCode.ALREADY_EXISTS, "duplicate_conflict", str(exc))
    if isinstance(exc, StorageCorrupt):
        if on_broken is not None:
            on_broken(exc)
        elif not analyzer.broken:
            analyzer.broken = str(exc)
            log.critical("%s", exc)
        return Refused(grpc.StatusCode.UNAVAILABLE, "storage",
                        f"analyzer cannot store windows: {exc}")
    if isinstance(exc, StorageError):
        return Refused(grpc.StatusCode.UNAVAILABLE, "storage",
                        f"analyzer cannot store windows: {exc}")
    # e.g. sqlite3 disk full: the agent keeps it and retries
    log.error("storing window %.64r/%d failed: %r", w.agent_id, w.seq, exc)
    return Refused(grpc.StatusCode.UNAVAILABLE, "storage",
                    f"analyzer cannot store windows right now ({exc}); retry later")


def _store_group(analyzer: Analyzer, windows: list[tuple[pb.NodeWindow, bytes]],
                 on_broken: Callable[[StorageCorrupt], None] | None) -> list[bool | Refused]:
    """Store accepted windows durably in one group: per window True (new), False (a
    duplicate) or the :class:`Refused` that ends its stream. Blocks until the group's commit:
    run in the store's thread."""
    try:
        outs: list[bool | BaseException] = analyzer.ingest_many(windows)
    except Exception as exc:      # the group as a whole failed: every window of it is refused
        log.exception("storing %d windows failed", len(windows))
        outs = [exc] * len(windows)
    return [o if isinstance(o, bool) else _refusal(analyzer, o, w, on_broken)
            for o, (w, _) in zip(outs, windows)]


class _StoreQueue(LoopGroups):
    """The accepted windows of every stream, stored in groups from the event loop
    (analyzer/ingest/loop_groups.py): one store call at a time takes the windows waiting to the
    store's thread and commits them as one group, so the ack still follows the commit that
    holds its window. Windows that arrive during a commit form the next group."""

    def __init__(self, analyzer: Analyzer, pool: futures.Executor,
                 on_broken: Callable[[StorageCorrupt], None] | None):
        super().__init__(
            pool, lambda group: _store_group(analyzer, group, on_broken),
            lambda exc, group: [_refusal(analyzer, exc, w, on_broken) for w, _ in group])

    def store(self, w: pb.NodeWindow, raw: bytes) -> asyncio.Future:
        """A future of the window's outcome: True (new), False (a duplicate) or Refused."""
        return self.submit((w, raw))


def _store_one(analyzer: Any, w: pb.NodeWindow, raw: bytes,
               on_broken: Callable[[StorageCorrupt], None] | None) -> bool | Refused:
    """Store one window through an analyzer that takes windows one by one (the cluster edge,
    which publishes each to JetStream): True (new), False (a duplicate) or its refusal."""
    try:
        return analyzer.ingest(w, raw)
    except Exception as exc:
        return _refusal(analyzer, exc, w, on_broken)


def _drop_jobs(w: Any, raw: bytes, dropped: list, refused: dict[str, Refused]
               ) -> tuple[pb.NodeWindow, bytes, list]:
    """The window without the process entries of the jobs in ``refused`` (a node's quota:
    analyzer/ingest/quotas.py), as a bad entry is dropped: counted in ``rejected_processes``,
    and why in the Ack. ``w`` may be a header only (the checkers' path): the whole window is
    parsed for this rare case."""
    whole = w if isinstance(w, pb.NodeWindow) else pb.NodeWindow.FromString(raw)
    keep = [p for p in whole.processes if p.job_id not in refused]
    gone = len(whole.processes) - len(keep)
    why = next(iter(refused.values())).details
    del whole.processes[:]
    whole.processes.extend(keep)
    whole.rejected_processes += gone
    log.warning("window %.64r/%d: dropped %d process entries of %d jobs: %s", whole.agent_id,
                whole.seq, gone, len(refused), why)
    return whole, whole.SerializeToString(), dropped + [why] * gone


#: Streams grpc may hold for the server before the Python loop takes them (soft and hard limit
#: of ``grpc.server.max_pending_requests``). Why: grpc.aio takes new calls one at a time, one
#: turn of the event loop each, and grpc's defaults (1,000 soft, 3,000 hard) cancel calls beyond
#: them at random; with a stream per agent opened in the seconds after each window end, a
#: busy loop then had thousands of agents' streams CANCELLED before their first message, and
#: every one of them sent its window again. Waiting in that queue costs the agent latency only.
MAX_PENDING_STREAMS = 1 << 17

#: Threads that run the store: the single-process analyzer sends one group at a time; an
#: analyzer that takes windows one by one (the cluster edge) waits on one thread per window.
STORE_THREADS = 64


def _ingest_handler(analyzer: Backend, access: Access | None, store_pool: futures.Executor,
                    max_skew_s: float = MAX_CLOCK_SKEW_S,
                    on_broken: Callable[[StorageCorrupt], None] | None = None,
                    checkers: Any = None,
                    quotas: AgentQuotas | None = None,
                    roster: SlurmRoster | None = None) -> grpc.GenericRpcHandler:
    """Ingest.Stream on the server's event loop: every stream is a coroutine, not a thread.

    Why: with a thread per stream (grpc's sync server) every window crossed threads twice in
    grpc alone (its poller wakes the stream's thread for the window and again for the ack's
    send), and every agent stream took a pool thread for its lifetime; at one stream per agent
    that cost more than parsing and storing the window (sim/bench_transport.py). Here the
    window is checked on the loop and only the blocking store goes to ``store_pool``, in groups
    (:class:`_StoreQueue`); the ack is sent once the store returned, so after the commit that
    holds the window. With ``checkers`` (analyzer/scale/check_process.py) the window's contents are
    checked in their processes, and the loop parses only what they accepted. ``quotas``
    (analyzer/ingest/quotas.py) bounds what each node may send; None: no bounds (tests).
    ``roster`` (analyzer/ingest/roster.py) refuses a node's windows of a Slurm job that does
    not run on it."""
    store = _StoreQueue(analyzer, store_pool, on_broken) if analyzer.groups_commits else None

    # what the loop parses of a checked window: all of it for an Engine in this process (its
    # queue holds the parsed window), else the header alone (the keys, the clock, the identity,
    # the ack), about a seventh of the time (proto/window_parts.py)
    parse = (pb.NodeWindow.FromString if analyzer.needs_whole_windows
             else WindowHeader.FromString)

    async def accept(raw: bytes, context: Any) -> tuple[pb.NodeWindow, bytes, list]:
        size = len(raw)
        if checkers is None:
            w, raw, dropped, shape = check_window(raw, context, access, max_skew_s)
        else:
            answer = await checkers.check(raw)
            if answer[0] != "ok":
                _, code, reason, details = answer
                raise Refused(grpc.StatusCode[code], reason, details)
            _, stored, dropped, shape = answer
            if stored is not None:
                raw = stored
            w = parse(raw)
            authorize(w, context, access, max_skew_s)
        refused: dict[str, Refused] = {}
        if roster is not None and shape.jobs:
            if not roster.known(w.node, shape.jobs, time.monotonic()):
                refused = await asyncio.get_running_loop().run_in_executor(
                    store_pool, roster.refusals, w.node, shape.jobs)
            if refused and len(refused) == len(shape.jobs):
                raise next(iter(refused.values()))
            if refused:
                shape = dataclasses.replace(
                    shape, jobs=tuple(j for j in shape.jobs if j not in refused),
                    gpus=tuple(g for g in shape.gpus if g[0] not in refused))
        if quotas is not None:
            refused.update(quotas.admit(w.node, shape, size, time.monotonic()))
        if refused:
            w, raw, dropped = _drop_jobs(w, raw, list(dropped), refused)
            for reason in {r.reason for r in refused.values()}:
                analyzer.metrics.reject(reason)
        if shape.unknown_bytes:
            analyzer.metrics.unknown_fields.inc()
        return w, raw, dropped

    nodes = analyzer.nodes                  # analyzer/ingest/nodes.py (not on a cluster edge)

    async def stream(request_iterator: AsyncIterator[bytes],
                     context: Any) -> AsyncIterator[pb.Ack]:
        loop = asyncio.get_running_loop()
        async for raw in request_iterator:
            try:
                w, raw, dropped = await accept(raw, context)
                if analyzer.broken:       # a damaged file acks nothing more: agents keep it
                    raise Refused(grpc.StatusCode.UNAVAILABLE, "storage",
                                  f"analyzer cannot store windows: {analyzer.broken}")
                new = (await store.store(w, raw) if store is not None else
                       await loop.run_in_executor(store_pool, _store_one, analyzer, w, raw,
                                                  on_broken))
                if isinstance(new, Refused):
                    raise new
                if nodes is not None:
                    nodes.seen(w, new)
            except Refused as refused:
                analyzer.metrics.reject(refused.reason)
                await context.abort(refused.code, refused.details)
                return
            yield pb.Ack(agent_id=w.agent_id, seq=w.seq, duplicate=not new,
                         rejected_processes=len(dropped),
                         rejected_reason=str(dropped[0]) if dropped else "")

    handler = grpc.stream_stream_rpc_method_handler(
        stream, request_deserializer=None, response_serializer=pb.Ack.SerializeToString)
    return grpc.method_handlers_generic_handler(INGEST_SERVICE, {"Stream": handler})
