"""Measure what one probed call costs, on this node, with this kernel.

The governor's promise is only as good as this number, and an entry+return uprobe costs from
under a microsecond on bare metal to several in a VM. A helper (probe_cost_bench.c) times loops
of ``hypertrace_null`` calls in thread CPU time, without probes and then with the session's own
entry+return probes on that function in that process; the difference of the medians per call
is the cost. CPU time, because the probe's work is charged to the traced thread while wall time
counts other tasks too; and ``hypertrace_null`` opens like a real library function (``push
%rbp``, emulated by the kernel), where a bare ``ret`` would be single-stepped and cost more
(docs/design.md, "The probe cost is calibrated in CPU time, on a real prologue").
"""
from __future__ import annotations

import logging
import statistics
import subprocess
from pathlib import Path

from hypertrace.collector.ebpf import CALIBRATION_API, ProbeUnavailable, UprobeSession
from hypertrace.proto.cbuild import BuildError, build_c

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
