"""Starting and ending the analyzer's worker processes (retention, Engine, window checkers).

Every worker is started by multiprocessing's ``forkserver`` context, not ``fork``: the analyzer
runs threads (gRPC's, the store's), and a forked child could inherit a lock held by a thread that
does not exist in it. Each talks to the analyzer over one pipe and exits when the analyzer closes
its end or dies (the pipe then reads EOF), so ending one is closing the pipe and waiting, then
killing it if it does not go.
"""
from __future__ import annotations

import multiprocessing
from typing import Any, Callable

#: How long a worker may take to start and say it is ready (forkserver's first start and the
#: worker's imports: about a second on the dev VM).
START_TIMEOUT_S = 60.0


class WorkerUnavailable(RuntimeError):
    """The worker process cannot run here, or it died; the message says why."""


def spawn(target: Callable[..., None], name: str, args: tuple, what: str) -> tuple[Any, Any]:
    """Start ``target(their_end_of_the_pipe, *args)`` in a daemon worker process named
    ``name``; returns (the process, our end of the pipe). ``what`` names the worker in the
    WorkerUnavailable raised where it cannot start (no /dev/shm or Unix sockets in a sandbox)."""
    try:
        ctx = multiprocessing.get_context("forkserver")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_without_interrupt, name=name, daemon=True,
                           args=(target, theirs, *args))
        proc.start()
    except (OSError, ValueError) as exc:
        raise WorkerUnavailable(f"{what} could not start ({exc})") from exc
    theirs.close()
    return proc, mine


def _without_interrupt(target: Callable[..., None], *args: Any) -> None:
    """Run a worker deaf to SIGINT. Why: Ctrl-C in a terminal signals the whole process group,
    workers included; the analyzer stops them itself (closing their pipes), while a worker
    killed by the KeyboardInterrupt looked like a crash, which was logged as an ERROR and
    replaced by a new worker in the middle of the shutdown."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    target(*args)


def end(proc: Any, conn: Any, terminate: bool = False) -> None:
    """Close our end of the pipe and see the worker gone: it exits on the pipe's end (at once
    with ``terminate``: SIGTERM, for one that may be busy), and is killed if it does not."""
    if conn is not None:
        conn.close()
    if proc is None:
        return
    if terminate and proc.is_alive():
        proc.terminate()
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    proc.close()


__all__ = ["START_TIMEOUT_S", "WorkerUnavailable", "end", "spawn"]
