"""This process's CUPTI callbacks as a probe backend of the window loop (daemon/window_loop.py).

The tiers are the uprobes': the **always** tier (synchronize and graph-launch callbacks) stays
enabled and gives the step boundaries; the **sliced** tier (launch callbacks) is on only in the
loop's slices. A callback pair's price is measured in process (:meth:`CuptiProbes.calibrate`:
``cudaGetDevice`` timed with its callbacks off and on); until then :data:`DEFAULT_COST_NS` is
charged. CUPTI has one subscriber per process: when another tool holds it, the windows say
``cupti_busy`` and name the holder, and subscribing is retried every ``retry_s``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

from hypertrace.collector.attribution import DEFAULT_JOB_ENV, attribute
from hypertrace.collector.cupti.native import Recorder, mapped_library
from hypertrace.collector.cupti.threads import ThreadSched
from hypertrace.collector.governor import Governor
from hypertrace.collector.readings import (
    TIER_ALWAYS,
    TIER_SLICED,
    ProcessReading,
    ProcessRecord,
    SliceOn,
)
from hypertrace.collector.steps import MARKER_API
from hypertrace.proto.apis import PERIODIC_KINDS, PROBED_APIS

log = logging.getLogger("hypertrace.cupti")

#: Charged per callback pair until the in-process measurement ran (ns; high on purpose).
DEFAULT_COST_NS = 2000.0
#: The calibration: calls per round, rounds (median of rounds each way).
CALIBRATION_CALLS = 2000
CALIBRATION_ROUNDS = 5
CALIBRATION_API = "cudaGetDevice"
#: The subscriber name other tools see ("CUPTI for hypertrace").
SUBSCRIBER_NAME = "hypertrace"
#: Said when the holder did not name itself. PyTorch's profiler (kineto) is one, and it keeps
#: CUPTI for the rest of the process once a profile ran.
UNNAMED_HINT = (" (a client that does not name itself; torch.profiler is one, and once it has "
                "profiled it keeps CUPTI until its process exits)")


def cupti_apis() -> list[tuple[str, str]]:
    """(name, kind) of the probed APIs that CUPTI can report: all but the step marker."""
    return [(a.name, a.kind) for a in PROBED_APIS if a.kind in ("launch", "sync", "graph")]


@dataclass
class BackendState:
    """What ``hypertrace.daemon.cupti.state()`` reports."""
    mode: str = "starting"          # starting | waiting_for_cuda | active | standby | direct |
                                    # no_agent | stopped
    subscribed: bool = False
    paused: bool = False
    blocked_by: str = ""            # the other CUPTI subscriber, while backed off
    probe_cost_ns: float = DEFAULT_COST_NS
    cost_measured: bool = False
    windows_sent: int = 0
    last_error: str = ""
    apis: list[str] = field(default_factory=list)


class CuptiProbes:
    """The recorder of this process and its tiers. Thread-safe where the runtime's threads meet
    (subscribe, enable, pause: under :attr:`lock`)."""

    measures_step_cost = False

    def __init__(self, state: BackendState, recorder: Recorder | None = None,
                 pid: int | None = None, retry_s: float = 30.0, cupti_lib: str = ""):
        self.state = state
        self.recorder = recorder
        self.pid = pid or os.getpid()
        self.retry_s = retry_s
        self.cupti_lib = cupti_lib
        self.node = ""                      # attribution's node name (the runtime sets it)
        self.lock = threading.RLock()
        self._always: list[str] = []
        self._sliced: list[str] = []
        self._next_subscribe = 0.0
        self._said_busy = ""
        self._calibrated_slot = False
        self._sched = ThreadSched()
        self._sched_read_ns = 0.0
        self._ops = 0                       # enable/disable operations not yet charged
        self._enabled = False               # the sliced tier is on

    def open(self) -> None:
        """Load the recorder and route the probed APIs (raises CuptiUnavailable)."""
        if self.recorder is None:
            self.recorder = Recorder()
        if not self.recorder.loaded:
            self.recorder.open(self.cupti_lib or None)
        for name, kind in cupti_apis():
            if not self.recorder.add_api(name, kind):
                log.debug("CUPTI has no callback for %s here", name)
        self.recorder.add_api(MARKER_API, "marker")       # hypertrace.step(), in process
        known = set(self.recorder.slots) - {MARKER_API}
        self._always = [n for n, k in cupti_apis() if k in PERIODIC_KINDS and n in known]
        self._sliced = [n for n, k in cupti_apis() if k not in PERIODIC_KINDS and n in known]
        self.state.apis = sorted(known)
        # Each periodic call reads its thread's schedstat twice (threads.py): priced here, paid
        # from the same account as the callbacks.
        self._sched_read_ns = self.recorder.sched_read_cost_ns()

    # -- subscription -------------------------------------------------------------------------
    def active(self) -> bool:
        return self.state.mode in ("active", "direct") and not self.state.paused

    def ensure_subscribed(self) -> None:
        """Subscribe (and enable the always tier) when active and not yet; a held CUPTI is
        retried every ``retry_s``."""
        with self.lock:
            if not self.active() or self.recorder.subscribed():
                return
            now = time.monotonic()
            if now < self._next_subscribe:
                return
            self._next_subscribe = now + self.retry_s
            try:
                holder = self.recorder.subscribe(SUBSCRIBER_NAME)
            except RuntimeError as exc:
                self.state.last_error = str(exc)
                log.error("hypertrace: CUPTI subscribe failed: %s; retrying in %.0f s", exc,
                          self.retry_s)
                return
            if holder is not None:
                if holder != self._said_busy:
                    log.warning("hypertrace: CUPTI is held by %s%s; backing off (no probes, "
                                "windows say cupti_busy), retrying every %.0f s", holder,
                                UNNAMED_HINT if "not provided" in holder else "",
                                self.retry_s)
                    self._said_busy = holder
                self.state.blocked_by = holder
                return
            self.state.blocked_by = ""
            self._said_busy = ""
            self.recorder.reset_periods()
            try:
                self.recorder.enable(self._always, True)
            except RuntimeError as exc:
                self.recorder.unsubscribe()     # all or nothing: retried at the next interval
                self.state.last_error = str(exc)
                log.error("hypertrace: enabling CUPTI callbacks failed: %s; retrying in %.0f s",
                          exc, self.retry_s)
                return
            self.state.subscribed = True
            log.info("hypertrace: subscribed to CUPTI; always tier: %s", ", ".join(self._always))

    def unsubscribe(self) -> None:
        """Stop every callback now (caller holds :attr:`lock` or owns the process's end)."""
        with self.lock:
            if self.recorder is not None and self.recorder.loaded and self.recorder.subscribed():
                self.recorder.unsubscribe()
            self.state.subscribed = False

    def pause(self) -> None:
        """Unsubscribe now (another tool may subscribe) until :meth:`resume`."""
        with self.lock:
            self.state.paused = True
            self.unsubscribe()

    def resume(self) -> None:
        with self.lock:
            self.state.paused = False
            self._next_subscribe = 0.0

    def mark(self) -> None:
        """hypertrace.step() was called: a step boundary."""
        if self.state.subscribed and MARKER_API in self.recorder.slots:
            self.recorder.mark(MARKER_API)

    # -- the window loop's protocol ------------------------------------------------------------
    def begin(self) -> str:
        self.ensure_subscribed()
        if not self.active():
            return "paused" if self.state.paused else "standby"
        if not self.recorder.subscribed():
            return "cupti_busy" if self.state.blocked_by else "attach_failed"
        return ""

    def unattributed_hits(self) -> int:
        return 0                # every callback is this process's own

    def earning(self) -> bool:
        # Credit is earned only while probing: a process paused, backed off or without an
        # agent for a while must not save up a burst of slices for later.
        return self.state.subscribed

    def slice_on(self) -> SliceOn:
        with self.lock:
            if not self.recorder.subscribed():
                return SliceOn(failed={
                    self.pid: "paused" if self.state.paused else "cupti_busy"})
            self.recorder.enable(self._sliced, True)
            self._enabled = True
        self._ops += len(self._sliced)
        return SliceOn(attached={self.pid: len(self._sliced)})

    def slice_off(self) -> float:
        t0 = time.monotonic()
        if self._enabled:
            with self.lock:
                if self.recorder.subscribed():
                    self.recorder.enable(self._sliced, False)
            self._ops += len(self._sliced)
            self._enabled = False
        return time.monotonic() - t0

    def read(self, start_ns: int, end_ns: int) -> list[ProcessReading]:
        """This process's window. The scheduler baseline moves on even when nobody takes the
        window, so that a later window covers only itself."""
        snap = self.recorder.read(self.pid)
        window_s = max((end_ns - start_ns) / 1e9, 1e-9)
        sched = self._sched.sample(self.recorder.threads(), snap.offcpu_ns, window_s)
        fixed = Governor.fixed_cost_s(self._ops) + snap.sched_reads * self._sched_read_ns * 1e-9
        self._ops = 0
        tiers = {api: TIER_ALWAYS for api in self._always}
        tiers.update({api: TIER_SLICED for api in self._sliced})
        return [ProcessReading(
            pid=self.pid, key=0,
            record=ProcessRecord(pid=self.pid, attribution=attribute(
                self.pid, dict(os.environ), self.node, DEFAULT_JOB_ENV)),
            samples={api: s for api, s in snap.samples.items() if api in self.recorder.kinds
                     and api not in (CALIBRATION_API, MARKER_API)},
            tiers=tiers, boundaries=snap.boundaries.only({*self._always, MARKER_API}),
            sched=sched if self.state.subscribed else None, fixed_cost_s=fixed)]

    def demote(self, pid: int, apis: list[str]) -> None:
        with self.lock:
            if self.recorder.subscribed():
                self.recorder.enable(apis, False)
            self._always = [a for a in self._always if a not in apis]
            self._sliced += apis

    def end(self) -> None:
        pass

    # -- the price of a callback ----------------------------------------------------------------
    def calibrate(self) -> float | None:
        """Price one callback pair in this process (module docstring); the cost in ns, or None
        when it cannot be measured now."""
        lib = mapped_library("/libcudart.so")
        if lib is None:
            return None
        try:
            cudart = ctypes.CDLL(lib)
            get_device = cudart.cudaGetDevice
            get_device.argtypes = [ctypes.POINTER(ctypes.c_int)]
        except (OSError, AttributeError) as exc:
            log.debug("calibration: cannot use %s: %s", lib, exc)
            return None
        with self.lock:
            if not self.recorder.subscribed():
                return None
            if not self._calibrated_slot:
                self._calibrated_slot = self.recorder.add_api(CALIBRATION_API, "launch")
                if not self._calibrated_slot:
                    return None
            off, on = [], []
            for _ in range(CALIBRATION_ROUNDS):
                off.append(self.recorder.time_calls(get_device, CALIBRATION_CALLS))
                self.recorder.enable([CALIBRATION_API], True)
                on.append(self.recorder.time_calls(get_device, CALIBRATION_CALLS))
                self.recorder.enable([CALIBRATION_API], False)
            self.recorder.forget_this_thread()      # this thread is not the workload's
        cost = max(statistics.median(on) - statistics.median(off), 1.0)
        self.state.probe_cost_ns = cost
        self.state.cost_measured = True
        log.info("hypertrace: one CUPTI callback pair costs %.0f ns here (cudaGetDevice %.0f ns "
                 "off, %.0f ns on)", cost, statistics.median(off), statistics.median(on))
        return cost
