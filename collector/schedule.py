"""Where and when every agent of a job takes its slice: the same wall-clock stretch, no traffic.

A window is worth scoring only when every rank's launch tier was attached in it at the same
time, and agents share nothing but the clock and the config. So window ``i = start // window``
puts its slice at an offset that depends on ``i`` alone (:func:`slice_offset`, a golden-ratio
sequence in 32-bit fixed point: bit-identical on every machine); an agent samples window ``i``
iff ``i % k == 0`` with ``k`` a power of two (:func:`cadence`: powers of two nest, so the
busiest agent's windows are everyone's); every slice starts where the longest may, so a shorter
one is a prefix; and ``guard_s`` from both edges keeps a skewed clock's slice in the same
window (docs/design.md, "Coordinated slices").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: floor(2^32 * (sqrt(5) - 1) / 2): the golden ratio's fractional part in 32-bit fixed point
#: (Knuth's multiplicative-hash constant). Integer arithmetic: identical on every machine.
GOLDEN_FIXED = 2654435769
_FIXED_ONE = 1 << 32
#: Largest cadence: one slice every 64 windows (about 11 minutes at 10-s windows). A budget that
#: cannot pay one slice that often says "budget" instead of promising a cross-section per hour.
MAX_CADENCE = 64


@dataclass(frozen=True)
class SliceBounds:
    """The room a window leaves for a slice: the edge guard and the longest slice that fits."""
    guard_s: float
    max_length_s: float


def slice_bounds(window_s: float, max_slice_s: float, guard_s: float) -> SliceBounds:
    """The guard and the longest slice a window of ``window_s`` holds.

    The guard is kept whole when the window has room for it; a window shorter than four guards
    (short windows in tests and demos) shrinks the guard to a quarter window, so a slice of at
    least half the window remains. The result depends only on shared configuration, so every
    agent of a job gets the same bounds.
    """
    if not window_s > 0 or max_slice_s < 0 or guard_s < 0:
        raise ValueError(f"need window_s > 0, max_slice_s >= 0, guard_s >= 0; got {window_s}, "
                         f"{max_slice_s}, {guard_s}")
    guard = min(guard_s, window_s / 4)
    return SliceBounds(guard_s=guard, max_length_s=max(0.0, min(max_slice_s, window_s - 2 * guard)))


def phase(i: int) -> float:
    """``frac(i * golden ratio)`` in [0, 1), exact for any integer window index."""
    return ((int(i) * GOLDEN_FIXED) % _FIXED_ONE) / _FIXED_ONE


def slice_offset(i: int, window_s: float, length_s: float, guard_s: float) -> float:
    """Seconds from the start of window ``i`` to the start of its slice.

    ``length_s`` is the longest slice any agent of the job may take (``max_slice_s``), not this
    agent's own slice: every agent passes the same value, so all slices start together (see the
    module docstring). The slice ``[offset, offset + length_s]`` stays at least ``guard_s`` from
    both window edges (the guard shrinks as in :func:`slice_bounds` when the window is short; a
    slice longer than the window starts at 0).
    """
    b = slice_bounds(window_s, length_s, guard_s)
    room = window_s - 2 * b.guard_s - b.max_length_s
    if room <= 0:
        return max(0.0, (window_s - b.max_length_s) / 2)
    return b.guard_s + phase(i) * room


def cadence(slice_cost_s: float, earn_per_window_s: float, max_k: int = MAX_CADENCE) -> int:
    """The smallest power of two ``k`` such that ``k`` windows of earnings pay for one slice.

    ``slice_cost_s``: probe time one slice costs (the busiest process's firings times the probe
    cost, plus fixed costs); ``earn_per_window_s``: what one window earns for the sliced tier
    (budget x window, less what the always-on tier spends). Returns ``max_k + 1`` when even
    ``max_k`` windows do not pay (the caller says "budget"). A free slice gives 1.
    """
    if slice_cost_s <= 0:
        return 1
    if earn_per_window_s <= 0:
        return max_k + 1
    need = slice_cost_s / earn_per_window_s
    k = 1 if need <= 1 else 1 << math.ceil(math.log2(need))
    # log2 rounding: make sure k really pays, and that a smaller power of two does not.
    while k * earn_per_window_s < slice_cost_s:
        k *= 2
    while k > 1 and (k // 2) * earn_per_window_s >= slice_cost_s:
        k //= 2
    return k if k <= max_k else max_k + 1


def is_sampled(i: int, k: int) -> bool:
    """Whether window ``i`` holds a slice at cadence ``k`` (a power of two)."""
    if k < 1 or k & (k - 1):
        raise ValueError(f"cadence must be a power of two >= 1, got {k}")
    return int(i) % k == 0


def window_index(start_ns: int, window_ns: int) -> int:
    """The aligned window that starts at or before ``start_ns``: the same number on every node."""
    if window_ns <= 0:
        raise ValueError(f"window_ns must be > 0, got {window_ns}")
    return int(start_ns) // int(window_ns)


def window_end(start_ns: int, window_ns: int) -> int:
    """The wall-clock window boundary after ``start_ns``; a stub shorter than a quarter window
    is merged into the following window (it would carry too few samples to score)."""
    end = (start_ns // window_ns + 1) * window_ns
    if end - start_ns < window_ns // 4:
        end += window_ns
    return end
