"""The node-local socket between the in-process CUPTI backend and the node agent.

One ``LocalMessage`` protobuf per datagram on an ``AF_UNIX`` ``SOCK_SEQPACKET`` socket: the
kernel keeps message boundaries, so there is no framing to get wrong, and a peer that dies
leaves an end-of-file, not half a message. The exchange::

    process -> agent   LocalHello            (once, on connect)
    agent -> process   LocalConfig           (mode "active" or "standby", the window, the budget)
    process -> agent   LocalFrame            (one per window)
    agent -> process   LocalControl          (pause / resume, when asked)

**Who is on the other end.** Both ends read the peer's credentials from the kernel
(``SO_PEERCRED``), never from a message. The agent takes the pid of a frame's process from the
socket, so a process can only report about itself. The process refuses an "agent" that is
neither root nor its own user, so an unprivileged squatter on the socket path cannot collect
other users' windows.
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

from hypertrace.proto import hypertrace_pb2 as pb

LOCAL_VERSION = 1
#: Default path of the agent's socket (``cupti_socket`` in the agent's config).
DEFAULT_SOCKET = "/run/hypertrace/cupti.sock"
#: Largest message accepted: a process window is a few KB; this bounds a broken peer.
MAX_MESSAGE_BYTES = 1 << 20


class LocalProtocolError(ValueError):
    """A peer sent something that is not a valid LocalMessage (the message says what)."""


@dataclass(frozen=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket) -> PeerCred:
    """The connected peer's pid, uid and gid, as the kernel recorded them at connect."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCred(pid, uid, gid)


def trusted_agent(cred: PeerCred) -> bool:
    """A process talks only to an agent run by root or by its own user."""
    return cred.uid == 0 or cred.uid == os.geteuid()


def send(sock: socket.socket, msg: pb.LocalMessage) -> None:
    data = msg.SerializeToString()
    if len(data) > MAX_MESSAGE_BYTES:
        raise LocalProtocolError(f"message of {len(data)} bytes is over {MAX_MESSAGE_BYTES}")
    sock.sendall(data)


def recv(sock: socket.socket) -> pb.LocalMessage | None:
    """The next message, or None at end of file (the peer closed or died)."""
    data = sock.recv(MAX_MESSAGE_BYTES + 1)
    if not data:
        return None
    if len(data) > MAX_MESSAGE_BYTES:
        raise LocalProtocolError(f"message over {MAX_MESSAGE_BYTES} bytes")
    msg = pb.LocalMessage()
    try:
        msg.ParseFromString(data)
    except Exception as exc:                       # DecodeError and friends
        raise LocalProtocolError(f"not a LocalMessage: {exc}") from None
    if msg.WhichOneof("body") is None:
        raise LocalProtocolError("empty LocalMessage (no body)")
    return msg


def connect(path: str, timeout_s: float = 2.0) -> socket.socket:
    """Connect to the agent's socket; OSError when nobody listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout_s)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock
