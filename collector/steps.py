"""A process's training steps, found in the sequence of its step-boundary calls.

Why steps: CPU contention delays a rank between its CUDA calls, not inside them, so the step
time shows it where launch latency does not. Both backends log every return of a periodic call
and every ``hypertrace.step()`` marker with the process's cumulative synchronize and idle time
(:class:`BoundaryEvents`). The step is the marker when it fired ``min_steps`` times in the
window; else the shortest lag at which the sequence of calls repeats (:func:`period_scores`),
kept while it still repeats so a CPU-stretched step keeps its clock; else none, with the reason.
Synchronize time is a wait on the own GPU, idle time a wait for peers, the rest is busy
(docs/design.md, "Steps without code change"). Pure numpy: tested without a kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import pack_histogram

#: The step marker's API name (collector/marker.py calls it once per training step).
MARKER_API = "hypertrace_step"
#: Longest pattern (in calls) taken for one step.
MAX_PERIOD = 64
#: Events of a process kept across windows for the period search.
HISTORY = 4096


def _empty() -> np.ndarray:
    return np.zeros(buckets.NUM_BUCKETS, dtype=np.uint64)


@dataclass
class ApiIntervals:
    """One API's return-to-return intervals and the waits inside each (ns)."""
    durations_ns: np.ndarray
    sync_wait_ns: np.ndarray
    offcpu_wait_ns: np.ndarray

    @property
    def count(self) -> int:
        return len(self.durations_ns)


@dataclass
class BoundaryEvents:
    """A process's step-boundary events since the previous read, oldest first.

    ``sync_ns``, ``offcpu_ns``, ``loader_ns`` and ``io_ns`` are cumulative counters as of each
    event (the process's time in synchronize calls, its idle time, the part of that its own
    loader workers ended, and the part it spent blocked on its own I/O), so any two events give
    the waits between them. ``lost``: events that were
    overwritten before this read (the log is a ring)."""

    ts_ns: np.ndarray
    api: np.ndarray                 # API name per event (numpy str array)
    sync_ns: np.ndarray
    offcpu_ns: np.ndarray
    lost: int = 0
    loader_ns: np.ndarray | None = None     # None: the backend cannot tell (all zero)
    io_ns: np.ndarray | None = None         # None: the backend cannot tell (all zero)

    def __post_init__(self) -> None:
        if self.loader_ns is None:
            self.loader_ns = np.zeros(len(self.ts_ns), dtype=np.uint64)
        if self.io_ns is None:
            self.io_ns = np.zeros(len(self.ts_ns), dtype=np.uint64)

    @classmethod
    def empty(cls) -> "BoundaryEvents":
        z = np.zeros(0, dtype=np.uint64)
        return cls(z, np.zeros(0, dtype="<U1"), z, z)

    @classmethod
    def of(cls, ts_ns, api, sync_ns=None, offcpu_ns=None, lost: int = 0,
           loader_ns=None, io_ns=None) -> "BoundaryEvents":
        """From sequences (tests, the CUPTI recorder); missing counters read as 0."""
        ts = np.asarray(ts_ns, dtype=np.uint64)

        def col(v) -> np.ndarray:
            return np.zeros(len(ts), dtype=np.uint64) if v is None else np.asarray(
                v, dtype=np.uint64)
        return cls(ts, np.asarray(api, dtype=str), col(sync_ns), col(offcpu_ns), lost,
                   col(loader_ns), col(io_ns))

    def __len__(self) -> int:
        return len(self.ts_ns)

    def intervals(self, api: str) -> "ApiIntervals":
        """The intervals between consecutive boundaries of one API, with the waits inside them."""
        at = np.flatnonzero(self.api == api)
        ts, sync, off = (x[at].astype(np.int64) for x in (self.ts_ns, self.sync_ns,
                                                           self.offcpu_ns))
        return ApiIntervals(np.diff(ts), np.maximum(np.diff(sync), 0),
                            np.maximum(np.diff(off), 0))

    def only(self, apis: set[str] | frozenset[str]) -> "BoundaryEvents":
        """The events of these APIs (an API probed only in slices would come and go, and its
        calls would break the pattern)."""
        keep = np.isin(self.api, list(apis))
        return BoundaryEvents(self.ts_ns[keep], self.api[keep], self.sync_ns[keep],
                              self.offcpu_ns[keep], self.lost, self.loader_ns[keep],
                              self.io_ns[keep])


