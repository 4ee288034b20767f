"""A process's training steps in one window, from the step boundaries the probes recorded.

Why steps: CPU contention delays a rank *between* its CUDA calls, not inside them, so launch
latency does not move when a noisy neighbour shares the rank's core; the step time does. The BPF
program (collector/ebpf_program.c) records, per process and per periodic API (a synchronize, a
graph launch, the ``hypertrace.step()`` marker), the interval between consecutive returns of
that API and the part of it not spent waiting (``busy`` = interval - sync time - off-CPU time).
What is left here is choosing *which* periodic API is the step:

1. **The marker**, when the process calls ``hypertrace.step()`` (at least ``min_steps`` times in
   the window): the user said where a step ends.
2. Otherwise **the most regular recurring call**: among periodic APIs with at least
   ``min_steps`` intervals whose interval histogram is regular (p90 / p10 <= ``max_spread``),
   the one with the largest median interval. A training loop synchronizes once per step
   (``loss.item()``, an optimizer's ``cudaStreamSynchronize``, a collective's wait), so its
   interval is the step. When a step holds several evenly spaced synchronizations, the one with
   the largest regular interval is still at best a sub-step (each sync's interval is a fraction
   of the step); that sub-step slows down with the step, which is what the analyzer compares
   across ranks, so it serves, and the source names the API so a reader knows.
3. Otherwise **no step**, with the reason naming the best candidate and why it was refused (too
   few intervals, or too irregular: an API called at data-dependent times is not a clock).

**Hysteresis.** Between 1 and 2 sits the API the process's steps were last inferred from
(``prefer``, remembered per process by the agent): while it has at least ``min_steps`` intervals
and their spread stays within the looser ``sticky_spread`` (default 4), it stays the step, even
when another API now looks more regular or longer. Why: a rank slowed by a CPU hog on its core
has stretched, uneven step intervals (a preemption lands in some steps and not others), so
under the strict ``max_spread`` its steps were refused in exactly the windows where its step
time is the evidence (the analyzer's what-if needs the slow rank's step). Contention stretches a
step's intervals; it does not turn the step into a different pattern, so the API that was the
clock stays the clock. Proof that it is not a clock (spread above ``sticky_spread``) drops it
and the strict rule applies again; a window with too few of its intervals says nothing either
way and keeps it. Staying on one API also keeps the step series of a process comparable from
window to window. The marker still wins over everything.

Everything here is pure numpy on :class:`ProcessStats`-like records, so it is tested without
a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np

from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import pack_histogram

#: The step marker's API name (collector/marker.py calls it once per training step).
MARKER_API = "hypertrace_step"


class PeriodicLike(Protocol):
    """What inference needs of one periodic API's boundaries (collector.ebpf.PeriodicSample)."""
    api: str
    intervals: np.ndarray
    busy: np.ndarray
    count: int
    interval_sum_ns: int
    sync_wait_ns: int
    offcpu_wait_ns: int


class StatsLike(Protocol):
    """What inference needs of one process's window (collector.ebpf.ProcessStats)."""
    pid: int
    periodic: Mapping[str, PeriodicLike]


def _empty() -> np.ndarray:
    return np.zeros(buckets.NUM_BUCKETS, dtype=np.uint64)


@dataclass
class StepInference:
    """The steps of one process in one window, or why there are none."""
    source: str = ""                 # "marker" | "inferred:<api>" | "" (refused)
    refused: str = ""                # why no step, when source is ""
    steps: int = 0
    step_hist: np.ndarray = field(default_factory=_empty)    # step durations (ns buckets)
    busy_hist: np.ndarray = field(default_factory=_empty)    # step minus its waits (ns buckets)
    gpu_wait_ns: int = 0             # synchronize time inside these steps
    peer_wait_ns: int = 0            # off-CPU time outside CUDA calls inside these steps
    step_sum_ns: int = 0
    #: The API to pass as ``prefer`` next window (None: none). Not on the wire.
    next_prefer: str | None = None

    def to_proto(self) -> tuple[pb.Histogram, pb.StepStats]:
        """``(ProcessWindow.step_time, ProcessWindow.steps)``."""
        return pack_histogram(self.step_hist), pb.StepStats(
            source=self.source, refused=self.refused, steps=self.steps,
            busy_time=pack_histogram(self.busy_hist), gpu_wait_us=self.gpu_wait_ns / 1e3,
            peer_wait_us=self.peer_wait_ns / 1e3, step_sum_us=self.step_sum_ns / 1e3)


def _from(sample: PeriodicLike, source: str, next_prefer: str | None) -> StepInference:
    return StepInference(
        source=source, steps=int(sample.count), next_prefer=next_prefer,
        step_hist=np.asarray(sample.intervals, dtype=np.uint64).copy(),
        busy_hist=np.asarray(sample.busy, dtype=np.uint64).copy(),
        gpu_wait_ns=int(sample.sync_wait_ns), peer_wait_ns=int(sample.offcpu_wait_ns),
        step_sum_ns=int(sample.interval_sum_ns))


