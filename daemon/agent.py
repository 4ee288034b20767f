"""The node agent's lifecycle: config -> prerequisites -> probes -> window loop -> clean exit.

One window (``config.window`` seconds, aligned to wall-clock multiples of the window so the
windows of all nodes fall into the same analyzer epoch) runs like this::

    |------------------------------ window ------------------------------|
       [on]           [on]           [on]           [on]        (duty < 1: duty_schedule slices)
    [on ................................................................] (duty = 1: stays on)
    discovery scans every scan_interval throughout; at the end: read_and_clear -> window -> uplink

Why slices: the probes cost every call they see, so they are attached only ``duty`` of the time
(the governor picks the duty from the measured probe cost and the busiest process's probe-hit
rate, keeping ``cost x rate x duty`` under the budget). Spreading the attached time over several
slices (collector.governor.duty_schedule) makes the sample cover the whole window instead of its
first seconds. A detach waits out an RCU grace period per probe (over a second for both
libraries in our VMs), so the agent times its detaches and never schedules a slice shorter than
one; very small duties then probe one slice every k-th window. At full duty nothing is detached
at all. The BPF program stays loaded; attaching and detaching never recompiles, and the maps are
double-buffered, so reading them while attached loses nothing.

Why discovery during the window: a new training process must be probed within one window. A
library discovered while the probes are attached is attached at once, otherwise at the start of
the next slice. A uprobe lives on the library file, so later processes that map an already
attached library are probed with no action at all.

Robustness rules: a library that cannot be attached is logged and retried later, never fatal; a
process that vanishes mid-scan is simply gone; any error inside one window is logged and the
agent carries on with the next. SIGTERM/SIGINT end the current window early, flush it to the
uplink (which spools it), detach everything and exit 0.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from hypertrace.collector.attribution import attribute_pid
from hypertrace.collector.apis import PROBED_APIS
from hypertrace.collector.discovery import DiscoveryDelta, Library, LibraryId, ProcessScanner
from hypertrace.collector.governor import Governor, duty_schedule
from hypertrace.collector.nvml import Nvml, PidGpuMap
from hypertrace.daemon.config import AgentConfig
from hypertrace.daemon.systemd import SdNotifier, watchdog_interval
from hypertrace.daemon.windows import ProcessRecord, WindowOverhead, build_window, probe_hits

log = logging.getLogger(__name__)

PROBED_API_NAMES = frozenset(a.name for a in PROBED_APIS)

#: A library that failed to attach is tried again after this long.
ATTACH_RETRY_S = 60.0
#: Smallest attach slice (before a detach was timed): shorter slices cost more than they sample.
MIN_SLICE_S = 0.05
#: On shutdown, how long the uplink may try to deliver what is spooled (the rest stays spooled).
SHUTDOWN_DRAIN_S = 5.0

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2


@dataclass
class WindowState:
    """Bookkeeping of the window in progress."""
    start_ns: int
    end_ns: int
    attached_s: float = 0.0                       # seconds the probes were live
    exited: set[int] = field(default_factory=set)  # pids that exited during this window


class Agent:
    """Runs the agent until :meth:`request_stop` (or SIGTERM through :meth:`install_signals`).

    The probe session, uplink and NVML are created in :meth:`run` from the config unless given
    (the constructor parameters exist so a caller can share or pre-build them).
    """

    def __init__(self, config: AgentConfig, *, session: Any = None, uplink: Any = None,
                 nvml: Nvml | None = None, notifier: SdNotifier | None = None,
                 probe_cost_ns: float | None = None):
        self.cfg = config
        self.session = session
        self.uplink = uplink
        self.nvml = nvml
        self.notifier = notifier or SdNotifier()
        # An explicit cost (argument, or the config's probe_cost_ns) skips the calibration.
        self.probe_cost_ns = probe_cost_ns if probe_cost_ns is not None else (
            config.probe_cost_ns or None)
        self.governor: Any = None
        self.scanner = ProcessScanner(exclude_pids=[os.getpid()])
        self.records: dict[int, ProcessRecord] = {}
        self.attached: set[LibraryId] = set()
        self.failed: dict[LibraryId, float] = {}      # library -> monotonic retry time
        self.duty = 1.0
        self.windows_sent = 0
        self._stop = threading.Event()
        self._want_attached = False
        self._new_process = False                     # a process appeared since the last slice
        self._on_since: float | None = None           # monotonic time the probes went live
        self.detach_s = MIN_SLICE_S                   # learned: how long a full detach takes
        self._next_scan = 0.0
        self._next_ping = 0.0
        self._ping_every = watchdog_interval()

    # -- control ---------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    def install_signals(self) -> None:
        # Event.set() takes a lock that the interrupted main thread may hold (inside
        # Event.wait), so the handler hands the set() to a short-lived thread.
        def on_signal(*_: object) -> None:
            threading.Thread(target=self.request_stop, name="stop", daemon=True).start()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)

    # -- setup -----------------------------------------------------------------------------
    def _setup(self) -> None:
        """Start the uplink (cheap checks first: a bad spool dir fails in milliseconds), NVML,
        then load the probes (compile once, seconds) and measure their cost."""
        if self.uplink is None:
            from hypertrace.daemon.uplink import Spool, Uplink
            spool = Spool(self.cfg.spool_dir, int(self.cfg.spool_max_mb * 1024 * 1024))
            self.uplink = Uplink(spool, self.cfg.analyzer).start()
        if self.nvml is None and self.cfg.nvml:
            self.nvml = Nvml()
            if not self.nvml.available:
                log.info("%s", self.nvml.reason)
        if self.session is None:
            from hypertrace.collector.ebpf import UprobeSession
            self.notifier.status("compiling the BPF program")
            self.session = UprobeSession(exclude_pids=[os.getpid()])
        if self.probe_cost_ns is None:
            from hypertrace.collector.probe_cost import measure_probe_cost_ns
            self.notifier.status("measuring the probe cost")
            self.probe_cost_ns = float(measure_probe_cost_ns(self.session))
            self.session.read_and_clear()            # the calibration's own records
        self.governor = Governor(budget=self.cfg.overhead_budget,
                                 probe_cost_ns=self.probe_cost_ns)
        self.duty = float(self.governor.duty)
        log.info("agent %s on node %s: probe cost %.0f ns/call, budget %.2f%%, window %.1f s",
                 self.cfg.agent_id, self.cfg.node, self.probe_cost_ns,
                 self.cfg.overhead_budget * 100, self.cfg.window)

    def _teardown(self) -> None:
        for step, fn in (("detach", lambda: self.session and self.session.detach_all()),
                         ("close probes", lambda: self.session and self.session.close()),
                         ("close uplink", lambda: self.uplink and self.uplink.close(
                             drain_timeout=SHUTDOWN_DRAIN_S)),
                         ("close NVML", lambda: self.nvml and self.nvml.close())):
            try:
                fn()
            except Exception:
                log.exception("shutdown: %s failed", step)
        self.attached.clear()

    # -- probes ----------------------------------------------------------------------------
    def _attach(self, lib: Library) -> None:
        if lib.id in self.attached:
            return
        retry = self.failed.get(lib.id)
        if retry is not None and time.monotonic() < retry:
            return
        try:
            apis = self.session.attach(lib.path)
        except Exception as e:  # a bad library must never take the agent down
            self.failed[lib.id] = time.monotonic() + ATTACH_RETRY_S
            log.warning("cannot probe %s (%s): %s; retrying in %.0f s", lib.path, lib.kind, e,
                        ATTACH_RETRY_S)
            return
        self.failed.pop(lib.id, None)
        self.attached.add(lib.id)
        if not apis:
            log.info("%s exports none of the probed APIs", lib.path)
        else:
            log.debug("attached %s: %s", lib.path, ", ".join(apis))

    def _detach(self, lib: Library) -> None:
        if lib.id not in self.attached:
            return
        self.attached.discard(lib.id)
        try:
            self.session.detach(lib.path)
        except Exception as e:
            log.warning("detaching %s failed: %s", lib.path, e)

    def _attach_all(self) -> None:
        """Attach every known library (no-op when already attached)."""
        if self._want_attached:
            return
        self._want_attached = True
        t0 = time.time()
        for lib in list(self.scanner.libraries.values()):
            self._attach(lib)
        self._on_since = time.monotonic()
        log.debug("probes attached at %.3f (took %.3f s)", t0, time.time() - t0)

    def _detach_all(self, win: WindowState) -> None:
        """Detach everything and account the attached time to ``win``.

        Detaching waits for an RCU grace period per probe (about 0.1 s each in our VMs, so over
        a second for both libraries); the probes go away one by one meanwhile, so half the
        detach time counts as attached. The measured detach time also becomes the smallest
        slice worth scheduling (``duty_schedule``'s ``min_slice_s``).
        """
        if not self._want_attached:
            return
        self._want_attached = False
        t0 = time.monotonic()
        if self._on_since is not None:
            win.attached_s += t0 - self._on_since
            self._on_since = None
        for lib in list(self.scanner.libraries.values()):
            self._detach(lib)
        took = time.monotonic() - t0
        log.debug("probes detached at %.3f (took %.3f s)", time.time(), took)
        win.attached_s += took / 2
        if self.attached or took > 0:
            self.detach_s = max(MIN_SLICE_S, took)

    # -- discovery -------------------------------------------------------------------------
    def _scan(self, win: WindowState) -> None:
        try:
            delta = self.scanner.scan()
        except Exception:
            log.exception("process scan failed; trying again at the next interval")
            return
        if delta:
            self._apply(delta, win)

    def _apply(self, delta: DiscoveryDelta, win: WindowState) -> None:
        gpus = PidGpuMap(self.nvml.pid_map()) if self.nvml and self.nvml.available else None
        for proc in delta.started:
            rec = ProcessRecord(pid=proc.pid, attribution=attribute_pid(
                proc.pid, self.cfg.node, self.cfg.job_env, gpus))
            self.records[proc.pid] = rec
            win.exited.discard(proc.pid)
            self._new_process = True
            a = rec.attribution
            log.info("found pid %d (%s): job %s rank %d local rank %d gpu %d", proc.pid,
                     proc.comm, a.job_id, a.rank, a.local_rank, a.gpu_index)
        for proc in delta.exited:
            if proc.pid not in self.scanner.processes:   # (not a reused pid already re-added)
                win.exited.add(proc.pid)
            log.info("pid %d (%s) exited", proc.pid, proc.comm)
        for lib in delta.libraries_removed:
            self._detach(lib)
            self.failed.pop(lib.id, None)
            log.info("no process maps %s any more", lib.path)
        for lib in delta.libraries_added:
            log.info("found %s library %s", lib.kind, lib.path)
            if self._want_attached:
                self._attach(lib)

    # -- waiting ---------------------------------------------------------------------------
    def _wait_until(self, deadline_ns: int, win: WindowState) -> bool:
        """Sleep until the wall-clock deadline, scanning and pinging the watchdog on the way.

        False when a stop was requested.
        """
        while not self._stop.is_set():
            mono = time.monotonic()
            if mono >= self._next_scan:
                self._scan(win)
                self._next_scan = mono + self.cfg.scan_interval
            if self._ping_every and mono >= self._next_ping:
                self.notifier.watchdog()
                self._next_ping = mono + self._ping_every
            left = (deadline_ns - time.time_ns()) / 1e9
            if left <= 0:
                return True
            waits = [left, self._next_scan - time.monotonic()]
            if self._ping_every:
                waits.append(self._next_ping - time.monotonic())
            self._stop.wait(max(0.0, min(waits)))
        return False

    # -- one window ------------------------------------------------------------------------
    def _run_window(self, win: WindowState) -> None:
        """Attach the probes on the governor's schedule for this window; return at its end
        (or on stop). At full duty the probes simply stay attached across windows."""
        window_s = (win.end_ns - win.start_ns) / 1e9
        if self.duty >= 1.0:
            self._attach_all()
            self._wait_until(win.end_ns, win)
            return
        self.governor.earn(window_s)
        min_slice_s = self.detach_s
        if self.governor.rate_hz:                     # the samples floor (config min_samples)
            min_slice_s = max(min_slice_s, self.cfg.min_samples / self.governor.rate_hz)
        schedule = duty_schedule(window_s, self.duty, slices=self.cfg.slices,
                                 min_slice_s=min(min_slice_s, window_s), window_index=0)
        # The budget account decides whether this window probes at all (see Governor.earn):
        # a slice costs its length plus about half a detach of firing.
        planned_s = sum(length for _, length in schedule) + self.detach_s / 2 * len(schedule)
        if not self.governor.can_afford(planned_s) and not self._new_process:
            schedule = []
        # A process found since the last slice is probed in this window even when the account
        # is short (it goes negative and later windows repay it): "probed within one window",
        # at the price of one extra slice per process start, which is rare on a training node.
        self._new_process = False
        for offset_s, length_s in schedule:
            on_at = win.start_ns + int(offset_s * 1e9)
            if time.time_ns() < on_at:
                self._detach_all(win)          # (still attached from a full-duty window)
            if not self._wait_until(on_at, win):
                return
            self._attach_all()
            if not self._wait_until(on_at + int(length_s * 1e9), win):
                return
            self._detach_all(win)
        self._detach_all(win)
        self._wait_until(win.end_ns, win)

    def _finish_window(self, win: WindowState, stopping: bool) -> int:
        """Read the maps, build and hand over the window, retune the duty; returns the
        window's actual end (ns), where the next window starts."""
        if stopping:
            self._detach_all(win)
        elif self._on_since is not None:             # full duty: stays attached, split time
            now = time.monotonic()
            win.attached_s += now - self._on_since
            self._on_since = now
        # The maps are double-buffered, so reading while attached loses nothing. Records of
        # the probe-cost calibration (API hypertrace_null) are not the workload's: drop them.
        read_ns = time.time_ns()
        end_ns = max(read_ns if stopping else max(read_ns, win.end_ns), win.start_ns)
        samples = {k: s for k, s in self.session.read_and_clear().items()
                   if k[1] in PROBED_API_NAMES}
        gpus = PidGpuMap(self.nvml.pid_map()) if self.nvml and self.nvml.available else None
        for pid in {pid for pid, _ in samples} - set(self.records):
            # Sampled before a scan saw it (or between scans): attribute it now.
            self.records[pid] = ProcessRecord(pid=pid, attribution=attribute_pid(
                pid, self.cfg.node, self.cfg.job_env, gpus))
        self._add_gpu_context(gpus)
        calls_by_pid: dict[int, int] = {}
        for (pid, _api), s in samples.items():
            calls_by_pid[pid] = calls_by_pid.get(pid, 0) + probe_hits(s)
        # A process with no calls is still reported when it belongs to a job (that GPU is then
        # "insufficient data", which is news); an unattributed idle one (a monitoring daemon
        # that maps libcuda) is not.
        report = {pid: rec for pid, rec in self.records.items()
                  if pid in calls_by_pid or rec.attribution.job_source}
        seq = self.uplink.next_seq()
        window = build_window(
            self.cfg.agent_id, self.cfg.node, seq, win.start_ns, end_ns, samples, report,
            WindowOverhead(attached_seconds=win.attached_s, probe_cost_ns=self.probe_cost_ns,
                           budget=self.cfg.overhead_budget))
        if self.uplink.submit(window):
            self.windows_sent += 1
        busiest = max(calls_by_pid.values(), default=0)
        used_duty = self.duty
        if used_duty < 1.0:                          # governed window: pay for what it cost
            self.governor.spend(busiest)
        try:
            self.duty = float(self.governor.next_duty(busiest, win.attached_s))
        except Exception:
            log.exception("governor failed; keeping duty %.3f", self.duty)
        status = (f"window {seq}: {len(window.processes)} processes, "
                  f"{sum(calls_by_pid.values())} probe hits, duty {used_duty:.3f} -> {self.duty:.3f}")
        log.info("%s", status)
        self.notifier.status(status)
        for pid in win.exited:                      # keep records only while samples may come
            if pid not in self.scanner.processes:
                self.records.pop(pid, None)
        # A process sampled but never seen by a scan (it lived between two scans) gets no exit
        # event: drop its record once it is gone, or it would be reported forever.
        for pid in [p for p in self.records
                    if p not in self.scanner.processes and not os.path.exists(f"/proc/{p}")]:
            del self.records[pid]
        return end_ns

    def _add_gpu_context(self, gpus: PidGpuMap | None) -> None:
        """Refresh NVML attribution (a CUDA context may appear after discovery) and context."""
        if not (self.nvml and self.nvml.available):
            return
        snaps: dict[int, Any] = {}
        for pid, rec in self.records.items():
            ref = gpus.gpu_for_pid(pid) if gpus else None
            if ref is not None and rec.attribution.gpu_source != "nvml":
                rec.attribution = replace(rec.attribution, gpu_index=ref.index,
                                          gpu_uuid=ref.uuid, gpu_source="nvml")
            idx = rec.attribution.gpu_index
            if idx < 0 and rec.attribution.gpu_uuid:
                idx = self.nvml.index_of_uuid(rec.attribution.gpu_uuid)
            if idx < 0:
                continue
            if idx not in snaps:
                snaps[idx] = self.nvml.snapshot(idx)
            rec.nvml = snaps[idx]
            rec.gpu_kind = rec.gpu_kind or self.nvml.gpu_kind(idx)

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped; the exit status (0 after a clean stop)."""
        from hypertrace.daemon.uplink import SpoolError
        try:
            self._setup()
        except SpoolError as e:
            # spool_dir is configuration: exit 2 so systemd does not restart into the same error
            # (the unit has RestartPreventExitStatus=2).
            log.error("agent cannot start: %s", e)
            self._teardown()
            return EXIT_CONFIG
        except Exception as e:
            log.error("agent cannot start: %s", e)
            self._teardown()
            return EXIT_FAILURE
        self._scan(WindowState(0, 0))                 # (logs each library it finds)
        self._next_scan = time.monotonic() + self.cfg.scan_interval
        self.notifier.ready(f"probing {len(self.scanner.processes)} processes")
        window_ns = int(self.cfg.window * 1e9)
        start = time.time_ns()
        while True:
            win = WindowState(start_ns=start, end_ns=window_end(start, window_ns))
            try:
                self._run_window(win)
            except Exception:
                log.exception("error during window; continuing")
            stopping = self._stop.is_set()
            try:
                # A window ends when its maps are read: at its boundary, earlier on a stop, or
                # later when a slow detach made the loop overrun (the next one starts there, so
                # no stretch of time is counted twice or skipped).
                start = self._finish_window(win, stopping)
            except Exception:
                log.exception("could not finish the window ending at %d; continuing",
                              win.end_ns)
                start = max(win.end_ns, time.time_ns())
            if stopping:
                break
        self.notifier.stopping("flushed the last window")
        self._teardown()
        log.info("agent stopped after %d windows", self.windows_sent)
        return EXIT_OK


def window_end(start_ns: int, window_ns: int) -> int:
    """The wall-clock window boundary after ``start_ns``; a stub shorter than a quarter window
    is merged into the following window (it would carry too few samples to score)."""
    end = (start_ns // window_ns + 1) * window_ns
    if end - start_ns < window_ns // 4:
        end += window_ns
    return end


def run_agent(config: AgentConfig, install_signals: bool = True,
              on_ready: Callable[[Agent], None] | None = None) -> int:
    """Build an :class:`Agent` from a config and run it (what ``hypertrace agent`` calls)."""
    agent = Agent(config)
    if install_signals:
        agent.install_signals()
    if on_ready:
        on_ready(agent)
    return agent.run()
