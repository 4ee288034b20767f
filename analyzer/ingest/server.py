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
import logging
import sys
import threading
from collections import deque
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hypertrace.analyzer.ingest.loop_groups import LoopGroups
from hypertrace.analyzer.report.metrics import AnalyzerMetrics, JobCollector, serve as serve_metrics
from hypertrace.analyzer.ingest.nodes import SEED_SPAN_S, NodeTable
from hypertrace.analyzer.store.storage import (ConflictingDuplicate, Storage, StorageCorrupt,
                                         StorageError)
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.transport import (DEFAULT_TRUST_DOMAIN, TlsFiles, TransportError,
                                        may_send_for, peer_identity, server_credentials)
from hypertrace.proto.window_parts import WindowHeader
from hypertrace.proto.wire import (INGEST_SERVICE, MAX_CLOCK_SKEW_S, MAX_WINDOW_BYTES,
                                   STREAM_METHOD, WireError, accept_window, check_clock, quote)

log = logging.getLogger(__name__)

QUERY_SERVICE = pb.DESCRIPTOR.services_by_name["Query"].full_name


class ServerError(RuntimeError):
    """The server cannot start (port taken, bad address); the message says how to fix it."""


def _default_engine_factory(config: Any) -> Any:
    from hypertrace.analyzer.score.engine import Engine
    return Engine(config)


#: Windows fed to the Engine between two hand-overs of the GIL. Feeding a burst's windows is
#: seconds of Python at 16,384 agents; the event loop, back from waiting on its sockets, would
#: otherwise wait for the interpreter's switch interval at every turn and acks would queue behind
#: the feed. A hand-over when nobody waits costs a system call.
FEED_YIELD_EVERY = 32
#: Windows sent to the Engine's worker process in one message (about 3.4 KB each).
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


class Analyzer:
    """Engine + Storage behind one lock: the state the gRPC handlers share."""

    def __init__(self, storage: Storage, config: Any = None,
                 engine_factory: Callable[[Any], Any] | None = None, evictor: Any = None,
                 metrics: AnalyzerMetrics | None = None,
                 snapshot_seconds: float = SNAPSHOT_SECONDS, engine_process: bool = False):
        if config is None:
            from hypertrace.analyzer.score.config import ScoringConfig
            config = ScoringConfig()
        self.config = config
        self.storage = storage
        self.evictor = evictor           # analyzer/evict: reviews jobs whose scoring convicted
        self.metrics = metrics or AnalyzerMetrics()   # analyzer/report/metrics.py (served or not)
        #: the Engine's worker process (analyzer/scale/engine_process.py), when the Engine runs there
        self.engine_process: Any = None
        if engine_process and engine_factory is None:
            self.engine_process = self._start_engine_process()
        self._engine = (self.engine_process if self.engine_process is not None
                        else (engine_factory or _default_engine_factory)(config))
        self._lock = threading.Lock()
        #: stored windows not yet in the Engine: (window, its stored bytes, its id, arrival ns)
        self._inbox: deque[tuple[pb.NodeWindow, bytes, int, int]] = deque()
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

    def _start_engine_process(self) -> Any:
        """The Engine's worker process, or None (with a log line) where it cannot run: the
        Engine then runs in this process."""
        from hypertrace.analyzer.scale.engine_process import EngineProcess, WorkerUnavailable
        if not isinstance(self.storage, Storage):
            return None
        try:
            return EngineProcess(self.config, str(self.storage.path), self._newest_stored_id,
                                 self.metrics.worker_restarts.labels("engine").inc)
        except WorkerUnavailable as exc:
            log.warning("the Engine runs in this process: %s", exc)
            return None

    def _newest_stored_id(self) -> int:
        with self.storage.commits_held() as upto:
            return upto

    def resume(self, use_snapshot: bool = True) -> int:
        """Load the stored Engine snapshot, if there is a usable one (and ``use_snapshot``), then
        replay every window stored after it (all of them without one) into the Engine, epoch by
        epoch (analyzer/store/replay.py); returns how many were replayed. So the restarted analyzer
        reaches the verdicts the live one reached."""
        from hypertrace.analyzer.store.replay import replay_stored
        if hasattr(self.storage, "newest_by_node"):
            self.nodes.seed(self.storage.newest_by_node(time.time_ns() - int(SEED_SPAN_S * 1e9)))
        with self._lock:
            if self.engine_process is not None:
                done = self.engine_process.replay(use_snapshot)
            else:
                done = replay_stored(self._engine, self.storage, use_snapshot)
        self.replay_pending_max = done.pending_max
        self.resumed_from_snapshot = done.from_snapshot
        if done.windows:
            log.info("resumed %d stored windows from %s (at most %d epochs pending)",
                     done.windows, self.storage.path, done.pending_max)
        return done.windows

    def close(self) -> None:
        """End the Engine's worker process, if it has one (its state is all stored)."""
        if self.engine_process is not None:
            self.engine_process.close()

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
        """Feed the queue to the Engine (lock held); the late windows go on ``late``."""
        if self.engine_process is not None:
            return self._feed_process(late)
        n = 0
        while self._inbox:
            w, _, _, arrived = self._inbox.popleft()
            n += 1
            if n % FEED_YIELD_EVERY == 0:
                time.sleep(0)   # hands the GIL to the event loop if it waits (FEED_YIELD_EVERY)
            try:
                if self._engine.ingest(w, arrived_ns=arrived):
                    late.append((w.agent_id, w.seq))
            except Exception:   # stored already; an engine bug must not stop the others
                log.exception("engine failed on window %.64r/%d (stored, not scored)",
                              w.agent_id, w.seq)
        return n

    def _feed_process(self, late: list[tuple[str, int]]) -> int:
        """:meth:`_feed` to the Engine's worker process: the stored bytes, in batches (lock
        held). This thread waits for each batch's answer without the interpreter lock."""
        n = 0
        inbox = self._inbox
        while inbox:
            batch = [inbox.popleft() for _ in range(min(len(inbox), FEED_BATCH))]
            n += len(batch)
            sent = [(wid, raw, arrived) for _, raw, wid, arrived in batch]
            for i in self.engine_process.ingest_batch(sent):
                late.append((batch[i][0].agent_id, batch[i][0].seq))
        return n

    def _mark_late(self, late: list[tuple[str, int]]) -> None:
        self.storage.mark_late_many(late)
        if late:
            self.metrics.late.inc(len(late))

    def flush(self, now_ns: int | None = None) -> int:
        """Score complete epochs and store the results; returns the number of epochs scored."""
        marks = [time.perf_counter()]             # start, fed, scored, stored, reviewed
        self.drain()
        now = now_ns if now_ns is not None else time.time_ns()
        marks.append(time.perf_counter())
        late: list[tuple[str, int]] = []
        captured = None
        with self._lock:
            results = self._engine.flush(now, expire=True) or []
            if results and self._snapshot_due(now):
                captured = self._capture(late)
        self._mark_late(late)
        marks.append(time.perf_counter())
        if results:
            self.metrics.scoring_seconds.observe(marks[2] - marks[1])
            self.metrics.scored.inc(len(results))
            snap = None
            if captured is not None:
                from hypertrace.analyzer.store import snapshot
                snap = snapshot.pack(captured[1], self.config, captured[0], now,
                                     compressed=self.engine_process is not None)
            self.storage.add_results(results, created_ns=now, snapshot=snap)
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
        if self.snapshot_seconds <= 0 or not (self.engine_process is not None
                                              or hasattr(self._engine, "export_state")):
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
        from hypertrace.analyzer.store import snapshot
        try:
            # most of the queue is fed while commits go on (a burst still arriving during
            # scoring can leave thousands); held, only what was committed since is fed
            self._feed(late)
            with self.storage.commits_held() as upto:
                self._feed(late)
            if self.engine_process is not None:
                return upto, self.engine_process.capture()
            return upto, snapshot.capture(self._engine)
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
                report = self._engine.report(job_id, brief=True)
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
            return self._engine.report(job_id or None)

    def list_jobs(self) -> pb.ListJobsResponse:
        self.drain()
        with self._lock:
            return self._engine.list_jobs()

    def job_collector(self, refresh_s: float = 15.0, max_gpus: int = 64) -> JobCollector:
        """The per-job and per-GPU series (analyzer/report/metrics.py), read from this analyzer."""
        def jobs() -> list[tuple[str, int]]:
            self.drain()
            with self._lock:
                return self._engine.scored_windows()

        def report(job_id: str) -> pb.JobReport | None:
            with self._lock:     # brief: the series come from the flagged GPUs and the job's
                try:
                    jobs = self._engine.report(job_id, brief=True).jobs
                except KeyError:               # expired between the two looks
                    return None
            return jobs[0] if jobs else None

        def uuids(job_id: str) -> dict[tuple[str, str], str]:
            with self._lock:
                try:
                    return self._engine.gpu_uuids(job_id)
                except KeyError:
                    return {}
        return JobCollector(jobs, report, uuids, refresh_s, max_gpus)


@dataclass(frozen=True)
class Access:
    """Who may call what, from the client certificate (proto/transport.py). ``None`` in place
    of an Access means a plaintext listener: nobody is identified, everything is allowed."""

    trust_domain: str = DEFAULT_TRUST_DOMAIN
    readers: tuple[str, ...] = ("reader", "admin")

    def require_reader(self, context: grpc.ServicerContext) -> None:
        ident = peer_identity(context, self.trust_domain)
        if ident is None or ident.role not in self.readers:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"reading reports needs a certificate of role reader or admin "
                          f"(spiffe://{self.trust_domain}/reader/NAME), this one is "
                          f"{ident or 'without a hypertrace identity'}; issue one with "
                          "`hypertrace certs issue --role reader NAME`")

    def window_refusal(self, context: Any, w: pb.NodeWindow) -> str | None:
        """Why this caller may not send ``w`` (None: it may). A plain check, no abort: the
        Ingest handler is a coroutine and ends the stream itself."""
        ident = peer_identity(context, self.trust_domain)
        if ident is not None and may_send_for(ident, w.node, w.agent_id):
            return None
        log.warning("refused window seq %d: node %.64r agent %.64r sent by %s", w.seq, w.node,
                    w.agent_id, ident or "a certificate without a hypertrace identity")
        return (f"window seq {w.seq}: node {w.node[:64]!r} / agent_id "
                f"{w.agent_id[:64]!r} may only be sent with the certificate "
                f"spiffe://{self.trust_domain}/agent/{w.node[:64]}; this one is "
                f"{ident or 'without a hypertrace identity'}")


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
    def __init__(self, analyzer: Analyzer, access: Access | None):
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
        nodes = getattr(self._a, "nodes", None)
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


class _Refused(Exception):
    """A window its stream must end on: the status, the reject counter's reason, the message."""

    def __init__(self, code: grpc.StatusCode, reason: str, details: str):
        super().__init__(details)
        self.code, self.reason, self.details = code, reason, details


def check_content(raw: bytes) -> tuple[pb.NodeWindow, bytes, list[WireError]]:
    """Size-check, parse and validate one window's bytes: (the window, the bytes to store, the
    process entries dropped), or :class:`_Refused`. Needs nothing but the bytes, so it also
    runs in the window checkers' processes (analyzer/scale/check_process.py)."""
    if len(raw) > MAX_WINDOW_BYTES:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "too_large",
                       f"NodeWindow: is {len(raw)} bytes, over the {MAX_WINDOW_BYTES}-byte "
                       "limit; send smaller windows")
    try:
        w = pb.NodeWindow.FromString(raw)
    except DecodeError as exc:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                       f"NodeWindow: not a valid hypertrace.v1 NodeWindow protobuf ({exc}); "
                       "is the agent speaking another protocol?") from None
    try:
        dropped = accept_window(w, encoded_size=len(raw))
    except WireError as exc:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid",
                       f"window seq {w.seq} of agent {quote(w.agent_id)}: {exc}") from None
    except Exception as exc:  # a validator bug must reject the window, not wedge the agent
        log.exception("validating window %.64r/%d failed", w.agent_id, w.seq)
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid",
                       f"window seq {w.seq} of agent {quote(w.agent_id)}: cannot be "
                       f"validated ({type(exc).__name__})") from None
    if dropped:
        w.rejected_processes = len(dropped)
        raw = w.SerializeToString()          # what is stored is what was accepted
        log.warning("window %.64r/%d: dropped %d invalid process entries (first: %s)",
                    w.agent_id, w.seq, len(dropped), dropped[0])
    return w, raw, dropped


