"""The in-process backend's life: subscribe, govern the callbacks, hand a window over each window.

It runs in one daemon thread inside the training process and does, per aligned window, what the
node agent does for eBPF (daemon/agent.py):

* the **always** tier (synchronize and graph-launch callbacks) stays enabled; it gives the step
  boundaries (collector/steps.py infers the steps from it, as for eBPF);
* the **sliced** tier (the launch callbacks) is enabled for one coordinated slice in the windows
  the governor picks (collector/governor.py): the same offset on every process and node, the
  same account in seconds of probe time, paid from what the callbacks cost;
* at the window's end the recorder is read, the window is built with the agent's own code
  (daemon/windows.build_window) and sent as a ``LocalFrame`` to the node agent's socket
  (proto/local.py), or, with no agent but an analyzer configured, straight to the analyzer
  through the agent's uplink (same spool, same TLS).

**The cost.** What one callback pair costs is measured in process: ``cudaGetDevice`` (cheap, no
side effect) is timed with its callbacks off and on, and the difference is the price of a call
(CUPTI's dispatch plus the recorder). Until that runs (the first window in which the process
made CUDA calls) a conservative :data:`DEFAULT_COST_NS` is charged.

**Coexistence.** CUPTI has one subscriber per process. When another tool holds it (a profiler,
Nsight), :meth:`InProcessBackend.start` does not fail: the windows say ``cupti_busy`` and name
the holder, the log says it once, and subscribing is retried every ``retry_s``. :meth:`pause`
unsubscribes at once, so a user can start a profiler; :meth:`resume` subscribes again. A stream
capture in progress refuses the start: enabling callbacks while a CUDA graph is being captured
is not something to try in someone's training job.
"""
from __future__ import annotations

import ctypes
import logging
import os
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hypertrace.collector.attribution import DEFAULT_JOB_ENV, attribute
from hypertrace.collector.cupti.native import CuptiUnavailable, Recorder, mapped_library
from hypertrace.collector.cupti.threads import ThreadSched
from hypertrace.collector.governor import Governor
from hypertrace.collector.schedule import window_end, window_index
from hypertrace.collector.steps import MARKER_API, StepFinder
from hypertrace.daemon.windows import (TIER_ALWAYS, TIER_SLICED, ProcessProbe, ProcessRecord,
                                       WindowOverhead, build_window, probe_hits)
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import local
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
BACKEND = "cupti"
#: A lazy start looks for the CUDA driver in the process this often (seconds).
LAZY_POLL_S = 2.0
#: Said when the holder did not name itself. PyTorch's profiler (kineto) is one, and it keeps
#: CUPTI for the rest of the process once a profile ran (measured on an H200, torch 2.11).
UNNAMED_HINT = (" (a client that does not name itself; torch.profiler is one, and once it has "
                "profiled it keeps CUPTI until its process exits)")


def cupti_apis() -> list[tuple[str, str]]:
    """(name, kind) of the probed APIs that CUPTI can report: all but the step marker."""
    return [(a.name, a.kind) for a in PROBED_APIS if a.kind in ("launch", "sync", "graph")]


