"""Coordinated slices: every agent derives the same slice from the window index alone."""
from __future__ import annotations

import pytest

from hypertrace.collector.schedule import (
    MAX_CADENCE,
    cadence,
    is_sampled,
    phase,
    slice_bounds,
    slice_offset,
    window_index,
)


def test_every_agent_computes_the_same_offset_from_the_index_alone():
    # Two "agents" (independent calls, different process state) agree bit for bit, for indices
    # as large as wall-clock windows since 1970 give.
    base = 1_764_000_000_000_000_000 // 10_000_000_000
    for i in range(base, base + 200):
        a = slice_offset(i, 10.0, 2.0, 1.0)
        b = slice_offset(int(str(i)), 10.0, 2.0, 1.0)
        assert a == b


def test_guard_is_respected_on_both_edges():
    for window_s, max_slice_s, guard_s in ((10.0, 2.0, 1.0), (10.0, 8.0, 1.0), (60.0, 2.0, 5.0),
                                          (2.0, 1.5, 1.0), (1.0, 2.0, 1.0)):
        b = slice_bounds(window_s, max_slice_s, guard_s)
        assert b.guard_s <= guard_s and b.max_length_s <= max_slice_s
        for i in range(500):
            off = slice_offset(i, window_s, max_slice_s, guard_s)
            assert off >= b.guard_s - 1e-12
            assert off + b.max_length_s <= window_s - b.guard_s + 1e-12


def test_short_windows_shrink_the_guard_not_the_whole_slice():
    b = slice_bounds(2.0, 1.5, 1.0)
    assert b.guard_s == pytest.approx(0.5) and b.max_length_s == pytest.approx(1.0)
    assert slice_bounds(10.0, 2.0, 1.0).guard_s == 1.0


def test_offsets_spread_over_the_window_and_do_not_repeat():
    offs = [slice_offset(i, 10.0, 2.0, 1.0) for i in range(64)]
    assert len(set(offs)) == 64
    assert min(offs) < 2.0 and max(offs) > 6.0          # the room [1, 7] is covered
    # golden-ratio phases: any 8 consecutive ones leave no gap wider than a quarter
    ph = sorted(phase(i) for i in range(100, 108))
    assert max(b - a for a, b in zip([0.0] + ph, ph + [1.0])) < 0.25


def test_cadence_is_the_smallest_power_of_two_that_pays():
    assert cadence(0.0, 0.05) == 1
    assert cadence(0.05, 0.05) == 1
    assert cadence(0.051, 0.05) == 2
    assert cadence(0.3, 0.05) == 8                       # 6 windows needed -> 8
    assert cadence(0.4, 0.05) == 8
    assert cadence(1.0, 0.0) == MAX_CADENCE + 1          # nothing earned: never pays
    assert cadence(100.0, 0.05) == MAX_CADENCE + 1       # 2000 windows: over the cap
    for need in (0.01, 0.7, 1.0, 1.3, 3.9, 17.0, 63.9):
        k = cadence(need, 1.0)
        assert k & (k - 1) == 0 and k >= need and (k == 1 or k / 2 < need)


def test_powers_of_two_nest_into_full_cross_sections():
    """Agents with cadences 1, 2, 4 and 8: every window the slowest samples, all sample."""
    cadences = [1, 2, 4, 8, 2, 1, 8, 4]
    windows = range(1000, 1200)
    full = [i for i in windows if all(is_sampled(i, k) for k in cadences)]
    slowest = [i for i in windows if is_sampled(i, max(cadences))]
    assert full == slowest and len(full) == 25
    with pytest.raises(ValueError, match="power of two"):
        is_sampled(3, 3)


def test_window_index_is_aligned_wall_clock():
    w = 10_000_000_000
    assert window_index(123 * w, w) == 123 and window_index(123 * w + w - 1, w) == 123
    with pytest.raises(ValueError):
        window_index(5, 0)
