"""A recorded file's windows validated in worker processes, ahead of the reader that ingests them.

Why: validating a window costs more than parsing and ingesting it (a 16k-GPU recording: 2.2 s
against 0.4 s and 1.5 s on the dev VM), and it depends on the window alone. For a plain binary
records file (``.pb``, not gzipped, a regular file), worker processes parse and validate chunks
of its records while the reader parses and ingests them in order, so validation leaves the
critical path of ``hypertrace analyze`` wherever a second core is free. A chunk goes to whoever
claims it first, so the reader validates the chunks it reaches before any worker has begun them
(while the workers start, or when they fall behind) instead of waiting for them.

What does not change: a window is handed on only once its verdict is known, and the verdict is
the one :func:`hypertrace.proto.wire.validate_window` gives (the workers run it on the same
bytes; its error, field and text travel back as they are). Whatever a worker cannot settle (a
record it cannot parse, records past a doubtful length) is validated by the reader itself, and
the reader's own framing errors are raised as before. Anything else (gzip, JSON lines, stdin, a
small file, ``workers`` 0) is validated in this process, window by window.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import stat
import threading
from pathlib import Path
from typing import Any, Iterator

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import records, wire

#: Records per task: large enough that a task's hand-off is negligible, small enough that the
#: reader waits little for the first.
CHUNK = 256
#: Files smaller than this are validated in this process (starting workers costs more).
MIN_PARALLEL_BYTES = 4 << 20

log = logging.getLogger(__name__)

_OK, _UNSETTLED = 0, 1            # a verdict: one of these, or an error's (field, problem)


def default_workers() -> int:
    """Worker processes when not told: the cores this process may use, less one for the
    reader, at most 4 (beyond that the reader is the critical path), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                     # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores - 1))


def validated_windows(path: str | Path, workers: int, min_bytes: int = MIN_PARALLEL_BYTES
                      ) -> Iterator[tuple[pb.NodeWindow, int | None, wire.WireError | None]]:
    """(window, encoded size, the :class:`~hypertrace.proto.wire.WireError` that
    ``validate_window`` raises on it, or None) per record of ``path``, in order; framing errors
    of the file are raised as :func:`~hypertrace.proto.records.read_windows_sized` raises them.
    ``workers``: processes validating ahead (0: none, all here); files under ``min_bytes``
    are validated here. The workers start at this call, not at the first window: a caller
    that has more to import or set up first lets them start meanwhile (then it must iterate,
    which stops them at the end)."""
    spans = _spans(path) if workers > 0 and _plain_binary(path, min_bytes) else []
    ahead = _Ahead.start(str(path), spans, workers) if len(spans) > CHUNK else None
    return _windows(path, spans, ahead)


