"""What a signal is: one :class:`Signal` record holds everything about it, from what it reads
off a window to how a report words it, so that adding a signal is its own module and one line
in analyzer/score/registry.py (docs/design.md, "Adding a signal").

A signal is one (G,) value per GPU per epoch beside the API latencies, scored by the same robust
rules (analyzer/score/signals.py ``score_signals``); which tail implicates a GPU is its own rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import CrossSection, Input

#: A finding's evidence: {signal or fact: (this GPU's value, its job median)}.
Evidence = Mapping[str, tuple[float, float]]


class Measured(NamedTuple):
    """One epoch's measure of a signal: (G,) values, (G,) whether each GPU may be scored, (G,)
    each value's sampling SE or None, and an absolute gate in the value's unit (None: the
    relative gate, ``min_effect`` of the median)."""

    value: np.ndarray
    usable: np.ndarray
    se: np.ndarray | None = None
    gate: float | None = None


@dataclass
class SignalInputs:
    """What every signal's :attr:`Signal.measure` and :attr:`Signal.implicate` may read about
    one job's epoch: the cross-section, the configuration, the peer groups, the job's mode and
    the per-step measures the built-in signals share (µs per step, NaN without steps)."""

    cs: CrossSection
    cfg: ScoringConfig
    groups: list[np.ndarray]
    mode: str
    launch_calls: np.ndarray
    steps: np.ndarray
    step_p50: np.ndarray
    step_n: np.ndarray
    step_se: np.ndarray
    busy_p50: np.ndarray
    busy_n: np.ndarray
    busy_se: np.ndarray
    share: np.ndarray
    gpu_wait: np.ndarray
    peer_wait: np.ndarray
    mean_step: np.ndarray
    typical: np.ndarray
    own: np.ndarray
    rate: np.ndarray
    clock: np.ndarray
    sched_ok: np.ndarray
    attached: np.ndarray
    step_ok: np.ndarray
    #: the wait signals' absolute gate: ``min_effect`` of the job's median step (None: no step)
    wait_gate: float | None
    #: (G,) the GPU's steps moved, or it has none to check (signals.steps_corroborate)
    steps_moved: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: per :class:`Input` name, its (G,) sums this epoch
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    #: what a signal's measure left for its implicate rule and the evidence (by its name)
    notes: dict[str, Any] = field(default_factory=dict)
    #: (G,) facts a signal's measure adds to every finding's evidence as (value, NaN): what
    #: its cause quotes beside the scored values (a loader's busy share); NaN: none
    facts: dict[str, np.ndarray] = field(default_factory=dict)
    #: scores a value with a signal's own unit and stat (signals._score): for a rule that must
    #: pass the gates on a second value
    rescore: Callable[[Signal, np.ndarray, np.ndarray], Any] | None = None


@dataclass(frozen=True)
class Signal:
    """One signal, all of it in one place.

    ``name`` is its key in findings, evidence and the registry; ``unit`` what ``value`` holds
    ("us" per step or a latency, "share" of wall time, "hz", "ratio", "count"), ``stat`` the label of
    what it is (``per_step``, ``p50``, ...); ``label`` how tables and charts name it;
    ``meanings`` what each tail says, shown with every finding. ``measure`` computes it (None:
    not this epoch); ``implicate`` is which tail makes a GPU suspect (None: it never does, it
    only says what grew); ``cause`` the probable cause it states when it leads (None: its
    meaning); ``brief`` how it is named after the first ("also: ..."), with ``{v}`` and ``{m}``.
    ``tier``: which leads a cause (0: it names a side, 1: own work, 2: a symptom).
    ``slow_when_low``: its low tail is the slow side (a finding's effect is its deficit).
    ``explains``: a high finding is quoted in a cause even when it does not implicate (which
    part of the step grew). ``measures_step``: a high finding's step share is the GPU's whole
    effect on the step. ``supports``: what its low tail adds to a cause, ``{v}``/``{m}``
    filled. ``context``: recorded beside every flagged node's own signal for the report's
    charts. ``inputs``: what it reads off the process windows beyond the cross-section."""

    name: str
    unit: str
    stat: str
    label: str
    meanings: Mapping[str, str]
    measure: Callable[[SignalInputs], Measured | None]
    implicate: Callable[[Any, SignalInputs], np.ndarray] | None = None
    cause: Callable[[Evidence], str] | None = None
    brief: str | None = None
    tier: int = 2
    slow_when_low: bool = False
    explains: bool = False
    measures_step: bool = False
    supports: str | None = None
    context: bool = False
    inputs: tuple[Input, ...] = ()

    def meaning(self, direction: str) -> str:
        return self.meanings[direction]

    def format(self, x: float) -> str:
        """A value of this signal in words: shares as %, rates per second, durations."""
        if self.unit in ("share", "ratio"):
            return share_text(x)
        if self.unit in ("hz", "count"):
            return f"{x:,.0f}" if math.isfinite(x) else "n/a"
        return duration_text(x)


def share_text(x: float) -> str:
    """A share of wall time as a percentage that keeps small values readable (31%, 0.2%)."""
    if not math.isfinite(x):
        return "n/a"
    pct = 100.0 * x
    return f"{pct:.0f}%" if abs(pct) >= 10 else f"{pct:.1f}%"


def duration_text(us: float, digits: int = 1) -> str:
    """A duration in the unit that reads best: µs (1 decimal), ms (``digits`` decimals) or s
    (``digits + 1``). Causes use 1; report tables 2, to tell close step times apart."""
    if not math.isfinite(us):
        return "n/a"
    if abs(us) < 1e3:
        return f"{us:.1f} us"
    if abs(us) < 1e6:
        return f"{us / 1e3:.{digits}f} ms"
    return f"{us / 1e6:.{digits + 1}f} s"


__all__ = ["Evidence", "Input", "Measured", "Signal", "SignalInputs", "duration_text",
           "share_text"]
