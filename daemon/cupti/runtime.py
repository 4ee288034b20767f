"""The CUPTI backend's runtime inside a training process: the window loop and the link.

One daemon thread runs the governed window loop (daemon/window_loop.py) over this process's
CUPTI callbacks (collector/cupti/probes.py) and hands each window as a ``LocalFrame`` to the
node agent's socket (proto/local.py), or, with no agent but an analyzer configured, straight
to the analyzer through the agent's uplink (same spool, same TLS). The agent's config, sent
when the process connects, sets the window and the governor, so slices start at the same
aligned moment as every other process and node.

A stream capture in progress refuses the start: enabling callbacks while a CUDA graph is being
captured is not something to try in someone's training job.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from hypertrace.collector.cupti.native import Recorder, mapped_library
from hypertrace.collector.cupti.probes import DEFAULT_COST_NS, BackendState, CuptiProbes
from hypertrace.collector.governor import Governor
from hypertrace.daemon.window_loop import WindowDone, WindowLoop
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import local

log = logging.getLogger("hypertrace.cupti")

BACKEND = "cupti"
#: A lazy start looks for the CUDA driver in the process this often (seconds).
LAZY_POLL_S = 2.0


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
    def from_env(cls, env: dict[str, str] | None = None) -> CuptiOptions:
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


def _governor(window: float, budget: float, always_share: float, max_slice_s: float,
              slice_guard_s: float, min_samples: int, cost: float = DEFAULT_COST_NS) -> Governor:
    return Governor(probe_cost_ns=cost, budget=budget, always_share=always_share,
                    max_slice_s=max_slice_s, slice_guard_s=slice_guard_s,
                    min_samples=min_samples)


class InProcessBackend:
    """One per process (CUPTI allows one subscriber). Thread-safe public methods."""

    def __init__(self, options: CuptiOptions, recorder: Recorder | None = None,
                 pid: int | None = None):
        self.opts = options
        self.state = BackendState()
        self.probes = CuptiProbes(self.state, recorder, pid, options.retry_s, options.cupti_lib)
        self.pid = self.probes.pid
        self._stop = threading.Event()
        self.loop = WindowLoop(self.probes, self, _governor(
            options.window, options.overhead_budget, options.always_share, options.max_slice_s,
            options.slice_guard_s, options.min_samples), options.window, self._stop,
            slice_log_level=logging.DEBUG)
        self._lock = self.probes.lock
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._uplink: Any = None
        self._next_link = 0.0
        self._link_config: pb.LocalConfig | None = None
        self.probes.node = self._node()

    # -- public ---------------------------------------------------------------------------------
    def start(self, lazy: bool = False) -> None:
        """Load the recorder and start the window thread. ``lazy``: wait, in the thread, until
        this process has loaded the CUDA driver before loading anything (the wrapper starts the
        backend in every Python process of a job: a launcher or a data-loader worker that never
        uses CUDA must not be probed, nor pose as its rank)."""
        refuse_during_capture()
        if not lazy:
            self.probes.open()
        self._thread = threading.Thread(target=self._run, args=(lazy,), name="hypertrace-cupti",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.probes.unsubscribe()
        self.state.mode = "stopped"
        self._close_link()
        if self._uplink is not None:
            self._uplink.close(drain_timeout=2.0)

    def pause(self) -> None:
        """Unsubscribe from CUPTI now (another tool may subscribe) until :meth:`resume`."""
        self.probes.pause()
        log.info("hypertrace CUPTI backend paused (unsubscribed); resume() to continue")

    def resume(self) -> None:
        self.probes.resume()
        log.info("hypertrace CUPTI backend resumed")

    def mark(self) -> None:
        """hypertrace.step() was called: a step boundary (collector/marker.py calls this)."""
        self.probes.mark()

    # -- the thread -----------------------------------------------------------------------------
    def _run(self, lazy: bool = False) -> None:
        if lazy and not self._await_cuda():
            return
        if not self._stop.is_set():
            self.loop.run(time.time_ns())

    def _await_cuda(self) -> bool:
        """Lazy start: poll until the CUDA driver is mapped; False when stopped first."""
        self.state.mode = "waiting_for_cuda"
        while not self._stop.is_set():
            if mapped_library("/libcuda.so"):
                try:
                    self.probes.open()
                except Exception as exc:        # never take the training process down
                    self.state.last_error = str(exc)
                    self.state.mode = "stopped"
                    log.warning("hypertrace CUPTI backend not started: %s", exc)
                    return False
                return True
            self._stop.wait(LAZY_POLL_S)
        return False

    # -- the window loop's sink -----------------------------------------------------------------
    def before_window(self) -> None:
        try:
            self._ensure_link()            # first: the agent's config sets the window
        except Exception as exc:           # never take the training process down
            log.exception("hypertrace: reaching the agent failed: %s", exc)

    def next_id(self) -> tuple[str, str, int]:
        return self._agent_id(), self._node(), 0

    def wants_window(self) -> bool:
        # Nobody to send to, or the agent's uprobes measure this process: no window is built
        # (the thread's CPU is the training process's).
        return (self._sock is not None or self._uplink is not None) and \
            self.state.mode != "standby"

    def deliver(self, window: pb.NodeWindow, done: WindowDone, stopping: bool) -> None:
        pw = window.processes[0]
        pw.backend = BACKEND
        pw.overhead.blocked_by = self.state.blocked_by
        self._send(window, pw, done)
        if not self.state.cost_measured and self.state.subscribed and done.hits:
            cost = self.probes.calibrate()    # after the send: the window is not held up by it
            if cost is not None:
                self.loop.governor.probe_cost_ns = cost

    def _send(self, node_window: pb.NodeWindow, pw: pb.ProcessWindow, done: WindowDone) -> None:
        sock = self._sock
        if sock is not None:
            try:
                local.send(sock, pb.LocalMessage(frame=pb.LocalFrame(
                    start_ns=done.start_ns, end_ns=done.end_ns, window=pw)))
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
        self.probes.node = self._node()
        self.state.mode = c.mode if c.mode in ("active", "standby") else "active"
        loop = self.loop
        if c.window_s > 0 and (c.window_s != loop.window_s or
                               c.overhead_budget != loop.governor.budget):
            loop.governor = _governor(c.window_s, c.overhead_budget, c.always_share,
                                      c.max_slice_s, c.slice_guard_s, c.min_samples,
                                      self.state.probe_cost_ns)
            loop.window_s = c.window_s
        if self.state.mode == "standby":
            self.probes.unsubscribe()

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
        self.probes.unsubscribe()
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
        from hypertrace.daemon.uplink import Spool, Uplink
        from hypertrace.proto.cbuild import cache_dir
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
        raise RuntimeError("hypertrace.daemon.cupti.start() was called during a CUDA graph "
                           "capture; start it before capturing (at the top of the training "
                           "script), graphs captured earlier are counted at every launch")
