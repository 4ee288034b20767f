"""Scheduler evidence of the probed threads, read in process from /proc/self/task.

CPU contention delays a rank between its CUDA calls, so callbacks alone miss it. The kernel
keeps, per thread, the time runnable but waiting for a CPU (``schedstat``) and the context
switches (``status``); summed over the threads that made a probed call they give the window's
``SchedStats``. Summing is an approximation of the eBPF program's "some thread waits and none
runs", exact with one training thread per rank; there is no run-queue histogram in process.
"""
from __future__ import annotations

import numpy as np

from hypertrace.collector.ebpf import SchedSample
from hypertrace.proto import buckets


class ThreadSched:
    """Per-window deltas of the listed threads' run delay and context switches."""

    def __init__(self, proc_self: str = "/proc/self"):
        self.proc_self = proc_self
        self._last: dict[int, tuple[int, int, int]] = {}

    def _read(self, tid: int) -> tuple[int, int, int] | None:
        base = f"{self.proc_self}/task/{tid}"
        try:
            with open(f"{base}/schedstat") as f:
                runq = int(f.read().split()[1])
            vol = invol = 0
            with open(f"{base}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        invol = int(line.split()[1])
            return runq, vol, invol
        except (OSError, ValueError, IndexError):
            return None

    def sample(self, tids: list[int], offcpu_ns: int, window_s: float) -> SchedSample | None:
        """The window's evidence, or None when no thread's schedstat can be read (no
        CONFIG_SCHED_INFO, or no probed thread yet)."""
        runq = vol = invol = 0
        seen = 0
        for tid in tids:
            cur = self._read(tid)
            if cur is None:
                self._last.pop(tid, None)        # exited (or unreadable): forget it
                continue
            seen += 1
            prev = self._last.get(tid)
            self._last[tid] = cur
            if prev is not None:
                runq += max(cur[0] - prev[0], 0)
                vol += max(cur[1] - prev[1], 0)
                invol += max(cur[2] - prev[2], 0)
        if not seen:
            return None
        cap = int(window_s * 1e9)
        return SchedSample(runq_ns=min(runq, cap), offcpu_ns=min(max(offcpu_ns, 0), cap),
                           involuntary=invol, voluntary=vol,
                           runq_hist=np.zeros(buckets.NUM_BUCKETS, dtype=np.uint64))
