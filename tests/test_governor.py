"""The overhead governor: the account, slice length, cadence, always-tier share."""
from __future__ import annotations

import time

import pytest

from hypertrace.collector.governor import (
    FIXED_NS_PER_PROBE_OP,
    MEASURE_SLICE_S,
    Governor,
    measured_overhead,
)
from hypertrace.collector.schedule import MAX_CADENCE, slice_offset


def test_first_plan_is_a_short_measuring_slice_at_the_shared_offset():
    g = Governor(probe_cost_ns=8000, budget=0.005)
    p = g.plan(1234, 10.0)
    assert p.sampled and p.reason == "" and p.cadence == 1
    assert p.length_s == pytest.approx(MEASURE_SLICE_S)
    assert p.offset_s == slice_offset(1234, 10.0, 2.0, 1.0)


def test_low_rate_samples_every_window_at_the_longest_slice():
    g = Governor(probe_cost_ns=1000, budget=0.005)
    g.observe_slice(hits=400, attached_s=1.0)             # 0.04% load while attached
    plans = [g.plan(i, 10.0) for i in range(8)]
    assert all(p.sampled and p.cadence == 1 for p in plans)
    assert all(p.length_s == pytest.approx(2.0) for p in plans)   # max_slice_s


def test_cadence_and_length_follow_the_account():
    """2,000 firings/s at 8 us: 1.6% load while attached. A window earns 50 ms; a floor slice
    (1000 samples = 0.5 s) costs 8 ms + half a 0.1-s detach at that load: k = 1. At 20,000/s
    (16% load) the floor slice (0.05 s) costs 8 + 8 ms: still k = 1, but only a slice of
    (credit + earn) / load long."""
    g = Governor(probe_cost_ns=8000, budget=0.005)
    g.observe_slice(2000, 1.0)
    p = g.plan(0, 10.0)
    assert p.sampled and p.cadence == 1
    # afford = 0 + 0.05 s; length = 0.05 / 0.016 - 0.05 = 3.07 s -> capped at 2 s
    assert p.length_s == pytest.approx(2.0)
    g = Governor(probe_cost_ns=8000, budget=0.005)
    g.observe_slice(20_000, 1.0)
    p = g.plan(0, 10.0)
    assert p.sampled and p.length_s == pytest.approx(0.05 / 0.16 - 0.05)


def test_expensive_slices_get_a_power_of_two_cadence_and_off_windows_say_why():
    g = Governor(probe_cost_ns=8000, budget=0.005, min_samples=100_000)
    g.observe_slice(100_000, 1.0)                          # 80% load; floor slice = 1 s
    plans = [g.plan(i, 10.0) for i in range(64)]
    k = plans[0].cadence
    # floor cost = 0.8 * (1 + 0.05) = 0.84 s against 0.05 s per window -> 16.8 -> k = 32
    assert k == 32
    assert {p.reason for p in plans if p.index % k} == {"off_cadence"}
    assert plans[0].reason == "budget"                    # nothing saved up yet
    for _ in range(32):
        g.earn(10.0)
    p = g.plan(64, 10.0)
    assert p.sampled and 1.0 <= p.length_s <= 2.0


def test_budget_too_small_for_any_cadence_says_budget():
    g = Governor(probe_cost_ns=8000, budget=0.0001, min_samples=100_000)
    g.observe_slice(100_000, 1.0)
    p = g.plan(0, 10.0)
    assert not p.sampled and p.reason == "budget" and p.cadence == MAX_CADENCE + 1


def test_always_tier_cost_leaves_less_for_slices():
    g = Governor(probe_cost_ns=8000, budget=0.005, min_samples=10_000)
    g.observe_slice(20_000, 1.0)                           # 16% load, floor slice 0.5 s
    k0 = g.plan(0, 10.0).cadence
    g.observe_always(hits=5000, window_s=10.0)             # 0.4% of wall time: most of budget
    assert g.always_load == pytest.approx(0.004)
    k1 = g.plan(0, 10.0).cadence
    assert k1 > k0


def test_always_split_keeps_cheap_apis_within_the_share():
    g = Governor(probe_cost_ns=1000, budget=0.005, always_share=0.2)   # 0.1% allowance = 1000/s
    keep, demote = g.always_split({"hypertrace_step": 50, "cudaStreamSynchronize": 400,
                                   "cudaDeviceSynchronize": 800, "cudaGraphLaunch": 5000})
    assert keep == ["hypertrace_step", "cudaStreamSynchronize"]
    assert demote == ["cudaDeviceSynchronize", "cudaGraphLaunch"]
    assert g.always_split({}) == ([], [])


def test_rate_rises_at_once_and_falls_smoothly():
    g = Governor(probe_cost_ns=1000, budget=0.01, smoothing=0.5)
    g.observe_slice(10_000, 1.0)
    g.observe_slice(100_000, 1.0)
    assert g.rate_hz == 100_000
    g.observe_slice(10_000, 1.0)
    assert g.rate_hz == pytest.approx(55_000)
    g.observe_slice(0, 0.0)                                 # nothing attached: no news
    assert g.rate_hz == pytest.approx(55_000)
    with pytest.raises(ValueError, match="attached_s"):
        g.observe_slice(10, -1)


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="budget"):
        Governor(probe_cost_ns=5000, budget=5)
    with pytest.raises(ValueError, match="probe_cost_ns"):
        Governor(probe_cost_ns=float("nan"))
    with pytest.raises(ValueError, match="always_share"):
        Governor(probe_cost_ns=5000, always_share=-0.1)


