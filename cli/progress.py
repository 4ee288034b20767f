"""Progress on stderr for anything that may take more than a couple of seconds: done so far,
the rate, and an ETA when the total is known.

Quiet unless stderr is a terminal (or ``HYPERTRACE_PROGRESS=1``), so pipes, logs and tests see
nothing; silent for the first ``after_s`` seconds, so short runs print nothing at all; then a
line at most every ``every_s`` seconds (``\\r``-rewritten on a terminal), and a last one at
:meth:`Progress.close` when anything was shown.

The ETA comes from the rate since the first unit was done, not since the start: what comes
before it (imports, worker processes starting, a connection) is no measure of the work, and
counting it once made a 6-second run announce hours.
"""
from __future__ import annotations

import os
import sys
import time
from typing import IO, Callable


class Progress:
    #: Seconds of measured work before an ETA is given.
    ETA_AFTER_S = 1.0

    def __init__(self, what: str, unit: str, total: int | None = None, *,
                 after_s: float = 2.0, every_s: float = 1.0, stream: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.unit, self.total = what, unit, total
        self.after_s, self.every_s = after_s, every_s
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.on = self.tty or os.environ.get("HYPERTRACE_PROGRESS") == "1"
        self.clock = clock
        self.n = 0
        self.t0 = clock()
        self.last = self.t0
        self.first: tuple[float, int] | None = None   # (when, count) at the first add
        self.shown = False

    def add(self, n: int = 1) -> None:
        self.n += n
        if self.first is None:
            self.first = (self.clock(), self.n)
        if not self.on:
            return
        now = self.clock()
        if now - self.t0 >= self.after_s and now - self.last >= self.every_s:
            self.last = now
            self._show(now)

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        took = max(now - self.t0, 1e-9)
        rate = self.n / took
        text = f"{self.what}: {self.n:,}"
        if self.total:
            text += f" of {self.total:,} {self.unit} ({self.n / self.total:.0%})"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.0f}/s, {took:.0f} s"
        eta = self.eta_s(now)
        if eta is not None:
            text += f", about {eta:.0f} s left"
        return text

    def eta_s(self, now: float) -> float | None:
        """Seconds left at the rate since the first unit; None before there is a measure."""
        if not self.total or self.first is None or self.n >= self.total:
            return None
        since, at = now - self.first[0], self.n - self.first[1]
        if since < self.ETA_AFTER_S or at <= 0:
            return None
        return (self.total - self.n) / (at / since)

    def _show(self, now: float) -> None:
        self.shown = True
        if self.tty:
            self.stream.write("\r" + self.line(now) + "\x1b[K")
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.on and self.shown:
            self._show(self.clock())
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()


__all__ = ["Progress"]