@dataclass
class StepInference:
    """The steps of one process in one window, or why there are none."""
    source: str = ""                 # "marker" | "inferred:<api>[/<P>]" | "" (refused)
    refused: str = ""                # why no step, when source is ""
    steps: int = 0
    step_hist: np.ndarray = field(default_factory=_empty)    # step durations (ns buckets)
    busy_hist: np.ndarray = field(default_factory=_empty)    # step minus its waits (ns buckets)
    own_hist: np.ndarray = field(default_factory=_empty)     # step minus its wait for peers
    gpu_wait_ns: int = 0             # synchronize time inside these steps
    peer_wait_ns: int = 0            # idle time inside these steps not ended by the own loader
    loader_wait_ns: int = 0          # idle time inside these steps that its loader workers ended
    io_wait_ns: int = 0              # idle time inside these steps blocked on its own I/O (D)
    step_sum_ns: int = 0
    #: Each step's end (monotonic ns, the kernel's clock) and duration. Not on the wire: the
    #: agent splits the window's steps into those a probe slice touched and the rest with them.
    ends_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    durations_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def ended_between(self, t0_ns: int, t1_ns: int) -> tuple[int, int]:
        """(steps, their summed duration in ns) of the steps that ended in [t0_ns, t1_ns]."""
        inside = (self.ends_ns >= t0_ns) & (self.ends_ns <= t1_ns)
        return int(np.count_nonzero(inside)), int(self.durations_ns[inside].sum())

    def to_proto(self) -> tuple[pb.Histogram, pb.StepStats]:
        """``(ProcessWindow.step_time, ProcessWindow.steps)``."""
        return pack_histogram(self.step_hist), pb.StepStats(
            source=self.source, refused=self.refused, steps=self.steps,
            busy_time=pack_histogram(self.busy_hist), own_time=pack_histogram(self.own_hist),
            gpu_wait_us=self.gpu_wait_ns / 1e3,
            peer_wait_us=self.peer_wait_ns / 1e3, step_sum_us=self.step_sum_ns / 1e3,
            loader_wait_us=self.loader_wait_ns / 1e3, io_wait_us=self.io_wait_ns / 1e3)


def source_api(source: str) -> str | None:
    """The API whose calls end the steps of a StepInference.source, or None without steps."""
    if source == "marker":
        return MARKER_API
    if source.startswith("inferred:"):
        return source.split(":", 1)[1].split("/", 1)[0]
    return None


def period_scores(tokens: np.ndarray, log_gap: np.ndarray, log_wait: np.ndarray,
                  max_period: int) -> tuple[np.ndarray, np.ndarray]:
    """(score, mismatch) per lag 1..max_period (index 0 unused): how unlike each call is to the
    call ``lag`` later, as the share of different APIs plus the median absolute differences of
    the log gaps before them and of half their log waits."""
    score = np.full(max_period + 1, np.inf)
    mismatch = np.ones(max_period + 1)
    for p in range(1, max_period + 1):
        m = float(np.mean(tokens[p:] != tokens[:-p]))
        dg = float(np.median(np.abs(log_gap[p:] - log_gap[:-p])))
        dw = float(np.median(np.abs(log_wait[p:] - log_wait[:-p])))
        mismatch[p] = m
        score[p] = m + dg + 0.5 * dw
    return score, mismatch