def authorize(w: pb.NodeWindow, context: Any, access: Access | None,
              max_skew_s: float) -> None:
    """The checks that need the analyzer's clock and the caller: :class:`_Refused` for a
    window ending too far ahead, or one this caller may not send."""
    try:
        check_clock(w, time.time_ns(), max_skew_s)
    except WireError as exc:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "clock_skew",
                       f"window seq {w.seq} of agent {quote(w.agent_id)}: {exc}") from None
    if access is not None:
        refusal = access.window_refusal(context, w)
        if refusal is not None:
            raise _Refused(grpc.StatusCode.PERMISSION_DENIED, "identity", refusal)


def _accept(raw: bytes, context: Any, access: Access | None,
            max_skew_s: float) -> tuple[pb.NodeWindow, bytes, list[WireError]]:
    """Parse, size-check, validate and authorize one window: (the window, the bytes to store,
    the process entries dropped), or :class:`_Refused`."""
    w, raw, dropped = check_content(raw)
    authorize(w, context, access, max_skew_s)
    return w, raw, dropped


def _refusal(analyzer: Analyzer, exc: BaseException, w: pb.NodeWindow,
             on_broken: Callable[[], None] | None) -> _Refused:
    """How a window the store did not take ends its stream."""
    if isinstance(exc, ConflictingDuplicate):
        log.error("%s", exc)
        return _Refused(grpc.StatusCode.ALREADY_EXISTS, "invalid", str(exc))
    if isinstance(exc, StorageCorrupt):
        if not analyzer.broken:
            analyzer.broken = str(exc)
            log.critical("%s", exc)
            if on_broken is not None:
                on_broken()
        return _Refused(grpc.StatusCode.UNAVAILABLE, "storage",
                        f"analyzer cannot store windows: {exc}")
    if isinstance(exc, StorageError):
        return _Refused(grpc.StatusCode.UNAVAILABLE, "storage",
                        f"analyzer cannot store windows: {exc}")
    # e.g. sqlite3 disk full: the agent keeps it and retries
    log.error("storing window %.64r/%d failed: %r", w.agent_id, w.seq, exc)
    return _Refused(grpc.StatusCode.UNAVAILABLE, "storage",
                    f"analyzer cannot store windows right now ({exc}); retry later")


def _store_group(analyzer: Analyzer, windows: list[tuple[pb.NodeWindow, bytes]],
                 on_broken: Callable[[], None] | None) -> list[bool | _Refused]:
    """Store accepted windows durably in one group: per window True (new), False (a
    duplicate) or the :class:`_Refused` that ends its stream. Blocks until the group's commit:
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
                 on_broken: Callable[[], None] | None):
        super().__init__(
            pool, lambda group: _store_group(analyzer, group, on_broken),
            lambda exc, group: [_refusal(analyzer, exc, w, on_broken) for w, _ in group])

    def store(self, w: pb.NodeWindow, raw: bytes) -> asyncio.Future:
        """A future of the window's outcome: True (new), False (a duplicate) or _Refused."""
        return self.submit((w, raw))


def _store_one(analyzer: Any, w: pb.NodeWindow, raw: bytes,
               on_broken: Callable[[], None] | None) -> bool | _Refused:
    """Store one window through an analyzer that takes windows one by one (the cluster edge,
    which publishes each to JetStream): True (new), False (a duplicate) or its refusal."""
    try:
        return analyzer.ingest(w, raw)
    except Exception as exc:
        return _refusal(analyzer, exc, w, on_broken)


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


