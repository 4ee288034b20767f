"""Step inference: the marker first, else the most regular periodic call, else a reason."""
from __future__ import annotations

import numpy as np
import pytest

from hypertrace.collector.steps import infer_steps
from hypertrace.proto import buckets
from hypertrace.proto.wire import unpack_histogram

from hypertrace.collector.ebpf import PeriodicSample, ProcessStats


def _periodic(api: str, intervals_ns, wait_ns: int = 0, offcpu_ns: int = 0) -> PeriodicSample:
    v = np.asarray(intervals_ns, dtype=np.float64)
    busy = np.maximum(v - (wait_ns + offcpu_ns) / max(len(v), 1), 0)
    return PeriodicSample(api=api, intervals=buckets.histogram_of_ns(v),
                          busy=buckets.histogram_of_ns(busy), count=len(v),
                          interval_sum_ns=int(v.sum()), sync_wait_ns=wait_ns,
                          offcpu_wait_ns=offcpu_ns)


def _stats(*samples: PeriodicSample) -> ProcessStats:
    return ProcessStats(pid=7, sched=None, periodic={s.api: s for s in samples})


rng = np.random.default_rng(3)
STEP = 20e6 * (1 + 0.02 * rng.standard_normal(50))          # 20 ms steps, 2% jitter
SUBSTEP = STEP / 4


def test_marker_is_preferred_over_any_inferred_step():
    sync = _periodic("cudaStreamSynchronize", STEP, wait_ns=10**8)
    marker = _periodic("hypertrace_step", STEP[:10] * 1.1, wait_ns=5 * 10**7, offcpu_ns=10**6)
    inf = infer_steps(_stats(sync, marker))
    assert inf.source == "marker" and inf.steps == 10 and not inf.refused
    assert inf.gpu_wait_ns == 5 * 10**7 and inf.peer_wait_ns == 10**6
    step_time, steps = inf.to_proto()
    assert int(unpack_histogram(step_time).sum()) == 10
    assert steps.source == "marker" and steps.steps == 10
    assert steps.step_sum_us == pytest.approx(STEP[:10].sum() * 1.1 / 1e3, rel=1e-6)
    assert steps.gpu_wait_us == pytest.approx(5e4) and steps.peer_wait_us == pytest.approx(1e3)
    assert int(unpack_histogram(steps.busy_time).sum()) == 10


def test_too_few_markers_fall_back_to_inference():
    inf = infer_steps(_stats(_periodic("hypertrace_step", STEP[:2]),
                             _periodic("cudaStreamSynchronize", STEP)))
    assert inf.source == "inferred:cudaStreamSynchronize" and inf.steps == 50


def test_regular_call_with_the_longest_interval_is_the_step():
    # Four evenly spaced device syncs per step and one stream sync per step: the step is the
    # longer regular interval; an irregular call with an even longer median is not a clock.
    irregular = _periodic("cudaEventSynchronize", rng.uniform(5e6, 200e6, 40))
    inf = infer_steps(_stats(_periodic("cudaDeviceSynchronize", SUBSTEP),
                             _periodic("cudaStreamSynchronize", STEP), irregular))
    assert inf.source == "inferred:cudaStreamSynchronize"
    sub_only = infer_steps(_stats(_periodic("cudaDeviceSynchronize", SUBSTEP), irregular))
    assert sub_only.source == "inferred:cudaDeviceSynchronize"   # a sub-step still serves


def test_irregular_only_is_refused_naming_the_best_candidate():
    inf = infer_steps(_stats(_periodic("cudaEventSynchronize", rng.uniform(5e6, 200e6, 40)),
                             _periodic("cudaStreamSynchronize", rng.uniform(1e6, 100e6, 40))))
    assert inf.source == "" and inf.steps == 0
    assert "not regular enough" in inf.refused and "p90/p10" in inf.refused
    step_time, steps = inf.to_proto()
    assert steps.refused == inf.refused and not step_time.counts


def test_too_few_intervals_and_no_periodic_calls_are_refused_with_reasons():
    few = infer_steps(_stats(_periodic("cudaStreamSynchronize", STEP[:2])))
    assert few.source == "" and "cudaStreamSynchronize" in few.refused and "fewer than 3" in \
        few.refused
    none = infer_steps(_stats())
    assert none.source == "" and "no periodic calls" in none.refused
    assert "no periodic calls" in infer_steps(None).refused
    marker_few = infer_steps(_stats(_periodic("hypertrace_step", STEP[:2])))
    assert "step marker was called 2 times" in marker_few.refused


