"""The analyzer's server: the gRPC services of analyzer/ingest/server.py on their event loop,
the background scoring pass, the retention pass, and the worker processes the options ask for
(the window checkers, the retention process). What it serves is a
:class:`~hypertrace.analyzer.ingest.server.Backend`: an Analyzer, whose Engine the command line
put in this process or in a worker (:func:`make_analyzer`), or the cluster mode's edge.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hypertrace.analyzer.ingest.checks import Access
from hypertrace.analyzer.ingest.quotas import AgentQuotas, QuotaSettings
from hypertrace.analyzer.ingest.server import (
    LIVE_TIMEOUT_S,
    MAX_PENDING_STREAMS,
    QUERY_SERVICE,
    RETENTION_EVERY_S,
    RETENTION_HOURS,
    STORE_THREADS,
    SUMMARY_RETENTION_DAYS,
    SWITCH_INTERVAL_S,
    Analyzer,
    Backend,
    ServerError,
    _ingest_handler,
    _QueryServicer,
)
from hypertrace.analyzer.report.metrics import AnalyzerMetrics
from hypertrace.analyzer.report.metrics import serve as serve_metrics
from hypertrace.analyzer.scale.engine_process import engine_for
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.transport import (
    DEFAULT_TRUST_DOMAIN,
    TlsFiles,
    TransportError,
    server_credentials,
)
from hypertrace.proto.wire import INGEST_SERVICE, MAX_CLOCK_SKEW_S, MAX_WINDOW_BYTES

log = logging.getLogger("hypertrace.analyzer.ingest.server")

#: Seconds between integrity checks of the database file (``PRAGMA quick_check``, on a
#: read-only connection of its own: seconds per GB, ingest goes on meanwhile).
INTEGRITY_CHECK_S = 3600.0


def make_analyzer(storage: Storage, config: ScoringConfig | None = None,
                  engine_process: bool = False, metrics: AnalyzerMetrics | None = None,
                  **kwargs: Any) -> Analyzer:
    """An Analyzer over ``storage`` whose Engine runs in a worker process of its own
    (``engine_process``, where one can run) or in this process."""
    config = config if config is not None else ScoringConfig()
    metrics = metrics or AnalyzerMetrics()
    engine = engine_for(config, storage, engine_process,
                        metrics.worker_restarts.labels("engine").inc)
    return Analyzer(storage, config, engine=engine, metrics=metrics, **kwargs)


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
    #: seconds between integrity checks of the database file (0: none; damage met by a read
    #: or a write is reported all the same)
    integrity_check_s: float = INTEGRITY_CHECK_S
    #: what one agent identity may send (analyzer/ingest/quotas.py); None: no bounds
    quotas: QuotaSettings | None = QuotaSettings()
    #: the scheduler's roster of each job (analyzer/ingest/roster.py); None: not checked
    roster: Any = None


class AnalyzerServer:
    """Runs the gRPC server plus the background flush/retention thread for one Analyzer.

    The server is grpc.aio on an event loop of its own thread: Ingest streams are coroutines on
    it (:func:`_ingest_handler`); Query and health are plain handlers that grpc runs in a pool
    of ``max_workers`` threads (a report can hold the Engine's lock for a second)."""

    def __init__(self, analyzer: Backend, options: ServerOptions = ServerOptions()):
        self.analyzer = analyzer
        self.options = options
        # windows are stored compressed (about 2.9 KB, not 7-9 KB) for the minutes until the
        # retention pass compacts them into blocks: at 90-100 us of CPU per window, what keeps
        # the disk of a live analyzer within its bound (docs/design.md, "The disk of a live
        # analyzer")
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
        self._broken_guard = threading.Lock()
        self._integrity_thread: threading.Thread | None = None

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
            self._storage_broken, self._checkers,
            AgentQuotas(self.options.quotas) if self.options.quotas is not None else None,
            self.options.roster),))
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
                if self.analyzer.nodes is not None:
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
        storage = self.analyzer.storage
        if isinstance(storage, Storage):
            storage.on_corrupt = self._storage_broken
            if self.options.integrity_check_s > 0:
                self._integrity_thread = threading.Thread(
                    target=self._integrity, name="hypertrace-integrity", daemon=True)
                self._integrity_thread.start()
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

    def _storage_broken(self, exc: Exception) -> None:
        """The database is damaged (the integrity check, or a read or write that met it):
        ingest refuses every window from now on (agents keep them spooled), health says
        NOT_SERVING for ingest so a load balancer or a probe sees it, the gauge
        ``hypertrace_database_corrupt`` is 1, and the log says how to recover, once. Queries of
        what is in memory still answer."""
        with self._broken_guard:
            if self.analyzer.broken:
                return
            self.analyzer.broken = str(exc)
        log.critical("%s", exc)
        self.analyzer.metrics.database_corrupt.set(1)
        self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._health.set(INGEST_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)

    def _damage_in(self, text: str) -> None:
        """A retention pass that failed on damage (its error is SQLite's word for it, maybe in
        the retention process's traceback) stops ingest as any other read would."""
        if "malformed" in text or "not a database" in text:
            from hypertrace.analyzer.store.storage import corrupt_error
            self._storage_broken(corrupt_error(self.analyzer.storage.path,
                                               text.strip().splitlines()[-1][:300]))

    def _integrity(self) -> None:
        """``PRAGMA quick_check`` of the file every ``integrity_check_s`` (module docstring of
        analyzer/store/storage.py: :func:`integrity_problem`); damage stops ingest."""
        while not self._stop.wait(self.options.integrity_check_s):
            if self.analyzer.broken:
                return
            try:
                damage = self.analyzer.storage.quick_check()
            except Exception:
                log.exception("integrity check failed to run")
                continue
            if damage is not None:
                self._storage_broken(damage)
                return

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
            self._retention_worker = RetentionProcess(
                storage.path, storage.synchronous, self.analyzer.config, self._retention_plan(),
                self.analyzer.metrics.worker_restarts.labels("retention").inc)
        self._retention_thread = threading.Thread(target=self._retention, daemon=True,
                                                  name="hypertrace-retention")
        self._retention_thread.start()

    def _retention(self) -> None:
        """Summarise, prune and compact, scheduled by a thread of its own: summarising a slot
        of a 16k-GPU job reads 61,440 windows (seconds of CPU), which must not delay scoring.
        The pass itself runs in the retention process where it can (``retention_process``),
        else here; this thread then only waits for its answer."""
        from hypertrace.analyzer.scale.retention_process import (
            PassFailed,
            WorkerUnavailable,
            run_pass,
        )
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
                self._damage_in(str(exc))
            except Exception as exc:   # keep serving; the next pass retries
                log.exception("retention pass failed")
                self._damage_in(str(exc))

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
        if self._integrity_thread is not None:
            self._integrity_thread.join(timeout=10)
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