def _windows(path: str | Path, spans: list[tuple[int, int]], ahead: "_Ahead | None"
             ) -> Iterator[tuple[pb.NodeWindow, int | None, wire.WireError | None]]:
    if ahead is None:
        for w, size in records.read_windows_sized(path):
            yield w, size, _verdict(w, size)
        return
    try:
        verdicts: list | None = None
        for k, (w, size) in enumerate(records.read_windows_sized(path)):
            if k < len(spans):
                if k % CHUNK == 0:
                    verdicts = ahead.verdicts(k // CHUNK)
                if verdicts is not None:
                    v = verdicts[k % CHUNK]
                    if v == _OK:
                        yield w, size, None
                        continue
                    if v != _UNSETTLED:
                        yield w, size, wire.WireError(*v)
                        continue
            yield w, size, _verdict(w, size)
    finally:
        ahead.close()


class _Ahead:
    """The worker processes and the chunks of verdicts they send back. Each chunk is validated
    by whoever claims it first: a worker, or the reader when it reaches a chunk that no worker
    has begun (while the workers start, about 0.3 s, or when they fall behind). Why: the
    reader then never waits for a chunk that nobody is validating, and it validates in its own
    pass over the windows it already parsed; a worker that finds its chunk claimed skips it."""

    def __init__(self, claims: Any):
        self._claims = claims
        self._pool: Any = None
        self._results: list | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, path: str, spans: list[tuple[int, int]], workers: int) -> "_Ahead | None":
        """Workers validating ``spans`` in chunks, started in a thread so that the reader
        begins at once; None where shared memory for the claims cannot be made (then this
        process validates, as with ``workers`` 0)."""
        ctx = multiprocessing.get_context("forkserver")
        tasks = [(path, c, spans[i:i + CHUNK]) for c, i in enumerate(range(0, len(spans), CHUNK))]
        try:
            claims = ctx.Array("b", len(tasks))
        except (OSError, ValueError) as exc:
            log.warning("validating in this process: no shared memory for workers (%s)", exc)
            return None
        self = cls(claims)
        self._thread = threading.Thread(target=self._run, args=(ctx, workers, tasks),
                                        name="validate-ahead", daemon=True)
        self._thread.start()
        return self

    def _run(self, ctx: Any, workers: int, tasks: list) -> None:
        """(The starting thread.) forkserver, not fork: a process that already runs threads
        (this one, gRPC's, a test runner's) can fork a child holding a lock that no thread will
        ever release, and that worker hangs."""
        try:
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(self._claims,))
        except (OSError, ValueError) as exc:     # no fork, no semaphores: the reader does all
            log.warning("validating in this process: worker processes could not start (%s)", exc)
            return
        self._pool = pool
        self._results = [pool.apply_async(_check_chunk, (task,)) for task in tasks]

    def verdicts(self, chunk: int) -> list | None:
        """The verdicts of chunk ``chunk`` from the worker that validated it, or None: the
        reader claimed it and validates its windows itself."""
        results = self._results
        if results is not None and results[chunk].ready():
            return results[chunk].get()
        if _claim(self._claims, chunk):
            return None
        assert self._thread is not None             # a worker holds it: wait for its verdicts
        self._thread.join()
        assert self._results is not None
        return self._results[chunk].get()

    def close(self) -> None:
        """Stop the workers (the reader is done, or gave up)."""
        if self._thread is not None:
            self._thread.join()
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()


def _claim(claims: Any, chunk: int) -> bool:
    """Take chunk ``chunk`` for the caller; False when someone else took it first."""
    with claims.get_lock():
        if claims[chunk]:
            return False
        claims[chunk] = 1
        return True


_worker_claims: Any = None          # (a worker) the claims shared with the reader


def _init_worker(claims: Any) -> None:
    global _worker_claims
    _worker_claims = claims


def _verdict(w: pb.NodeWindow, size: int | None) -> wire.WireError | None:
    try:
        wire.validate_window(w, encoded_size=size)
    except wire.WireError as exc:
        return exc
    return None


def _plain_binary(path: str | Path, min_bytes: int) -> bool:
    """A regular file of at least ``min_bytes`` holding binary records, not gzipped (its
    records can be found by seeking)."""
    if str(path) == "-":
        return False
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False                          # the reader reports it
    return (stat.S_ISREG(st.st_mode) and st.st_size >= min_bytes and head[:2] != b"\x1f\x8b"
            and head.lstrip()[:1] not in (b"{", b""))


def _spans(path: str | Path) -> list[tuple[int, int]]:
    """(offset, size) of each record's bytes, from the start as far as every length is sound;
    it stops quietly at the first doubtful one (the reader raises its error there)."""
    out: list[tuple[int, int]] = []
    with open(path, "rb") as fh:
        end = os.fstat(fh.fileno()).st_size
        while True:
            try:
                size = records.read_varint(fh, str(path))
            except wire.WireError:
                return out
            start = fh.tell()
            if size is None or not 0 < size <= wire.MAX_WINDOW_BYTES or start + size > end:
                return out
            out.append((start, size))
            fh.seek(start + size)


def _check_chunk(task: tuple[str, int, list[tuple[int, int]]]) -> list | None:
    """A worker: the verdict on each record of one chunk; None when the reader claimed the
    chunk first."""
    path, chunk, spans = task
    if not _claim(_worker_claims, chunk):
        return None
    out: list = []
    with open(path, "rb") as fh:
        for offset, size in spans:
            fh.seek(offset)
            data = fh.read(size)
            try:
                w = pb.NodeWindow.FromString(data)
            except Exception:                 # the reader raises its own error for it
                out.append(_UNSETTLED)
                continue
            exc = _verdict(w, size)
            out.append(_OK if exc is None else (exc.field, exc.problem))
    return out


__all__ = ["CHUNK", "MIN_PARALLEL_BYTES", "default_workers", "validated_windows"]
