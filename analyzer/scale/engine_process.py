"""The Engine in a worker process of its own, off the interpreter lock of the gRPC event loop.

Why: in one process the event loop (parse, validate, store, ack) and the Engine (ingest, scoring,
reports) share one interpreter lock. At 16,384 agents the Engine's ingest and scoring are about a
third of the analyzer's CPU per window, and a scoring pass of a 131,072-GPU epoch holds the lock
for seconds in one piece: acks then wait on scoring. With the Engine here, the analyzer's process
only parses, validates, stores and acks; the accepted windows go to the worker as their stored
bytes, in batches, and the worker parses them again (a few microseconds each) and ingests them.
Scoring, reports and snapshots run in the worker while the analyzer's threads wait for the answer
without the lock.

:class:`EngineProcess` is the :class:`~hypertrace.analyzer.ingest.engines.Engine` of an
:class:`~hypertrace.analyzer.ingest.server.Analyzer` whose scoring runs here: each call is
answered by the worker's :class:`~hypertrace.analyzer.ingest.engines.LocalEngine` over a pipe,
one at a time (the Analyzer's lock orders them); windows go as their stored bytes.

A worker that dies (killed, out of memory) loses only memory: every window it held is stored.
The next call starts a new worker, which loads the stored snapshot and replays the windows stored
up to the newest one at that moment (analyzer/store/replay.py), and the batches that follow leave out
every window up to that one: each window reaches the new Engine once. The worker is started by
the ``forkserver`` context (the analyzer runs threads; a forked child could inherit a held lock)
and exits when the analyzer closes its end of the pipe or dies. Where it cannot start (a sandbox
without /dev/shm, an in-memory database) the Analyzer keeps its Engine in its own process
(:class:`WorkerUnavailable`).
"""
from __future__ import annotations

import logging
import pickle
import threading
import traceback
from typing import Any, Callable

from hypertrace.analyzer.ingest.engines import Engine, LocalEngine, Queued
from hypertrace.analyzer.scale.worker_process import START_TIMEOUT_S, WorkerUnavailable, end, spawn
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import GpuKey
from hypertrace.analyzer.score.epoch_scoring import EpochResult
from hypertrace.analyzer.store import snapshot
from hypertrace.analyzer.store.replay import Replayed
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb

log = logging.getLogger(__name__)

class WorkerFailed(RuntimeError):
    """The call raised in the worker, with an exception that does not pickle: its traceback."""


class EngineProcess:
    """An :class:`~hypertrace.analyzer.ingest.engines.Engine` in a worker process (module
    docstring). Not thread-safe: the Analyzer calls it under its lock. ``newest_id`` returns the id of the newest stored window (the cut a
    replacement worker replays up to); ``on_restart`` is called for each worker started after
    one died."""

    needs_whole_windows = False
    captures_compressed = True

    def __init__(self, config: ScoringConfig, path: str, newest_id: Callable[[], int],
                 on_restart: Callable[[], None] | None = None):
        if path in ("", ":memory:") or path.startswith("file::memory:"):
            raise WorkerUnavailable("the database is in memory, another process cannot open it")
        self.config = config
        self.path = path
        self._newest_id = newest_id
        self._on_restart = on_restart        # told of each worker started after one died
        self._proc: Any = None
        self._conn: Any = None
        self._closed = False
        self._guard = threading.Lock()
        self.restarts = 0           # workers started after one died
        #: windows with an id up to this were replayed by the current worker: not fed again
        self.skip_upto = 0
        self._start()

    # ---- the Engine's calls ---------------------------------------------------------------

    def feed(self, items: list[Queued]) -> list[int]:
        """Feed stored windows in store order, as their bytes; returns the indexes (in
        ``items``) of those that were late for some job. Windows a replacement worker already
        replayed are left out (never late)."""
        def send() -> list[int]:
            keep = [i for i, it in enumerate(items) if it[2] > self.skip_upto]
            if not keep:
                return []
            late = self._call("feed", [(items[i][1], items[i][3]) for i in keep])
            return [keep[j] for j in late]
        return self._retrying(send)

    def flush(self, now_ns: int | None = None, expire: bool = False) -> list[EpochResult]:
        return self._retrying(lambda: self._call("flush", now_ns, expire))

    def report(self, job_id: str | None = None, brief: bool = False) -> pb.Report:
        return self._retrying(lambda: self._call("report", job_id, brief))

    def list_jobs(self) -> pb.ListJobsResponse:
        return self._retrying(lambda: self._call("list_jobs"))

    def scored_windows(self) -> list[tuple[str, int]]:
        return self._retrying(lambda: self._call("scored_windows"))

    def gpu_uuids(self, job_id: str) -> dict[GpuKey, str]:
        return self._retrying(lambda: self._call("gpu_uuids", job_id))

    def capture(self) -> bytes:
        """The Engine's state pickled and compressed (analyzer/store/snapshot.py ``capture``, then
        ``compress``), made in the worker."""
        return self._retrying(lambda: self._call("capture"))

    def replay(self, use_snapshot: bool = True) -> Replayed:
        """:func:`~hypertrace.analyzer.store.replay.replay_stored` in the (fresh) worker, up to the
        newest stored window; later windows come through :meth:`ingest_batch`."""
        return self._retrying(lambda: self._replay(use_snapshot), replay=False)

    def _restart(self) -> None:
        self._start()
        self.restarts += 1
        if self._on_restart is not None:
            self._on_restart()

    def _replay(self, use_snapshot: bool) -> Replayed:
        self.skip_upto = upto = self._newest_id()
        return self._call("replay", use_snapshot, upto)

    # ---- the worker ------------------------------------------------------------------------

    def _retrying(self, send: Callable[[], Any], replay: bool = True) -> Any:
        """``send()``, once more in a new worker if the worker died; the new worker first
        replays the stored windows unless ``send`` is that replay."""
        try:
            return send()
        except WorkerUnavailable as exc:
            if self._closed:
                raise
            log.error("the Engine's worker process ended (%s); starting another, which "
                      "replays the stored windows", exc)
        self._restart()
        if replay:
            replayed = self._replay(True)
            log.warning("the new Engine worker replayed %d stored windows (from the snapshot: "
                        "%s)", replayed.windows, replayed.from_snapshot)
        return send()

    def _start(self) -> None:
        self._reap()
        if self._closed:
            raise WorkerUnavailable("closed")
        proc, mine = spawn(_serve, "hypertrace-engine",
                           (self.config, self.path, logging.getLogger().getEffectiveLevel()),
                           "the Engine's worker process")
        with self._guard:
            self._proc, self._conn = proc, mine
            if self._closed:                      # close() came meanwhile
                self._proc = self._conn = None
                end(proc, mine)
                raise WorkerUnavailable("closed")
        if not mine.poll(START_TIMEOUT_S):
            self._reap()
            raise WorkerUnavailable("the Engine's worker process did not start in time")
        self._answer()

    def _call(self, op: str, *args: Any) -> Any:
        conn = self._conn
        if conn is None:
            raise WorkerUnavailable("no worker (closed)")
        try:
            conn.send((op, args))
        except (OSError, ValueError) as exc:
            raise WorkerUnavailable(f"the pipe to it broke ({exc})") from None
        return self._answer()

    def _answer(self) -> Any:
        """The worker's answer to the last request; raises what the call raised there."""
        conn, proc = self._conn, self._proc
        try:
            kind, value = conn.recv()           # waits without the interpreter lock
        except (EOFError, OSError, ValueError, AttributeError):
            code = None
            try:
                if proc is not None:
                    proc.join(1)
                    code = proc.exitcode
            except ValueError:
                pass
            self._reap()
            raise WorkerUnavailable(f"exit code {code}") from None
        if kind == "error":
            if isinstance(value, BaseException):
                raise value
            raise WorkerFailed(value)
        return value

    def _reap(self) -> None:
        with self._guard:
            proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        end(proc, conn)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None

    def close(self) -> None:
        """End the worker (its Engine's memory with it; everything it held is stored)."""
        self._closed = True
        self._reap()