def test_thresholds_are_parameters():
    spread = _periodic("cudaStreamSynchronize", np.linspace(10e6, 25e6, 30))   # p90/p10 ~ 2
    assert infer_steps(_stats(spread)).source == ""
    assert infer_steps(_stats(spread), max_spread=3.0).source == "inferred:cudaStreamSynchronize"
    assert infer_steps(_stats(_periodic("x", STEP[:2])), min_steps=2).source == "inferred:x"
    with pytest.raises(ValueError):
        infer_steps(_stats(), min_steps=0)


def _spread_to(ratio: float, n: int = 41, step_ns: float = 20e6) -> np.ndarray:
    """Intervals whose p90/p10 is about ``ratio``: a step stretched unevenly by contention
    (the steps a hog preempted take longer, by varying amounts). Geometric spacing from 1 to
    R puts p10 at R**0.1 and p90 at R**0.9, so R = ratio**1.25."""
    v = step_ns * np.geomspace(1.0, ratio ** 1.25, n)
    return v[np.random.default_rng(5).permutation(n)]


def test_hysteresis_keeps_the_last_step_api_while_contention_spreads_its_intervals():
    # Window 1: a regular stream sync is the step; it is what the next window prefers.
    first = infer_steps(_stats(_periodic("cudaStreamSynchronize", STEP),
                               _periodic("cudaDeviceSynchronize", SUBSTEP)))
    assert first.source == "inferred:cudaStreamSynchronize"
    assert first.next_prefer == "cudaStreamSynchronize"
    # Window 2: a CPU hog stretches the same steps unevenly (p90/p10 ~ 2.5). A sub-step that
    # stayed regular does not take the step's place.
    hogged = _periodic("cudaStreamSynchronize", _spread_to(2.5))
    spread = buckets.quantiles_us(hogged.intervals, [0.1, 0.9])
    assert 2.0 < spread[1] / spread[0] < 3.0
    other = _periodic("cudaDeviceSynchronize", SUBSTEP)
    kept = infer_steps(_stats(hogged, other), prefer=first.next_prefer)
    assert kept.source == "inferred:cudaStreamSynchronize" and kept.steps == 41
    assert kept.next_prefer == "cudaStreamSynchronize" and not kept.refused
    assert kept.step_sum_ns == hogged.interval_sum_ns
    # Without the memory the strict rule refuses it (only the sub-step is regular).
    assert infer_steps(_stats(hogged)).source == ""
    assert infer_steps(_stats(hogged, other)).source == "inferred:cudaDeviceSynchronize"


def test_a_preferred_api_spread_past_the_sticky_bound_falls_back_with_a_reason():
    wild = _periodic("cudaStreamSynchronize", _spread_to(6.0))
    inf = infer_steps(_stats(wild), prefer="cudaStreamSynchronize")
    assert inf.source == "" and inf.steps == 0 and inf.next_prefer is None
    assert "cudaStreamSynchronize, the step of the last windows" in inf.refused
    assert "> 4" in inf.refused and "not regular enough" in inf.refused
    # Falling back means the strict rule, which may pick another regular API.
    other = infer_steps(_stats(wild, _periodic("cudaDeviceSynchronize", SUBSTEP)),
                        prefer="cudaStreamSynchronize")
    assert other.source == "inferred:cudaDeviceSynchronize"
    assert other.next_prefer == "cudaDeviceSynchronize"
    # The bound is a parameter; it may not be stricter than max_spread.
    assert infer_steps(_stats(wild), prefer="cudaStreamSynchronize",
                       sticky_spread=8.0).source == "inferred:cudaStreamSynchronize"
    with pytest.raises(ValueError, match="sticky_spread"):
        infer_steps(_stats(wild), sticky_spread=1.2)


def test_too_few_intervals_of_the_preferred_api_keep_the_memory():
    # A window holding fewer than min_steps of its intervals says nothing about its regularity.
    inf = infer_steps(_stats(_periodic("cudaStreamSynchronize", STEP[:2])),
                      prefer="cudaStreamSynchronize")
    assert inf.source == "" and "fewer than 3" in inf.refused
    assert inf.next_prefer == "cudaStreamSynchronize"
    assert infer_steps(_stats(), prefer="cudaStreamSynchronize").next_prefer == \
        "cudaStreamSynchronize"


def test_the_marker_beats_the_preferred_api():
    inf = infer_steps(_stats(_periodic("cudaStreamSynchronize", STEP),
                             _periodic("hypertrace_step", STEP[:10] * 1.1)),
                      prefer="cudaStreamSynchronize")
    assert inf.source == "marker" and inf.steps == 10