def test_costs_and_measured_overhead_include_fixed_costs():
    g = Governor(probe_cost_ns=8000)
    assert g.cost_s(6250, probe_ops=0) == pytest.approx(0.05)
    assert g.cost_s(0, probe_ops=10) == pytest.approx(10 * FIXED_NS_PER_PROBE_OP * 1e-9)
    assert measured_overhead(8000, 6250, 10.0) == pytest.approx(0.005)
    assert measured_overhead(8000, 6250, 10.0, fixed_cost_s=0.01) == pytest.approx(0.006)


def test_account_keeps_long_run_overhead_under_budget_despite_expensive_detaches():
    """Slices that cost far more than planned (slow detach, bursts) are repaid by skipped
    windows: over many windows the spent probe time stays within the budget plus one slice."""
    g = Governor(probe_cost_ns=8000.0, budget=0.005)
    window_s, rate = 10.0, 50_000                          # 40% load while attached
    spent = 0.0
    sampled = 0
    worst = 0.0
    for i in range(2000):
        plan = g.plan(i, window_s)
        cost = 0.0
        if plan.sampled:
            sampled += 1
            hits = int(rate * (plan.length_s + 1.0))        # a 1-s detach the plan did not expect
            g.observe_slice(int(rate * plan.length_s), plan.length_s)
            cost = g.cost_s(hits, probe_ops=8)
            worst = max(worst, cost)
        g.earn(window_s)
        g.spend(cost)
        spent += cost
    assert sampled > 50                                    # it does keep sampling
    assert spent <= 0.005 * 2000 * window_s + worst


def test_governor_on_real_probes_plans_from_the_counted_rate(uprobe_session, fakecuda, tmp_path,
                                                              probe_cost_ns):
    """A worker launching 2,000 times/s (runtime launch with the driver launch inside, so 4,000
    probe firings/s): the slice the governor plans from what the probes counted costs what one
    window earns, at that rate. The worker runs from a private copy of the stand-ins (uprobes
    live on inodes: other tests probing the shared build must not meet these probes)."""
    import shutil
    from types import SimpleNamespace

    from conftest import Worker

    private = tmp_path / "fakecuda"
    private.mkdir()
    for f in (fakecuda.worker, fakecuda.cudart, fakecuda.cuda):
        shutil.copy2(f, private / f.name)
    rate = 2000
    w = Worker(SimpleNamespace(worker=private / fakecuda.worker.name), "--api", "launch",
               "--rate", str(rate), "--duration", "30", wait=True)
    try:
        try:                           # attached before its first call: every call is whole
            uprobe_session.attach(str(private / fakecuda.cudart.name), w.pid)
            uprobe_session.attach(str(private / fakecuda.cuda.name), w.pid)
        finally:
            w.go()                     # (a worker left waiting on stdin would not stop)
        uprobe_session.read_and_clear()
        t0 = time.monotonic()
        time.sleep(1.5)
        got = uprobe_session.read_and_clear()
        attached = time.monotonic() - t0
    finally:
        w.stop()
    hits = sum(s.probe_hits for (pid, _), s in got.items() if pid == w.pid)
    # The probes count every call exactly, so hits / attached is the true firing rate. A loaded
    # machine may pace the worker slower than asked: only a loose sanity check against the
    # nominal rate (no timing assertion); the governor math on it is exact.
    true_rate = hits / attached
    assert 0.3 * 2 * rate <= true_rate <= 1.5 * 2 * rate
    g = Governor(probe_cost_ns=probe_cost_ns, budget=0.005, detach_s=0.0)
    g.observe_slice(hits, attached)
    plan = g.plan(0, 10.0)
    load = probe_cost_ns * 1e-9 * true_rate
    assert plan.sampled
    assert plan.length_s == pytest.approx(min(2.0, 0.05 / load), rel=1e-9)


def test_slice_is_shortened_so_its_detach_ends_inside_the_window():
    """A slow detach (seconds on a loaded VM) should not overrun the window: the slice keeps its
    shared start and gets shorter, down to the floor (never refused: the detach time is only
    measured by detaching)."""
    g = Governor(probe_cost_ns=1000, budget=0.005, detach_s=0.1)
    g.observe_slice(4000, 1.0)                             # floor: 1000 samples = 0.25 s
    free = g.plan(5, 10.0)
    g.detach_s = 9.5 - free.offset_s - 0.5                 # leaves half a second before 9.5 s
    p = g.plan(5, 10.0)
    assert p.sampled and p.offset_s == free.offset_s
    assert p.length_s == pytest.approx(10.0 - free.offset_s - g.detach_s)
    g.detach_s = 10.0 - free.offset_s                     # nothing left: the floor slice
    p = g.plan(5, 10.0)
    assert p.sampled and p.length_s == pytest.approx(0.25)