def _within(best: float, pairs: int) -> float:
    """The highest score still within the tolerance of ``best`` (:func:`choose_period`)."""
    return best + max(0.15, 0.3 * best) + 1.0 / np.sqrt(max(pairs, 1))


def choose_period(score: np.ndarray, pairs: int) -> int:
    """The shortest lag whose score is within a tolerance of the best (module docstring, 2).

    The tolerance grows with the best score (noisy loops) and with fewer pairs compared, so a
    short history picks the simplest period unless a longer one is clearly better. Then a
    divisor of the lag chosen (other than 1) is taken where it is within the tolerance of a
    robust best: each lag's score pooled, as the median, with its multiples' (every multiple
    of the period repeats as well as the period does). Why: the best alone is the luckiest of
    dozens of multiples. On a stand-in loop of three calls a step spread 5x (p90/p10) one
    multiple scored 0.79, the period 1.10 and most multiples 0.9-1.05, and the step read twice
    its length. Lag 1 is left to the first rule: every lag is its multiple, so pooling says
    nothing about it."""
    best = float(np.min(score[1:]))
    lag = int(np.flatnonzero(score[1:] <= _within(best, pairs))[0]) + 1
    pooled = [float(np.median(score[d::d])) for d in range(2, (score.size - 1) // 2 + 1)]
    if lag < 4 or not pooled:
        return lag
    bar = _within(min(pooled), pairs)
    for d in range(2, lag):
        if lag % d == 0 and score[d] <= bar:
            return d
    return lag


@dataclass
class _Period:
    lag: int
    phase: int                       # anchor position: global index % lag
    api: str                         # the anchor's API


def _spread(durations: np.ndarray) -> tuple[float, float, float]:
    """(p90/p10, p10, p90) of step durations in ns (inf when p10 is 0)."""
    p10, p90 = np.quantile(durations, [0.1, 0.9])
    return (float(p90 / p10) if p10 > 0 else float("inf")), float(p10), float(p90)


class StepFinder:
    """Finds one process's steps window after window from its boundary events.

    Keeps the last :data:`HISTORY` events (a step may begin in an earlier window than it ends,
    and the period search wants more calls than a short window holds) and the period found last
    (the hysteresis of the module docstring)."""

    def __init__(self, min_steps: int = 3, max_spread: float = 10.0, sticky_spread: float = 15.0,
                 max_mismatch: float = 0.25, history: int = HISTORY,
                 pattern_spread: float = 30.0) -> None:
        if (min_steps < 1 or not 1 <= max_spread <= sticky_spread <= pattern_spread
                or not 0 <= max_mismatch < 1):
            raise ValueError(f"need min_steps >= 1, 1 <= max_spread <= sticky_spread <= "
                             f"pattern_spread and 0 <= max_mismatch < 1, got "
                             f"min_steps={min_steps}, max_spread={max_spread}, "
                             f"sticky_spread={sticky_spread}, pattern_spread={pattern_spread}, "
                             f"max_mismatch={max_mismatch}")
        self.min_steps = min_steps
        self.max_spread = max_spread
        self.sticky_spread = sticky_spread
        self.pattern_spread = pattern_spread
        self.max_mismatch = max_mismatch
        self.history = history
        self._ev = BoundaryEvents.empty()
        self._idx = np.zeros(0, dtype=np.int64)    # global index of each kept event
        self._call = np.zeros(0, dtype=np.int64)   # global ordinal among calls (-1: a marker)
        self._next = 0                             # global index of the next event
        self._next_call = 0                        # global ordinal of the next call
        self._period: _Period | None = None

    @property
    def period(self) -> int | None:
        """The pattern length (calls per step) in use, or None."""
        return self._period.lag if self._period else None

    def _append(self, new: BoundaryEvents) -> None:
        self._next += new.lost                     # a gap in the log: no step spans it
        idx = np.arange(self._next, self._next + len(new), dtype=np.int64)
        self._next += len(new)
        is_call = new.api != MARKER_API
        call = np.where(is_call, self._next_call + np.cumsum(is_call) - 1, -1)
        self._next_call += int(np.count_nonzero(is_call))
        ev = self._ev
        keep = slice(max(0, len(ev) + len(new) - self.history), None)
        self._ev = BoundaryEvents(
            np.concatenate([ev.ts_ns, new.ts_ns])[keep],
            np.concatenate([ev.api.astype(str), new.api.astype(str)])[keep],
            np.concatenate([ev.sync_ns, new.sync_ns])[keep],
            np.concatenate([ev.offcpu_ns, new.offcpu_ns])[keep], 0,
            np.concatenate([ev.loader_ns, new.loader_ns])[keep],
            np.concatenate([ev.io_ns, new.io_ns])[keep])
        self._idx = np.concatenate([self._idx, idx])[keep]
        self._call = np.concatenate([self._call, call])[keep]

    def feed(self, new: BoundaryEvents | None) -> StepInference:
        """Take the events read this window; the steps that ended in it, or why none."""
        new = new if new is not None else BoundaryEvents.empty()
        first_new = self._next + new.lost
        self._append(new)
        is_new = self._idx >= first_new
        marker = self._ev.api == MARKER_API
        n_marker = int(np.count_nonzero(marker & is_new))
        if n_marker >= self.min_steps:
            return self._steps(np.flatnonzero(marker), is_new, "marker")
        calls = np.flatnonzero(~marker)
        if not np.any(is_new[calls]):
            inf = StepInference(refused="no periodic calls this window (no synchronize, graph "
                                        "launch or hypertrace.step() call)")
        else:
            inf = self._inferred(calls, is_new)
        if n_marker and inf.refused:
            inf.refused += (f"; the step marker was called {n_marker} times, fewer than "
                            f"{self.min_steps} (a window shorter than {self.min_steps} steps: "
                            "lengthen the window)")
        return inf

    def _inferred(self, calls: np.ndarray, is_new: np.ndarray) -> StepInference:
        n = len(calls)
        max_period = min(MAX_PERIOD, (n - 1) // (self.min_steps + 1))
        if max_period < 1:
            return StepInference(refused=f"only {n} periodic calls in the recent history, too "
                                         f"few to find a step")
        ev = self._ev
        ts = ev.ts_ns[calls].astype(np.int64)
        sync = ev.sync_ns[calls].astype(np.int64)
        # Each call after the first, with the gap and the synchronize time since the previous.
        tokens = ev.api[calls][1:]
        log_gap = np.log(np.maximum(np.diff(ts), 1000).astype(np.float64))
        log_wait = np.log(np.maximum(np.diff(sync), 1000).astype(np.float64))
        dropped = ""
        kept = self._period
        if kept is not None and kept.lag <= max_period:
            mismatch = float(np.mean(tokens[kept.lag:] != tokens[:-kept.lag]))
            if mismatch <= self.max_mismatch:
                inf = self._from_period(kept, calls, is_new, self.sticky_spread)
                if not inf.refused or "fewer than" in inf.refused:
                    return inf
                dropped = f"the step of the last windows no longer holds ({inf.refused}); "
        self._period = None
        score, mismatch_of = period_scores(tokens, log_gap, log_wait, max_period)
        lag = choose_period(score, len(tokens) - 1)
        if mismatch_of[lag] > self.max_mismatch:
            return StepInference(refused=(
                f"{dropped}no recurring order of synchronizing calls: the best pattern, "
                f"{lag} call(s) long, differs in {mismatch_of[lag]:.0%} of its calls (more than "
                f"{self.max_mismatch:.0%}); a process that synchronizes at data-dependent "
                "times has no step to find: call hypertrace.step() once per step"))
        # Anchor: the position in the pattern that ends the longest gap (median over repeats).
        pos = self._call[calls][1:] % lag
        med = [float(np.median(log_gap[pos == j])) if np.any(pos == j) else -np.inf
               for j in range(lag)]
        phase = int(np.argmax(med))
        period = _Period(lag, phase, str(tokens[np.flatnonzero(pos == phase)[-1]]))
        inf = self._from_period(period, calls, is_new, self.max_spread)
        if inf.refused:
            inf.refused = dropped + inf.refused
        if not inf.refused or "fewer than" in inf.refused:
            self._period = period
        return inf

    def _from_period(self, period: _Period, calls: np.ndarray, is_new: np.ndarray,
                     spread_limit: float) -> StepInference:
        anchors = calls[(self._call[calls] % period.lag) == period.phase]
        source = f"inferred:{period.api}" + (f"/{period.lag}" if period.lag > 1 else "")
        # A pattern of several calls was told from one call a step by its order or its gaps'
        # shape (choose_period), which calls at random times do not have (spaced in pairs they
        # spread 7x, in threes 5x): there the spread says how irregular the loop is, not
        # whether it is one. One call a step has only its regularity to show it is a clock.
        limit = spread_limit if period.lag == 1 else max(spread_limit, self.pattern_spread)
        return self._steps(anchors, is_new, source, limit, lag=period.lag)

    def _steps(self, anchors: np.ndarray, is_new: np.ndarray, source: str,
               spread_limit: float | None = None, lag: int = 0) -> StepInference:
        """The steps between consecutive anchors that end in this window: no event lost in
        between, and (for a pattern) exactly ``lag`` calls apart."""
        ev, idx = self._ev, self._idx
        a, b = anchors[:-1], anchors[1:]
        ok = (idx[b] - idx[a]) == (b - a)
        if lag:
            ok &= (self._call[b] - self._call[a]) == lag
        dur = ev.ts_ns[b].astype(np.int64) - ev.ts_ns[a].astype(np.int64)
        ok &= dur > 0
        if spread_limit is not None and np.count_nonzero(ok) >= self.min_steps:
            spread, p10, p90 = _spread(dur[ok])
            if spread > spread_limit:
                return StepInference(refused=(
                    f"{source}: steps spread p90/p10 = {spread:.2f} > {spread_limit:g} "
                    f"(p10 {p10 / 1e6:.3g} ms, p90 {p90 / 1e6:.3g} ms): not a clock"))
        ok &= is_new[b]
        n = int(np.count_nonzero(ok))
        if n < self.min_steps:
            return StepInference(refused=f"{source}: {n} steps ended this window, fewer than "
                                         f"{self.min_steps} (lengthen the window)")
        a, b, dur = a[ok], b[ok], dur[ok]
        ws = np.maximum(ev.sync_ns[b].astype(np.int64) - ev.sync_ns[a].astype(np.int64), 0)
        wo = np.maximum(ev.offcpu_ns[b].astype(np.int64) - ev.offcpu_ns[a].astype(np.int64), 0)
        wl = np.maximum(ev.loader_ns[b].astype(np.int64) - ev.loader_ns[a].astype(np.int64), 0)
        ws = np.minimum(ws, dur)
        wo = np.minimum(wo, dur - ws)
        wl = np.minimum(wl, wo)
        wi = np.maximum(ev.io_ns[b].astype(np.int64) - ev.io_ns[a].astype(np.int64), 0)
        wi = np.minimum(wi, wo - wl)
        busy = dur - ws - wo
        return StepInference(
            source=source, steps=n, step_hist=buckets.histogram_of_ns(dur),
            busy_hist=buckets.histogram_of_ns(busy),
            own_hist=buckets.histogram_of_ns(dur - (wo - wl - wi)), gpu_wait_ns=int(ws.sum()),
            peer_wait_ns=int((wo - wl - wi).sum()), loader_wait_ns=int(wl.sum()),
            io_wait_ns=int(wi.sum()),
            step_sum_ns=int(dur.sum()),
            ends_ns=ev.ts_ns[b].astype(np.int64), durations_ns=dur)
