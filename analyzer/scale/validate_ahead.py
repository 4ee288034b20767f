"""A recorded file's windows validated in worker processes, ahead of the reader that ingests them.

Why: validating a window costs more than parsing and ingesting it (a 16k-GPU recording: 2.2 s
against 0.4 s and 1.5 s on the dev VM), and it depends on the window alone. For a plain binary
records file (``.pb``, not gzipped, a regular file), worker processes parse and validate chunks
of its records while the reader parses and ingests them in order, so validation leaves the
critical path of ``hypertrace analyze`` wherever a second core is free.

What does not change: a window is handed on only once its verdict is known, and the verdict is
the one :func:`hypertrace.proto.wire.validate_window` gives (the workers run it on the same
bytes; its error, field and text travel back as they are). Whatever a worker cannot settle (a
record it cannot parse, records past a doubtful length) is validated by the reader itself, and
the reader's own framing errors are raised as before. Anything else (gzip, JSON lines, stdin, a
small file, ``workers`` 0) is validated in this process, window by window.

A worker may do more with a chunk it found valid: the caller's ``prepare`` (``analyze`` passes
the Engine's :func:`~hypertrace.analyzer.score.engine.prepare_windows`, which takes the histograms and
numbers out of the messages) runs on its windows there, and the reader gets its result instead
of the windows, which it then does not parse at all.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from google.protobuf.message import DecodeError

from hypertrace.analyzer.scale.worker_start import MIN_PARALLEL_BYTES, default_workers, fork_context
from hypertrace.analyzer.scale.worker_start import plain_binary as _plain_binary
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import records, wire
from hypertrace.proto.window_parts import window_part

#: Records per task: large enough that a task's hand-off is negligible, small enough that the
#: reader waits little for the first.
CHUNK = 256

log = logging.getLogger(__name__)

_OK, _UNSETTLED = 0, 1            # a verdict: one of these, or an error's (field, problem)


@dataclass
class Prepared:
    """A chunk of windows that a worker found valid and handed to ``prepare``: what it returned
    (``value``), in place of the ``windows`` windows themselves."""

    value: Any
    windows: int
    #: every window after this chunk in the file has its midpoint ((start + end) // 2, ns) at
    #: or after this; None: no such promise (the last chunk, or the file could not say)
    later_midpoint_ns: int | None = None


def validated_windows(path: str | Path, workers: int, min_bytes: int = MIN_PARALLEL_BYTES,
                      prepare: Callable[[list[pb.NodeWindow]], Any] | None = None
                      ) -> Iterator[tuple[pb.NodeWindow, int | None, wire.WireError | None]
                                    | Prepared]:
    """(window, encoded size, the :class:`~hypertrace.proto.wire.WireError` that
    ``validate_window`` raises on it, or None) per record of ``path``, in order; framing errors
    of the file are raised as :func:`~hypertrace.proto.records.read_windows_sized` raises them.
    ``workers``: processes validating ahead (0: none, all here); files under ``min_bytes``
    are validated here. ``prepare`` (picklable): a worker whose chunk of windows is valid
    through and through passes them to it, and a :class:`Prepared` with its result comes in
    their place (the reader does not parse them); other chunks come window by window."""
    spans = _spans(path) if workers > 0 and _plain_binary(path, min_bytes) else []
    pool = _start_pool(workers, prepare) if len(spans) > CHUNK else None
    if pool is None:
        for w, size in records.read_windows_sized(path):
            yield w, size, _verdict(w, size)
        return
    with contextlib.ExitStack() as stack:
        handoff = stack.enter_context(tempfile.TemporaryDirectory(
            prefix="hypertrace-analyze-", dir=_handoff_dir())) if prepare is not None else ""
        stack.enter_context(pool)        # ended before handoff goes: no worker writes there after
        fh = stack.enter_context(open(path, "rb"))
        tasks = [(str(path), spans[i:i + CHUNK], prepare, handoff)
                 for i in range(0, len(spans), CHUNK)]
        results = pool.imap(_check_chunk, tasks)
        # while the workers start: what each chunk promises of the windows after it
        later = _later_midpoints(path, spans) if prepare is not None else []
        verdicts: list = []
        prepared = None
        for k, (where, data) in enumerate(records.read_records(fh, str(path))):
            if k < len(spans):
                if k % CHUNK == 0:
                    verdicts, prepared = next(results)
                    if prepared is not None:
                        yield Prepared(_take(prepared), len(verdicts),
                                       later[k // CHUNK] if later else None)
                if prepared is not None:
                    continue                       # it came in the chunk's Prepared
                v = verdicts[k % CHUNK]
                if v == _OK:
                    yield records.parse_record(data, where), len(data), None
                    continue
                if v != _UNSETTLED:
                    yield records.parse_record(data, where), len(data), wire.WireError(*v)
                    continue
            w = records.parse_record(data, where)
            yield w, len(data), _verdict(w, len(data))


def _start_pool(workers: int, prepare: Callable | None = None) -> Any:
    """The worker processes, or None where they cannot start (no usable /dev/shm for their
    semaphores, a sandbox without fork): then this process validates, as with ``workers`` 0.
    They are forked by a fork server (:func:`~hypertrace.analyzer.scale.worker_start.fork_context`),
    which imports this module and ``prepare``'s once, before it forks the workers, instead of
    each worker at its first chunk (about 0.1-0.15 s of each worker's start); where
    :func:`~hypertrace.analyzer.scale.worker_start.start_early` started it, it is already running."""
    ctx = fork_context(getattr(prepare, "func", prepare).__module__ if prepare is not None
                       else None)
    try:
        return ctx.Pool(workers)
    except (OSError, ValueError) as exc:
        log.warning("validating in this process: worker processes could not start (%s)", exc)
        return None


def _verdict(w: pb.NodeWindow, size: int | None) -> wire.WireError | None:
    try:
        wire.validate_window(w, encoded_size=size)
    except wire.WireError as exc:
        return exc
    return None


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


def _handoff_dir() -> str | None:
    """Where workers leave what ``prepare`` made: memory (/dev/shm) where there is one."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _leave(value: Any, handoff: str) -> str:
    """Pickle ``value`` into a new file of ``handoff``; its path. Why a file and not the
    pool's result pipe: results of a megabyte came through it for 50 ms each (read 64 KB at a
    time into buffers of the whole size), and the pool's worker-watching thread then spun."""
    fd, name = tempfile.mkstemp(dir=handoff)
    with os.fdopen(fd, "wb") as out:
        pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
    return name


def _take(name: str) -> Any:
    """What :func:`_leave` left at ``name``; the file is removed."""
    try:
        with open(name, "rb") as fh:
            return pickle.load(fh)
    finally:
        os.unlink(name)


def _later_midpoints(path: str | Path, spans: list[tuple[int, int]]) -> list[int | None]:
    """Per chunk of ``spans``, the earliest midpoint of the windows in the chunks after it
    (None for the last); empty when some record's midpoint cannot be read for sure or records
    follow the spans (then nothing is promised)."""
    mids: list[int] = []
    with open(path, "rb") as fh:
        if not spans or sum(spans[-1]) != os.fstat(fh.fileno()).st_size:
            return []
        for offset, size in spans:
            fh.seek(offset)
            mid = midpoint_ns(fh.read(size))
            if mid is None:
                return []
            mids.append(mid)
    out: list[int | None] = []
    low: int | None = None
    for i in reversed(range(0, len(mids), CHUNK)):
        out.append(low)
        here = min(mids[i:i + CHUNK])
        low = here if low is None else min(low, here)
    out.reverse()
    return out


def midpoint_ns(data: bytes) -> int | None:
    """``(start + end) // 2`` in ns of the serialized NodeWindow ``data``, as parsing the window
    gives it, without parsing its processes (about a fifth of the time): the bytes are read as
    a message that has only the window's ``start`` and ``end`` (the other fields are skipped
    as unknown ones). None when they do not parse."""
    try:
        times = _WindowTimes.FromString(data)
    except DecodeError:
        return None
    return (times.start.ToNanoseconds() + times.end.ToNanoseconds()) // 2


#: NodeWindow's ``start`` and ``end`` alone (proto/window_parts.py).
_WindowTimes = window_part("WindowTimes", ("start", "end"))


def _check_chunk(task: tuple[str, list[tuple[int, int]], Callable | None, str]
                 ) -> tuple[list, str | None]:
    """A worker: the verdict on each record of one chunk, and where it left what ``prepare``
    made of its windows when every one is valid (else None)."""
    path, spans, prepare, handoff = task
    out: list = []
    windows: list[pb.NodeWindow] = []
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
            windows.append(w)
    ready = prepare is not None and len(windows) == len(out) and all(v == _OK for v in out)
    return out, (_leave(prepare(windows), handoff) if ready else None)


__all__ = ["CHUNK", "MIN_PARALLEL_BYTES", "Prepared", "default_workers", "validated_windows"]
