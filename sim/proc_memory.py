"""The memory of a process and of everything it started: PSS from /proc/PID/smaps_rollup.

Why PSS and not RSS: the analyzer is several processes (the server, its Engine worker, window
checkers, the retention process, multiprocessing's forkserver) that share pages: the
interpreter, numpy, pages a fork copied. RSS counts a shared page once per process, and the
main process's RSS alone leaves the others out. PSS divides each page among the processes
mapping it, so the PSS of all of them adds up to what the machine gives the analyzer.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from hypertrace.collector.memory import proc_kb


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...) from /proc's children lists: the
    retention process is a child of multiprocessing's forkserver, itself the analyzer's."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue                     # ended meanwhile
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", encoding="ascii") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def pss_kb(pid: int) -> int | None:
    """The proportional set size of ``pid`` in kB; None when it ended or its smaps_rollup
    cannot be read (another user's process, a kernel without it: Linux < 4.14)."""
    return proc_kb(pid, "smaps_rollup", "Pss:")


def rss_kb(pid: int) -> int | None:
    """The resident set of ``pid`` in kB (VmRSS: what top and systemd show a user); None when
    it ended or cannot be read."""
    return proc_kb(pid, "status", "VmRSS:")


@dataclass(frozen=True)
class TreeMemory:
    """PSS of a process and of every process below it, at one moment."""

    main_kb: int
    #: (pid, kB) of each process below the main one that could be read
    children_kb: tuple[tuple[int, int], ...]

    @property
    def processes(self) -> int:
        return 1 + len(self.children_kb)

    @property
    def total_kb(self) -> int:
        return self.main_kb + sum(kb for _, kb in self.children_kb)

    @property
    def total_mb(self) -> float:
        return self.total_kb / 1024

    @property
    def main_mb(self) -> float:
        return self.main_kb / 1024


def tree_pss(pid: int) -> TreeMemory:
    """PSS of ``pid`` and of each process below it now (:func:`descendants`); a child that
    ended between the listing and the read is left out. Raises ProcessLookupError when
    ``pid`` itself cannot be read."""
    main = pss_kb(pid)
    if main is None:
        raise ProcessLookupError(f"no readable /proc/{pid}/smaps_rollup (ended, or another "
                                 "user's process: run the bench as the analyzer's user)")
    kids = tuple((k, kb) for k in descendants(pid) if (kb := pss_kb(k)) is not None)
    return TreeMemory(main, kids)
