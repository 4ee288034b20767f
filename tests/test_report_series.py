"""What the report carries for its pictures: a flagged node's signals per window against the
job's spread (analyzer/score/window_series.py), the what-if over job sizes (analyzer/report/whatif_curve.py),
the measured step, the per-GPU spike rates and the flagged GPUs' NVML context. Real windows
(the simulator) scored by the Engine."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hypertrace.analyzer.report import whatif_curve
from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score import theory, window_series
from hypertrace.analyzer.score.engine import Engine
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.simulate import SimConfig, Straggler, generate

SLOW = "node-0011"


def _report(cfg: SimConfig, touch=None) -> pb.JobReport:
    e = Engine()
    for w in generate(cfg):
        if touch is not None:
            touch(w)
        e.ingest(w)
    e.flush(None)
    return build_report(e).jobs[0]


@pytest.fixture(scope="module")
def job() -> pb.JobReport:
    return _report(SimConfig(gpus=256, windows=10, seed=3, stragglers=(Straggler(SLOW, 1.3),)))


def test_the_slow_nodes_signal_per_window_against_the_jobs_spread(job):
    node = job.nodes[0]
    assert node.node == SLOW and node.verdict == "straggler"
    lead = node.gpus[0].findings[0]
    s = node.series[0]
    assert (s.signal, s.stat, s.unit) == (lead.api, lead.stat, lead.unit)
    assert len(s.node) == len(job.history_windows)
    ratio = np.asarray(s.node) / np.asarray(s.job_median)
    assert np.all(np.abs(ratio - lead.ratio) < 0.1), ratio        # slow in every window
    assert np.all(np.asarray(s.job_p10) <= np.asarray(s.job_median))
    assert np.all(np.asarray(s.job_median) <= np.asarray(s.job_p90))
    assert np.all(np.asarray(s.job_p90) < np.asarray(s.node))      # outside the job's band
    # beside it, where its time per step went
    context = {x.signal: x for x in node.series[1:]}
    assert set(context) == {"sched.runq", "step.gpu_wait", "step.peer_wait"}
    assert context["sched.runq"].unit == "share"
    # a healthy node has none (nothing flagged it)
    assert not any(n.series for n in job.nodes if n.verdict == "healthy")


def test_a_node_is_recorded_from_the_window_it_is_first_flagged():
    records = [(1, 100.0, {}), (2, 100.0, {("x", "p50"): (1.0, 2.0, 3.0, {"a": 5.0})}),
               (3, 110.0, {("x", "p50"): (1.0, 2.0, 3.0, {"a": 6.0, "b": 2.5})})]
    mine, med, lo, hi = window_series.node_series([1, 2, 3], records, "a", ("x", "p50"))
    assert math.isnan(mine[0]) and mine[1:] == [5.0, 6.0]
    assert math.isnan(med[0]) and med[1:] == [2.0, 2.0] and lo[1:] == [1.0, 1.0]
    assert window_series.node_series([1, 2, 3], records, "c", ("x", "p50")) is None
    # the measured step weighs recent windows as the what-if does: 0.5 per window back
    assert window_series.measured_step_us(records, 0.5) == pytest.approx(
        (100 * 0.25 + 100 * 0.5 + 110) / 1.75)
    assert window_series.measured_step_us([(1, float("nan"), {})], 0.5) == 0.0


def test_the_what_if_curve_meets_the_exact_what_if_at_the_jobs_size(job):
    c = job.cluster
    at = {p.ranks: p for p in c.curve}
    assert 1 in at and job.gpus in at and max(at) == whatif_curve.REACH * job.gpus
    assert at[job.gpus].now_us == pytest.approx(c.step_time_now_us, rel=0.005)
    assert at[job.gpus].after_us == pytest.approx(c.step_time_after_eviction_us, rel=0.005)
    now = [p.now_us for p in c.curve]
    after = [p.after_us for p in c.curve]
    assert now == sorted(now) and after == sorted(after)          # more ranks, longer max
    assert all(a < b for a, b in zip(after, now))                 # evicting the slow node helps
    assert c.measured_step_us > 0
    assert 0.8 < c.measured_step_us / c.step_time_now_us < 1.25


def test_the_curve_pools_ranks_into_classes_and_keeps_the_exact_value():
    """More ranks than classes: the pooled curve still meets theory.what_if at N = R."""
    rng = np.random.default_rng(4)
    ranks, buckets = 300, 40
    centre = rng.normal(20, 1.5, size=ranks)
    centre[:8] += 6                                                  # eight slow ranks
    cols = np.arange(buckets)
    counts = np.exp(-0.5 * ((cols[None, :] - centre[:, None]) / 1.2) ** 2) * 1000
    evict = np.zeros(ranks, dtype=bool)
    evict[:8] = True
    shift = rng.uniform(0, 5e4, size=ranks)
    now, after = theory.what_if(counts, evict, shift, first_bucket=60)
    curve = {n: (a, b) for n, a, b in whatif_curve.what_if_curve(counts, evict, shift, 60)}
    assert curve[ranks][0] == pytest.approx(now, rel=0.005)
    assert curve[ranks][1] == pytest.approx(after, rel=0.005)
    # nothing to evict: one curve
    same = whatif_curve.what_if_curve(counts, np.zeros(ranks, dtype=bool), shift, 60)
    assert all(a == b for _, a, b in same)


def test_spike_rates_cover_every_gpu():
    job = _report(SimConfig(gpus=128, windows=8, seed=6, step_tail_prob=0.01,
                            mode="independent", stragglers=(Straggler(SLOW, 1.3),)))
    sr = job.spike_rates
    assert list(sr.upper)[:4] == pytest.approx([0.0, 0.001, 0.002, 0.005])
    assert sum(sr.gpus) == 128
    rates = [g.spike_rate for n in job.nodes for g in n.gpus]
    assert sr.mean == pytest.approx(np.mean(rates), rel=1e-6)
    assert sum(sr.gpus[1:]) == sum(1 for r in rates if r > 0)


def test_a_flagged_gpu_carries_its_nvml_context():
    def throttle(w: pb.NodeWindow) -> None:
        for p in w.processes:
            p.nvml.sm_clock_mhz = 1200 if w.node == SLOW else 1980
            p.nvml.max_sm_clock_mhz = 1980
            if w.node == SLOW:
                p.nvml.clock_event_reasons = 0x40        # hardware thermal slowdown

    job = _report(SimConfig(gpus=128, windows=8, seed=2, stragglers=(Straggler(SLOW, 1.3),)),
                  throttle)
    slow = next(n for n in job.nodes if n.node == SLOW)
    assert all(g.nvml.sm_clock_mhz == 1200 and g.nvml.clock_event_reasons == 0x40
               for g in slow.gpus if g.verdict == "straggler")
    assert not any(g.HasField("nvml") for n in job.nodes if n.verdict == "healthy"
                   for g in n.gpus)
    from hypertrace.analyzer.report.report_html import report_to_html
    rep = pb.Report()
    rep.jobs.append(job)
    page = report_to_html(rep)
    assert "1200 of 1980 MHz" in page and "hardware thermal slowdown" in page
