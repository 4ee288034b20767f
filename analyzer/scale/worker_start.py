"""Whether a recorded file is read with worker processes, and their fork server started early.

Why a module of its own: it imports nothing heavy (no protobuf, no numpy), so ``hypertrace
analyze`` can start the fork server of :mod:`hypertrace.analyzer.scale.validate_ahead`'s workers before
it imports anything else. The fork server is a fresh interpreter that imports the workers'
modules before it forks them (0.3-0.5 s on the dev VM); started first, that runs on another core
while the reader imports the same modules and opens the file, instead of after them.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import stat
from pathlib import Path

#: Files smaller than this are validated in this process (starting workers costs more).
MIN_PARALLEL_BYTES = 4 << 20
#: The module of the validation workers' task (imported by the fork server before it forks).
WORKER_MODULE = "hypertrace.analyzer.scale.validate_ahead"

log = logging.getLogger(__name__)


def default_workers() -> int:
    """Worker processes when not told: the cores this process may use, less one for the
    reader, at most 8, at least 1. The reader registers GPUs and scores epochs while the workers
    read (16k GPUs x 4 windows on the GPU host's Xeon, 5 cores: 4 workers 3.50-3.53 s, 5 workers
    3.89-4.10 s), so it needs a core of its own."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                     # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores - 1))


def plain_binary(path: str | Path, min_bytes: int) -> bool:
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


def preload_modules(prepare_module: str | None) -> list[str]:
    """What the fork server imports before it forks a worker: the main module, the workers'
    task and the module of the caller's ``prepare`` (None: none)."""
    return ["__main__", WORKER_MODULE] + ([prepare_module] if prepare_module else [])


def fork_context(prepare_module: str | None) -> multiprocessing.context.BaseContext:
    """The forkserver context, its preload set (it takes effect where the server is not yet
    running). forkserver, not fork: a process that already runs threads (gRPC's, a test
    runner's) can fork a child holding a lock that no thread will ever release."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(preload_modules(prepare_module))
    return ctx


def start_early(path: str | Path, workers: int, prepare_module: str | None) -> bool:
    """Start the fork server now, without waiting for it, when ``path`` will be read with
    ``workers`` worker processes (:func:`~hypertrace.analyzer.scale.validate_ahead.validated_windows`
    with ``prepare`` from ``prepare_module``); whether it was started. Where it cannot start,
    nothing happens: the pool's own start then finds out and the read goes on in this process."""
    if workers <= 0 or not plain_binary(path, MIN_PARALLEL_BYTES):
        return False
    fork_context(prepare_module)
    from multiprocessing import forkserver
    try:
        forkserver.ensure_running()
    except (OSError, ValueError) as exc:
        log.debug("fork server not started early: %s", exc)
        return False
    return True


__all__ = ["MIN_PARALLEL_BYTES", "WORKER_MODULE", "default_workers", "fork_context",
           "plain_binary", "preload_modules", "start_early"]
