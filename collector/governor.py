"""Overhead governor: how much of each window the probes may stay attached.

The math. Let

* ``c``  = cost of one probed call in ns (entry + return, measured by probe_cost.py),
* ``r``  = probe firings per second of the *busiest* process while attached (nested driver calls
  included: they are counted once in the histograms but each one still pays ``c``),
* ``d``  = duty, the fraction of wall time the probes are attached,
* ``b``  = budget, the fraction of a process's wall time we may spend in probes (default 0.005).

While attached, a process spends ``c * r * 1e-9`` of its time in probes, so its overhead over a
window is ``c * r * d * 1e-9``. Holding it under the budget gives

    d = min(max_duty, b / (c * r * 1e-9))

Why the busiest process: a uprobe lives on the library *file* and fires in every process that
maps it, so the shared attachment must be paced for the process that calls most.

What the duty buys: samples per window ``n = r_api * d * W``. At the budget (when ``d < 1``)
that is ``n = b * W / (c * 1e-9)`` times the API's share of the firings: *independent of the
call rate*. With c = 8 us, b = 0.5% and W = 10 s, every window carries about 6,000 probed
calls, enough to resolve a 10% p50 shift many times over (see collector/tradeoff.py for the
table). A higher budget or a longer window buys samples; a cheaper probe (bare metal) buys
both.

Rate estimation: the rate is observed only while attached. It rises immediately (a burst must
not blow the budget for a whole window) and falls with exponential smoothing (so one quiet
window does not make the next one expensive). Before any observation the governor assumes the
worst case, ``c * r * 1e-9 = 1`` (a process doing nothing but probed calls), so the first window
costs at most the budget whatever the workload.

Granularity: attaching is cheap, but detaching a uprobe waits for a kernel RCU grace period
(measured ~0.1 s per probe in our Firecracker VMs, serialized), so very small duties cannot be
cut into slices inside one window. :func:`duty_schedule` then probes one minimum slice every
k-th window instead, which keeps the long-run average at the duty.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Governor:
    """Keeps ``probe_cost_ns * rate * duty`` under ``budget``; call :meth:`next_duty` each window."""

    probe_cost_ns: float
    budget: float = 0.005
    min_duty: float = 0.0
    max_duty: float = 1.0
    smoothing: float = 0.5            # weight of a new, lower rate observation
    rate_hz: float | None = None      # smoothed probe firings/s of the busiest process
    duty: float = -1.0                # current duty; set in __post_init__
    credit_s: float = 0.0             # probe time the budget has granted and not yet spent
    credit_cap_s: float = 600.0       # at most this much wall time of budget is saved up

    def __post_init__(self) -> None:
        for name in ("probe_cost_ns", "budget", "min_duty", "max_duty"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Governor.{name} must be a finite number >= 0, got {value}")
        if self.budget > 1 or self.max_duty > 1 or self.min_duty > self.max_duty:
            raise ValueError("need 0 <= min_duty <= max_duty <= 1 and budget <= 1 (a fraction "
                             f"of wall time, e.g. 0.005); got budget={self.budget}, "
                             f"min_duty={self.min_duty}, max_duty={self.max_duty}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"Governor.smoothing must be in (0, 1], got {self.smoothing}")
        if self.duty < 0:
            self.duty = self._duty_for(self.rate_hz)

    def load(self, rate_hz: float | None = None) -> float:
        """Fraction of a process's time spent in probes while attached (worst case 1 if unknown)."""
        rate = self.rate_hz if rate_hz is None else rate_hz
        if rate is None:
            return 1.0
        return self.probe_cost_ns * 1e-9 * rate

    def _duty_for(self, rate_hz: float | None) -> float:
        load = self.load(rate_hz)
        duty = self.max_duty if load <= 0 else self.budget / load
        return float(min(self.max_duty, max(self.min_duty, duty)))

    def next_duty(self, calls: int, attached_seconds: float) -> float:
        """Feed what the last window saw (probe firings of the busiest process, seconds attached)
        and get the duty for the next window."""
        if calls < 0 or not math.isfinite(attached_seconds) or attached_seconds < 0:
            raise ValueError(f"need calls >= 0 and attached_seconds >= 0, got {calls}, "
                             f"{attached_seconds}")
        if attached_seconds > 0:
            observed = calls / attached_seconds
            if self.rate_hz is None or observed >= self.rate_hz:
                self.rate_hz = observed
            else:
                self.rate_hz = self.smoothing * observed + (1 - self.smoothing) * self.rate_hz
        self.duty = self._duty_for(self.rate_hz)
        return self.duty

    # -- the budget as an account ----------------------------------------------------------
    # The duty above is a plan. What a slice really costs is only known afterwards: a detach
    # waits out an RCU grace period per probe (about 0.1 s each on our VMs), and the probes fire
    # until their own turn comes. So the budget is also kept as an account, in seconds of probe
    # time: every wall second earns ``budget`` seconds, every counted firing spends
    # ``probe_cost_ns``. A slice is taken only when the account can pay for it, and an
    # overspent account (a slice that cost more than planned) skips slices until it is repaid.
    # The long-run overhead is then at most the budget by construction, measured in firings the
    # kernel counted, whatever the detach latency.

    def earn(self, wall_s: float) -> None:
        """Credit ``wall_s`` seconds of wall time at the budget (capped)."""
        cap = self.budget * self.credit_cap_s
        self.credit_s = min(self.credit_s + self.budget * max(wall_s, 0.0), max(cap, self.credit_s))

    def spend(self, probe_hits: int) -> None:
        """Debit the probe time that ``probe_hits`` counted firings cost."""
        self.credit_s -= self.probe_cost_ns * 1e-9 * max(probe_hits, 0)

    def can_afford(self, attached_s: float) -> bool:
        """Whether a slice attached for ``attached_s`` seconds fits the account.

        With no rate measured yet the answer is yes: that first slice is the measurement, and
        its cost is repaid from later credit like any overspend."""
        if self.rate_hz is None:
            return True
        return self.credit_s >= self.load() * attached_s

    def estimated_overhead(self) -> float:
        """Fraction of the busiest process's wall time the probes cost at the current duty."""
        return self.load() * self.duty

    def samples_per_window(self, window_s: float, share: float = 1.0) -> float:
        """Expected probed calls per window of an API with ``share`` of the firings."""
        if self.rate_hz is None:
            return 0.0
        return self.rate_hz * share * self.duty * window_s


