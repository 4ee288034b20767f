"""Overhead governor: keeps what the probes cost each training process under the budget.

The budget is an account in seconds of probe time (docs/design.md, "The overhead governor keeps
the budget as an account"). Every wall second earns ``budget`` (:meth:`Governor.earn`); every
window spends what it cost the most charged process: its counted firings in both tiers times the
measured probe cost, plus fixed attach/detach costs (:meth:`Governor.spend`). Probes are attached
per process, so holding the worst one under the budget holds them all, whatever the detach
latency. :meth:`Governor.plan` takes a slice only when the account can pay for it, at the
smallest power-of-two cadence that pays one useful slice; the always tier gets at most
``always_share`` of the budget (:meth:`Governor.always_split`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from hypertrace.collector import schedule
from hypertrace.collector.schedule import MAX_CADENCE

#: Probe time charged to a process for each attach or detach of one uprobe in it. Installing or
#: removing the breakpoint rewrites a text page of the process (copy-on-write, under its mmap
#: lock), which stalls that process's own page faults briefly: tens of microseconds. An
#: estimate, kept conservative; it is small against a 0.5% budget (50 ms per 10-s window).
FIXED_NS_PER_PROBE_OP = 20_000.0
#: Length of the first slice, taken before any launch rate is known: it is the measurement.
MEASURE_SLICE_S = 0.2
#: The shortest slice worth taking: below it, attach and detach cost more than it samples.
MIN_SLICE_S = 0.05


@dataclass(frozen=True)
class SlicePlan:
    """This agent's decision for one aligned window."""
    index: int            # aligned window index (start_ns // window_ns)
    sampled: bool
    reason: str           # "" when sampled; else "off_cadence" | "budget"
    offset_s: float       # slice start from the window start (the same for every agent)
    length_s: float       # 0 when not sampled
    cadence: int          # k: this agent samples windows with index % k == 0


@dataclass
class Governor:
    """The budget account and the slice planner (module docstring has the math)."""

    probe_cost_ns: float
    budget: float = 0.005
    always_share: float = 0.2
    max_slice_s: float = 2.0
    slice_guard_s: float = 1.0
    min_samples: int = 1000
    smoothing: float = 0.5            # weight of a new, lower rate observation
    rate_hz: float | None = None      # sliced-tier firings/s of the busiest process, attached
    always_load: float = 0.0          # share of wall time the always tier cost (busiest process)
    detach_s: float = 0.1             # last measured time to remove the sliced tier
    fixed_slice_s: float = 0.0        # fixed cost of one slice (attach + detach ops) per process
    credit_s: float = 0.0             # probe time earned and not yet spent (may go negative)
    credit_cap_s: float = 600.0       # at most this much wall time of budget is saved up
    k: int = 1                        # the cadence of the last plan

    def __post_init__(self) -> None:
        for name in ("probe_cost_ns", "budget", "always_share", "max_slice_s", "slice_guard_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Governor.{name} must be a finite number >= 0, got {value}")
        if self.budget > 1 or self.always_share > 1:
            raise ValueError("budget and always_share are fractions in [0, 1] (e.g. 0.005 and "
                             f"0.2); got budget={self.budget}, always_share={self.always_share}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"Governor.smoothing must be in (0, 1], got {self.smoothing}")
        if self.min_samples < 0:
            raise ValueError(f"Governor.min_samples must be >= 0, got {self.min_samples}")

    # -- measurements ------------------------------------------------------------------------
    def load(self, rate_hz: float | None = None) -> float:
        """Share of a process's time spent in sliced-tier probes while attached (1 if unknown:
        the worst case, a process doing nothing but probed calls)."""
        rate = self.rate_hz if rate_hz is None else rate_hz
        if rate is None:
            return 1.0
        return self.probe_cost_ns * 1e-9 * rate

    def observe_slice(self, hits: int, attached_s: float) -> None:
        """Feed a slice's sliced-tier firings of the busiest process and its attached seconds.

        The rate rises at once (a burst must not blow the budget for long) and falls with
        exponential smoothing (one quiet slice must not make the next one expensive)."""
        if hits < 0 or not math.isfinite(attached_s) or attached_s < 0:
            raise ValueError(f"need hits >= 0 and attached_s >= 0, got {hits}, {attached_s}")
        if attached_s <= 0:
            return
        observed = hits / attached_s
        if self.rate_hz is None or observed >= self.rate_hz:
            self.rate_hz = observed
        else:
            self.rate_hz = self.smoothing * observed + (1 - self.smoothing) * self.rate_hz

    def observe_always(self, hits: int, window_s: float) -> None:
        """Feed the always-tier firings of the most charged process over a window."""
        if window_s > 0:
            self.always_load = self.probe_cost_ns * 1e-9 * max(hits, 0) / window_s

    # -- the account -------------------------------------------------------------------------
    def earn(self, wall_s: float) -> None:
        """Credit ``wall_s`` seconds of wall time at the budget (capped: a long idle stretch
        must not fund minutes of probing later). The cap always leaves room for the longest
        cadence, so a slice every :data:`~collector.schedule.MAX_CADENCE` windows stays payable."""
        wall_s = max(wall_s, 0.0)
        cap = self.budget * max(self.credit_cap_s, (MAX_CADENCE + 1) * wall_s)
        self.credit_s = min(self.credit_s + self.budget * wall_s, max(cap, self.credit_s))

    def spend(self, probe_s: float) -> None:
        """Debit ``probe_s`` seconds of probe time (see :meth:`cost_s`)."""
        self.credit_s -= max(probe_s, 0.0)

    def cost_s(self, hits: int, probe_ops: int = 0) -> float:
        """Probe time that ``hits`` counted firings and ``probe_ops`` attach/detach operations
        cost one process."""
        return (self.probe_cost_ns * max(hits, 0) + FIXED_NS_PER_PROBE_OP * max(probe_ops, 0)) * 1e-9

    @staticmethod
    def fixed_cost_s(probe_ops: int) -> float:
        """Fixed cost of ``probe_ops`` attach/detach operations in one process."""
        return FIXED_NS_PER_PROBE_OP * 1e-9 * max(probe_ops, 0)

    # -- planning ----------------------------------------------------------------------------
    def slice_cost_s(self, length_s: float) -> float:
        """Planned cost of a slice: firings while attached and during half a detach, plus the
        fixed attach/detach cost."""
        return self.load() * (max(length_s, 0.0) + self.detach_s / 2) + self.fixed_slice_s

    def floor_s(self, max_length_s: float) -> float:
        """The shortest useful slice: ``min_samples`` firings of the busiest process."""
        if self.rate_hz is None:
            return min(MEASURE_SLICE_S, max_length_s)
        want = self.min_samples / self.rate_hz if self.rate_hz > 0 else 0.0
        return min(max_length_s, max(MIN_SLICE_S, want))

    def net_earn_s(self, window_s: float) -> float:
        """What one window earns for the sliced tier: the budget less the always tier's cost."""
        return (self.budget - self.always_load) * window_s

    def plan(self, index: int, window_s: float) -> SlicePlan:
        """Whether aligned window ``index`` takes a slice, where, and how long.

        The slice is as long as the account affords, ``(credit + net earnings - fixed) / load -
        detach / 2``, at most ``max_slice_s`` and at least the floor (``min_samples`` firings);
        the first one, before any rate is known, is a short measuring slice repaid later."""
        bounds = schedule.slice_bounds(window_s, self.max_slice_s, self.slice_guard_s)
        offset = schedule.slice_offset(index, window_s, self.max_slice_s, self.slice_guard_s)
        floor = self.floor_s(bounds.max_length_s)

        def no(reason: str) -> SlicePlan:
            return SlicePlan(index, False, reason, offset, 0.0, self.k)

        if floor <= 0:
            return no("budget")
        if self.rate_hz is None:                      # the first slice is the measurement
            self.k = 1
            return SlicePlan(index, True, "", offset, floor, 1)
        net = self.net_earn_s(window_s)
        self.k = schedule.cadence(self.slice_cost_s(floor), net)
        if self.k > MAX_CADENCE:
            return no("budget")
        if not schedule.is_sampled(index, self.k):
            return no("off_cadence")
        load = self.load()
        afford = self.credit_s + net - self.fixed_slice_s
        length = bounds.max_length_s if load <= 0 else afford / load - self.detach_s / 2
        length = min(bounds.max_length_s, length)
        if length < floor:
            return no("budget")
        # The detach should end inside the window, or the next window starts late and its own
        # slice moment has passed ("detaching" there). A shorter slice is still a prefix of the
        # others (same start). Never below the floor, though: a slow detach costs the next
        # window at worst, while refusing would stop slicing for good (the detach time is only
        # measured by detaching).
        length = max(floor, min(length, window_s - offset - self.detach_s))
        return SlicePlan(index, True, "", offset, length, self.k)

    def always_split(self, rates_hz: Mapping[str, float]) -> tuple[list[str], list[str]]:
        """Split one process's always-tier APIs (name -> firings/s) into (keep, demote).

        Cheapest first, APIs are kept while their summed cost stays within ``always_share`` of
        the budget; the rest go to the sliced tier. A single API over the share is demoted on
        its own; several cheap ones together cannot crowd out the launch tier either."""
        allowance = self.always_share * self.budget
        keep: list[str] = []
        demote: list[str] = []
        used = 0.0
        for api, rate in sorted(rates_hz.items(), key=lambda kv: (kv[1], kv[0])):
            load = self.probe_cost_ns * 1e-9 * max(rate, 0.0)
            if used + load <= allowance:
                keep.append(api)
                used += load
            else:
                demote.append(api)
        return keep, demote

    def samples_per_slice(self, length_s: float, share: float = 1.0) -> float:
        """Expected probed calls in a slice of an API with ``share`` of the sliced firings."""
        return 0.0 if self.rate_hz is None else self.rate_hz * share * length_s


def measured_overhead(probe_cost_ns: float, probe_hits: int, window_s: float,
                      fixed_cost_s: float = 0.0) -> float:
    """Overhead actually paid in a window, from the firings the maps counted (not the plan),
    plus the fixed costs charged to it.

    It includes probes that stayed attached while a detach was still in progress, so it is the
    honest figure to report in each window's Overhead message.
    """
    if window_s <= 0:
        return 0.0
    return (probe_cost_ns * 1e-9 * probe_hits + max(fixed_cost_s, 0.0)) / window_s
