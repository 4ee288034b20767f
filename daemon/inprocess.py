"""The agent's end of the node-local socket: windows from in-process (CUPTI) backends.

Training processes that run the CUPTI backend (collector/cupti) connect to ``cupti_socket`` and
send one ``LocalFrame`` per window (proto/local.py). The agent merges each into its own
``NodeWindow`` (:meth:`InProcessHub.merge`), so the analyzer sees one window per node whatever
measured its processes, and scores them alike (``ProcessWindow.backend`` says which).

**Counted once.** When the agent itself probes with eBPF, every process it can see is covered by
uprobes, so it answers a connecting process with mode ``standby``: the process subscribes to
nothing and sends nothing. A frame that arrives anyway for a pid the agent probes is dropped.

**Trust.** The pid of a frame is the peer's, from ``SO_PEERCRED``; a frame's own pid is ignored,
so a process can report only about itself. Attribution (job, rank, GPU) comes from the agent's
own reading of /proc/PID/environ and NVML when it has one, else from the frame. Frames are
validated like the analyzer validates windows (proto/wire.py); a bad frame is dropped with a
log line naming the peer, and the connection is closed after :data:`MAX_BAD_FRAMES`.

**Timing.** A process ends its window at the same aligned boundary as the agent. At the end of
its window the agent waits up to ``grace_s`` for a frame from each active peer; a frame that
comes later is dropped and counted (``late_frames``).
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import local
from hypertrace.proto.wire import WIRE_VERSION, WireError, accept_window

log = logging.getLogger(__name__)

#: A peer whose frames fail validation this many times is disconnected.
MAX_BAD_FRAMES = 3
#: Frames kept per peer while waiting to be merged (a stuck agent must not grow without bound).
MAX_PENDING = 4


@dataclass
class _Peer:
    sock: socket.socket
    cred: local.PeerCred
    mode: str
    frames: list[pb.LocalFrame] = field(default_factory=list)
    bad: int = 0


class InProcessHub:
    """Listens on the socket in a thread; :meth:`merge` is called by the agent's window loop."""

    def __init__(self, path: str, config: pb.LocalConfig, *, standby: bool,
                 grace_s: float = 1.0):
        self.path = path
        self.config = config
        self.standby = standby
        self.grace_s = grace_s
        self.late_frames = 0
        self.dropped_frames = 0
        self._peers: dict[int, _Peer] = {}
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "InProcessHub":
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()                   # a socket left by an earlier agent
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.bind(self.path)
        # Any local user's training process may connect: each reports only about itself
        # (peer credentials), so the socket needs no secrecy.
        os.chmod(self.path, 0o666)
        sock.listen(64)
        self._listener = sock
        self._thread = threading.Thread(target=self._serve, name="inprocess-hub", daemon=True)
        self._thread.start()
        log.info("in-process backends: listening on %s (%s)", self.path,
                 "standby: eBPF probes this node" if self.standby else "active")
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        with self._lock:
            for peer in self._peers.values():
                peer.sock.close()
            self._peers.clear()
        if self._listener is not None:
            self._listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def peers(self) -> dict[int, str]:
        """pid -> mode of the connected processes."""
        with self._lock:
            return {pid: p.mode for pid, p in self._peers.items()}

    def control(self, pause: bool, pid: int | None = None, uid: int = 0) -> list[int]:
        """Pause (or resume) the CUPTI backend of ``pid`` (None: every process) on behalf of
        user ``uid`` (root may control any process, others only their own); the pids told."""
        msg = pb.LocalMessage(control=pb.LocalControl(pause=pause))
        told = []
        with self._lock:
            for p, peer in self._peers.items():
                if (pid is None or p == pid) and uid in (0, peer.cred.uid):
                    try:
                        local.send(peer.sock, msg)
                        told.append(p)
                    except OSError as exc:
                        log.warning("cannot reach pid %d: %s", p, exc)
        return told

    # -- the socket thread ------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                socks = {p.sock: pid for pid, p in self._peers.items()}
            try:
                ready, _, _ = select.select([self._listener, *socks], [], [], 0.5)
            except (OSError, ValueError):
                continue                    # a socket closed under us; list again
            for s in ready:
                if s is self._listener:
                    self._accept()
                else:
                    self._receive(socks[s])

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        try:
            cred = local.peer_cred(conn)
            conn.settimeout(2.0)
            hello = local.recv(conn)
            if hello is not None and hello.WhichOneof("body") == "control":
                self._operator(conn, cred, hello.control)
                return
            if hello is None or hello.WhichOneof("body") != "hello":
                raise local.LocalProtocolError("expected a LocalHello first")
            if hello.hello.version != local.LOCAL_VERSION:
                raise local.LocalProtocolError(
                    f"LocalHello version {hello.hello.version} is not {local.LOCAL_VERSION}: "
                    "run the same hypertrace version in the training image and on the node")
            cfg = pb.LocalConfig()
            cfg.CopyFrom(self.config)
            cfg.mode = "standby" if self.standby else "active"
            local.send(conn, pb.LocalMessage(config=cfg))
        except (OSError, local.LocalProtocolError) as exc:
            log.warning("in-process backend connection refused: %s", exc)
            conn.close()
            return
        conn.settimeout(None)
        with self._lock:
            old = self._peers.pop(cred.pid, None)
            if old is not None:
                old.sock.close()
            self._peers[cred.pid] = _Peer(conn, cred, cfg.mode)
        log.info("in-process backend connected: pid %d (uid %d), %s", cred.pid, cred.uid,
                 cfg.mode)

    def _operator(self, conn: socket.socket, cred: local.PeerCred, ctl: pb.LocalControl) -> None:
        """`hypertrace cupti pause|resume`: forward, answer with the pids told, close."""
        told = self.control(ctl.pause, ctl.pid or None, cred.uid)
        error = "" if told else (f"no connected process {ctl.pid} that uid {cred.uid} may "
                                 "control" if ctl.pid else "no connected process to control")
        try:
            local.send(conn, pb.LocalMessage(done=pb.LocalControlDone(pids=told, error=error)))
        finally:
            conn.close()
        log.info("%s requested by uid %d (pid %d): told %s", "pause" if ctl.pause else "resume",
                 cred.uid, cred.pid, told or "nobody")

    def _drop(self, pid: int, why: str) -> None:
        with self._lock:
            peer = self._peers.pop(pid, None)
        if peer is not None:
            peer.sock.close()
            log.info("in-process backend of pid %d disconnected (%s)", pid, why)

    def _receive(self, pid: int) -> None:
        with self._lock:
            peer = self._peers.get(pid)
        if peer is None:
            return
        try:
            msg = local.recv(peer.sock)
        except local.LocalProtocolError as exc:
            self._bad(peer, str(exc))
            return
        except OSError as exc:
            self._drop(pid, str(exc))
            return
        if msg is None:
            self._drop(pid, "closed")
            return
        if msg.WhichOneof("body") != "frame":
            self._bad(peer, f"unexpected {msg.WhichOneof('body')} message")
            return
        problem = check_frame(msg.frame)
        if problem:
            self._bad(peer, problem)
            return
        with self._arrived:
            peer.frames.append(msg.frame)
            if len(peer.frames) > MAX_PENDING:
                peer.frames.pop(0)
                self.dropped_frames += 1
            self._arrived.notify_all()

    def _bad(self, peer: _Peer, why: str) -> None:
        peer.bad += 1
        log.warning("dropping a frame from pid %d: %s", peer.cred.pid, why)
        if peer.bad >= MAX_BAD_FRAMES:
            self._drop(peer.cred.pid, f"{MAX_BAD_FRAMES} bad frames")

    # -- merging ----------------------------------------------------------------------------------
    def take(self, start_ns: int, end_ns: int, skip_pids: set[int] = frozenset(),
             wait: bool = True) -> dict[int, pb.LocalFrame]:
        """The frame of each active peer for the window ending at ``end_ns`` (pid -> frame).

        Waits up to ``grace_s`` for active peers that have not sent it yet. Frames that end at or
        before ``start_ns`` missed their window: dropped and counted as late."""
        deadline = time.monotonic() + (self.grace_s if wait else 0.0)
        half = (end_ns - start_ns) // 2
        with self._arrived:
            while True:
                waiting = [p for pid, p in self._peers.items() if p.mode == "active"
                           and pid not in skip_pids
                           and not any(f.end_ns > end_ns - half for f in p.frames)]
                left = deadline - time.monotonic()
                if not waiting or left <= 0:
                    break
                self._arrived.wait(left)
            out: dict[int, pb.LocalFrame] = {}
            for pid, p in self._peers.items():
                keep = []
                for f in p.frames:
                    if f.end_ns <= start_ns + half:
                        self.late_frames += 1
                    elif f.end_ns > end_ns + half:
                        keep.append(f)          # already the next window's
                    elif pid in skip_pids:
                        self.dropped_frames += 1
                    else:
                        out[pid] = f
                p.frames = keep
        return out

    @staticmethod
    def merge(window: pb.NodeWindow, frames: dict[int, pb.LocalFrame]) -> int:
        """Put each frame's process into ``window``: it replaces the entry the agent built for
        that pid (attribution and NVML kept from the agent's), or is added. Returns how many."""
        by_pid = {p.pid: p for p in window.processes}
        for pid, frame in sorted(frames.items()):
            pw = pb.ProcessWindow()
            pw.CopyFrom(frame.window)
            pw.pid = pid
            pw.backend = pw.backend or "cupti"
            mine = by_pid.get(pid)
            if mine is not None:
                for name in ("job_id", "rank", "local_rank", "gpu_index", "gpu_uuid", "gpu_kind",
                             "group"):
                    value = getattr(mine, name)
                    if value not in ("", -1):
                        setattr(pw, name, value)
                if mine.HasField("nvml"):
                    pw.nvml.CopyFrom(mine.nvml)
                mine.CopyFrom(pw)
            else:
                window.processes.append(pw)
        return len(frames)


