"""The checks of incoming windows (size, parse, validation) in worker processes of their own.

Why: checking a window's contents (every process entry, every histogram's total) is the
largest single cost the analyzer's event loop pays per window, about a third of its CPU, and it
holds the interpreter lock that the loop needs for every other stream. At 16,384 agents the
whole fleet's windows arrive within a second or two of each window's end and must be stored
before the epoch is scored, ``grace_seconds`` later. Here a few worker processes check the
bytes while the loop goes on; the loop then only parses the accepted bytes (tens of
microseconds), checks the clock and the caller's identity, stores and acks.

The event loop hands each worker its windows in groups, as the store does (:class:`_Lane`, one
per worker): the windows read in one turn of the loop go in one message, so a burst costs a
pipe round trip per group, not per window. Each window's answer is the bytes to store (the
window re-encoded when bad process entries were dropped) and why each dropped entry was
dropped, or the refusal that ends its stream: the same answers, with the same messages, as
checking it on the loop (``analyzer.ingest.checks.check_content``).

A worker that dies (killed, out of memory) is started again and its group checked once more
there; a group that fails twice is refused with UNAVAILABLE, which agents retry. The workers are
started by the ``forkserver`` context (the analyzer runs threads; a forked child could inherit
a held lock) and exit when the analyzer closes their pipes or dies. Where they cannot start,
the server checks windows on its loop as before (:class:`WorkerUnavailable`).
"""
from __future__ import annotations

import logging
from concurrent import futures
from typing import Any, Callable

from hypertrace.analyzer.ingest.loop_groups import LoopGroups
from hypertrace.analyzer.scale.worker_process import START_TIMEOUT_S, WorkerUnavailable, end, spawn

log = logging.getLogger(__name__)

#: Most windows one message to a worker carries (about 3-7 KB each).
MAX_GROUP = 256

#: One window's answer: ("ok", bytes to store or None for the bytes sent, [why each dropped
#: entry was dropped], its WindowShape) or ("refused", status code name, reject reason, message).
Answer = tuple


class _Worker:
    """One checker process and its pipe; used from one thread at a time."""

    def __init__(self, log_level: int):
        self._log_level = log_level
        self._proc: Any = None
        self._conn: Any = None

    def start(self) -> None:
        proc, mine = spawn(_serve, "hypertrace-checker", (self._log_level,),
                           "a window checker process")
        self._proc, self._conn = proc, mine
        try:
            if not mine.poll(START_TIMEOUT_S) or mine.recv() != "ready":
                raise WorkerUnavailable("a window checker process did not start in time")
        except (EOFError, OSError) as exc:
            self.close()
            raise WorkerUnavailable(f"a window checker process ended at start ({exc})") from None
        except WorkerUnavailable:
            self.close()
            raise

    def check(self, raws: list[bytes]) -> list[Answer]:
        """The answers for ``raws``; WorkerUnavailable when the worker died meanwhile."""
        conn = self._conn
        if conn is None:
            raise WorkerUnavailable("closed")
        try:
            conn.send(raws)
            return conn.recv()                 # waits without the interpreter lock
        except (EOFError, OSError, ValueError) as exc:
            self.close()
            raise WorkerUnavailable(f"a window checker process ended ({exc!r})") from None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None

    def close(self) -> None:
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        end(proc, conn)


class _Lane(LoopGroups):
    """The windows waiting for one worker, sent as one group (at most MAX_GROUP) per call
    (analyzer/ingest/loop_groups.py)."""

    def __init__(self, worker: _Worker, pool: futures.Executor,
                 on_restart: Callable[[], None] | None = None):
        super().__init__(pool, self._check, _unavailable, MAX_GROUP)
        self.worker = worker
        self._on_restart = on_restart

    def _check(self, raws: list[bytes]) -> list[Answer]:
        """In the pool's thread: the worker's answers; once more in a new worker if it died."""
        try:
            return self.worker.check(raws)
        except WorkerUnavailable as exc:
            log.error("%s; starting another and checking its %d windows again", exc, len(raws))
        self.worker.start()
        if self._on_restart is not None:
            self._on_restart()
        return self.worker.check(raws)


def _unavailable(exc: BaseException, raws: list[bytes]) -> list[Answer]:
    """The answer to a group no worker could check (the pool shut down, or two workers in a
    row died): UNAVAILABLE, which agents retry."""
    return [("refused", "UNAVAILABLE", "storage",
             f"analyzer cannot check windows right now ({exc}); retry")] * len(raws)


class WindowCheckers:
    """``processes`` checker processes and their lanes (module docstring). :meth:`check` is
    called on the server's event loop; :meth:`close` from any thread, once. ``on_restart`` is
    called for each checker started after one died."""

    def __init__(self, processes: int, on_restart: Callable[[], None] | None = None):
        level = logging.getLogger().getEffectiveLevel()
        self._pool = futures.ThreadPoolExecutor(max_workers=processes,
                                                thread_name_prefix="hypertrace-checks")
        workers = []
        try:
            for _ in range(processes):
                w = _Worker(level)
                w.start()
                workers.append(w)
        except WorkerUnavailable:
            for w in workers:
                w.close()
            self._pool.shutdown(wait=False)
            raise
        self._lanes = [_Lane(w, self._pool, on_restart) for w in workers]
        self._next = 0

    @property
    def pids(self) -> list[int | None]:
        return [lane.worker.pid for lane in self._lanes]

    async def check(self, raw: bytes) -> Answer:
        """The answer for one window's bytes (see :data:`Answer`), from the next lane in turn."""
        lane = self._lanes[self._next]
        self._next = (self._next + 1) % len(self._lanes)
        return await lane.submit(raw)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for lane in self._lanes:
            lane.worker.close()


def check_bytes(raws: list[bytes]) -> list[Answer]:
    """Each window's answer, as ``analyzer.ingest.checks.check_content`` decides it."""
    from hypertrace.analyzer.ingest.checks import Refused, check_content
    out: list[Answer] = []
    for raw in raws:
        try:
            _, stored, dropped, shape = check_content(raw)
        except Refused as refused:
            out.append(("refused", refused.code.name, refused.reason, refused.details))
            continue
        out.append(("ok", None if stored is raw else stored, [str(d) for d in dropped], shape))
    return out


def _serve(conn: Any, log_level: int = logging.WARNING) -> None:
    """The worker: answer each group of window bytes until the pipe closes."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s "
                        "[window checker]: %(message)s")
    check_bytes([])                          # its imports, before it says it is ready
    conn.send("ready")
    while True:
        try:
            raws = conn.recv()
        except (EOFError, OSError):          # the analyzer closed its end or died
            return
        conn.send(check_bytes(raws))


__all__ = ["Answer", "MAX_GROUP", "WindowCheckers", "WorkerUnavailable", "check_bytes"]
