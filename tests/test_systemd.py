"""sd_notify over a real unix datagram socket, path and abstract ('@') addresses."""
from __future__ import annotations

import os
import socket
import uuid

from hypertrace.daemon.systemd import SdNotifier, watchdog_interval


def _recv(sock: socket.socket) -> str:
    sock.settimeout(5)
    return sock.recv(4096).decode()


def test_path_socket(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        n = SdNotifier({"NOTIFY_SOCKET": path})
        assert n.enabled
        assert n.ready("attached to 2 libraries")
        assert _recv(sock) == "READY=1\nSTATUS=attached to 2 libraries"
        assert n.watchdog()
        assert _recv(sock) == "WATCHDOG=1"
        assert n.stopping()
        assert _recv(sock) == "STOPPING=1"
        assert n.status("window 7 sent")
        assert _recv(sock) == "STATUS=window 7 sent"


def test_abstract_socket():
    name = f"hypertrace-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        n = SdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert _recv(sock) == "READY=1"


def test_no_socket_is_a_silent_noop(tmp_path):
    assert not SdNotifier({}).enabled
    assert SdNotifier({}).ready() is False
    assert SdNotifier({"NOTIFY_SOCKET": "vsock:2:99"}).enabled is False
    # systemd gone: the send fails, the agent does not.
    assert SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "absent")}).watchdog() is False


def test_watchdog_interval():
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    me = str(os.getpid())
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": me}) == 2.0
    assert watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None


def test_a_receiver_that_does_not_read_never_blocks_the_sender(tmp_path):
    # A unix datagram queue holds few messages; a blocking send would hang the agent's loop
    # (seen in the end-to-end test before the sends were made non-blocking).
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        n = SdNotifier({"NOTIFY_SOCKET": path})
        results = [n.watchdog() for _ in range(500)]
        assert results[0] is True and results[-1] is False
        assert _recv(sock) == "WATCHDOG=1"