def measured_overhead(probe_cost_ns: float, probe_hits: int, window_s: float) -> float:
    """Overhead actually paid in a window, from the firings the maps counted (not the plan).

    It includes probes that stayed attached while a detach was still in progress, so it is the
    honest figure to report in each window's Overhead message.
    """
    if window_s <= 0:
        return 0.0
    return probe_cost_ns * 1e-9 * probe_hits / window_s


def duty_schedule(window_s: float, duty: float, slices: int = 4, min_slice_s: float = 0.05,
                  window_index: int = 0) -> list[tuple[float, float]]:
    """When to attach within a window: ``[(offset_s, length_s), ...]`` spread over the window.

    Several slices spread evenly make the sample cover the whole window (a stall in its second
    half is still seen). When ``duty * window_s`` is shorter than one ``min_slice_s`` (the
    attach/detach granularity), one slice of ``min_slice_s`` is taken every k-th window, k =
    ceil(min_slice_s / (duty * window_s)); other windows get ``[]``. The average duty holds.
    """
    if window_s <= 0 or duty <= 0:
        return []
    duty = min(duty, 1.0)
    if duty >= 1.0:
        return [(0.0, window_s)]
    total = duty * window_s
    if total < min_slice_s:
        every = math.ceil(min_slice_s / total)
        if window_index % every:
            return []
        length = min(min_slice_s, window_s)
        return [((window_s - length) / 2, length)]
    n = max(1, min(slices, int(total // min_slice_s)))
    length = total / n
    step = window_s / n
    return [(i * step + (step - length) / 2, length) for i in range(n)]
