"""The agent's end of the node-local socket: windows from in-process (CUPTI) backends.

Training processes running the CUPTI backend (daemon/cupti) connect to ``cupti_socket`` and send
one ``LocalFrame`` per window (proto/local.py); :meth:`InProcessHub.merge` puts each into the
agent's own window, so the analyzer sees one window per node whatever measured it. An agent with
uprobes answers ``standby`` and drops frames of pids it probes: each process is counted once. A
frame's pid is the peer's (``SO_PEERCRED``) and the attribution of a process the agent can see
is its own reading, so a process reports only about itself and never into another job. One
thread serves non-blocking sockets, so a silent or stuck peer delays nobody; frames are
validated as the analyzer validates windows; a frame later than ``grace_s`` after the window's
end is dropped and counted.
"""
from __future__ import annotations

import itertools
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hypertrace.collector.attribution import Attribution
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
    """One connection: a backend after its hello, or a connection still owing one."""
    sock: socket.socket
    cred: local.PeerCred
    mode: str = ""                      # "" until the hello; then "active" | "standby"
    pid: int = 0                        # the kernel's, or the process's own word (see _hello)
    frames: list[pb.LocalFrame] = field(default_factory=list)
    bad: int = 0

    @property
    def visible(self) -> bool:
        """The agent sees the process (same PID namespace): its pid is the kernel's."""
        return self.cred.pid != 0


@dataclass(frozen=True)
class Taken:
    """A frame taken for the agent's window, with what the agent knows of its sender."""
    pid: int
    visible: bool
    frame: pb.LocalFrame


