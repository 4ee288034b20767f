"""Progress on stderr for anything that may take more than a couple of seconds: done so far,
the rate, and an ETA when the total is known.

Quiet unless stderr is a terminal (or ``HYPERTRACE_PROGRESS=1``), so pipes, logs and tests see
nothing; silent for the first ``after_s`` seconds, so short runs print nothing at all; then a
line at most every ``every_s`` seconds (``\\r``-rewritten on a terminal), and a last one at
:meth:`Progress.close` when anything was shown.
"""
from __future__ import annotations

import os
import sys
import time
from typing import IO


class Progress:
    def __init__(self, what: str, unit: str, total: int | None = None, *,
                 after_s: float = 2.0, every_s: float = 1.0, stream: IO[str] | None = None):
        self.what, self.unit, self.total = what, unit, total
        self.after_s, self.every_s = after_s, every_s
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.on = self.tty or os.environ.get("HYPERTRACE_PROGRESS") == "1"
        self.n = 0
        self.t0 = time.monotonic()
        self.last = self.t0
        self.shown = False

    def add(self, n: int = 1) -> None:
        self.n += n
        if not self.on:
            return
        now = time.monotonic()
        if now - self.t0 >= self.after_s and now - self.last >= self.every_s:
            self.last = now
            self._show(now)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        took = max(now - self.t0, 1e-9)
        rate = self.n / took
        text = f"{self.what}: {self.n:,}"
        if self.total:
            text += f" of {self.total:,} {self.unit} ({self.n / self.total:.0%})"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.0f}/s, {took:.0f} s"
        if self.total and rate > 0 and self.n < self.total:
            text += f", about {(self.total - self.n) / rate:.0f} s left"
        return text

    def _show(self, now: float) -> None:
        self.shown = True
        if self.tty:
            self.stream.write("\r" + self.line(now) + "\x1b[K")
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.on and self.shown:
            self._show(time.monotonic())
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()


__all__ = ["Progress"]
