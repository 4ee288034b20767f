"""Free TCP ports on localhost, for the real servers the tests and benchmarks start."""
from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago (all held open together while chosen,
    so none repeats; the caller's server may still lose a race for one, as with any such pick)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports
