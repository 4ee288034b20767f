"""One retry schedule (proto/backoff.py) for the agent's uplink and the evictor's backends:
exponential, capped, jittered."""
from __future__ import annotations

import random

import pytest

from hypertrace.analyzer.evict.backends import BackendError, Refused, Retry
from hypertrace.proto.backoff import Backoff


def test_the_evictors_retries_wait_the_shared_jittered_backoff():
    """A backend that keeps failing is retried after min(cap, base * 2**n) * U(0.5, 1) seconds:
    never the bare exponential (all evictors of a fleet would retry in step)."""
    slept: list[float] = []
    calls = []

    def failing() -> str:
        calls.append(1)
        raise OSError("scheduler down")

    with pytest.raises(BackendError, match="failed after 5 attempts: scheduler down"):
        Retry(attempts=5, base_s=1.0, cap_s=4.0).run(failing, sleep=slept.append)
    assert len(calls) == 5 and len(slept) == 4
    for n, d in enumerate(slept):
        nominal = min(4.0, 2.0 ** n)
        assert 0.5 * nominal <= d < nominal, (n, d)
    assert slept != [1.0, 2.0, 4.0, 4.0]


def test_a_refusal_is_final_and_not_retried():
    calls = []

    def refused() -> str:
        calls.append(1)
        raise Refused("drained by someone else")

    with pytest.raises(Refused):
        Retry(attempts=3, base_s=0.01).run(refused, sleep=lambda s: None)
    assert len(calls) == 1


def test_backoff_retry_returns_the_first_success():
    tries = iter([ValueError("a"), ValueError("b"), "ok"])

    def action() -> str:
        v = next(tries)
        if isinstance(v, Exception):
            raise v
        return v

    assert Backoff(0.1, 1.0).retry(action, 3, (ValueError,), sleep=lambda s: None,
                                   rng=random.Random(1)) == "ok"