class InProcessHub:
    """Listens on the socket in a thread; :meth:`merge` is called by the agent's window loop.

    Every socket is non-blocking and served by one thread: a process that sends nothing (or
    stops reading) can delay nobody, and the lock is never held across a send."""

    def __init__(self, path: str, config: pb.LocalConfig, *, standby: bool,
                 grace_s: float = 1.0):
        self.path = path
        self.config = config
        self.standby = standby
        self.grace_s = grace_s
        self.late_frames = 0
        self.dropped_frames = 0
        self._conns: dict[int, _Peer] = {}           # connection id -> peer
        self._next_id = itertools.count(1)
        self._orphans: list[Taken] = []              # frames of peers that disconnected
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
        sock.setblocking(False)
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
            for peer in self._conns.values():
                peer.sock.close()
            self._conns.clear()
        if self._listener is not None:
            self._listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def peers(self) -> dict[int, str]:
        """pid -> mode of the connected processes."""
        with self._lock:
            return {p.pid: p.mode for p in self._conns.values() if p.mode}

    def control(self, pause: bool, pid: int | None = None, uid: int = 0) -> list[int]:
        """Pause (or resume) the CUPTI backend of ``pid`` (None: every process) on behalf of
        user ``uid`` (root may control any process, others only their own); the pids told.
        A process whose socket is full (it stopped reading) is not told, and not waited for."""
        data = pb.LocalMessage(control=pb.LocalControl(pause=pause)).SerializeToString()
        with self._lock:
            targets = [p for p in self._conns.values() if p.mode and (pid is None or p.pid == pid)
                       and uid in (0, p.cred.uid)]
        told = []
        for peer in targets:
            try:
                peer.sock.send(data, socket.MSG_DONTWAIT)
                told.append(peer.pid)
            except OSError as exc:          # BlockingIOError included: not told
                log.warning("cannot reach pid %d: %s", peer.pid, exc)
        return told

    # -- the socket thread ------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                socks = {p.sock: cid for cid, p in self._conns.items()}
            try:
                ready, _, _ = select.select([self._listener, *socks], [], [], 0.5)
            except (OSError, ValueError):
                continue                    # a socket closed under us; list again
            for s in ready:
                try:
                    if s is self._listener:
                        self._accept()
                    else:
                        self._receive(socks[s])
                except Exception:           # one connection's trouble must not end the hub
                    log.exception("in-process socket: unexpected error; carrying on")

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        try:
            cred = local.peer_cred(conn)
        except OSError as exc:
            log.warning("in-process backend connection refused: %s", exc)
            conn.close()
            return
        conn.setblocking(False)
        with self._lock:
            self._conns[next(self._next_id)] = _Peer(conn, cred)

    def _hello(self, cid: int, peer: _Peer, msg: pb.LocalMessage) -> None:
        """The first message of a connection: a backend's hello, or an operator's control."""
        if msg.WhichOneof("body") == "control":
            self._operator(cid, peer, msg.control)
            return
        if msg.WhichOneof("body") != "hello":
            raise local.LocalProtocolError("expected a LocalHello first")
        if msg.hello.version != local.LOCAL_VERSION:
            raise local.LocalProtocolError(
                f"LocalHello version {msg.hello.version} is not {local.LOCAL_VERSION}: "
                "run the same hypertrace version in the training image and on the node")
        cfg = pb.LocalConfig()
        cfg.CopyFrom(self.config)
        cfg.mode = "standby" if self.standby else "active"
        peer.sock.send(pb.LocalMessage(config=cfg).SerializeToString(), socket.MSG_DONTWAIT)
        # A process in another PID namespace (a pod, when the agent runs without hostPID) is
        # not visible here: the kernel reports pid 0, and the process's own pid is all there is.
        peer.pid = peer.cred.pid or msg.hello.pid
        if not peer.visible:
            log.info("in-process backend of pid %d (its own word) is in another PID namespace; "
                     "run the agent with the host's PID namespace to verify pids", peer.pid)
        stale = []
        with self._lock:
            peer.mode = cfg.mode
            if peer.visible:                # the same process reconnected: the old link is dead
                stale = [c for c, p in self._conns.items() if c != cid and p.visible
                         and p.pid == peer.pid and p.cred.uid == peer.cred.uid]
        for c in stale:
            self._drop(c, "replaced by a new connection of the same process")
        log.info("in-process backend connected: pid %d (uid %d), %s", peer.pid, peer.cred.uid,
                 cfg.mode)

    def _operator(self, cid: int, peer: _Peer, ctl: pb.LocalControl) -> None:
        """`hypertrace cupti pause|resume`: forward, answer with the pids told, close."""
        told = self.control(ctl.pause, ctl.pid or None, peer.cred.uid)
        error = "" if told else (f"no connected process {ctl.pid} that uid {peer.cred.uid} may "
                                 "control" if ctl.pid else "no connected process to control")
        try:
            peer.sock.send(pb.LocalMessage(done=pb.LocalControlDone(
                pids=told, error=error)).SerializeToString(), socket.MSG_DONTWAIT)
        except OSError:
            pass
        self._drop(cid, "operator request done", quiet=True)
        log.info("%s requested by uid %d (pid %d): told %s", "pause" if ctl.pause else "resume",
                 peer.cred.uid, peer.cred.pid, told or "nobody")

    def _drop(self, cid: int, why: str, quiet: bool = False) -> None:
        with self._lock:
            peer = self._conns.pop(cid, None)
            if peer is not None and peer.frames:
                # Its last windows still count (a process that sent its final window and exited).
                self._orphans += [Taken(peer.pid, peer.visible, f) for f in peer.frames]
                peer.frames = []
                self._arrived.notify_all()
        if peer is not None:
            peer.sock.close()
            if not quiet:
                log.info("in-process backend of pid %d disconnected (%s)", peer.pid, why)

    def _receive(self, cid: int) -> None:
        with self._lock:
            peer = self._conns.get(cid)
        if peer is None:
            return
        try:
            msg = local.recv(peer.sock)
        except BlockingIOError:
            return
        except local.LocalProtocolError as exc:
            if not peer.mode:
                log.warning("in-process backend connection refused: %s", exc)
                self._drop(cid, str(exc), quiet=True)
            else:
                self._bad(cid, peer, str(exc))
            return
        except OSError as exc:
            self._drop(cid, str(exc))
            return
        if msg is None:
            self._drop(cid, "closed", quiet=not peer.mode)
            return
        if not peer.mode:
            try:
                self._hello(cid, peer, msg)
            except (OSError, local.LocalProtocolError) as exc:
                log.warning("in-process backend connection refused: %s", exc)
                self._drop(cid, str(exc), quiet=True)
            return
        if msg.WhichOneof("body") != "frame":
            self._bad(cid, peer, f"unexpected {msg.WhichOneof('body')} message")
            return
        if peer.mode != "active":
            with self._lock:
                self.dropped_frames += 1    # told to stand by: uprobes measure it
            return
        problem = check_frame(msg.frame)
        if problem:
            self._bad(cid, peer, problem)
            return
        with self._arrived:
            peer.frames.append(msg.frame)
            if len(peer.frames) > MAX_PENDING:
                peer.frames.pop(0)
                self.dropped_frames += 1
            self._arrived.notify_all()

    def _bad(self, cid: int, peer: _Peer, why: str) -> None:
        peer.bad += 1
        log.warning("dropping a frame from pid %d: %s", peer.pid, why)
        if peer.bad >= MAX_BAD_FRAMES:
            self._drop(cid, f"{MAX_BAD_FRAMES} bad frames")

    # -- merging ----------------------------------------------------------------------------------
    def take(self, start_ns: int, end_ns: int, skip_pids: set[int] = frozenset(),
             wait: bool = True) -> list[Taken]:
        """The frame of each active peer for the window ending at ``end_ns``.

        Waits up to ``grace_s`` for active peers that have not sent it yet. Frames that end at or
        before ``start_ns`` missed their window: dropped and counted as late. ``skip_pids``:
        visible processes the uprobes measure (their frames are dropped: counted once)."""
        deadline = time.monotonic() + (self.grace_s if wait else 0.0)
        half = (end_ns - start_ns) // 2
        out: list[Taken] = []
        with self._arrived:
            while True:
                waiting = [p for p in self._conns.values() if p.mode == "active"
                           and not (p.visible and p.pid in skip_pids)
                           and not any(f.end_ns > end_ns - half for f in p.frames)]
                left = deadline - time.monotonic()
                if not waiting or left <= 0:
                    break
                self._arrived.wait(left)
            pending = [(p.pid, p.visible, p) for p in self._conns.values()]
            orphans, self._orphans = self._orphans, []
            for pid, visible, p in pending:
                keep = []
                for f in p.frames:
                    verdict = self._place(f, start_ns, end_ns, half, visible and pid in skip_pids)
                    if verdict == "next":
                        keep.append(f)
                    elif verdict == "take":
                        out.append(Taken(pid, visible, f))
                p.frames = keep
            for o in orphans:
                verdict = self._place(o.frame, start_ns, end_ns, half,
                                      o.visible and o.pid in skip_pids)
                if verdict == "take":
                    out.append(o)
                elif verdict == "next":
                    self._orphans.append(o)
        return out

    def _place(self, f: pb.LocalFrame, start_ns: int, end_ns: int, half: int,
               skipped: bool) -> str:
        """Where a frame goes at this window's end (caller holds the lock)."""
        if f.end_ns <= start_ns + half:
            self.late_frames += 1
            return "late"
        if f.end_ns > end_ns + half:
            return "next"                   # already the next window's
        if skipped:
            self.dropped_frames += 1
            return "skipped"
        return "take"

    @staticmethod
    def merge(window: pb.NodeWindow, taken: list[Taken],
              attribute: Callable[[int], Attribution] | None = None) -> int:
        """Put each frame's process into ``window``; returns how many.

        A process the agent can see is attributed by the agent: from the entry it built for that
        pid, else from ``attribute(pid)`` (its reading of /proc/PID/environ), never from the frame,
        so a process cannot report itself into another job. A process in another PID namespace
        keeps the frame's attribution (the agent has nothing better; its log said so)."""
        by_pid = {p.pid: p for p in window.processes}
        for t in sorted(taken, key=lambda t: t.pid):
            pw = pb.ProcessWindow()
            pw.CopyFrom(t.frame.window)
            pw.pid = t.pid
            pw.backend = pw.backend or "cupti"
            mine = by_pid.get(t.pid) if t.visible else None
            if mine is not None:
                for name in _ATTRIBUTION:
                    setattr(pw, name, getattr(mine, name))
                if mine.HasField("nvml"):
                    pw.nvml.CopyFrom(mine.nvml)
                mine.CopyFrom(pw)
                continue
            if t.visible and attribute is not None:
                a = attribute(t.pid)
                pw.job_id, pw.rank, pw.local_rank = a.job_id, a.rank, a.local_rank
                pw.gpu_index, pw.gpu_uuid, pw.group = a.gpu_index, a.gpu_uuid, a.group
            window.processes.append(pw)
        return len(taken)


#: ProcessWindow fields that say whose GPU it is (the agent's to set for processes it sees).
_ATTRIBUTION = ("job_id", "rank", "local_rank", "gpu_index", "gpu_uuid", "gpu_kind", "group")


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

    def set_loaders(self, pid, children) -> None:
        pass

    def set_threads(self, pid, tids) -> None:
        pass

    def read_and_clear(self) -> dict:
        return {}

    def read_process_stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass
