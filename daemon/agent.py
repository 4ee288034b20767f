"""The node agent's lifecycle: config -> prerequisites -> probes -> window loop -> clean exit.

The agent sets up the uplink, NVML and the probes (the eBPF backend,
collector/uprobe_backend.py, or none where only in-process CUPTI backends report), measures what
a probe costs, and runs the governed window loop (daemon/window_loop.py) with itself as the
sink: it merges the in-process backends' frames into each window (daemon/inprocess.py), hands
it to the uplink, and writes its status and metrics. Discovery scans run while the loop waits.

SIGTERM/SIGINT end the current window early, flush it to the uplink (which spools it), detach
everything and exit 0; a configuration error at start exits 2 (systemd does not restart into
it).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Callable

from hypertrace.collector.attribution import attribute_pid
from hypertrace.collector.governor import Governor
from hypertrace.collector.memory import resident_kb, trim_heap
from hypertrace.collector.nvml import Nvml
from hypertrace.collector.uprobe_backend import UprobeBackend
from hypertrace.daemon.config import AgentConfig
from hypertrace.daemon.inprocess import InProcessHub, NoProbes
from hypertrace.daemon.systemd import SdNotifier, watchdog_interval
from hypertrace.daemon.window_loop import WindowDone, WindowLoop
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.transport import TransportError, channel_credentials, tls_files

log = logging.getLogger(__name__)

#: On shutdown, how long the uplink may try to deliver what is spooled (the rest stays spooled).
SHUTDOWN_DRAIN_S = 5.0

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2


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
        self.backend: UprobeBackend | None = None
        self.windows_sent = 0
        # the agent's own CPU (all threads), read at each window: what it costs its node
        self._cpu_mark = (time.monotonic(), time.process_time())
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
        self.backend = UprobeBackend(
            self.session, node=self.cfg.node, job_env=self.cfg.job_env,
            probe_unattributed=self.cfg.probe_unattributed, nvml=self.nvml,
            probing=not self.cupti_only)
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
                        "backend: start training with `python -m hypertrace.daemon.cupti -- "
                        "CMD` (or call hypertrace.daemon.cupti.start() in the script); it "
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
        if self.backend is not None:
            self.backend.clear()

    # -- the window loop's sink ------------------------------------------------------------
    def before_window(self) -> None:
        pass

    def next_id(self) -> tuple[str, str, int]:
        return self.cfg.agent_id, self.cfg.node, self.uplink.next_seq()

    def wants_window(self) -> bool:
        return True

    def deliver(self, window: pb.NodeWindow, done: WindowDone, stopping: bool) -> None:
        """Merge the in-process backends' frames, hand the window to the uplink, say how the
        window went (log, systemd status, metrics file), and give the heap the window freed
        back to the system."""
        window.agent_version, window.agent_backend, window.probe_mode = self._identity()
        if self.nvml is not None and self.nvml.available:
            window.node_gpus = self.nvml.device_count       # what bounds the node's GPUs
        if self.hub is not None:
            # In-process windows of this window; a pid the uprobes cover is counted once (theirs).
            skip = set() if self.cupti_only else set(done.probes)
            taken = self.hub.take(done.start_ns, done.end_ns, skip, wait=not stopping)
            if self.cupti_only:
                sent = {t.pid for t in taken if t.visible}
                for pw in window.processes:
                    if pw.pid not in sent:       # found, but measures nothing: say why
                        pw.overhead.unsampled_reason = "no_cupti_backend"
            gpus = self.backend.gpus
            self.hub.merge(window, taken, lambda pid: attribute_pid(
                pid, self.cfg.node, self.cfg.job_env, gpus))
        if self.uplink.submit(window):
            self.windows_sent += 1
        g = self.governor
        sampled = sum(1 for pp in done.probes.values() if pp.sampled)
        why = sorted({pp.unsampled_reason for pp in done.probes.values() if not pp.sampled})
        status = (f"window {window.seq}: {len(window.processes)} processes, "
                  f"{done.hits} probe hits, {sampled} sampled"
                  + (f" (others: {', '.join(why)})" if why else "")
                  + f", cadence {g.k}, credit {g.credit_s * 1e3:.1f} ms, "
                  f"agent CPU {self._cpu_share():.1%} of a core, "
                  f"resident {resident_kb() / 1024:.0f} MB")
        log.info("%s", status)
        self.notifier.status(status)
        if self.cfg.metrics_textfile:
            self._write_metrics(window, done)
        trim_heap()

    def _tick(self) -> float:
        """While the loop waits: scan for processes and ping the watchdog when due; the
        seconds until the next is due."""
        mono = time.monotonic()
        if mono >= self._next_scan:
            self.backend.scan()
            self._next_scan = mono + self.cfg.scan_interval
        if self._ping_every and mono >= self._next_ping:
            self.notifier.watchdog()
            self._next_ping = mono + self._ping_every
        due = [self._next_scan]
        if self._ping_every:
            due.append(self._next_ping)
        return min(due) - time.monotonic()

    def _cpu_share(self) -> float:
        """The agent's CPU time (all its threads) since the previous window, per wall second."""
        wall, cpu = time.monotonic(), time.process_time()
        (wall0, cpu0), self._cpu_mark = self._cpu_mark, (wall, cpu)
        return (cpu - cpu0) / (wall - wall0) if wall > wall0 else 0.0

    def _write_metrics(self, window: pb.NodeWindow, done: WindowDone) -> None:
        """The agent's own metrics file (daemon/metrics_file.py); a failure is logged, never
        fatal: the windows matter more than the file. Imported here: prometheus_client costs
        12 MB of resident memory, which an agent without the file should not carry."""
        from hypertrace.daemon.metrics_file import AgentMetrics
        from hypertrace.daemon.metrics_file import write as write_metrics_file
        try:
            tiers: dict[str, str] = {}
            for p in self.backend.probed.values():
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
                probe_hits=done.hits, overhead_fraction=done.cost_s / done.window_s,
                budget_fraction=self.cfg.overhead_budget, duty=done.attached_s / done.window_s,
                cadence=self.governor.k, tiers=tiers,
                backend="cupti" if self.cupti_only else "ebpf",
                inprocess_connected=len(self.hub.peers()) if self.hub else 0,
                inprocess_late_frames=self.hub.late_frames if self.hub else 0,
                inprocess_dropped_frames=self.hub.dropped_frames if self.hub else 0,
                resident_bytes=resident_kb() * 1024, cpu_seconds=time.process_time())
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
        start = time.time_ns()
        self.backend.scan()                           # (logs each library it finds)
        self._next_scan = time.monotonic() + self.cfg.scan_interval
        self.notifier.ready(f"probing {len(self.backend.probed)} processes")
        WindowLoop(self.backend, self, self.governor, self.cfg.window, self._stop,
                   tick=self._tick).run(start)
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
