"""The retention pass (summaries, prune, compaction into blocks) in a worker process of its own.

Why: the pass costs about 5 ms of CPU per stored window (LZMA blocks, then the summaries that
read them back), and in the analyzer's process most of it holds the interpreter lock that the
event loop (acks) and the Engine's feed need. One long-lived worker process opens its own
connection to the same database file (SQLite WAL: one writer at a time across processes, readers
never blocked; analyzer/store/storage.py) and runs :func:`~hypertrace.analyzer.store.summaries.apply_retention`
there, so the analyzer's own process only waits for the answer. The worker's CPU is still spent
on the host: each pass reports it, and the server counts it
(``hypertrace_retention_cpu_seconds_total``).

The worker is started by the ``forkserver`` context, not ``fork``: the analyzer runs threads
(gRPC's, the store's), and a forked child may inherit a lock that no thread will release. It
exits when the analyzer closes its end of the pipe or dies (the pipe then reads EOF), and
:meth:`RetentionProcess.close` ends it at once, mid-pass if need be: SQLite rolls back a
transaction whose process died, so nothing is half-written. Where it cannot start (a sandbox
without /dev/shm or Unix sockets, an in-memory database) the caller runs the pass in its own
thread, as before (:class:`WorkerUnavailable`).
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from hypertrace.analyzer.scale.worker_process import START_TIMEOUT_S, WorkerUnavailable, end, spawn

log = logging.getLogger(__name__)

#: How often the waiting thread looks at the stop event and the worker's health.
POLL_S = 0.2


class PassFailed(RuntimeError):
    """The pass raised in the worker; the message is its traceback."""


@dataclass(frozen=True)
class RetentionPlan:
    """What one pass applies (:func:`~hypertrace.analyzer.store.summaries.apply_retention`)."""

    raw_hours: float
    summary_days: float
    compact_after_s: float | None = None


@dataclass(frozen=True)
class PassResult:
    rows_pruned: int
    cpu_s: float            # CPU seconds the pass took (user + system, in the worker)


def run_pass(storage: Any, config: Any, plan: RetentionPlan, now_ns: int | None = None
             ) -> PassResult:
    """One pass on ``storage`` in this thread; its CPU is this thread's."""
    from hypertrace.analyzer.store.summaries import apply_retention
    t0 = time.thread_time()
    n = apply_retention(storage, config, plan.raw_hours, plan.summary_days, now_ns=now_ns,
                        compact_after_s=plan.compact_after_s)
    return PassResult(n, time.thread_time() - t0)


