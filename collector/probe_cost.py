"""Measure what one probed call costs, on this node, with this kernel.

Why measure instead of assuming: the cost of an entry+return uprobe ranges from under 1 us on
bare metal to several us in a Firecracker VM. The governor's whole promise (every process pays at
most the budget) is only as good as this number.

How: a tiny helper program (probe_cost_bench.c, compiled with the system C compiler on first use
into a cache directory) times loops of N calls of ``hypertrace_null`` in **CPU time**
(CLOCK_THREAD_CPUTIME_ID): a few loops without probes, then, after we attach the session's own
entry+return probes to that function in that process only (the same BPF program and maps the
real probes use), a few loops with them. The difference of the medians per call is the cost.

Two choices keep the number honest (an earlier wall-clock calibration on a bare ``ret`` read
2x too high on an H200 host and 10-100x too high on a loaded VM):

* CPU time, not wall time: the probe's work is charged to the traced thread, while wall time
  also counts every moment another task held the CPU.
* ``hypertrace_null`` opens like a real library function (``push %rbp; mov %rsp,%rbp``), which
  the kernel emulates; a bare ``ret`` is single-stepped out of line and costs more than any
  probed CUDA entry point would.
"""
from __future__ import annotations

import logging
import statistics
import subprocess
from pathlib import Path

from hypertrace.collector.cbuild import BuildError, build_c
from hypertrace.collector.ebpf import CALIBRATION_API, ProbeUnavailable, UprobeSession

log = logging.getLogger(__name__)

BENCH_SOURCE = Path(__file__).with_name("probe_cost_bench.c")
#: The lowest believable cost of an entry+return uprobe pair: a trap in, the BPF program and the
#: return trampoline cannot take less, even on bare metal.
MIN_PROBE_COST_NS = 300.0
NULL_SYMBOL = "hypertrace_null"


def bench_binary() -> Path:
    """Path of the compiled calibration helper (built once per source version)."""
    try:
        return build_c(BENCH_SOURCE, "probe-cost-bench", ["-O2", "-rdynamic"])
    except BuildError as exc:
        raise ProbeUnavailable(f"{exc}; or set the agent's probe_cost_ns (--probe-cost-ns) to a "
                               "measured value") from exc


def _timed(proc: subprocess.Popen, repeats: int) -> float:
    """Median of the helper's next ``repeats`` loop times (ns)."""
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return statistics.median(int(proc.stdout.readline()) for _ in range(repeats))


def measure_probe_cost_ns(session: UprobeSession | None = None, calls: int = 20000,
                          repeats: int = 5) -> float:
    """CPU nanoseconds one entry+return-probed call costs the calling process (>= the floor).

    With ``session=None`` a private session is compiled (seconds) and closed afterwards; pass the
    agent's session to reuse its loaded program. The calibration records appear in that
    session's next read under the helper's short-lived pid and API ``hypertrace_null``.
    """
    if calls <= 0 or repeats <= 0:
        raise ValueError("calls and repeats must be positive")
    exe = bench_binary()
    own = session is None
    sess = session if session is not None else UprobeSession(apis=())
    proc = subprocess.Popen([str(exe), str(calls), str(repeats)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline().split()
        if len(ready) != 2 or ready[0] != "ready":
            raise ProbeUnavailable(f"the calibration helper {exe} did not start: {ready}")
        pid = int(ready[1])
        base = _timed(proc, repeats)
        if proc.stdout.readline().strip() != "probe":
            raise ProbeUnavailable(f"the calibration helper {exe} broke its protocol")
        sess.attach_symbol(str(exe), NULL_SYMBOL, api=CALIBRATION_API.name, pid=pid)
        try:
            probed = _timed(proc, repeats)
        finally:
            sess.detach(str(exe), pid)
        proc.wait(timeout=30)
        if own:
            seen = sum(s.count for (_, api), s in sess.read_and_clear().items()
                       if api == CALIBRATION_API.name)
            if seen < calls * repeats:
                raise ProbeUnavailable(f"the calibration probe saw {seen} of {calls * repeats} "
                                       "calls: uprobes are not firing on this node")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if own:
            sess.close()
    measured = (probed - base) / calls
    if measured < MIN_PROBE_COST_NS:
        # A noisy calibration (the unprobed run happened to be slower) must not read as "free":
        # a zero cost would let the governor keep the probes attached all the time.
        log.warning("probe cost measured %.0f ns/call, below the %.0f ns floor; using the floor",
                    measured, MIN_PROBE_COST_NS)
        return MIN_PROBE_COST_NS
    return measured
