"""The governed window loop: one loop for both probe backends (uprobes and CUPTI callbacks).

Windows are aligned to wall-clock multiples of ``window_s``, so window ``i`` is the same stretch
of time on every node. In each, the governor (collector/governor.py) plans whether it holds a
slice, at an offset that depends on ``i`` alone (collector/schedule.py); at its end the loop
reads the backend, finds each process's steps, builds the window (daemon/windows.py), pays the
account and hands the window to the sink. Each process says whether its slice sampled it, or
why not (``_reason``). The backend (:class:`ProbeBackend`) switches its tiers and reads its
counters; the sink (:class:`WindowSink`) names and takes the window. An error inside a window is
logged and the next goes on; a stop ends the window in progress early and delivers it.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from hypertrace.collector.governor import Governor, SlicePlan
from hypertrace.collector.readings import (
    TIER_ALWAYS,
    ProcessReading,
    SliceOn,
    probe_hits,
)
from hypertrace.collector.schedule import window_end, window_index
from hypertrace.collector.step_cost import StepCostMeter
from hypertrace.collector.steps import StepFinder, StepInference
from hypertrace.daemon.windows import ProcessProbe, WindowOverhead, build_window
from hypertrace.proto import hypertrace_pb2 as pb

log = logging.getLogger(__name__)


class ProbeBackend(Protocol):
    """The probes under the loop: collector/uprobe_backend.py, collector/cupti/probes.py."""

    #: Whether the loop measures what the probes cost in step time (collector/step_cost.py).
    measures_step_cost: bool

    def begin(self) -> str:
        """Get ready for a window: '' when the sliced tier may go on in it, else why not."""

    def slice_on(self) -> SliceOn:
        """Switch the sliced tier on."""

    def slice_off(self) -> float:
        """Switch the sliced tier off; the seconds that took."""

    def read(self, start_ns: int, end_ns: int) -> list[ProcessReading]:
        """Read and clear the counters of the window ``[start_ns, end_ns)``."""

    def demote(self, pid: int, apis: list[str]) -> None:
        """Move these always-tier APIs of ``pid`` to the sliced tier (they cost too much)."""

    def earning(self) -> bool:
        """Whether the window earns budget (a backend that probes nothing saves none up)."""

    def unattributed_hits(self) -> int:
        """Probe firings of the last read that belong to no reported process (counted in the
        window's hits: they cost what any firing does)."""

    def end(self) -> None:
        """The window is over, delivered or not (also after a failure): clean up."""


class WindowSink(Protocol):
    """Who names the windows and takes them: the node agent, or a training process's runtime."""

    def before_window(self) -> None:
        """Called before each window is laid out (it may change the loop's window length)."""

    def next_id(self) -> tuple[str, str, int]:
        """(agent_id, node, seq) of the window about to be built."""

    def wants_window(self) -> bool:
        """False: nobody takes this window, so none is built and the account stands still."""

    def deliver(self, window: pb.NodeWindow, done: WindowDone, stopping: bool) -> None:
        """Take the window (``stopping``: the last one, do not wait for anything)."""


@dataclass
class WindowDone:
    """What the loop measured of one window, for the sink's log and metrics."""
    start_ns: int
    end_ns: int
    window_s: float
    attached_s: float                # seconds the sliced tier was live
    probes: dict[int, ProcessProbe]  # pid -> what the probes did for it
    hits: int                        # probe firings, all processes
    cost_s: float                    # probe time charged to the most charged process


@dataclass
class _Window:
    """Bookkeeping of the window in progress."""
    start_ns: int
    end_ns: int
    window_s: float                               # the loop's window length at its start
    first: bool
    plan: SlicePlan | None = None
    blocked: str = ""                             # the backend's reason no slice can go on
    on: SliceOn = field(default_factory=SliceOn)  # what the slice attached
    slice_state: str = ""                         # "" | done | late | stopped | empty
    attached_s: float = 0.0                       # seconds the sliced tier was live
    slice_length_s: float = 0.0                   # from the attach to the detach request
    detach_s: float = 0.0
    # The slice's touched stretch (monotonic ns) and its seconds: the steps it touched
    # (collector/step_cost.py).
    touch_ns: tuple[int, int] | None = None
    touched_s: float = 0.0


class WindowLoop:
    """Runs windows until ``stop`` is set; ``governor`` and ``window_s`` may be replaced between
    windows (a training process takes the agent's settings when it connects)."""

    def __init__(self, backend: ProbeBackend, sink: WindowSink, governor: Governor,
                 window_s: float, stop: threading.Event, *,
                 tick: Callable[[], float] | None = None, slice_log_level: int = logging.INFO):
        self.backend = backend
        self.sink = sink
        self.governor = governor
        self.window_s = window_s
        self.stop = stop
        self.tick = tick                  # called while waiting; seconds until it is due again
        self.slice_log_level = slice_log_level
        self.steps: dict[tuple[int, int], StepFinder] = {}       # process -> its steps
        self.step_cost: dict[tuple[int, int], StepCostMeter] = {}
        self._slice_open = False

    def run(self, start_ns: int) -> None:
        """Run windows from ``start_ns`` until a stop; the last window ends at the stop."""
        start, first = start_ns, True
        while True:
            try:
                self.sink.before_window()
            except Exception:
                log.exception("preparing the window failed; continuing")
            window_s = self.window_s
            win = _Window(start, window_end(start, int(window_s * 1e9)), window_s, first)
            first = False
            try:
                self._open(win)
            except Exception:
                log.exception("error during window; continuing")
            self.wait_until(win.end_ns)
            stopping = self.stop.is_set()
            try:
                # A window ends when its counters are read: at its boundary, earlier on a stop,
                # or later when a slow detach made the loop overrun (the next one starts there,
                # so no stretch of time is counted twice or skipped).
                start = self._finish(win, stopping)
            except Exception:
                log.exception("could not finish the window ending at %d; continuing",
                              win.end_ns)
                start = max(win.end_ns, time.time_ns())
            finally:
                try:
                    self.backend.end()
                except Exception:
                    log.exception("cleaning up after the window failed")
            if stopping:
                return

    def wait_until(self, deadline_ns: int) -> bool:
        """Sleep until the wall-clock deadline, calling ``tick`` when due; False on a stop."""
        while not self.stop.is_set():
            nap = self.tick() if self.tick is not None else math.inf
            left = (deadline_ns - time.time_ns()) / 1e9
            if left <= 0:
                return True
            self.stop.wait(max(0.0, min(left, nap)))
        return False

    # -- the slice ---------------------------------------------------------------------------
    def _open(self, win: _Window) -> None:
        """Plan the window and take its slice if the plan says so. The slice belongs to the
        last aligned window this window covers."""
        window_ns = int(win.window_s * 1e9)
        index = window_index(win.end_ns - 1, window_ns)
        win.plan = self.governor.plan(index, win.window_s)
        win.blocked = self.backend.begin()
        if win.plan.sampled and not win.blocked:
            self._slice(win, win.plan, index * window_ns)

    def _slice(self, win: _Window, plan: SlicePlan, aligned_start_ns: int) -> None:
        """Switch the sliced tier on at the plan's offset, for its length, then off."""
        on_at = aligned_start_ns + int(plan.offset_s * 1e9)
        if time.time_ns() > on_at:
            win.slice_state = "late"                 # started (or overran) past the moment
            return
        if not self.wait_until(on_at):
            win.slice_state = "stopped"
            return
        touch_start_ns = time.monotonic_ns()
        t0 = time.monotonic()
        started_ns = time.time_ns()
        self._slice_open = True
        win.on = self.backend.slice_on()
        if win.on.empty:
            self._slice_open = False
            win.slice_state = "empty"
            return
        stopped = not self.wait_until(on_at + int(plan.length_s * 1e9))
        t1 = time.monotonic()
        took = self._slice_off()
        win.touch_ns = (touch_start_ns, time.monotonic_ns())
        win.touched_s = time.monotonic() - t0
        # Detached probes go away together after about one grace period: half of it counts
        # as attached time (the firings themselves are counted exactly either way).
        win.attached_s = (t1 - t0) + took / 2
        win.slice_length_s = t1 - t0
        win.detach_s = took
        win.slice_state = "stopped" if stopped else "done"
        self.governor.detach_s = max(took, 0.0)
        log.log(self.slice_log_level, "slice in window %d at +%.3f s (planned +%.3f s) for "
                "%.3f s, cadence %d, %d processes, detach took %.3f s", plan.index,
                (started_ns - aligned_start_ns) / 1e9, plan.offset_s, t1 - t0, plan.cadence,
                len(win.on.attached), took)

    def _slice_off(self) -> float:
        self._slice_open = False
        return float(self.backend.slice_off())

    def _reason(self, win: _Window, pid: int, sliced_hits: int) -> tuple[bool, str]:
        """Whether this process's sliced tier was sampled in the window, or why not."""
        plan = win.plan
        if plan is None:
            return False, "stopping"
        if win.blocked:
            return False, win.blocked
        if not plan.sampled:
            return False, plan.reason
        if win.slice_state == "late":
            # The slice's moment had passed when the window began: the loop just started (its
            # processes are new to it), or the previous window overran into this one.
            return False, "new_process" if win.first else "detaching"
        if win.slice_state == "empty":
            return False, "new_process"
        if win.slice_state == "stopped" and not win.on.attached:
            return False, "stopping"
        if pid in win.on.failed:
            return False, win.on.failed[pid]
        if pid not in win.on.attached:
            return False, "new_process"
        if sliced_hits == 0:
            return False, "no_calls"
        return True, ""

    # -- the window's end --------------------------------------------------------------------
    def _finish(self, win: _Window, stopping: bool) -> int:
        """Read the counters, build and hand over the window, pay the account; returns the
        window's actual end (ns), where the next window starts."""
        if self._slice_open:                         # (an error cut the slice short)
            win.detach_s = self._slice_off()
        read_ns = time.time_ns()
        end_ns = max(read_ns if stopping else max(read_ns, win.end_ns), win.start_ns + 1)
        window_s = (end_ns - win.start_ns) / 1e9
        readings = self.backend.read(win.start_ns, end_ns)
        if not self.sink.wants_window():
            return end_ns
        g = self.governor
        probes: dict[int, ProcessProbe] = {}
        cost_by_pid: dict[int, float] = {}
        hits = busiest_sliced = busiest_always = 0
        for r in readings:
            own = {api: probe_hits(s) for api, s in r.samples.items()}
            always = {api for api, tier in r.tiers.items() if tier == TIER_ALWAYS}
            always_hits = sum(n for api, n in own.items() if api in always)
            sliced_hits = sum(own.values()) - always_hits
            sampled, reason = self._reason(win, r.pid, sliced_hits)
            key = (r.pid, r.key)
            steps = self.steps.setdefault(key, StepFinder()).feed(r.boundaries)
            probe = ProcessProbe(
                sampled=sampled, unsampled_reason=reason, tiers=r.tiers,
                attached_s=win.attached_s if r.pid in win.on.attached else 0.0,
                fixed_cost_s=r.fixed_cost_s, covered_s=r.covered_s, sched=r.sched,
                loader=r.loader, steps=steps)
            if self.backend.measures_step_cost:
                probe.step_fraction, probe.step_basis = self._step_cost(
                    win, key, steps, window_s, g.cost_s(always_hits) / window_s)
            probes[r.pid] = probe
            cost_by_pid[r.pid] = g.cost_s(sum(own.values())) + r.fixed_cost_s
            hits += sum(own.values())
            if r.pid in win.on.attached:
                busiest_sliced = max(busiest_sliced, sliced_hits)
            if r.live:
                rates = {api: own.get(api, 0) / window_s for api in always}
                keep, demote = g.always_split(rates)
                if demote:
                    self._demote(r.pid, demote, rates)
                busiest_always = max(busiest_always, sum(own.get(a, 0) for a in keep))
        agent_id, node, seq = self.sink.next_id()
        window = build_window(
            agent_id, node, seq, win.start_ns, end_ns,
            {(r.pid, api): s for r in readings for api, s in r.samples.items()},
            {r.pid: r.record for r in readings if r.record is not None},
            WindowOverhead(attached_seconds=win.attached_s, probe_cost_ns=g.probe_cost_ns,
                           budget=g.budget), probes)
        # The account: earn the wall time, pay what the most charged process paid.
        cost_s = max(cost_by_pid.values(), default=0.0)
        if self.backend.earning():
            g.earn(window_s)
        g.spend(cost_s)
        if win.slice_state in ("done", "stopped") and win.on.attached:
            # Rate over the slice proper: the firings during the detach are in the numerator,
            # so the estimate errs high (safe), never low.
            g.observe_slice(busiest_sliced, win.slice_length_s)
            # Each probe of the slice is attached and detached once in its process.
            g.fixed_slice_s = Governor.fixed_cost_s(2 * max(win.on.attached.values()))
        g.observe_always(busiest_always, window_s)
        hits += self.backend.unattributed_hits()
        self.sink.deliver(window, WindowDone(win.start_ns, end_ns, window_s, win.attached_s,
                                             probes, hits, cost_s), stopping)
        live = {(r.pid, r.key) for r in readings}
        for state in (self.steps, self.step_cost):
            for key in [k for k in state if k not in live]:
                del state[key]                       # processes that are gone
        return end_ns

    def _demote(self, pid: int, apis: list[str], rates: dict[str, float]) -> None:
        g = self.governor
        for api in apis:
            rate = rates.get(api, 0.0)
            log.info("pid %d: %s fires %.0f/s, %.3g%% of its time at %.0f ns a call; the always "
                     "tier may cost it %.3g%% in all (always_share x overhead_budget), so %s "
                     "moves to the sliced tier", pid, api, rate, rate * g.probe_cost_ns * 1e-7,
                     g.probe_cost_ns, g.always_share * g.budget * 100, api)
        self.backend.demote(pid, apis)

    def _step_cost(self, win: _Window, key: tuple[int, int], steps: StepInference,
                   window_s: float, always_cpu: float) -> tuple[float, str]:
        """(share of step time the probes cost the process, basis): measured from the steps
        the slice touched (collector/step_cost.py) once enough are in, else "cpu" and the
        CPU-time charge is all there is to say (Overhead.step_basis)."""
        meter = self.step_cost.setdefault(key, StepCostMeter())
        if steps is not None and steps.steps:
            touched, touched_s = (0, 0), 0.0
            if win.touch_ns is not None:
                touched, touched_s = steps.ended_between(*win.touch_ns), win.touched_s
            meter.observe(steps.source, (steps.steps, steps.step_sum_ns), touched, touched_s,
                          window_s)
        sliced = meter.sliced_fraction()
        if sliced is None:
            return 0.0, "cpu"
        return sliced + always_cpu, "steps"