class RetentionProcess:
    """One worker process holding its own :class:`~hypertrace.analyzer.store.storage.Storage` on
    ``path``. Not thread-safe: one thread (the server's retention thread) runs the passes;
    :meth:`close` may come from another."""

    def __init__(self, path: str, synchronous: str, config: Any, plan: RetentionPlan,
                 on_replaced: Callable[[], None] | None = None):
        self.path = path
        #: called (after the log line) each time a worker that died is replaced, wherever it
        #: died: during a pass, or idle between two (the server counts it)
        self.on_replaced = on_replaced
        self.synchronous = synchronous
        self.config = config
        self.plan = plan
        self._proc: Any = None
        self._conn: Any = None
        self._closed = threading.Event()
        self._guard = threading.Lock()        # start/close from two threads
        #: a worker started and opened the database once: one that cannot start again later
        #: (it died) is restarted at the next pass, not given up for the in-thread pass
        self.started_once = False

    @property
    def pid(self) -> int | None:
        """The worker's process id while one runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None

    def _start(self, stop: threading.Event) -> None:
        """Start the worker and wait until it opened the database; WorkerUnavailable if it
        cannot run here."""
        if self.path in ("", ":memory:") or self.path.startswith("file::memory:"):
            raise WorkerUnavailable("the database is in memory, another process cannot open it")
        if self._closed.is_set():
            raise WorkerUnavailable("closed")
        proc, mine = spawn(_serve, "hypertrace-retention",
                           (self.path, self.synchronous, self.config, self.plan,
                            logging.getLogger().getEffectiveLevel()), "the worker process")
        with self._guard:
            self._proc, self._conn = proc, mine
            if self._closed.is_set():             # close() came meanwhile
                self._proc = self._conn = None
                end(proc, mine, terminate=True)
                raise WorkerUnavailable("closed")
        try:
            ready = self._answer(stop, START_TIMEOUT_S)
        except PassFailed as exc:
            self._reap()
            raise WorkerUnavailable(f"the worker could not open {self.path}: {exc}") from None
        if ready is None:
            self._reap()
            raise WorkerUnavailable("the worker process did not start in time (or stopping)")
        self.started_once = True

    def run(self, stop: threading.Event, now_ns: int | None = None) -> PassResult | None:
        """One pass in the worker (started on first use, and again after it died); None when
        ``stop`` was set meanwhile. PassFailed when the pass raised there (the worker goes on),
        WorkerUnavailable when the worker cannot start or died during the pass (the next
        call starts a new one)."""
        if self._proc is None or not self._proc.is_alive():
            died = self._proc is not None        # killed or crashed while idle
            if died:
                log.error("the retention process (pid %s) ended between passes (exit code "
                          "%s); a new one is started", self._proc.pid, self._proc.exitcode)
            self._reap()
            if died:
                self._replaced()
            self._start(stop)
        try:
            self._conn.send(now_ns)
        except (OSError, ValueError) as exc:          # it died between two passes
            self._reap()                              # the caller counts and logs it
            raise WorkerUnavailable(f"the worker process is gone ({exc})") from None
        return self._answer(stop, None)

    def _answer(self, stop: threading.Event | None, timeout: float | None) -> Any:
        """The worker's next answer; None on ``stop`` or ``timeout``."""
        conn, proc = self._conn, self._proc      # close() from another thread clears them
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if conn is not None and conn.poll(POLL_S):
                    kind, value, cpu_s = conn.recv()
                    break
                ended = proc is None or not proc.is_alive()
            except (EOFError, OSError, ValueError):  # its end closed: it died, or close()
                ended = True
            if ended:
                try:
                    code = None if proc is None else proc.exitcode
                except ValueError:                    # closed by close() meanwhile
                    code = None
                self._reap()
                raise WorkerUnavailable(f"the worker process ended (exit code {code})")
            if stop is not None and stop.is_set():
                return None
            if deadline is not None and time.monotonic() > deadline:
                return None
        if kind == "error":
            raise PassFailed(value)
        return PassResult(int(value), float(cpu_s))

    def _replaced(self) -> None:
        if self.on_replaced is not None:
            self.on_replaced()

    def _reap(self) -> None:
        """Forget a worker that ended (or end it): its exit status collected, its pipe closed."""
        with self._guard:
            proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        end(proc, conn, terminate=True)       # SIGTERM: a transaction under way rolls back

    def close(self) -> None:
        """End the worker now (mid-pass too); no pass runs after."""
        self._closed.set()
        self._reap()


def _serve(conn: Any, path: str, synchronous: str, config: Any, plan: RetentionPlan,
           log_level: int = logging.WARNING) -> None:
    """The worker: open the database, say so, then one pass per request until the pipe
    closes. An exception in a pass is sent back as text, and the worker waits for the next.
    What the pass logs (a block that does not decode, a WAL not truncated) goes to the
    analyzer's stderr at the analyzer's level, marked as the retention process's."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s "
                        "[retention process]: %(message)s")
    from hypertrace.analyzer.store.storage import Storage
    try:
        storage = Storage.open(path, synchronous=synchronous, check=False)   # checked there
    except Exception:
        conn.send(("error", traceback.format_exc(limit=4), 0.0))
        return
    conn.send(("ready", 0, 0.0))
    try:
        while True:
            try:
                now_ns = conn.recv()
            except (EOFError, OSError):       # the analyzer closed its end or died
                return
            t0 = time.process_time()
            try:
                result = run_pass(storage, config, plan, now_ns)
            except Exception:
                conn.send(("error", traceback.format_exc(), time.process_time() - t0))
                continue
            conn.send(("ok", result.rows_pruned, time.process_time() - t0))
    finally:
        storage.close()


__all__ = ["PassFailed", "PassResult", "RetentionPlan", "RetentionProcess", "WorkerUnavailable",
           "run_pass"]
