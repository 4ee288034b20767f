"""sd_notify in a few lines of socket code: READY=1, WATCHDOG=1, STOPPING=1, STATUS=.

The protocol is one datagram on the unix socket ``$NOTIFY_SOCKET`` names, so the agent needs no
libsystemd; without ``$NOTIFY_SOCKET`` every call is a no-op. With ``WatchdogSec=`` systemd sets
``$WATCHDOG_USEC``, and the agent pings at half that period, as systemd's documentation advises.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Mapping

log = logging.getLogger(__name__)


def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None
                      ) -> float | None:
    """Seconds between WATCHDOG=1 pings, or None when systemd asked for no watchdog.

    Honors ``$WATCHDOG_PID``: the watchdog is meant for that process only.
    """
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    wpid = env.get("WATCHDOG_PID", "")
    if wpid and wpid.isdigit() and int(wpid) != (os.getpid() if pid is None else pid):
        return None
    return int(usec) / 1e6 / 2.0


class SdNotifier:
    """Sends state changes to systemd; silent (and harmless) outside systemd."""

    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if addr.startswith("@"):
            self.address = "\0" + addr[1:]
        elif addr.startswith("/"):
            self.address = addr
        elif addr:
            log.warning("NOTIFY_SOCKET=%r is not a unix socket path; systemd notifications "
                        "disabled", addr)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram. False when disabled or it failed."""
        if self.address is None:
            return False
        msg = "\n".join(assignments).encode("utf-8")
        try:
            # Non-blocking: a unix datagram send blocks while the receiver's queue is full
            # (a hung or busy systemd), and the agent's window loop must never stall on it.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.setblocking(False)
                s.sendto(msg, self.address)
            return True
        except OSError as e:  # systemd gone, queue full, socket unwritable: never fatal
            log.debug("sd_notify %r failed: %s", assignments, e)
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")