def _ingest_handler(analyzer: Analyzer, access: Access | None, store_pool: futures.Executor,
                    max_skew_s: float = MAX_CLOCK_SKEW_S,
                    on_broken: Callable[[], None] | None = None,
                    checkers: Any = None) -> grpc.GenericRpcHandler:
    """Ingest.Stream on the server's event loop: every stream is a coroutine, not a thread.

    Why: with a thread per stream (grpc's sync server) every window crossed threads twice in
    grpc alone (its poller wakes the stream's thread for the window and again for the ack's
    send), and every agent stream took a pool thread for its lifetime; at one stream per agent
    that cost more than parsing and storing the window (sim/bench_transport.py). Here the
    window is checked on the loop and only the blocking store goes to ``store_pool``, in groups
    (:class:`_StoreQueue`); the ack is sent once the store returned, so after the commit that
    holds the window. With ``checkers`` (analyzer/scale/check_process.py) the window's contents are
    checked in their processes, and the loop parses only what they accepted."""
    store = (_StoreQueue(analyzer, store_pool, on_broken) if hasattr(analyzer, "ingest_many")
             else None)

    # what the loop parses of a checked window: all of it for an Engine in this process (its
    # queue holds the parsed window), else the header alone (the keys, the clock, the identity,
    # the ack), about a seventh of the time (proto/window_parts.py)
    parse = (WindowHeader.FromString if getattr(analyzer, "engine_process", None) is not None
             else pb.NodeWindow.FromString)

    async def accept(raw: bytes, context: Any) -> tuple[pb.NodeWindow, bytes, list]:
        if checkers is None:
            return _accept(raw, context, access, max_skew_s)
        answer = await checkers.check(raw)
        if answer[0] != "ok":
            _, code, reason, details = answer
            raise _Refused(grpc.StatusCode[code], reason, details)
        _, stored, dropped = answer
        if stored is not None:
            raw = stored
        w = parse(raw)
        authorize(w, context, access, max_skew_s)
        return w, raw, dropped

    nodes = getattr(analyzer, "nodes", None)        # analyzer/ingest/nodes.py (not on a cluster edge)

    async def stream(request_iterator: AsyncIterator[bytes],
                     context: Any) -> AsyncIterator[pb.Ack]:
        loop = asyncio.get_running_loop()
        async for raw in request_iterator:
            try:
                w, raw, dropped = await accept(raw, context)
                new = (await store.store(w, raw) if store is not None else
                       await loop.run_in_executor(store_pool, _store_one, analyzer, w, raw,
                                                  on_broken))
                if isinstance(new, _Refused):
                    raise new
                if nodes is not None:
                    nodes.seen(w, new)
            except _Refused as refused:
                analyzer.metrics.reject(refused.reason)
                await context.abort(refused.code, refused.details)
                return
            yield pb.Ack(agent_id=w.agent_id, seq=w.seq, duplicate=not new,
                         rejected_processes=len(dropped),
                         rejected_reason=str(dropped[0]) if dropped else "")

    handler = grpc.stream_stream_rpc_method_handler(
        stream, request_deserializer=None, response_serializer=pb.Ack.SerializeToString)
    return grpc.method_handlers_generic_handler(INGEST_SERVICE, {"Stream": handler})


@dataclass(frozen=True)
class ServerOptions:
    listen: str = "127.0.0.1:50051"
    flush_interval: float = 1.0          # seconds between background scoring passes; 0: only on query
    #: raw windows and score rows are kept this long (0 or None: keep everything), then
    #: summarised per GPU and 5 minutes (analyzer/store/summaries.py)
    retention_hours: float | None = RETENTION_HOURS
    #: summaries, verdict changes and scored epochs are kept this long (0: no summaries; the
    #: verdicts then follow retention_hours)
    summary_retention_days: float = SUMMARY_RETENTION_DAYS
    max_workers: int = 4096              # threads for Query and health calls (Ingest needs none)
    shutdown_grace_s: float = 2.0        # how long stop() lets in-flight calls finish
    tls: TlsFiles | None = None          # mutual TLS (proto/transport.py)
    insecure: bool = False               # plaintext without identities: tests on one machine
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    max_clock_skew_s: float = MAX_CLOCK_SKEW_S   # live windows may end at most this far ahead
    metrics_listen: str | None = None    # HOST:PORT of the Prometheus /metrics endpoint
    #: new streams grpc may queue for the server; beyond, it cancels them (MAX_PENDING_STREAMS)
    max_pending_streams: int = MAX_PENDING_STREAMS
    #: run the retention pass in a worker process of its own (analyzer/scale/retention_process.py),
    #: off this process's interpreter lock; False, or where it cannot start: in a thread here
    retention_process: bool = True
    #: seconds between retention passes, and age at which a pass compacts a window into a
    #: block (defaults: RETENTION_EVERY_S, COMPACT_AFTER_S; shorter for tests and benchmarks)
    retention_every_s: float = RETENTION_EVERY_S
    compact_after_s: float | None = None
    #: processes that check incoming windows' contents off the event loop's interpreter lock
    #: (analyzer/scale/check_process.py); 0: the loop checks them itself
    checker_processes: int = 0