@dataclass
class CuptiOptions:
    """Settings of the in-process backend; :meth:`from_env` reads ``HYPERTRACE_CUPTI_*``.

    The governor's settings come from the agent when one is connected (its config rules the
    node); these are used in direct mode and until the agent answers."""
    socket: str = local.DEFAULT_SOCKET
    analyzer: str = ""              # direct mode: HOST:PORT, used when no agent answers
    insecure: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    spool_dir: str = ""             # direct mode; default: the per-user cache
    node: str = ""
    window: float = 10.0
    overhead_budget: float = 0.005
    always_share: float = 0.2
    max_slice_s: float = 2.0
    slice_guard_s: float = 1.0
    min_samples: int = 1000
    retry_s: float = 30.0           # reconnect to the agent / re-subscribe to CUPTI
    cupti_lib: str = ""             # libcupti path ("" = find it)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "CuptiOptions":
        env = dict(os.environ if env is None else env)
        o = cls()
        o.socket = env.get("HYPERTRACE_CUPTI_SOCKET", o.socket)
        o.analyzer = env.get("HYPERTRACE_ANALYZER", "")
        o.insecure = env.get("HYPERTRACE_INSECURE", "") in ("1", "true", "yes")
        o.tls_ca = env.get("HYPERTRACE_TLS_CA", "")
        o.tls_cert = env.get("HYPERTRACE_TLS_CERT", "")
        o.tls_key = env.get("HYPERTRACE_TLS_KEY", "")
        o.spool_dir = env.get("HYPERTRACE_SPOOL_DIR", "")
        o.node = env.get("HYPERTRACE_NODE", "")
        o.cupti_lib = env.get("HYPERTRACE_CUPTI_LIB", "")
        for key, attr in (("HYPERTRACE_WINDOW", "window"),
                          ("HYPERTRACE_OVERHEAD_BUDGET", "overhead_budget"),
                          ("HYPERTRACE_CUPTI_RETRY_S", "retry_s")):
            if env.get(key):
                try:
                    setattr(o, attr, float(env[key]))
                except ValueError:
                    raise ValueError(f"{key}={env[key]!r} is not a number") from None
        return o


@dataclass
class _Window:
    start_ns: int
    end_ns: int
    sampled: bool = False
    reason: str = ""
    attached_s: float = 0.0
    ops: int = 0                    # enable/disable operations (fixed costs)


@dataclass
class BackendState:
    """What :func:`hypertrace.collector.cupti.state` reports."""
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


