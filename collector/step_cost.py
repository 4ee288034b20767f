"""What the probes cost a process's steps, measured in place (``Overhead.step_fraction``).

The account charges CPU time, an upper bound that overstates the cost for a rank waiting on its
GPU anyway. So each sampled window splits the process's steps, by their end on the monotonic
clock, into those the slice touched (from just before its attach to just after its detach) and
the rest: ``(mean touched / mean other - 1) x touched share of the time`` over decayed sums
(half-life about 23 windows), plus the always tier at its CPU price. No figure until
``min_steps`` touched steps are in; a negative excess counts as zero; costs that hit every
process of the host alike are not seen (docs/design.md, "Two overhead figures").
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class StepCostMeter:
    """Decayed sums of touched and untouched steps of one process (module docstring)."""

    decay: float = 0.97          # per window: half-life log(0.5)/log(0.97) ~ 23 windows
    min_steps: int = 20          # touched steps needed before a figure is given
    source: str | None = None    # the step source the sums belong to (a change restarts them)
    touched_n: float = 0.0
    touched_ns: float = 0.0
    rest_n: float = 0.0
    rest_ns: float = 0.0
    touched_s: float = 0.0
    total_s: float = 0.0

    def observe(self, source: str, whole: tuple[int, int], touched: tuple[int, int],
                touched_s: float, window_s: float) -> None:
        """Feed one window: ``whole`` and ``touched`` are (steps, their sum in ns) over the
        window and over its touched stretch, from steps of ``source`` (StepInference.source);
        ``touched_s`` is 0 in a window without a slice."""
        if source != self.source:    # another clock: its steps are not comparable
            self.source = source
            self.touched_n = self.touched_ns = self.rest_n = self.rest_ns = 0.0
            self.touched_s = self.total_s = 0.0
        if not (math.isfinite(window_s) and window_s > 0):
            return
        tn, tns = max(0, min(touched[0], whole[0])), max(0, min(touched[1], whole[1]))
        if tn == 0:
            tns = 0
        d = self.decay
        self.touched_n = d * self.touched_n + tn
        self.touched_ns = d * self.touched_ns + tns
        self.rest_n = d * self.rest_n + (whole[0] - tn)
        self.rest_ns = d * self.rest_ns + (whole[1] - tns)
        self.touched_s = d * self.touched_s + min(max(touched_s, 0.0), window_s)
        self.total_s = d * self.total_s + window_s

    def sliced_fraction(self) -> float | None:
        """The sliced tier's share of step time lost, or None until enough touched steps."""
        if self.touched_n < self.min_steps or self.rest_n < self.min_steps or self.total_s <= 0:
            return None
        rest_mean = self.rest_ns / self.rest_n
        if rest_mean <= 0:
            return None
        excess = (self.touched_ns / self.touched_n) / rest_mean - 1.0
        return max(excess, 0.0) * (self.touched_s / self.total_s)
