"""Every signal the analyzer scores, in the order a probable cause prefers them among equals:
the one list to add a signal to (docs/design.md, "Adding a signal"). Everything else about a
signal is in its own :class:`~hypertrace.analyzer.score.signal.Signal` record."""
from __future__ import annotations

from hypertrace.analyzer.score import loader, signals, sync_share
from hypertrace.analyzer.score.signal import Input, Signal

SIGNALS: tuple[Signal, ...] = (
    signals.RUNQ,
    signals.SM_CLOCK,
    signals.GPU_WAIT,
    loader.LOADER_WAIT,
    loader.IO_WAIT,
    loader.LOADER_WORKERS,
    signals.OWN,
    signals.STEP_TIME,
    signals.BUSY,
    signals.LAUNCH_RATE,
    signals.PEER_WAIT,
    sync_share.SYNC_SHARE,
)


def by_name(name: str) -> Signal | None:
    """The registered signal called ``name``; None for anything else (an API)."""
    for s in SIGNALS:
        if s.name == name:
            return s
    return None


def inputs() -> tuple[Input, ...]:
    """What the registered signals read off each process window beyond the cross-section."""
    return tuple(i for s in SIGNALS for i in s.inputs)


__all__ = ["SIGNALS", "by_name", "inputs"]