class InProcessBackend:
    """One per process (CUPTI allows one subscriber). Thread-safe public methods."""

    def __init__(self, options: CuptiOptions, recorder: Recorder | None = None,
                 pid: int | None = None):
        self.opts = options
        self.pid = pid or os.getpid()
        self.recorder = recorder
        self.state = BackendState()
        self.governor = self._governor(options.window, options.overhead_budget,
                                       options.always_share, options.max_slice_s,
                                       options.slice_guard_s, options.min_samples)
        self.window_s = options.window
        self._lock = threading.RLock()     # recorder subscribe/enable/pause
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._uplink: Any = None
        self._next_link = 0.0
        self._next_subscribe = 0.0
        self._said_busy = ""
        self._always: list[str] = []
        self._sliced: list[str] = []
        self._steps = StepFinder()
        self._calibrated_slot = False
        self._link_config: pb.LocalConfig | None = None
        self._sched = ThreadSched()
        self._sched_read_ns = 0.0

    @staticmethod
    def _governor(window: float, budget: float, always_share: float, max_slice_s: float,
                  slice_guard_s: float, min_samples: int, cost: float = DEFAULT_COST_NS) -> Governor:
        return Governor(probe_cost_ns=cost, budget=budget, always_share=always_share,
                        max_slice_s=max_slice_s, slice_guard_s=slice_guard_s,
                        min_samples=min_samples)

    # -- public ---------------------------------------------------------------------------------
    def start(self, lazy: bool = False) -> None:
        """Load the recorder and start the window thread. ``lazy``: wait, in the thread, until
        this process has loaded the CUDA driver before loading anything (the wrapper starts the
        backend in every Python process of a job: a launcher or a data-loader worker that never
        uses CUDA must not be probed, nor pose as its rank)."""
        refuse_during_capture()
        if not lazy:
            self._open_recorder()
        self._thread = threading.Thread(target=self._run, args=(lazy,), name="hypertrace-cupti",
                                        daemon=True)
        self._thread.start()

    def _open_recorder(self) -> None:
        if self.recorder is None:
            self.recorder = Recorder()
        if not self.recorder.loaded:
            self.recorder.open(self.opts.cupti_lib or None)
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

    def _await_cuda(self) -> bool:
        """Lazy start: poll until the CUDA driver is mapped; False when stopped first."""
        self.state.mode = "waiting_for_cuda"
        while not self._stop.is_set():
            if mapped_library("/libcuda.so"):
                try:
                    self._open_recorder()
                except Exception as exc:        # never take the training process down
                    self.state.last_error = str(exc)
                    self.state.mode = "stopped"
                    log.warning("hypertrace CUPTI backend not started: %s", exc)
                    return False
                return True
            self._stop.wait(LAZY_POLL_S)
        return False

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            if self.recorder is not None and self.recorder.loaded:
                self.recorder.unsubscribe()
        self.state.subscribed = False
        self.state.mode = "stopped"
        self._close_link()
        if self._uplink is not None:
            self._uplink.close(drain_timeout=2.0)

    def pause(self) -> None:
        """Unsubscribe from CUPTI now (another tool may subscribe) until :meth:`resume`."""
        with self._lock:
            self.state.paused = True
            if self.recorder is not None and self.recorder.subscribed():
                self.recorder.unsubscribe()
            self.state.subscribed = False
        log.info("hypertrace CUPTI backend paused (unsubscribed); resume() to continue")

    def mark(self) -> None:
        """hypertrace.step() was called: a step boundary (collector/marker.py calls this)."""
        if self.state.subscribed and MARKER_API in self.recorder.slots:
            self.recorder.mark(MARKER_API)

    def resume(self) -> None:
        with self._lock:
            self.state.paused = False
            self._next_subscribe = 0.0
        self._wake.set()
        log.info("hypertrace CUPTI backend resumed")

    # -- the link: the agent, or the analyzer directly --------------------------------------------
    def _ensure_link(self) -> None:
        if self._sock is not None or self._uplink is not None:
            return
        now = time.monotonic()
        if now < self._next_link:
            return
        self._next_link = now + self.opts.retry_s
        try:
            sock = local.connect(self.opts.socket)
        except OSError as exc:
            if self.opts.analyzer:
                self._start_direct()
            else:
                if self.state.mode != "no_agent":
                    log.warning("hypertrace: no agent at %s (%s); nothing is sent until one "
                                "listens there (or set HYPERTRACE_ANALYZER to send directly)",
                                self.opts.socket, exc.strerror or exc)
                self.state.mode = "no_agent"
            return
        try:
            cred = local.peer_cred(sock)
            if not local.trusted_agent(cred):
                raise local.LocalProtocolError(
                    f"the socket {self.opts.socket} is served by uid {cred.uid}, neither root nor "
                    "this process's user: not an agent of this node; refusing it")
            local.send(sock, pb.LocalMessage(hello=pb.LocalHello(version=local.LOCAL_VERSION,
                                                                  pid=self.pid)))
            reply = local.recv(sock)
            if reply is None or reply.WhichOneof("body") != "config":
                raise local.LocalProtocolError("the agent did not answer with its config")
            with self._lock:
                self._apply_config(reply.config)
                sock.settimeout(None)
                self._sock = sock
        except (OSError, ValueError) as exc:      # LocalProtocolError, or a config out of range
            sock.close()
            self.state.last_error = str(exc)
            log.warning("hypertrace: agent handshake on %s failed: %s", self.opts.socket, exc)
            return
        threading.Thread(target=self._read_controls, args=(sock,), name="hypertrace-cupti-ctl",
                         daemon=True).start()
        log.info("hypertrace CUPTI backend: agent %s on %s, mode %s", reply.config.agent_id,
                 self.opts.socket, reply.config.mode)

    def _apply_config(self, c: pb.LocalConfig) -> None:
        self._link_config = c
        self.state.mode = c.mode if c.mode in ("active", "standby") else "active"
        if c.window_s > 0 and (c.window_s != self.window_s or
                               c.overhead_budget != self.governor.budget):
            self.window_s = c.window_s
            self.governor = self._governor(c.window_s, c.overhead_budget, c.always_share,
                                           c.max_slice_s, c.slice_guard_s, c.min_samples,
                                           self.state.probe_cost_ns)
        if self.state.mode == "standby":
            with self._lock:
                if self.recorder.subscribed():
                    self.recorder.unsubscribe()
                self.state.subscribed = False

    def _read_controls(self, sock: socket.socket) -> None:
        """Pause/resume from the agent; EOF drops the link (reconnect later)."""
        while not self._stop.is_set():
            try:
                msg = local.recv(sock)
            except (OSError, local.LocalProtocolError) as exc:
                log.debug("agent link: %s", exc)
                msg = None
            if msg is None:
                break
            body = msg.WhichOneof("body")
            if body == "control":
                (self.pause if msg.control.pause else self.resume)()
            elif body == "config":
                self._apply_config(msg.config)
        with self._lock:
            if self._sock is not sock:
                return                          # already replaced (or dropped by a failed send)
            self._link_lost()
        log.warning("hypertrace: the agent closed the link; unsubscribed, reconnecting")

    def _link_lost(self) -> None:
        """Nobody receives the windows now: stop paying for callbacks until an agent is back
        (caller holds the lock)."""
        self._close_link()
        self.state.mode = "no_agent"
        if self.recorder is not None and self.recorder.subscribed():
            self.recorder.unsubscribe()
        self.state.subscribed = False
        self._next_link = time.monotonic() + min(self.opts.retry_s, 5.0)

    def _close_link(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _start_direct(self) -> None:
        """No agent: stream this process's windows to the analyzer with the agent's uplink."""
        from hypertrace.collector.cbuild import cache_dir
        from hypertrace.daemon.uplink import Spool, Uplink
        from hypertrace.proto.transport import channel_credentials, tls_files
        files = tls_files(self.opts.tls_ca, self.opts.tls_cert, self.opts.tls_key)
        if files is None and not self.opts.insecure:
            self.state.last_error = ("direct mode needs HYPERTRACE_TLS_CA/CERT/KEY, or "
                                     "HYPERTRACE_INSECURE=1 for an analyzer without TLS")
            log.error("hypertrace: %s", self.state.last_error)
            self.state.mode = "no_agent"
            return
        spool = Spool(self.opts.spool_dir or cache_dir() / f"cupti-spool-{self.pid}",
                      64 * 1024 * 1024)
        self._uplink = Uplink(spool, self.opts.analyzer, credentials=(
            channel_credentials(files) if files is not None else None)).start()
        self.state.mode = "direct"
        log.info("hypertrace CUPTI backend: no agent at %s; sending to %s directly",
                 self.opts.socket, self.opts.analyzer)

    # -- CUPTI --------------------------------------------------------------------------------
    def _active(self) -> bool:
        return self.state.mode in ("active", "direct") and not self.state.paused

    def _ensure_subscribed(self) -> None:
        with self._lock:
            if not self._active() or self.recorder.subscribed():
                return
            now = time.monotonic()
            if now < self._next_subscribe:
                return
            self._next_subscribe = now + self.opts.retry_s
            try:
                holder = self.recorder.subscribe(SUBSCRIBER_NAME)
            except RuntimeError as exc:
                self.state.last_error = str(exc)
                log.error("hypertrace: CUPTI subscribe failed: %s; retrying in %.0f s", exc,
                          self.opts.retry_s)
                return
            if holder is not None:
                if holder != self._said_busy:
                    log.warning("hypertrace: CUPTI is held by %s%s; backing off (no probes, "
                                "windows say cupti_busy), retrying every %.0f s", holder,
                                UNNAMED_HINT if "not provided" in holder else "",
                                self.opts.retry_s)
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
                          exc, self.opts.retry_s)
                return
            self.state.subscribed = True
            log.info("hypertrace: subscribed to CUPTI; always tier: %s", ", ".join(self._always))

    def _calibrate(self) -> None:
        """Price one callback pair in this process (module docstring)."""
        lib = mapped_library("/libcudart.so")
        if lib is None:
            return
        try:
            cudart = ctypes.CDLL(lib)
            get_device = cudart.cudaGetDevice
            get_device.argtypes = [ctypes.POINTER(ctypes.c_int)]
        except (OSError, AttributeError) as exc:
            log.debug("calibration: cannot use %s: %s", lib, exc)
            return
        with self._lock:
            if not self.recorder.subscribed():
                return
            if not self._calibrated_slot:
                self._calibrated_slot = self.recorder.add_api(CALIBRATION_API, "launch")
                if not self._calibrated_slot:
                    return
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
        self.governor.probe_cost_ns = cost
        log.info("hypertrace: one CUPTI callback pair costs %.0f ns here (cudaGetDevice %.0f ns "
                 "off, %.0f ns on)", cost, statistics.median(off), statistics.median(on))

    # -- the window loop ------------------------------------------------------------------------
    def _wait_until(self, deadline_ns: int) -> bool:
        while not self._stop.is_set():
            left = (deadline_ns - time.time_ns()) / 1e9
            if left <= 0:
                return True
            self._wake.wait(min(left, 1.0))
            self._wake.clear()
        return False

    def _run(self, lazy: bool = False) -> None:
        if lazy and not self._await_cuda():
            return
        start = time.time_ns()
        while not self._stop.is_set():
            try:
                self._ensure_link()            # first: the agent's config sets the window
            except Exception as exc:           # never take the training process down
                log.exception("hypertrace: reaching the agent failed: %s", exc)
            window_ns = int(self.window_s * 1e9)
            win = _Window(start, window_end(start, window_ns))
            try:
                self._ensure_subscribed()
                self._run_slice(win, window_ns)
            except Exception as exc:
                log.exception("hypertrace: window failed: %s", exc)
            self._wait_until(win.end_ns)
            end = max(time.time_ns(), win.end_ns) if not self._stop.is_set() else time.time_ns()
            win.end_ns = max(end, win.start_ns + 1)
            try:
                self._finish(win)
            except Exception as exc:
                log.exception("hypertrace: could not finish a window: %s", exc)
            start = win.end_ns

    def _run_slice(self, win: _Window, window_ns: int) -> None:
        if not self._active():
            win.reason = "paused" if self.state.paused else "standby"
            return
        if not self.recorder.subscribed():
            win.reason = "cupti_busy" if self.state.blocked_by else "attach_failed"
            return
        index = window_index(win.end_ns - 1, window_ns)
        plan = self.governor.plan(index, self.window_s)
        if not plan.sampled:
            win.reason = plan.reason
            return
        on_at = index * window_ns + int(plan.offset_s * 1e9)
        if time.time_ns() > on_at:
            win.reason = "new_process"
            return
        if not self._wait_until(on_at):
            win.reason = "stopping"
            return
        t0 = time.monotonic()
        with self._lock:
            if not self.recorder.subscribed():
                win.reason = "paused" if self.state.paused else "cupti_busy"
                return
            self.recorder.enable(self._sliced, True)
        win.ops += len(self._sliced)
        self._wait_until(on_at + int(plan.length_s * 1e9))
        with self._lock:
            if self.recorder.subscribed():
                self.recorder.enable(self._sliced, False)
        win.ops += len(self._sliced)
        win.attached_s = time.monotonic() - t0
        win.sampled = True

    def _finish(self, win: _Window) -> None:
        snap = self.recorder.read(self.pid)
        window_s = max((win.end_ns - win.start_ns) / 1e9, 1e-9)
        if (self._sock is None and self._uplink is None) or self.state.mode == "standby":
            # Nobody to send to, or the agent's uprobes measure this process: no window is built
            # (the thread's CPU is the training process's). The scheduler baseline still moves
            # on, so that a later window covers only itself.
            self._sched.sample(self.recorder.threads(), snap.offcpu_ns, window_s)
            return
        samples = {(self.pid, api): s for api, s in snap.samples.items()
                   if api in self.recorder.kinds and api not in (CALIBRATION_API, MARKER_API)}
        always_hits = sum(probe_hits(s) for (_, api), s in samples.items() if api in self._always)
        sliced_hits = sum(probe_hits(s) for (_, api), s in samples.items()
                          if api not in self._always)
        g = self.governor
        fixed = Governor.fixed_cost_s(win.ops) + snap.sched_reads * self._sched_read_ns * 1e-9
        sched = self._sched.sample(self.recorder.threads(), snap.offcpu_ns, window_s)
        if win.sampled and sliced_hits == 0:
            win.sampled, win.reason = False, "no_calls"
        steps = self._steps.feed(snap.boundaries.only({*self._always, MARKER_API}))
        tiers = {api: TIER_ALWAYS for api in self._always}
        tiers.update({api: TIER_SLICED for api in self._sliced})
        probe = ProcessProbe(sampled=win.sampled, unsampled_reason=win.reason, tiers=tiers,
                             attached_s=win.attached_s, fixed_cost_s=fixed, steps=steps,
                             sched=sched if self.state.subscribed else None)
        rec = ProcessRecord(pid=self.pid, attribution=attribute(
            self.pid, dict(os.environ), self._node(), DEFAULT_JOB_ENV))
        node_window = build_window(
            self._agent_id(), self._node(), 0, win.start_ns, win.end_ns, samples,
            {self.pid: rec}, WindowOverhead(win.attached_s, self.state.probe_cost_ns,
                                            g.budget), {self.pid: probe})
        pw = node_window.processes[0]
        pw.backend = BACKEND
        pw.overhead.blocked_by = self.state.blocked_by
        # The account, as the agent keeps it for eBPF (collector/governor.py).
        if self.state.subscribed:
            # Credit is earned only while probing: a process paused, backed off or without an
            # agent for a while must not save up a burst of slices for later.
            g.earn(window_s)
        g.spend(g.cost_s(always_hits + sliced_hits) + fixed)
        if win.sampled:
            g.observe_slice(sliced_hits, win.attached_s)
        g.observe_always(always_hits, window_s)
        self._demote({api: probe_hits(s) / window_s for (_, api), s in samples.items()
                      if api in self._always}, g)
        self._send(node_window, pw, win)
        if not self.state.cost_measured and self.state.subscribed and always_hits + sliced_hits:
            self._calibrate()           # after the send: the window is not held up by it

    def _demote(self, rates: dict[str, float], g: Governor) -> None:
        """An always-tier API that would cost more than its share of the budget moves to the
        sliced tier, as the agent does for uprobes (Governor.always_split)."""
        _, demote = g.always_split({api: rates.get(api, 0.0) for api in self._always})
        if not demote:
            return
        with self._lock:
            if self.recorder.subscribed():
                self.recorder.enable(demote, False)
            self._always = [a for a in self._always if a not in demote]
            self._sliced += demote
        log.info("hypertrace: %s fire%s too often for the always tier; sliced from now on",
                 ", ".join(demote), "s" if len(demote) == 1 else "")

    def _send(self, node_window: pb.NodeWindow, pw: pb.ProcessWindow, win: _Window) -> None:
        sock = self._sock
        if sock is not None:
            try:
                local.send(sock, pb.LocalMessage(frame=pb.LocalFrame(
                    start_ns=win.start_ns, end_ns=win.end_ns, window=pw)))
                self.state.windows_sent += 1
            except OSError as exc:
                log.warning("hypertrace: sending to the agent failed: %s; reconnecting", exc)
                with self._lock:
                    if self._sock is sock:
                        self._link_lost()
            return
        if self._uplink is not None:
            node_window.seq = self._uplink.next_seq()
            if self._uplink.submit(node_window):
                self.state.windows_sent += 1

    def _node(self) -> str:
        c = self._link_config
        return (c.node if c is not None and c.node else "") or self.opts.node or socket.gethostname()

    def _agent_id(self) -> str:
        return f"{self._node()}/cupti-{self.pid}"


def refuse_during_capture() -> None:
    """Refuse to start while a CUDA graph capture is in progress in this process (PyTorch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        capturing = bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return
    if capturing:
        raise RuntimeError("hypertrace.collector.cupti.start() was called during a CUDA graph "
                           "capture; start it before capturing (at the top of the training "
                           "script), graphs captured earlier are counted at every launch")


__all__ = ["BackendState", "CuptiOptions", "CuptiUnavailable", "InProcessBackend"]