class AnalyzerServer:
    """Runs the gRPC server plus the background flush/retention thread for one Analyzer.

    The server is grpc.aio on an event loop of its own thread: Ingest streams are coroutines on
    it (:func:`_ingest_handler`); Query and health are plain handlers that grpc runs in a pool
    of ``max_workers`` threads (a report can hold the Engine's lock for a second)."""

    def __init__(self, analyzer: Analyzer, options: ServerOptions = ServerOptions()):
        self.analyzer = analyzer
        self.options = options
        # the retention pass compacts windows into blocks minutes after they ended: compressing
        # each one at ingest as well would cost CPU per window for those minutes only
        if hasattr(analyzer.storage, "compress_at_ingest"):
            analyzer.storage.compress_at_ingest = not options.retention_hours
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._metrics_server = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retention_thread: threading.Thread | None = None
        self._retention_worker: Any = None   # RetentionProcess (start(); None: in a thread)
        self._health = health.HealthServicer()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._server: Any = None             # grpc.aio.Server, made on the loop in start()
        self._rpc_pool = futures.ThreadPoolExecutor(max_workers=options.max_workers,
                                                    thread_name_prefix="hypertrace-rpc")
        self._store_pool = futures.ThreadPoolExecutor(max_workers=STORE_THREADS,
                                                      thread_name_prefix="hypertrace-store")
        self._stopped = threading.Event()
        self._serving = threading.Event()     # started: /readyz may say ready
        self._switch_interval_before: float | None = None
        self._checkers: Any = None           # WindowCheckers while serving, if any

    def _on_loop(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _make_server(self) -> Any:
        server = grpc.aio.server(
            migration_thread_pool=self._rpc_pool,
            options=[("grpc.max_receive_message_length", 2 * MAX_WINDOW_BYTES),
                     ("grpc.so_reuseport", 0),
                     ("grpc.server.max_pending_requests", self.options.max_pending_streams),
                     ("grpc.server.max_pending_requests_hard_limit",
                      self.options.max_pending_streams)])
        access = None if self.options.tls is None else Access(self.options.trust_domain)
        server.add_generic_rpc_handlers((_ingest_handler(
            self.analyzer, access, self._store_pool, self.options.max_clock_skew_s,
            self._not_serving, self._checkers),))
        pb_grpc.add_QueryServicer_to_server(_QueryServicer(self.analyzer, access), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        return server

    def _start_loop(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                             name="hypertrace-grpc")
        self._loop_thread.start()

    def _end_loop(self) -> None:
        """Stop the loop and its thread (the server is stopped or was never started)."""
        if self._loop is not None and self._loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=10)
            self._loop.close()
        self._rpc_pool.shutdown(wait=False)
        self._store_pool.shutdown(wait=True)     # a store under way finishes its commit
        self._close_checkers()
        self._stopped.set()

    def start(self) -> int:
        """Bind and start serving; returns the bound port (useful with port 0)."""
        if self.options.tls is not None:
            try:
                creds = server_credentials(self.options.tls)
            except TransportError as exc:
                raise ServerError(str(exc)) from None
        elif not self.options.insecure:
            raise ServerError("no TLS configured: pass --tls-ca, --tls-cert and --tls-key (make "
                              "them with `hypertrace certs init`), or --insecure to listen in "
                              "plaintext (anyone who reaches the port can then read every report "
                              "and send windows for any node)")
        else:
            creds = None
            log.warning("listening WITHOUT TLS on %s: no client is identified; anyone who "
                        "reaches this port can read reports and send windows for any node",
                        self.options.listen)
        self._switch_interval_before = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._start_checkers()
        self._start_loop()
        try:
            self._server = self._on_loop(self._make_server())
            try:
                port = (self._server.add_secure_port(self.options.listen, creds)
                        if creds is not None
                        else self._server.add_insecure_port(self.options.listen))
            except RuntimeError as exc:
                port = 0
                detail = str(exc)
            else:
                detail = ""
            if not port:
                raise ServerError(f"cannot listen on {self.options.listen}: the port is taken or "
                                  f"the address is not local ({detail or 'bind failed'}); stop "
                                  "the other process or pass another --listen HOST:PORT (port 0 "
                                  "picks a free one)")
            self.port = port
            if self.options.metrics_listen:
                m = self.analyzer.metrics
                m.add_collector(self.analyzer.job_collector())
                if getattr(self.analyzer, "nodes", None) is not None:
                    m.add_collector(self.analyzer.nodes.collector())
                m.watch_files(self.analyzer.storage.files)
                if self.analyzer.evictor is not None:
                    m.add_collector(self.analyzer.evictor.collector())
                try:
                    self._metrics_server, self.metrics_port = serve_metrics(
                        m, self.options.metrics_listen, self._live, self._ready)
                except (OSError, ValueError) as exc:
                    raise ServerError(f"cannot serve metrics on {self.options.metrics_listen} "
                                      f"({exc}); pass another --metrics-listen HOST:PORT") from None
            self._on_loop(self._server.start())
        except BaseException:
            self._end_loop()
            raise
        for service in ("", INGEST_SERVICE, QUERY_SERVICE):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._serving.set()
        self._thread = threading.Thread(target=self._background, name="hypertrace-flush",
                                        daemon=True)
        self._thread.start()
        if self.options.retention_hours:
            self._start_retention()
        return port

    def _live(self) -> tuple[bool, str]:
        """``/healthz``: the gRPC event loop answers (it runs every Ingest stream)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False, "the gRPC event loop is not running"
        try:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(LIVE_TIMEOUT_S)
        except (futures.TimeoutError, RuntimeError):
            return False, f"the gRPC event loop did not answer within {LIVE_TIMEOUT_S:g} s"
        return True, "ok"

    def _ready(self) -> tuple[bool, str]:
        """``/readyz``: serving (started, not stopping) with a usable database."""
        if self.analyzer.broken:
            return False, f"not storing windows: {self.analyzer.broken}"
        if not self._serving.is_set() or self._stop.is_set():
            return False, "not serving (starting or stopping)"
        return self._live()

    def _start_checkers(self) -> None:
        """The window checkers' processes, where asked for and where they can run."""
        if self.options.checker_processes <= 0:
            return
        from hypertrace.analyzer.scale.check_process import WindowCheckers, WorkerUnavailable
        try:
            self._checkers = WindowCheckers(
                self.options.checker_processes,
                self.analyzer.metrics.worker_restarts.labels("checker").inc)
        except WorkerUnavailable as exc:
            log.warning("windows are checked on the event loop: %s", exc)

    def _close_checkers(self) -> None:
        checkers, self._checkers = self._checkers, None
        if checkers is not None:
            checkers.close()

    def _not_serving(self) -> None:
        """The database broke: health says NOT_SERVING for ingest, so a load balancer or a
        probe sees it; queries of what is in memory still answer."""
        self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._health.set(INGEST_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)

    def _background(self) -> None:
        interval = self.options.flush_interval if self.options.flush_interval > 0 else 1.0
        while not self._stop.wait(interval):
            try:
                if self.options.flush_interval > 0:
                    self.analyzer.flush()
                else:
                    self.analyzer.drain()
            except Exception:   # keep serving; the next pass retries
                log.exception("background flush failed")

    def _retention_plan(self) -> Any:
        from hypertrace.analyzer.scale.retention_process import RetentionPlan
        return RetentionPlan(float(self.options.retention_hours or 0),
                             self.options.summary_retention_days, self.options.compact_after_s)

    def _start_retention(self) -> None:
        """The retention thread, and the worker process it runs the passes in (started at the
        first pass) where the option is on and the storage is a file another process can open."""
        from hypertrace.analyzer.scale.retention_process import RetentionProcess
        from hypertrace.analyzer.store.storage import Storage
        storage = self.analyzer.storage
        if self.options.retention_process and isinstance(storage, Storage):
            self._retention_worker = RetentionProcess(storage.path, storage.synchronous,
                                                      self.analyzer.config, self._retention_plan())
        self._retention_thread = threading.Thread(target=self._retention, daemon=True,
                                                  name="hypertrace-retention")
        self._retention_thread.start()

    def _retention(self) -> None:
        """Summarise, prune and compact, scheduled by a thread of its own: summarising a slot
        of a 16k-GPU job reads 61,440 windows (seconds of CPU), which must not delay scoring.
        The pass itself runs in the retention process where it can (``retention_process``),
        else here; this thread then only waits for its answer."""
        from hypertrace.analyzer.scale.retention_process import PassFailed, WorkerUnavailable, run_pass
        storage, plan = self.analyzer.storage, self._retention_plan()
        while not self._stop.wait(self.options.retention_every_s):
            worker = self._retention_worker
            try:
                if worker is None:
                    res, where = run_pass(storage, self.analyzer.config, plan), "this process"
                else:
                    res, where = worker.run(self._stop), "the retention process"
                    if res is None:                   # stopping
                        return
                    if res.rows_pruned:               # what prune reloads in its own process
                        storage.reload_after_prune()
                self.analyzer.metrics.retention_cpu.inc(res.cpu_s)
                if res.rows_pruned:
                    log.info("retention: pruned %d rows (pass: %.1f s CPU in %s)",
                             res.rows_pruned, res.cpu_s, where)
            except WorkerUnavailable as exc:
                if self._stop.is_set():
                    return
                if worker is not None and not worker.started_once:    # it cannot run here
                    log.warning("retention passes run in this process: %s", exc)
                    self._retention_worker = None
                else:                                 # it died: a new one at the next pass
                    log.error("retention pass failed: %s", exc)
                    self.analyzer.metrics.worker_restarts.labels("retention").inc()
            except PassFailed as exc:
                log.error("retention pass failed (in the retention process):\n%s", exc)
            except Exception:   # keep serving; the next pass retries
                log.exception("retention pass failed")

    def stop(self) -> None:
        """Stop accepting, let in-flight calls finish (grace), score what is complete, stop."""
        self._health.enter_graceful_shutdown()
        self._stop.set()
        if self._server is not None and not self._stopped.is_set():
            try:
                self._on_loop(self._server.stop(self.options.shutdown_grace_s))
            finally:
                self._end_loop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._retention_thread is not None:
            self._retention_thread.join(timeout=10)
        worker = self._retention_worker
        if worker is not None:        # mid-pass too: SQLite rolls its transaction back
            worker.close()
        try:
            self.analyzer.flush()
        except Exception:
            log.exception("final flush failed")
        if self._switch_interval_before is not None:   # the process's own setting again
            sys.setswitchinterval(self._switch_interval_before)
            self._switch_interval_before = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stopped; True if ``timeout`` ran out first."""
        return not self._stopped.wait(timeout)
