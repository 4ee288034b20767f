"""The scoring bench's compiled pass (sim/scoring_ref.c) flags exactly the GPUs the analyzer's
rules flag, and the bench reports the flush against it."""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.score.scoring import score_api
from hypertrace.sim.bench_scoring import bench_size, flag_mismatches
from hypertrace.sim.scoring_ref import ReferencePass
from hypertrace.sim.synthetic import job_windows, node_name


def _pending(slow: dict[str, float], nodes: int = 64, windows: int = 1, **kw):
    engine = Engine(ScoringConfig())
    for w in job_windows(nodes, 8, windows, slow=slow, seed=3, all_apis=True, **kw):
        engine.ingest(w)
    (acc,) = [a for job in engine._jobs.values() for a in job.pending.values()]
    return engine.config, acc


def _assert_same_as_score_api(cfg, acc):
    ref = ReferencePass(cfg).flags(acc)
    cs = acc.build()
    assert sorted(ref) == sorted(cs.apis)                     # every API, none extra
    for api, hists in cs.apis.items():
        sc = score_api(hists, cfg)
        values, high, low = ref[api]
        assert np.array_equal(values, sc.value_us.T, equal_nan=True), api
        assert np.array_equal(high, sc.high.T), api
        assert np.array_equal(low, sc.low.T), api
    assert flag_mismatches(acc, cfg, ref) == []
    return ref


def test_compiled_pass_flags_the_slow_nodes_gpus_as_the_analyzer_does():
    cfg, acc = _pending({node_name(42): 1.10})
    ref = _assert_same_as_score_api(cfg, acc)
    high = ref["cudaLaunchKernel"][1]
    assert np.array_equal(np.flatnonzero(high[0]), np.arange(42 * 8, 43 * 8))


def test_compiled_pass_rereads_the_fences_of_a_contaminated_cross_section():
    # 8 of 64 nodes slow: an eighth of the GPUs beyond the z cut, the quartiles read without them
    cfg, acc = _pending({node_name(i): 1.12 for i in range(8)})
    ref = _assert_same_as_score_api(cfg, acc)
    assert ref["cudaLaunchKernel"][1][0, :64].all()


def test_compiled_pass_merges_windows_and_skips_thin_gpus():
    # two windows per GPU in the epoch add up; a node with 30 calls per window stays unscored
    cfg, acc = _pending({node_name(5): 1.10}, windows=2, window_seconds=5.0,
                        samples_by_node={node_name(9): 10})
    ref = _assert_same_as_score_api(cfg, acc)
    assert np.isnan(ref["cudaLaunchKernel"][0][:, 9 * 8:10 * 8]).all()


def test_compiled_pass_refuses_a_cross_section_too_small_to_score():
    cfg, acc = _pending({}, nodes=1, samples=10)
    ref = _assert_same_as_score_api(cfg, acc)
    assert not any(h.any() or lo.any() for _, h, lo in ref.values())


def test_bench_reports_flush_time_over_the_compiled_pass():
    r = bench_size(512, 3, seed=1)
    assert r["c_ms_median"] > 0 and r["c_ratio"] > 0
    assert r["flag_mismatches"] == []
