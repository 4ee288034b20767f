"""Exponential backoff with jitter: the one retry schedule of the agent and the analyzer.

Why jitter: after an analyzer restart or a scheduler outage every agent (or every eviction
retry) fails at the same moment; without jitter they all come back in the same second too.
The delay before retry ``n`` is ``min(cap, base * 2**n)`` times a uniform factor in
[0.5, 1): never more than the cap, never less than half of the exponential step.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """delay(n) = min(cap, base * 2**n) * U(0.5, 1), in seconds."""

    base: float = 0.5
    cap: float = 30.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        r = rng if rng is not None else random
        return min(self.cap, self.base * (2 ** min(attempt, 30))) * r.uniform(0.5, 1.0)

    def retry(self, action: Callable[[], T], attempts: int,
              retry_on: tuple[type[BaseException], ...],
              sleep: Callable[[float], None] = time.sleep,
              rng: random.Random | None = None) -> T:
        """``action()`` up to ``attempts`` times, sleeping :meth:`delay` between tries when it
        raises one of ``retry_on``; the last such error is raised. Anything else propagates at
        once."""
        for i in range(attempts):
            try:
                return action()
            except retry_on:
                if i + 1 >= attempts:
                    raise
                sleep(self.delay(i, rng))
        raise ValueError("attempts must be >= 1")


__all__ = ["Backoff"]
