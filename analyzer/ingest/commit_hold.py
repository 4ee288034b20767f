"""A full disk is backpressure, not loss: scoring waits while the database cannot commit.

While a commit fails (a full disk, an I/O error: anything but a conflicting duplicate or
damage), every window of it is refused with UNAVAILABLE and its agent keeps it in its spool and
sends it again (the uplink replays with backoff). Scoring meanwhile would score the epochs those
windows belong to without them, and they would all arrive late, never scored. So the scoring
time is held at the first failed commit of the outage, until ``catch_up_s`` after the first
commit that succeeds again: the agents' windows that arrive within it are scored on time. The
catch-up is bounded, so a node that stays silent after the outage delays its job's verdicts by
that much at most.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Default seconds of catch-up after the database commits again: twice the agents' longest
#: backoff between two sends (30 s), so every agent retries at least once within it.
CATCH_UP_S = 60.0


@dataclass
class CommitHold:
    """The outage under way, if any, and the scoring time held while it lasts (thread-safe)."""

    catch_up_ns: int = int(CATCH_UP_S * 1e9)
    since_ns: int | None = None          # the first failed commit of the outage under way
    held_ns: int | None = None           # scoring time is held here ...
    until_ns: int = 0                    # ... until then, once the outage ended
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def failed(self, now_ns: int) -> None:
        """A commit failed (not for its windows' content)."""
        with self._guard:
            if self.since_ns is not None:
                return
            self.since_ns = now_ns
            if self.held_ns is None:             # a second outage within the catch-up: same hold
                self.held_ns = now_ns
        log.error("the database cannot commit: windows are refused (agents keep them) and "
                  "scoring waits until %g s after it can again", self.catch_up_ns / 1e9)

    def committed(self, now_ns: int) -> None:
        """A commit succeeded."""
        with self._guard:
            if self.since_ns is None:
                return
            down_s = (now_ns - self.since_ns) / 1e9
            self.since_ns = None
            self.until_ns = now_ns + self.catch_up_ns
        log.warning("the database commits again after %.1f s; scoring catches up in %g s",
                    down_s, self.catch_up_ns / 1e9)

    def scoring_time(self, now_ns: int) -> int:
        """The time a scoring pass at ``now_ns`` scores up to: ``now_ns``, or the held time
        during an outage and its catch-up."""
        with self._guard:
            if self.held_ns is None:
                return now_ns
            if self.since_ns is None and now_ns >= self.until_ns:
                self.held_ns = None
                return now_ns
            return min(now_ns, self.held_ns)


__all__ = ["CATCH_UP_S", "CommitHold"]