def interval_quantiles_ns(sample: PeriodicLike) -> tuple[float, float, float]:
    """(p10, p50, p90) of the API's return-to-return intervals, in ns (NaN when empty)."""
    q = buckets.quantiles_us(np.asarray(sample.intervals, dtype=np.uint64), [0.1, 0.5, 0.9])
    return float(q[0] * 1e3), float(q[1] * 1e3), float(q[2] * 1e3)


def _spread(sample: PeriodicLike) -> tuple[float, float, float, float]:
    """(p90/p10, p10, p50, p90) of the API's intervals (inf when p10 is 0)."""
    p10, p50, p90 = interval_quantiles_ns(sample)
    return (p90 / p10 if p10 > 0 else float("inf")), p10, p50, p90


def infer_steps(stats: StatsLike | None, min_steps: int = 3, max_spread: float = 1.5,
                prefer: str | None = None, sticky_spread: float = 4.0) -> StepInference:
    """Pick the step source of one process's window (module docstring has the rule).

    ``min_steps``: fewest intervals that make a step estimate; ``max_spread``: the largest
    p90/p10 ratio of intervals still called regular; ``prefer``: the API the process's steps
    were last inferred from (the previous result's ``next_prefer``), kept while its spread is
    at most ``sticky_spread``.
    """
    if min_steps < 1 or not max_spread >= 1 or not sticky_spread >= max_spread:
        raise ValueError(f"need min_steps >= 1 and 1 <= max_spread <= sticky_spread, got "
                         f"min_steps={min_steps}, max_spread={max_spread}, "
                         f"sticky_spread={sticky_spread}")
    periodic = dict(stats.periodic) if stats is not None else {}
    marker = periodic.pop(MARKER_API, None)
    if marker is not None and marker.count >= min_steps:
        return _from(marker, "marker", prefer)
    dropped = ""                     # why the preferred API lost its place, when it did
    preferred = periodic.get(prefer) if prefer else None
    if preferred is not None and preferred.count >= min_steps:
        spread, p10, _p50, p90 = _spread(preferred)
        if spread <= sticky_spread:
            return _from(preferred, f"inferred:{prefer}", prefer)
        dropped = (f"{prefer}, the step of the last windows, spread p90/p10 = {spread:.2f} > "
                   f"{sticky_spread:g} (p10 {p10 / 1e6:.3g} ms, p90 {p90 / 1e6:.3g} ms): "
                   "no longer a clock")
        prefer = None
    inf = _strict(periodic, marker, min_steps, max_spread)
    if inf.refused:
        if dropped:
            inf.refused = f"{dropped}; {inf.refused}"
        inf.next_prefer = prefer     # too few of its intervals says nothing: keep it
    return inf


def _strict(periodic: dict[str, PeriodicLike], marker: PeriodicLike | None, min_steps: int,
            max_spread: float) -> StepInference:
    """Rule 2, else 3, of the module docstring (the marker is already ruled out)."""
    if not any(s.count > 0 for s in periodic.values()) and (marker is None or not marker.count):
        return StepInference(refused="no periodic calls this window (no synchronize, graph "
                                     "launch or hypertrace.step() call was seen twice)")
    regular: list[tuple[float, str, PeriodicLike]] = []
    irregular: list[tuple[float, str, float, float]] = []     # (spread, api, p10, p90)
    few: list[tuple[int, str]] = []
    for api in sorted(periodic):
        s = periodic[api]
        if s.count < min_steps:
            few.append((int(s.count), api))
            continue
        spread, p10, p50, p90 = _spread(s)
        if spread <= max_spread:
            regular.append((p50, api, s))
        else:
            irregular.append((spread, api, p10, p90))
    if regular:
        _p50, api, s = max(regular, key=lambda r: (r[0], r[1]))
        return _from(s, f"inferred:{api}", api)
    if irregular:
        spread, api, p10, p90 = min(irregular)
        why = (f"{api} is the most regular periodic call but not regular enough: its intervals "
               f"spread p90/p10 = {spread:.2f} > {max_spread:g} (p10 {p10 / 1e6:.3g} ms, "
               f"p90 {p90 / 1e6:.3g} ms)")
    else:
        count, api = max(few) if few else (0, "")
        why = f"{api} recurred only {count} times, fewer than {min_steps}"
    if marker is not None and marker.count:
        why += (f"; the step marker was called {marker.count} times, fewer than {min_steps} "
                "(a window shorter than 3 steps: lengthen the window)")
    return StepInference(refused=why)
