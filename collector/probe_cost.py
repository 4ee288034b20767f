"""Measure what one probed call costs, on this node, with this kernel.

Why measure instead of assuming: the cost of an entry+return uprobe ranges from under 1 us on
bare metal to several us in a Firecracker VM. The governor's whole promise (every process pays at
most the budget) is only as good as this number.

How: a tiny helper program (probe_cost_bench.c, compiled with the system C compiler on first use
into a cache directory) calls ``hypertrace_null`` N times and prints the **CPU time** the loop
took (CLOCK_THREAD_CPUTIME_ID). We run it without probes, then with the session's own
entry+return probes on that function (the same BPF program and maps the real probes use), and
take the per-call difference. The median of a few repetitions damps what noise is left.

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
import os
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


def _run(exe: Path, calls: int) -> int:
    out = subprocess.run([str(exe), str(calls)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


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
    try:
        base = statistics.median(_run(exe, calls) for _ in range(repeats))
        sess.attach_symbol(str(exe), NULL_SYMBOL, api=CALIBRATION_API.name)
        try:
            probed = statistics.median(_run(exe, calls) for _ in range(repeats))
        finally:
            sess.detach(str(exe))
        if own:
            seen = sum(s.count for (_, api), s in sess.read_and_clear().items()
                       if api == CALIBRATION_API.name)
            if seen < calls * repeats:
                raise ProbeUnavailable(f"the calibration probe saw {seen} of {calls * repeats} "
                                       "calls: uprobes are not firing on this node")
    finally:
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