def _serve(conn: Any, config: ScoringConfig, path: str, log_level: int = logging.WARNING) -> None:
    """The worker: one LocalEngine, one request at a time until the pipe closes. An exception
    in a call is sent back (pickled, else as its traceback) and the worker waits for the next."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s "
                        "[engine process]: %(message)s")
    engine = LocalEngine(config)
    conn.send(("ready", None))
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):          # the analyzer closed its end or died
            return
        try:
            reply: tuple = ("ok", _do(engine, path, op, args))
        except Exception as exc:
            reply = ("error", _portable(exc))
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return
        except Exception as exc:              # the answer does not pickle
            conn.send(("error", traceback.format_exception_only(type(exc), exc)[-1]))


def _do(engine: LocalEngine, path: str, op: str, args: tuple) -> Any:
    """One request of :class:`EngineProcess`, answered by the worker's LocalEngine."""
    if op == "feed":
        return engine.feed([(pb.NodeWindow.FromString(data), data, 0, arrived)
                            for data, arrived in args[0]])
    if op == "flush":
        return engine.flush(*args)
    if op == "report":
        return engine.report(*args)
    if op == "list_jobs":
        return engine.list_jobs()
    if op == "scored_windows":
        return engine.scored_windows()
    if op == "gpu_uuids":
        return engine.gpu_uuids(*args)
    if op == "capture":
        return snapshot.compress(engine.capture())
    if op == "replay":
        engine.storage = Storage.open_read_only(path)
        try:
            return engine.replay(*args)
        finally:
            engine.storage.close()
            engine.storage = None
    raise ValueError(f"unknown request {op!r}")


def _portable(exc: BaseException) -> Any:
    """``exc`` if it pickles (a KeyError for an unknown job stays one), else its traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


__all__ = ["EngineProcess", "WorkerFailed", "WorkerUnavailable", "engine_for"]


def engine_for(config: ScoringConfig, storage: Storage, in_worker: bool,
               on_restart: Callable[[], None] | None = None) -> Engine:
    """The Engine of an analyzer over ``storage``: in a worker process of its own where asked
    and where one can run, else in this process (logged: a sandbox without /dev/shm, an
    in-memory database)."""
    if in_worker:
        def newest_id() -> int:
            with storage.commits_held() as upto:
                return upto
        try:
            return EngineProcess(config, str(storage.path), newest_id, on_restart)
        except WorkerUnavailable as exc:
            log.warning("the Engine runs in this process: %s", exc)
    return LocalEngine(config, storage)
