"""The scoring bench's numpy floor scores what the analyzer scores, and the bench reports the
flush against it."""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.sim.bench_scoring import bench_size
from hypertrace.sim.scoring_floor import floor_flags, raw_histograms
from hypertrace.sim.synthetic import job_windows, node_name


def _pending(gpus_per_node: int = 8, nodes: int = 64):
    engine = Engine(ScoringConfig())
    for w in job_windows(nodes, gpus_per_node, 1, slow={node_name(42): 1.10}, seed=3,
                         all_apis=True):
        engine.ingest(w)
    (acc,) = [a for job in engine._jobs.values() for a in job.pending.values()]
    return engine, acc


def test_floor_flags_the_slow_nodes_gpus_on_p50_of_every_launch_api():
    engine, acc = _pending()
    flags = floor_flags(acc, engine.config)
    assert len(flags) == 10 == len(raw_histograms(acc))       # every API an agent sends
    slow = np.arange(42 * 8, 43 * 8)
    for api in ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch"):
        high, low = flags[api]
        assert high.shape == (2, 512)                         # (stats, GPUs): p50, p99
        assert np.array_equal(np.flatnonzero(high[0]), slow)


def test_floor_reads_the_same_quantiles_as_the_cross_section():
    """Its inputs are the analyzer's: the p50 it flags on is the cross-section's p50 (checked
    through the flags: a GPU flagged by the floor is beyond the cross-section's own fence)."""
    engine, acc = _pending()
    cs = acc.build()
    q = cs.apis["cudaLaunchKernel"].quantiles_us([0.5])[:, 0]
    high = floor_flags(acc, engine.config)["cudaLaunchKernel"][0][0]
    q1, q3 = np.percentile(q, [25.0, 75.0])
    assert (q[high] > q3 + engine.config.iqr_k * (q3 - q1)).all()


def test_bench_reports_flush_time_over_the_floor():
    r = bench_size(512, 3, seed=1)
    assert r["floor_ms_median"] > 0 and r["floor_ratio"] > 0
    assert r["stragglers"] == r["slow"] == [node_name(42)]


def test_bench_expects_every_copy_of_the_slow_node_when_the_pool_is_reused():
    # 96 nodes from a pool of 48: node 42 and its copy, node 90, are both slow
    r = bench_size(96 * 8, 4, seed=1, pool_size=48)
    assert r["slow"] == [node_name(42), node_name(90)]
    assert r["stragglers"] == r["slow"]


def test_bench_times_the_rules_that_wait_for_the_last_window_only_when_asked():
    assert bench_size(512, 2, seed=1)["rules_ms_median"] is None
    r = bench_size(512, 2, seed=1, rules=True)
    assert r["rules_ms_median"] > 0