def check_frame(frame: pb.LocalFrame) -> str:
    """'' when the frame is acceptable, else why not (the analyzer's own validation)."""
    if frame.end_ns <= frame.start_ns:
        return f"frame ends ({frame.end_ns}) before it starts ({frame.start_ns})"
    w = pb.NodeWindow(version=WIRE_VERSION, agent_id="local", node="local", seq=1)
    w.start.FromNanoseconds(frame.start_ns)
    w.end.FromNanoseconds(frame.end_ns)
    w.processes.append(frame.window)
    try:
        dropped = accept_window(w)
    except WireError as exc:
        return str(exc)
    return "; ".join(str(e) for e in dropped)


class NoProbes:
    """The agent's probe session where eBPF is not available: it probes nothing, and every
    measurement comes from in-process backends through :class:`InProcessHub`. It answers the
    calls of collector.ebpf.UprobeSession that the agent makes, with empty results."""

    attachments: dict = {}

    def attach(self, library_path: str, pid: int = -1, apis=None) -> list[str]:
        return []

    def detach_many(self, items) -> float:
        return 0.0

    def detach_all(self) -> float:
        return 0.0

    def track_pids(self, pids) -> None:
        pass

    def forget_pids(self, pids) -> None:
        pass

    def step_totals(self) -> dict:
        return {}

    def read_and_clear(self) -> dict:
        return {}

    def read_process_stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass
