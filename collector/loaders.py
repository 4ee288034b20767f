"""A rank's loader workers: its child processes, and what they used of the node's CPUs.

An input pipeline is the commonest slow rank (too few DataLoader workers, a slow disk, a decode
competing for CPUs). The workers are the rank's children and share its environment, so discovery
would take each for one more process of the rank: they are grouped under it instead, told to the
BPF program (a wake-up by one of them ends a loader wait), and their CPU time and run-queue wait
per window are read from /proc, to explain a loader wait ("its 2 workers are 97% busy").
"""
from __future__ import annotations

import os
from dataclasses import dataclass

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass
class LoaderSample:
    """One rank's loader workers over one window."""
    workers: int
    cpu_s: float
    runq_s: float


def read_cpu_and_runq(pid: int, proc_root: str = "/proc") -> tuple[float, float] | None:
    """(CPU seconds, run-queue seconds) of a process so far, or None once it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
        fields = raw[raw.rfind(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) * _TICK_S      # utime, stime (fields 14, 15)
        runq = 0.0
        try:
            with open(f"{proc_root}/{pid}/schedstat") as f:
                runq = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            pass                                   # no schedstats in this kernel: CPU only
        return cpu, runq
    except (OSError, IndexError, ValueError):
        return None


class LoaderTracker:
    """The loader workers of each rank and the /proc readings of the previous window."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self.workers: dict[int, set[int]] = {}          # rank pid -> worker pids
        self._last: dict[int, tuple[float, float]] = {}  # worker pid -> its last reading

    def set_workers(self, rank_pid: int, workers: set[int]) -> None:
        self.workers[rank_pid] = set(workers)

    def forget(self, rank_pid: int) -> None:
        for w in self.workers.pop(rank_pid, set()):
            self._last.pop(w, None)

    def sample(self) -> dict[int, LoaderSample]:
        """Per rank tracked: its workers' count (0: none, the loader runs in the rank) and what
        they used since the previous sample (a worker seen for the first time counts from now
        on)."""
        out: dict[int, LoaderSample] = {}
        for rank, workers in self.workers.items():
            cpu = runq = 0.0
            alive = 0
            for w in workers:
                now = read_cpu_and_runq(w, self.proc_root)
                if now is None:
                    self._last.pop(w, None)
                    continue
                alive += 1
                before = self._last.get(w, now)
                cpu += max(now[0] - before[0], 0.0)
                runq += max(now[1] - before[1], 0.0)
                self._last[w] = now
            out[rank] = LoaderSample(workers=alive, cpu_s=cpu, runq_s=runq)
        return out
