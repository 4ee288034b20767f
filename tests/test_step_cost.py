"""The in-place measure of what the probes cost a process's steps (collector/step_cost.py)."""
import pytest

from hypertrace.collector.step_cost import StepCostMeter

MS = 1_000_000


def _feed(meter: StepCostMeter, windows: int, *, touched_steps: int, rest_steps: int,
          touched_ms: float, rest_ms: float, touched_s: float, window_s: float = 10.0,
          source: str = "inferred:cudaStreamSynchronize") -> None:
    for _ in range(windows):
        whole = (touched_steps + rest_steps,
                 int(touched_steps * touched_ms * MS + rest_steps * rest_ms * MS))
        meter.observe(source, whole, (touched_steps, int(touched_steps * touched_ms * MS)),
                      touched_s, window_s)


def test_excess_of_touched_steps_times_touched_share():
    m = StepCostMeter()
    # Steps the slice touched are 2% longer; the slice touched 1 s of every 10-s window.
    _feed(m, 5, touched_steps=40, rest_steps=360, touched_ms=25.5, rest_ms=25.0, touched_s=1.0)
    assert m.sliced_fraction() == pytest.approx(0.02 * 0.1, rel=1e-9)


def test_windows_without_a_slice_dilute_the_touched_share():
    m = StepCostMeter(decay=1.0)
    _feed(m, 1, touched_steps=40, rest_steps=360, touched_ms=25.5, rest_ms=25.0, touched_s=1.0)
    _feed(m, 3, touched_steps=0, rest_steps=400, touched_ms=0.0, rest_ms=25.0, touched_s=0.0)
    # One second touched in 40 s of windows.
    assert m.sliced_fraction() == pytest.approx(0.02 * 1.0 / 40.0, rel=1e-3)


def test_no_figure_until_enough_touched_steps():
    m = StepCostMeter(min_steps=20)
    _feed(m, 1, touched_steps=10, rest_steps=390, touched_ms=30.0, rest_ms=25.0, touched_s=0.5)
    assert m.sliced_fraction() is None
    _feed(m, 1, touched_steps=12, rest_steps=390, touched_ms=30.0, rest_ms=25.0, touched_s=0.5)
    assert m.sliced_fraction() is not None


def test_steps_with_slack_lose_nothing_and_noise_below_zero_counts_as_zero():
    m = StepCostMeter()
    _feed(m, 5, touched_steps=40, rest_steps=360, touched_ms=24.9, rest_ms=25.0, touched_s=1.0)
    assert m.sliced_fraction() == 0.0


def test_a_new_step_source_restarts_the_sums():
    m = StepCostMeter()
    _feed(m, 5, touched_steps=40, rest_steps=360, touched_ms=30.0, rest_ms=25.0, touched_s=1.0)
    _feed(m, 1, touched_steps=5, rest_steps=100, touched_ms=10.0, rest_ms=10.0, touched_s=1.0,
          source="marker")
    assert m.source == "marker" and m.touched_n == 5
    assert m.sliced_fraction() is None          # the old source's 200 touched steps are gone


def test_older_windows_fade():
    m = StepCostMeter(decay=0.5, min_steps=1)
    _feed(m, 1, touched_steps=40, rest_steps=360, touched_ms=50.0, rest_ms=25.0, touched_s=1.0)
    _feed(m, 20, touched_steps=40, rest_steps=360, touched_ms=25.25, rest_ms=25.0, touched_s=1.0)
    assert m.sliced_fraction() == pytest.approx(0.01 * 0.1, rel=1e-3)


def test_touched_counts_are_clamped_to_the_window():
    m = StepCostMeter(min_steps=1)
    # A bracket read can only see steps inside the window; a stale or racing read must not
    # produce negative "rest" steps.
    m.observe("x", (10, 10 * 25 * MS), (15, 15 * 26 * MS), 1.0, 10.0)
    assert m.rest_n == 0 and m.touched_n == 10
