"""The node agent's lifecycle: config -> prerequisites -> probes -> window loop -> clean exit.

Which processes: only those attributed to a job (their environment names one, see
collector/attribution.py), unless ``probe_unattributed`` is set. A monitoring daemon that maps
libcuda is none of our business, and on a node shared by several jobs (or several agents, one
per rank, as in our 8-rank emulation of an 8-node job) each agent probes only its own ranks.

Two probe tiers per process (collector/governor.py has the cost model):

* **Always** (from the scan that finds the process until it exits): the periodic-kind APIs of
  the libraries it maps (synchronize, graph launch, the step marker), attached for that pid
  only, plus scheduler tracking (``track_pids``). They give the step time and the run-queue
  wait every window; CPU contention shows nowhere else. An API whose rate makes it cost more
  than ``always_share`` of the budget moves to the sliced tier (logged).
* **Sliced**: the launch APIs (and any demoted periodic API), attached for all probed
  processes in one slice per sampled window and removed together with ``detach_many``.

One window (``config.window`` seconds, aligned to wall-clock multiples of the window so every
node's window ``i = start // window`` is the same stretch of time)::

    |---guard---|...........[ slice: launch tier on ]...........|---guard---|
    [always tier and scheduler tracking on ...................................]
    discovery scans every scan_interval; at the end: read_and_clear + read_process_stats
    -> StepFinder.feed per process -> build_window -> uplink; the account pays what was counted

Whether window ``i`` holds a slice, where and how long comes from the governor's plan
(collector/schedule.py): the offset is a function of ``i`` alone, the cadence ``k`` a power of
two, so every agent of a job slices the same windows at the same moment with no traffic.
A process found after the slice began joins the next sampled window (its always tier attaches
at once). Each process's window says whether it was sampled, or why not: "budget",
"off_cadence", "no_calls", "detaching" (the previous window's detach overran into this one,
past its slice moment), "new_process", "attach_failed", "stopping".

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

from hypertrace.proto.apis import ENTRY_ONLY_KINDS, PERIODIC_KINDS, PROBED_APIS
from hypertrace.collector.attribution import attribute_pid
from hypertrace.collector.discovery import DiscoveryDelta, Library, LibraryId, ProcessScanner
from hypertrace.collector.governor import Governor, SlicePlan
from hypertrace.collector.nvml import Nvml, PidGpuMap
from hypertrace.collector.schedule import window_end, window_index
from hypertrace.collector.step_cost import StepCostMeter
from hypertrace.collector.loaders import LoaderTracker
from hypertrace.collector.steps import StepFinder, StepInference
from hypertrace.daemon.config import AgentConfig
from hypertrace.daemon.inprocess import InProcessHub, NoProbes
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.daemon.metrics_file import AgentMetrics, write as write_metrics_file
from hypertrace.proto.transport import TransportError, channel_credentials, tls_files
from hypertrace.daemon.systemd import SdNotifier, watchdog_interval
from hypertrace.daemon.windows import (TIER_ALWAYS, TIER_SLICED, ProcessProbe, ProcessRecord,
                                       WindowOverhead, build_window, probe_hits)

log = logging.getLogger(__name__)

PROBED_API_NAMES = frozenset(a.name for a in PROBED_APIS)
_KIND_OF = {a.name: a.kind for a in PROBED_APIS}

#: A library that failed to attach is tried again after this long.
ATTACH_RETRY_S = 60.0
#: On shutdown, how long the uplink may try to deliver what is spooled (the rest stays spooled).
SHUTDOWN_DRAIN_S = 5.0

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2


def probe_ops(api: str) -> int:
    """Uprobes one API takes in a process (entry + return; entry only for the marker): each
    attach or detach of one is a fixed cost to that process (governor.FIXED_NS_PER_PROBE_OP)."""
    return 1 if _KIND_OF.get(api) in ENTRY_ONLY_KINDS else 2


@dataclass
class Probed:
    """A process the agent probes, and what is attached to it."""
    pid: int
    found_ns: int
    libs: dict[LibraryId, Library] = field(default_factory=dict)   # libraries carrying probes
    always: dict[str, set[str]] = field(default_factory=dict)      # library path -> APIs
    sliced: set[str] = field(default_factory=set)       # sliced-tier APIs it exports (seen)
    demoted: set[str] = field(default_factory=set)      # periodic APIs moved to the sliced tier
    failed: dict[LibraryId, float] = field(default_factory=dict)   # -> monotonic retry time
    slice_failed: set[LibraryId] = field(default_factory=set)      # its last slice attach failed
    ops: int = 0                                        # attach/detach ops not yet charged

    @property
    def always_apis(self) -> set[str]:
        return set().union(*self.always.values()) if self.always else set()

    def tiers(self) -> dict[str, str]:
        out = {api: TIER_SLICED for api in self.sliced}
        out.update({api: TIER_ALWAYS for api in self.always_apis})
        return out


@dataclass
class WindowState:
    """Bookkeeping of the window in progress."""
    start_ns: int
    end_ns: int
    plan: SlicePlan | None = None
    attached_s: float = 0.0                       # seconds the sliced tier was live
    slice_state: str = ""                         # "" | "done" | "late" | "stopped" | "empty"
    slice_pids: set[int] = field(default_factory=set)       # got the sliced tier this window
    slice_failed: set[int] = field(default_factory=set)     # its sliced attach failed
    slice_probes: dict[int, int] = field(default_factory=dict)  # pid -> uprobes in the slice
    slice_length_s: float = 0.0                   # from the attach to the detach request
    detach_s: float = 0.0
    exited: dict[int, Probed] = field(default_factory=dict)  # probed pids that exited
    # Step counters just before the slice's attach and just after its detach, and the seconds
    # between: the steps the slice touched (collector/step_cost.py).
    touch_ns: tuple[int, int] | None = None     # the slice's touched stretch (monotonic ns)
    touched_s: float = 0.0


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
        self.governor: Governor | None = None
        self.scanner = ProcessScanner(exclude_pids=[os.getpid()])
        self.records: dict[int, ProcessRecord] = {}
        self.probed: dict[int, Probed] = {}
        self.step_finders: dict[int, StepFinder] = {}   # pid -> its steps across windows
        self.step_cost: dict[int, StepCostMeter] = {}   # pid -> its probes' cost in step time
        self.loaders = LoaderTracker()                  # each rank's loader workers
        self.worker_of: dict[int, int | None] = {}      # child pid -> its rank's pid, or None
        self.windows_sent = 0
        self._slice_items: list[tuple[str, int, list[str]]] = []   # sliced tier now attached
        self._first_window: WindowState | None = None
        self._stop = threading.Event()
        self._next_scan = 0.0
        self._next_ping = 0.0
        self._ping_every = watchdog_interval()
        self.hub: InProcessHub | None = None
        self.cupti_only = False
        self._version: str | None = None

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
            from hypertrace.daemon.uplink import Spool, Uplink, idle_close_for
            spool = Spool(self.cfg.spool_dir, int(self.cfg.spool_max_mb * 1024 * 1024))
            files = tls_files(self.cfg.tls_ca, self.cfg.tls_cert, self.cfg.tls_key)
            creds = channel_credentials(files) if files is not None else None
            self.uplink = Uplink(spool, self.cfg.analyzer, credentials=creds,
                                 idle_close=idle_close_for(self.cfg.window), tls_files=files,
                                 on_fatal=lambda _cause: self.request_stop())
            self.uplink.preflight()      # a TLS configuration error ends the start, exit 2
            self.uplink.start()
        if self.nvml is None and self.cfg.nvml:
            self.nvml = Nvml()
            if not self.nvml.available:
                log.info("%s", self.nvml.reason)
        if self.session is None and self._ebpf_unavailable():
            self.session = NoProbes()
            self.cupti_only = True
            self.probe_cost_ns = self.probe_cost_ns or 0.0
        if self.session is None:
            from hypertrace.collector.ebpf import UprobeSession
            self.notifier.status("compiling the BPF program")
            self.session = UprobeSession(exclude_pids=[os.getpid()])
        if self.cfg.cupti_socket:
            self._start_hub()
        if self.probe_cost_ns is None:
            from hypertrace.collector.probe_cost import measure_probe_cost_ns
            self.notifier.status("measuring the probe cost")
            self.probe_cost_ns = float(measure_probe_cost_ns(self.session))
            self.session.read_and_clear()            # the calibration's own records
        self.governor = Governor(
            probe_cost_ns=self.probe_cost_ns, budget=self.cfg.overhead_budget,
            always_share=self.cfg.always_share, max_slice_s=self.cfg.max_slice_s,
            slice_guard_s=self.cfg.slice_guard_s, min_samples=self.cfg.min_samples)
        log.info("agent %s on node %s: probe cost %.0f ns/call (CPU), budget %.2f%%, window "
                 "%.1f s, slices up to %.2f s, %s", self.cfg.agent_id, self.cfg.node,
                 self.probe_cost_ns, self.cfg.overhead_budget * 100, self.cfg.window,
                 self.cfg.max_slice_s, "probing every CUDA process" if
                 self.cfg.probe_unattributed else "probing processes attributed to a job")

    def _start_hub(self) -> None:
        """Listen for in-process backends. Without uprobes that is the agent's only source, so
        a failure is fatal then; beside uprobes it is logged and the agent goes on."""
        hub = InProcessHub(self.cfg.cupti_socket, pb.LocalConfig(
            agent_id=self.cfg.agent_id, node=self.cfg.node, window_s=self.cfg.window,
            overhead_budget=self.cfg.overhead_budget, always_share=self.cfg.always_share,
            max_slice_s=self.cfg.max_slice_s, slice_guard_s=self.cfg.slice_guard_s,
            min_samples=self.cfg.min_samples), standby=not self.cupti_only)
        try:
            self.hub = hub.start()
        except OSError as exc:
            msg = (f"cannot listen on cupti_socket {self.cfg.cupti_socket}: {exc}; set "
                   "cupti_socket to a writable path (or \"\" to accept no in-process backends)")
            if self.cupti_only:
                raise RuntimeError(msg) from None
            log.warning("%s; in-process (CUPTI) backends cannot connect", msg)

    def _ebpf_unavailable(self) -> bool:
        """Whether this agent runs without uprobes (``backend``: cupti, or auto where eBPF's
        prerequisites are missing). Says why, and what the training processes need then."""
        if self.cfg.backend == "ebpf":
            return False
        if self.cfg.backend == "auto":
            from hypertrace.collector import prereqs
            problems = prereqs.check_all()
            if not problems:
                return False
            if not self.cfg.cupti_socket:
                raise RuntimeError(prereqs.describe(problems) + "; and cupti_socket is \"\", "
                                   "so no in-process backend can report either")
            log.warning("eBPF is not available here (%s). This node needs the in-process CUPTI "
                        "backend: start training with `python -m hypertrace.collector.cupti -- "
                        "CMD` (or call hypertrace.collector.cupti.start() in the script); it "
                        "connects to %s", prereqs.describe(problems), self.cfg.cupti_socket)
        else:
            log.info("backend cupti: no uprobes; windows come from in-process backends on %s",
                     self.cfg.cupti_socket)
        return True

    def _teardown(self) -> None:
        if self.hub is not None:
            self.hub.close()
        for step, fn in (("detach", lambda: self.session and self.session.detach_all()),
                         ("close probes", lambda: self.session and self.session.close()),
                         ("close uplink", lambda: self.uplink and self.uplink.close(
                             drain_timeout=SHUTDOWN_DRAIN_S)),
                         ("close NVML", lambda: self.nvml and self.nvml.close())):
            try:
                fn()
            except Exception:
                log.exception("shutdown: %s failed", step)
        self._slice_items.clear()
        self.probed.clear()

    # -- the always tier -------------------------------------------------------------------
    def _always_apis(self, p: Probed, lib: Library) -> list[str]:
        return [a.name for a in PROBED_APIS if a.library == lib.kind
                and a.kind in PERIODIC_KINDS and a.name not in p.demoted]

    def _sliced_apis(self, p: Probed, lib: Library) -> list[str]:
        return [a.name for a in PROBED_APIS if a.library == lib.kind
                and (a.kind not in PERIODIC_KINDS or a.name in p.demoted)]

    def _attach_always(self, p: Probed) -> None:
        """Attach the always tier on every library of the process not attached yet (a process
        may map libcuda long after libcudart, or the step marker after both)."""
        proc = self.scanner.processes.get(p.pid)
        if proc is None:
            return
        now = time.monotonic()
        for lib_id in proc.libraries:
            lib = self.scanner.libraries.get(lib_id)
            if lib is None or lib_id in p.libs:
                continue
            retry = p.failed.get(lib_id)
            if retry is not None and now < retry:
                continue
            apis = self._always_apis(p, lib)
            try:
                got = self.session.attach(lib.path, p.pid, apis) if apis else []
            except Exception as e:  # a bad library must never take the agent down
                p.failed[lib_id] = now + ATTACH_RETRY_S
                log.warning("cannot probe %s (%s) in pid %d: %s; retrying in %.0f s", lib.path,
                            lib.kind, p.pid, e, ATTACH_RETRY_S)
                # What did attach before the failure stays attached: account for it as the
                # always tier (the retry attaches the rest; attach is idempotent per API).
                held = set(self.session.attachments.get(
                    (os.path.abspath(lib.path), p.pid), ())) & set(apis)
                if held:
                    p.always[lib.path] = held
                continue
            p.failed.pop(lib_id, None)
            p.libs[lib_id] = lib
            on = set(got) & set(apis)
            p.always[lib.path] = on
            p.ops += sum(probe_ops(a) for a in on)
            if on:
                log.debug("pid %d: always tier on %s: %s", p.pid, lib.path, ", ".join(sorted(on)))

    def _start_probing(self, pid: int, found_ns: int) -> None:
        p = Probed(pid=pid, found_ns=found_ns)
        self.probed[pid] = p
        try:
            self.session.track_pids([pid])
        except Exception as e:
            log.warning("cannot track the scheduling of pid %d: %s", pid, e)
        self._attach_always(p)

    def _stop_probing(self, gone: dict[int, Probed]) -> None:
        """Remove every probe of these (exited) processes and their kernel records, at once
        (the closes run concurrently: about one RCU grace period in all)."""
        items = [(path, pid, None) for pid, p in gone.items()
                 for path in sorted({lib.path for lib in p.libs.values()} | set(p.always))]
        try:                       # and whatever else the session holds for them
            held = {(path, pid) for path, pid in self.session.attachments if pid in gone}
            items += [(path, pid, None) for path, pid in sorted(held)
                      if (path, pid, None) not in items]
        except Exception:
            log.exception("listing the probes of exited pids %s failed", sorted(gone))
        try:
            if items:
                self.session.detach_many(items)
            self.session.forget_pids(list(gone))
        except Exception:
            log.exception("cleaning up after exited pids %s failed", sorted(gone))

    def _demote(self, p: Probed, apis: list[str], rates: dict[str, float]) -> None:
        """Move always-tier APIs of one process to the sliced tier (they cost too much)."""
        allowance = self.cfg.always_share * self.cfg.overhead_budget
        for api in apis:
            rate = rates.get(api, 0.0)
            log.info("pid %d: %s fires %.0f/s, %.3g%% of its time at %.0f ns a call; the always "
                     "tier may cost it %.3g%% in all (always_share x overhead_budget), so %s "
                     "moves to the sliced tier", p.pid, api, rate,
                     rate * self.probe_cost_ns * 1e-7, self.probe_cost_ns, allowance * 100, api)
        p.demoted.update(apis)
        items = []
        for path, on in p.always.items():
            gone = on & set(apis)
            if gone:
                items.append((path, p.pid, sorted(gone)))
                on -= gone
                p.ops += sum(probe_ops(a) for a in gone)
        if items:
            try:
                self.session.detach_many(items)
            except Exception:
                log.exception("detaching demoted APIs of pid %d failed", p.pid)

    # -- the sliced tier -------------------------------------------------------------------
    def _attach_slice(self, win: WindowState) -> None:
        for pid, p in list(self.probed.items()):
            ok = False
            for lib in p.libs.values():
                apis = self._sliced_apis(p, lib)
                if not apis:
                    continue
                try:
                    got = set(self.session.attach(lib.path, pid, apis)) & set(apis)
                except Exception as e:
                    # Said once per library and process, not every slice.
                    (log.debug if lib.id in p.slice_failed else log.warning)(
                        "slice: cannot probe %s in pid %d: %s", lib.path, pid, e)
                    p.slice_failed.add(lib.id)
                    # attach() keeps the APIs that did attach before one failed: they must go
                    # with the slice, or they would fire ungoverned until the process exits.
                    self._slice_items.append((lib.path, pid, sorted(apis)))
                    continue
                p.slice_failed.discard(lib.id)
                ok = ok or bool(got)
                p.sliced |= got
                n = sum(probe_ops(a) for a in got)
                p.ops += n
                win.slice_probes[pid] = win.slice_probes.get(pid, 0) + n
                self._slice_items.append((lib.path, pid, sorted(got)))
            (win.slice_pids if ok else win.slice_failed).add(pid)

    def _detach_slice(self) -> float:
        items, self._slice_items = self._slice_items, []
        if not items:
            return 0.0
        for path, pid, apis in items:
            p = self.probed.get(pid)
            if p is not None:
                p.ops += sum(probe_ops(a) for a in apis)
        return float(self.session.detach_many(items))

    def _run_slice(self, win: WindowState, plan: SlicePlan, aligned_start_ns: int) -> None:
        """Attach the sliced tier at the plan's offset, for its length; detach all at once."""
        on_at = aligned_start_ns + int(plan.offset_s * 1e9)
        if time.time_ns() > on_at:
            win.slice_state = "late"                 # the agent (re)started after the slice
            return
        if not self._wait_until(on_at, win):
            win.slice_state = "stopped"
            return
        if not self.probed:
            win.slice_state = "empty"
            return
        touch_start_ns = time.monotonic_ns()
        t0 = time.monotonic()
        started_ns = time.time_ns()
        self._attach_slice(win)
        stopped = not self._wait_until(on_at + int(plan.length_s * 1e9), win)
        t1 = time.monotonic()
        took = self._detach_slice()
        win.touch_ns = (touch_start_ns, time.monotonic_ns())
        win.touched_s = time.monotonic() - t0
        # The probes go away together after about one grace period: half of it counts as
        # attached time (the firings themselves are counted exactly either way).
        win.attached_s = (t1 - t0) + took / 2
        win.slice_length_s = t1 - t0
        win.detach_s = took
        win.slice_state = "stopped" if stopped else "done"
        self.governor.detach_s = max(took, 0.0)
        log.info("slice in window %d at +%.3f s (planned +%.3f s) for %.3f s, cadence %d, "
                 "%d processes, detach took %.3f s", plan.index,
                 (started_ns - aligned_start_ns) / 1e9, plan.offset_s, t1 - t0, plan.cadence,
                 len(win.slice_pids), took)

    # -- discovery -------------------------------------------------------------------------
    def _scan(self, win: WindowState) -> None:
        try:
            delta = self.scanner.scan()
        except Exception:
            log.exception("process scan failed; trying again at the next interval")
            return
        if delta:
            self._apply(delta, win)
        self._group_loaders()
        for p in list(self.probed.values()):         # libraries mapped since the last scan
            proc = self.scanner.processes.get(p.pid)
            if proc is not None and set(proc.libraries) - set(p.libs):
                self._attach_always(p)

    def _should_probe(self, rec: ProcessRecord) -> bool:
        return bool(rec.attribution.job_source) or self.cfg.probe_unattributed

    def _rank_of_child(self, pid: int, ppid: int) -> int | None:
        """The rank process whose loader worker ``pid`` is, or None: a child of a probed rank
        with the same job and rank in its environment (a DataLoader worker inherits it; a rank
        that a launcher started has its own rank)."""
        if pid in self.worker_of:
            return self.worker_of[pid]
        parent = self.records.get(ppid)
        rank = None
        if ppid in self.probed and parent is not None:
            mine = attribute_pid(pid, self.cfg.node, self.cfg.job_env)
            if (mine.job_id, mine.rank) == (parent.attribution.job_id, parent.attribution.rank):
                rank = ppid
        self.worker_of[pid] = rank
        return rank

    def _group_loaders(self) -> None:
        """Tell the probes and the loader tracker each rank's loader workers and threads."""
        children = self.scanner.children
        for pid in list(self.probed):
            workers = {c for c in children.get(pid, ()) if self._rank_of_child(c, pid) == pid}
            self.loaders.set_workers(pid, workers)
            try:
                self.session.set_loaders(pid, workers)
                self.session.set_threads(pid, (int(t) for t in os.listdir(f"/proc/{pid}/task")))
            except OSError:
                pass                                 # the process exited since the scan
            except Exception:
                log.exception("telling the probes about pid %d's loader workers failed", pid)
        live = {c for kids in children.values() for c in kids}
        for pid in [p for p in self.worker_of if p not in live]:
            del self.worker_of[pid]

    def _apply(self, delta: DiscoveryDelta, win: WindowState) -> None:
        gpus = PidGpuMap(self.nvml.pid_map()) if self.nvml and self.nvml.available else None
        for proc in delta.exited:
            p = self.probed.pop(proc.pid, None)
            if p is not None:
                win.exited[proc.pid] = p
            log.info("pid %d (%s) exited", proc.pid, proc.comm)
        for proc in sorted(delta.started, key=lambda p: p.start_time):
            rank = self._rank_of_child(proc.pid, proc.ppid)
            if rank is not None:
                log.info("pid %d (%s) is a loader worker of pid %d: grouped under that rank, not "
                         "probed as one", proc.pid, proc.comm, rank)
                continue
            if proc.pid in win.exited:
                # The pid was reused within one scan: the old process's probes and counters
                # must go before the new one's attach (same (file, pid) keys).
                self._stop_probing({proc.pid: win.exited.pop(proc.pid)})
                self.step_finders.pop(proc.pid, None)
                self.step_cost.pop(proc.pid, None)
            rec = ProcessRecord(pid=proc.pid, attribution=attribute_pid(
                proc.pid, self.cfg.node, self.cfg.job_env, gpus))
            self.records[proc.pid] = rec
            a = rec.attribution
            probe = self._should_probe(rec)
            log.info("found pid %d (%s): job %s rank %d local rank %d gpu %d%s", proc.pid,
                     proc.comm, a.job_id, a.rank, a.local_rank, a.gpu_index,
                     "" if probe else " (no job: not probed; see probe_unattributed)")
            if probe:
                self._start_probing(proc.pid, time.time_ns())
        for lib in delta.libraries_removed:
            log.info("no process maps %s any more", lib.path)
        for lib in delta.libraries_added:
            log.info("found %s library %s", lib.kind, lib.path)

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
        """Take this window's slice if the plan says so; return at the window's end (or on
        stop). The slice belongs to the last aligned window this agent window covers."""
        window_ns = int(self.cfg.window * 1e9)
        index = window_index(win.end_ns - 1, window_ns)
        win.plan = self.governor.plan(index, self.cfg.window)
        if win.plan.sampled and not self.cupti_only:
            self._run_slice(win, win.plan, index * window_ns)
        self._wait_until(win.end_ns, win)

    def _reason(self, win: WindowState, pid: int, sliced_calls: int) -> tuple[bool, str]:
        """Whether this process's launch tier was sampled in the window, or why not."""
        plan = win.plan
        if plan is None:
            return False, "stopping"
        if not plan.sampled:
            return False, plan.reason
        if win.slice_state == "late":
            # The slice's moment had passed when the window began: the agent just started (its
            # processes are new to it), or the previous window's detach overran into this one.
            return False, "new_process" if win is self._first_window else "detaching"
        if win.slice_state == "empty":
            return False, "new_process"
        if win.slice_state == "stopped" and not win.slice_pids:
            return False, "stopping"
        if pid in win.slice_failed:
            return False, "attach_failed"
        if pid not in win.slice_pids:
            return False, "new_process"
        if sliced_calls == 0:
            return False, "no_calls"
        return True, ""

    def _finish_window(self, win: WindowState, stopping: bool) -> int:
        """Read the maps, build and hand over the window, pay the account; returns the
        window's actual end (ns), where the next window starts."""
        if self._slice_items:                        # (a stop cut the slice short)
            win.detach_s = self._detach_slice()
        read_ns = time.time_ns()
        end_ns = max(read_ns if stopping else max(read_ns, win.end_ns), win.start_ns)
        window_s = max((end_ns - win.start_ns) / 1e9, 1e-9)
        # Records of the probe-cost calibration (API hypertrace_null) are not the workload's.
        samples = {k: s for k, s in self.session.read_and_clear().items()
                   if k[1] in PROBED_API_NAMES}
        stats = self.session.read_process_stats()
        loader = self.loaders.sample()
        gpus = PidGpuMap(self.nvml.pid_map()) if self.nvml and self.nvml.available else None
        self._add_gpu_context(gpus)
        report = {**win.exited, **self.probed}
        hits: dict[int, dict[str, int]] = {}
        for (pid, api), s in samples.items():
            hits.setdefault(pid, {})[api] = probe_hits(s)
        probes: dict[int, ProcessProbe] = {}
        cost_by_pid: dict[int, float] = {}
        busiest_sliced = 0
        busiest_always = 0
        for pid, p in report.items():
            own = hits.get(pid, {})
            always = p.always_apis
            sliced_hits = sum(n for api, n in own.items() if api not in always)
            always_rates = {api: own.get(api, 0) / window_s for api in always}
            covered = (end_ns - max(win.start_ns, p.found_ns)) / 1e9
            st = stats.get(pid)
            sampled, reason = self._reason(win, pid, sliced_hits)
            fixed = Governor.fixed_cost_s(p.ops)
            probes[pid] = ProcessProbe(
                sampled=sampled, unsampled_reason=reason, tiers=p.tiers(),
                attached_s=win.attached_s if pid in win.slice_pids else 0.0,
                fixed_cost_s=fixed, covered_s=covered if covered < window_s else 0.0,
                sched=st.sched if st else None, loader=loader.get(pid),
                steps=self.step_finders.setdefault(pid, StepFinder()).feed(
                    st.boundaries.only(always) if st and st.boundaries else None))
            always_cpu = self.governor.cost_s(sum(n for a, n in own.items() if a in always)) / window_s
            probes[pid].step_fraction, probes[pid].step_basis = self._step_cost(
                win, pid, probes[pid].steps, window_s, always_cpu)
            cost_by_pid[pid] = self.governor.cost_s(sum(own.values()), p.ops)
            p.ops = 0
            if pid in win.slice_pids:
                busiest_sliced = max(busiest_sliced, sliced_hits)
            if pid in self.probed:
                keep, demote = self.governor.always_split(always_rates)
                if demote:
                    self._demote(p, demote, always_rates)
                busiest_always = max(busiest_always, sum(own.get(a, 0) for a in keep))
        records = {pid: self.records[pid] for pid in report if pid in self.records}
        seq = self.uplink.next_seq()
        window = build_window(
            self.cfg.agent_id, self.cfg.node, seq, win.start_ns, end_ns, samples, records,
            WindowOverhead(attached_seconds=win.attached_s, probe_cost_ns=self.probe_cost_ns,
                           budget=self.cfg.overhead_budget), probes)
        window.agent_version, window.agent_backend, window.probe_mode = self._identity()
        if self.hub is not None:
            # In-process windows of this window; a pid the uprobes cover is counted once (theirs).
            skip = set() if self.cupti_only else set(report)
            taken = self.hub.take(win.start_ns, end_ns, skip, wait=not stopping)
            if self.cupti_only:
                sent = {t.pid for t in taken if t.visible}
                for pw in window.processes:
                    if pw.pid not in sent:       # found, but measures nothing: say why
                        pw.overhead.unsampled_reason = "no_cupti_backend"
            self.hub.merge(window, taken, lambda pid: attribute_pid(
                pid, self.cfg.node, self.cfg.job_env, gpus))
        if self.uplink.submit(window):
            self.windows_sent += 1
        # The account: earn the wall time, pay what the most charged process paid.
        g = self.governor
        g.earn(window_s)
        g.spend(max(cost_by_pid.values(), default=0.0))
        if win.slice_state in ("done", "stopped") and win.slice_pids:
            # Rate over the slice proper: the firings during the detach are in the numerator,
            # so the estimate errs high (safe), never low.
            g.observe_slice(busiest_sliced, win.slice_length_s)
            # Each uprobe of the slice is attached and detached once in its process.
            g.fixed_slice_s = Governor.fixed_cost_s(2 * max(win.slice_probes.values(), default=0))
        g.observe_always(busiest_always, window_s)
        sampled = sum(1 for pp in probes.values() if pp.sampled)
        why = sorted({pp.unsampled_reason for pp in probes.values() if not pp.sampled})
        status = (f"window {seq}: {len(window.processes)} processes, "
                  f"{sum(sum(h.values()) for h in hits.values())} probe hits, "
                  f"{sampled} sampled" + (f" (others: {', '.join(why)})" if why else "")
                  + f", cadence {g.k}, credit {g.credit_s * 1e3:.1f} ms")
        log.info("%s", status)
        self.notifier.status(status)
        if self.cfg.metrics_textfile:
            self._write_metrics(window, probes, hits, cost_by_pid, window_s, win)
        self._forget_exited(win)
        return end_ns

    def _write_metrics(self, window: Any, probes: dict, hits: dict,
                       cost_by_pid: dict[int, float], window_s: float, win: WindowState) -> None:
        """The agent's own metrics file (daemon/metrics_file.py); a failure is logged, never
        fatal: the windows matter more than the file."""
        try:
            tiers: dict[str, str] = {}
            for p in self.probed.values():
                tiers.update(p.tiers())
            up = self.uplink
            spool = getattr(up, "spool", None)
            m = AgentMetrics(
                node=self.cfg.node, windows_sent=self.windows_sent,
                windows_acked=getattr(up, "acked", 0),
                windows_rejected=getattr(up, "rejected", 0),
                spool_windows=len(spool) if spool is not None else 0,
                spool_bytes=spool.bytes_used if spool is not None else 0,
                last_ack_s=getattr(up, "last_ack_s", 0.0), processes=len(window.processes),
                probe_hits=sum(sum(h.values()) for h in hits.values()),
                overhead_fraction=max(cost_by_pid.values(), default=0.0) / window_s,
                budget_fraction=self.cfg.overhead_budget, duty=win.attached_s / window_s,
                cadence=self.governor.k, tiers=tiers,
                backend="cupti" if self.cupti_only else "ebpf",
                inprocess_connected=len(self.hub.peers()) if self.hub else 0,
                inprocess_late_frames=self.hub.late_frames if self.hub else 0,
                inprocess_dropped_frames=self.hub.dropped_frames if self.hub else 0)
            write_metrics_file(self.cfg.metrics_textfile, m)
        except OSError as exc:
            log.warning("cannot write the metrics file %s: %s", self.cfg.metrics_textfile, exc)
        except Exception:                  # a bug here must not cost the window
            log.exception("the metrics file %s was not written", self.cfg.metrics_textfile)

    def _identity(self) -> tuple[str, str, str]:
        """(version, backend, probe mode) carried by every window, for `hypertrace nodes`."""
        if self._version is None:
            from importlib import metadata
            try:
                self._version = metadata.version("hypertrace")
            except metadata.PackageNotFoundError:
                self._version = ""
        if self.cupti_only:
            return self._version, "cupti", ""
        mode = getattr(self.session, "mechanism", "")
        return self._version, "ebpf", {"link": "uprobe_multi"}.get(mode, mode)

    def _step_cost(self, win: WindowState, pid: int, steps: StepInference, window_s: float,
                   always_cpu: float) -> tuple[float, str]:
        """(share of step time the probes cost the process, basis): measured from the steps
        the slice touched (collector/step_cost.py) once enough are in, else "cpu" and the
        CPU-time charge is all there is to say (Overhead.step_basis)."""
        meter = self.step_cost.setdefault(pid, StepCostMeter())
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

    def _forget_exited(self, win: WindowState) -> None:
        """Remove the probes and records of processes that exited during ``win``. Runs once per
        window even when finishing it failed (``run`` calls it then): a skipped cleanup would
        leave probes and kernel records that a reused pid would inherit."""
        exited, win.exited = win.exited, {}
        if exited:
            self._stop_probing(exited)
            for pid in exited:
                self.step_finders.pop(pid, None)
                self.step_cost.pop(pid, None)
                self.loaders.forget(pid)
        for pid in [p for p in self.records if p not in self.scanner.processes]:
            del self.records[pid]                    # unprobed processes that exited

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
        from hypertrace.collector.ebpf import ProbeUnavailable
        from hypertrace.daemon.uplink import SpoolError
        try:
            self._setup()
        except (SpoolError, TransportError, ProbeUnavailable) as e:
            # spool_dir, the TLS files and the node's eBPF prerequisites (capabilities, tracefs,
            # headers, bcc) are configuration: exit 2 so systemd does not restart into the same
            # error (the unit has RestartPreventExitStatus=2).
            log.error("agent cannot start: %s", e)
            self._teardown()
            return EXIT_CONFIG
        except Exception as e:
            log.error("agent cannot start: %s", e)
            self._teardown()
            return EXIT_FAILURE
        window_ns = int(self.cfg.window * 1e9)
        start = time.time_ns()
        first = self._first_window = WindowState(start_ns=start,
                                                  end_ns=window_end(start, window_ns))
        self._scan(first)                             # (logs each library it finds)
        self._next_scan = time.monotonic() + self.cfg.scan_interval
        self.notifier.ready(f"probing {len(self.probed)} processes")
        win = first
        while True:
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
                try:
                    self._forget_exited(win)
                except Exception:
                    log.exception("cleaning up exited processes failed")
            if stopping:
                break
            win = WindowState(start_ns=start, end_ns=window_end(start, window_ns))
        self.notifier.stopping("flushed the last window")
        self._teardown()
        fatal = getattr(self.uplink, "fatal", None)
        if fatal:            # a configuration error the uplink cannot retry away (logged there)
            log.error("agent stopped after %d windows: %s", self.windows_sent, fatal)
            return EXIT_CONFIG
        log.info("agent stopped after %d windows", self.windows_sent)
        return EXIT_OK


def run_agent(config: AgentConfig, install_signals: bool = True,
              on_ready: Callable[[Agent], None] | None = None) -> int:
    """Build an :class:`Agent` from a config and run it (what ``hypertrace agent`` calls)."""
    agent = Agent(config)
    if install_signals:
        agent.install_signals()
    if on_ready:
        on_ready(agent)
    return agent.run()
