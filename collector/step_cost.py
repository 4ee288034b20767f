"""What the probes cost a process's *steps*, measured in place.

The governor's account (collector/governor.py) charges CPU time: counted firings times the
calibrated probe cost. That is the right currency for a budget, because it is what a process
whose CPU is on the critical path loses. It is not what most training steps lose. On an H200
with 8 ranks sharing a GPU, the launch probes cost 8% of a rank's CPU while attached and its
steps grew by 0.2%: the rank was waiting for the GPU anyway. The account's 0.5% was then 8x
the measured loss. A step-time figure needs the step's slack, and no model of it holds across
workloads (launch-bound, GPU-bound, pipelined), so the agent measures it instead.

**The natural experiment.** Every sampled window has a *touched* stretch, from just before the
sliced tier's attach to just after its detach, and an untouched rest. Attach, live firings and
detach all land in the touched stretch; the always tier is live in both. The agent notes the
monotonic clock at both ends of the stretch, and every step carries its end on the same clock
(``StepInference.ends_ns``), so each window splits the process's steps (by their end) into
touched ones and the rest, with exact counts and sums. Then::

    sliced cost = (mean touched step / mean other step - 1) x (touched seconds / all seconds)

and the estimate adds what the always tier costs at its CPU price (it is never off, so it has
no untouched comparison; it is a few calls per step, so its CPU price is a close upper bound).

**Noise.** One window's touched stretch holds tens of steps, so one window's ratio is noisy.
The sums are kept over the process's life with a per-window decay (half-life about 23 windows),
and no figure is given until ``min_steps`` touched steps are in. A negative excess (noise, or
the probed rank winning a shared GPU's time) counts as zero: probes do not speed steps up.

**What it cannot see:** costs that hit every process of the host alike (the scheduler
tracepoints run on every context switch, probed or not), and costs that last beyond the touched
stretch. The overhead benchmark (tests/gpu/overhead_concurrent.py) measures against an unprobed
control group and compares this estimate with what it measured.
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
