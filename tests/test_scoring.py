"""Scoring rules on hand-made cross-sections: robust z, MAD = 0, Tukey fences, effect size,
minimum samples, both tails, per-kind and per-job comparison."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ConfigError, ScoringConfig
from hypertrace.analyzer.score.cross_section import Hists
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.score.scoring import (
    HOST_FENCE_MIN,
    MAX_HOST_ALLOWANCE,
    HostLayout,
    host_allowance,
    host_medians,
    implicates,
    node_weights,
    sampling_se_us,
    score_hosts,
    score_values,
)
from hypertrace.proto import buckets, wire
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.settings import load_settings
from hypertrace.sim.synthetic import job_windows

CFG = ScoringConfig()
ENOUGH = np.full(1, 1000)


def _score(values: list[float], cfg: ScoringConfig = CFG, count: int = 1000):
    v = np.asarray(values, dtype=float)[:, None]
    return score_values(v, np.full(v.shape[0], count), cfg, ("p50",))


def test_robust_z_is_0_6745_times_deviation_over_mad():
    vals = [10.0, 10.2, 9.8, 10.4, 9.6, 10.0, 10.1, 9.9, 13.0]
    sc = _score(vals)
    med = np.median(vals)
    mad = np.median(np.abs(np.asarray(vals) - med))
    assert sc.median_us[0] == pytest.approx(med)
    assert sc.robust_z[-1, 0] == pytest.approx(0.6745 * (13.0 - med) / mad)
    assert sc.high[-1, 0] and not sc.high[:-1].any() and not sc.low.any()


def test_identical_values_mad_zero_flags_nothing_and_never_divides_by_zero():
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # a division by zero would warn
        sc = _score([10.0] * 64)
    assert np.all(sc.robust_z == 0.0)
    assert not sc.high.any() and not sc.low.any()


def test_mad_zero_still_flags_a_real_outlier_through_the_floor():
    sc = _score([10.0] * 63 + [11.0])                 # MAD = 0, one GPU 10% slower
    assert np.isfinite(sc.robust_z).all()
    assert sc.high[-1, 0] and sc.high.sum() == 1


def test_minimum_effect_size_blocks_tiny_but_significant_deviations():
    rng = np.random.default_rng(0)
    # 4% off a very tight cross-section: z = 5.4 even on the MAD floor (0.5% of the median),
    # far beyond the z cut, but below the 5% minimum effect.
    tight = list(10.0 + rng.normal(0, 0.001, 99)) + [10.4]
    sc = _score(tight)
    assert sc.robust_z[-1, 0] > 5
    assert not sc.high.any()
    loose = ScoringConfig(min_effect=0.03)
    assert _score(tight, loose).high[-1, 0]


def test_host_allowance_is_standard_errors_of_a_host_median_read_within_hosts():
    # 64 hosts of 8 GPUs; within each host the GPUs spread by sd 0.8% of the median, the hosts
    # themselves by 3% (persistent): the allowance follows the within-host noise only
    rng = np.random.default_rng(5)
    host_off = np.repeat(rng.normal(0.0, 0.03, 64), 8)
    v = (10.0 * (1.0 + host_off + rng.normal(0.0, 0.008, 512)))[:, None]
    layout = HostLayout.of(np.repeat(np.arange(64), 8))
    ok = np.ones(512, dtype=bool)
    a = host_allowance(v, ok, layout, np.array([10.0]), CFG)[0]
    se = 1.2533 * 0.008 / np.sqrt(8)
    assert a == pytest.approx(CFG.host_effect_sigmas * se, rel=0.25)
    # noisier GPUs: capped, so a host under 4% slow is never convicted as a host
    noisy = (10.0 * (1.0 + rng.normal(0.0, 0.05, 512)))[:, None]
    assert host_allowance(noisy, ok, layout, np.array([10.0]), CFG)[0] == MAX_HOST_ALLOWANCE
    assert host_allowance(v, ok, layout, np.array([10.0]),
                          ScoringConfig(host_effect_sigmas=0.0))[0] == 0.0


def test_single_gpus_keep_the_plain_min_effect_gate():
    # 4.5% off a tight cross-section: far beyond the z cut, under the 5% gate of single GPUs
    rng = np.random.default_rng(1)
    sc = _score(list(10.0 + rng.normal(0, 0.001, 99)) + [10.45])
    assert sc.robust_z[-1, 0] > 5 and sc.effect_gate[0] == pytest.approx(0.05)
    assert not sc.high[-1, 0]


def _hosts(n_hosts: int, gpus: int, sigma_host: float, seed: int, slow: float = 0.0):
    """GPU p50s of n_hosts x gpus: host jitter sigma_host, GPU noise 0.5%; with ``slow``, host 0
    sits exactly ``slow`` above the median host."""
    rng = np.random.default_rng(seed)
    host = np.exp(rng.normal(0, sigma_host, n_hosts))
    if slow:
        host[0] = np.median(host) * (1.0 + slow)
    v = 10.0 * np.repeat(host, gpus) * np.exp(rng.normal(0, 0.005, n_hosts * gpus))
    return v[:, None], HostLayout.of(np.repeat(np.arange(n_hosts), gpus))


def test_host_medians_are_the_median_of_each_hosts_scored_gpus():
    v = np.array([[1.0], [5.0], [3.0], [10.0], [20.0], [np.nan]])
    layout = HostLayout.of(np.array([7, 7, 7, 2, 2, 2]))        # host codes in any order
    med, n = host_medians(v, np.array([True, True, True, True, True, False]), layout)
    by_host = dict(zip(layout.host[[0, 3]].tolist(), [0, 1]))
    assert med[layout.host[0], 0] == 3.0 and med[layout.host[3], 0] == 15.0
    assert n[layout.host[0]] == 3 and n[layout.host[3]] == 2 and len(by_host) == 2


def test_full_host_grid_gives_the_same_host_medians_scores_and_allowance_as_the_scatter():
    # GPUs listed host by host, 8 each: the grid is the values reshaped (HostLayout.full);
    # with the scatter path forced, every number must be the same
    rng = np.random.default_rng(5)
    v = np.exp(rng.normal(2.0, 0.05, (2, 512))).T                 # (G, S) view, as scored
    full = HostLayout.of(np.repeat(np.arange(64), 8))
    scatter = dataclasses.replace(full, full=False)
    assert full.full and not HostLayout.of(np.array([3, 1, 3, 1])).full
    for scored in (np.ones(512, dtype=bool), np.arange(512) % 37 != 0):
        for a, b in zip(host_medians(v, scored, full), host_medians(v, scored, scatter)):
            assert np.array_equal(a, b, equal_nan=True)
        med = np.median(v[scored], axis=0)
        assert np.array_equal(host_allowance(v, scored, full, med, CFG),
                              host_allowance(v, scored, scatter, med, CFG))
        (hs_full, of_full), (hs_scatter, of_scatter) = (
            score_hosts(v, scored, lay, CFG, CFG.stats) for lay in (full, scatter))
        assert np.array_equal(of_full, of_scatter)
        for name in ("value_us", "median_us", "mad_us", "effect_gate", "robust_z", "high",
                     "low"):
            assert np.array_equal(getattr(hs_full, name), getattr(hs_scatter, name),
                                  equal_nan=True), name


def test_a_host_measured_under_min_effect_is_flagged_through_its_median():
    # host 0 is 4.7% slower than the job (a 5% host whose measurement took 0.3%): no single GPU
    # passes the plain 5% gate reliably, but its median clears 5% less 2.5 standard errors of a
    # host median (GPU noise 0.5%: ~4.45%)
    v, layout = _hosts(256, 8, 0.006, seed=3, slow=0.047)
    cnt = np.full(v.shape[0], 1000)
    gpu = score_values(v, cnt, CFG, ("p50",))
    hs, of_gpu = score_hosts(v, gpu.scored, layout, CFG, ("p50",))
    assert hs.high[layout.host[0], 0]
    assert hs.high[of_gpu].sum() == 8                        # maps onto host 0's 8 GPUs
    assert 0.04 < hs.effect_gate[0] < 0.047 < CFG.min_effect
    plain = ScoringConfig(host_effect_sigmas=0.0)
    assert not score_hosts(v, gpu.scored, layout, plain, ("p50",))[0].high[layout.host[0], 0]


def test_healthy_hosts_of_a_large_job_are_not_flagged():
    for seed in range(5):
        v, layout = _hosts(2048, 8, 0.006, seed=seed)
        gpu = score_values(v, np.full(v.shape[0], 1000), CFG, ("p50",))
        hs, _ = score_hosts(v, gpu.scored, layout, CFG, ("p50",))
        assert not hs.high.any() and not hs.low.any()


def test_a_few_hosts_are_not_fenced_so_a_naturally_slow_neighbour_cannot_hide_a_slow_host():
    # 8 hosts (a 64-GPU job): one 5.6% slow, one naturally 3.5% slow, the rest within -1..+1.5%.
    # Q3 of eight values leans on the 3.5% host, so Q3 + 1.5 IQR lands near +6% and the fence
    # alone would hide the slow host, which the z cut and the effect gate both see.
    host = np.array([1.056, 1.035, 1.015, 1.0, 0.998, 0.995, 0.992, 0.99])
    v = 10.0 * np.repeat(host, 8)[:, None]
    layout = HostLayout.of(np.repeat(np.arange(8), 8))
    gpu = score_values(v, np.full(64, 1000), CFG, ("p50",))
    hs, _ = score_hosts(v, gpu.scored, layout, CFG, ("p50",))
    assert hs.high[layout.host[0], 0] and hs.high.sum() == 1
    x = np.sort(host)
    q1, q3 = np.percentile(x, [25, 75])
    assert host[0] / np.median(host) < q3 + CFG.iqr_k * (q3 - q1)        # the fence would hide it
    # the effect gate still holds: a host 3% high among tight hosts is a z outlier, not flagged
    calm = np.array([1.03, 1.01, 1.002, 1.0, 0.999, 0.998, 0.997, 0.996])
    v2 = 10.0 * np.repeat(calm, 8)[:, None]
    hs2, _ = score_hosts(v2, np.ones(64, bool), layout, CFG, ("p50",))
    assert hs2.robust_z[layout.host[0], 0] > CFG.z_threshold and not hs2.high.any()
    # from HOST_FENCE_MIN hosts on, the fence applies again
    many = np.concatenate([host, np.tile(host[2:], 5)])
    v3 = 10.0 * np.repeat(many, 8)[:, None]
    lay3 = HostLayout.of(np.repeat(np.arange(many.size), 8))
    assert many.size >= HOST_FENCE_MIN
    hs3, _ = score_hosts(v3, np.ones(v3.shape[0], bool), lay3, CFG, ("p50",))
    q1, q3 = np.percentile(many, [25, 75])
    assert hs3.high[lay3.host[0], 0] == (1.056 / np.median(many) > q3 + CFG.iqr_k * (q3 - q1))


def test_hosts_with_too_few_scored_gpus_are_not_scored():
    v, layout = _hosts(64, 2, 0.006, seed=4, slow=0.2)      # 2 GPUs per host, under host_min_gpus
    gpu = score_values(v, np.full(v.shape[0], 1000), CFG, ("p50",))
    hs, _ = score_hosts(v, gpu.scored, layout, CFG, ("p50",))
    assert not hs.scored.any() and not hs.high.any()


def test_tukey_fence_vetoes_values_inside_a_wide_interquartile_range():
    # median 10 with MAD 0 (60% of GPUs identical) but a wide upper quartile: 12 has a huge z,
    # yet lies inside Q3 + 1.5 IQR, so it is part of the spread, not an outlier.
    vals = [10.0] * 60 + list(np.linspace(10.0, 13.0, 40)) + [12.0]
    sc = _score(vals)
    assert sc.robust_z[-1, 0] > CFG.z_threshold
    assert not sc.high[-1, 0]


def test_both_tails_are_scored():
    vals = [100.0 + d for d in np.linspace(-1, 1, 40)] + [60.0, 140.0]
    sc = _score(vals)
    assert sc.low[-2, 0] and not sc.high[-2, 0]
    assert sc.high[-1, 0] and not sc.low[-1, 0]


def test_tail_meaning_per_api_kind():
    assert implicates("launch", "high") and not implicates("launch", "low")
    assert not implicates("sync", "low") and not implicates("sync", "high")   # support only
    assert implicates("other", "high") and not implicates("other", "low")
    assert CFG.api_kind("cudaLaunchKernel") == "launch"
    assert CFG.api_kind("cuStreamSynchronize") == "sync"
    assert CFG.api_kind("cudaMemcpyAsync") == "other"


def test_too_few_samples_are_not_scored():
    sc = score_values(np.array([[10.0]] * 20 + [[20.0]]), np.array([1000] * 20 + [10]), CFG,
                      ("p50",))
    assert not sc.scored[-1] and not sc.high[-1].any()
    assert np.isnan(sc.robust_z[-1, 0])


def test_cross_section_smaller_than_min_gpus_is_not_scored():
    sc = _score([10.0, 10.0, 30.0])
    assert not sc.scored.any() and not sc.high.any()


def test_sampling_error_floor_calms_a_sparse_tail():
    # p99 of 1,000 lognormal calls: few calls in a wide bucket -> large SE; p50 -> small SE.
    rng = np.random.default_rng(1)
    h = buckets.histogram_of_ns(rng.lognormal(np.log(10_000), 0.3, 1000)).astype(float)[None]
    q = buckets.quantiles_us(h, [0.5, 0.99])
    se = sampling_se_us(Hists(h.T.copy(), 0), q, ("p50", "p99"))
    assert se[0, 0] / q[0, 0] < 0.03
    assert se[0, 1] / q[0, 1] > 0.02
    assert se[0, 1] / q[0, 1] > 2 * se[0, 0] / q[0, 0]


# ---- through the Engine: per job, per kind, insufficient data ------------------------------

def _engine_with(windows: list[pb.NodeWindow], cfg: ScoringConfig = CFG) -> Engine:
    e = Engine(cfg)
    for w in windows:
        wire.validate_window(w)
        e.ingest(w)
    e.flush(None)
    return e


def _verdicts(e: Engine, job: str) -> dict[tuple[str, str], str]:
    rep = build_report(e, job, now_ns=0)
    return {(n.node, g.gpu): g.verdict for n in rep.jobs[0].nodes for g in n.gpus}


def test_jobs_are_scored_separately():
    fast = job_windows(8, 4, 4, job_id="fast", launch_us=10.0, seed=1)
    slow = job_windows(8, 4, 4, job_id="slow", launch_us=30.0, seed=2)
    e = _engine_with(fast + slow)
    for job in ("fast", "slow"):
        assert set(_verdicts(e, job).values()) <= {"healthy", "suspect"}
        assert "straggler" not in _verdicts(e, job).values()


def test_gpu_kinds_are_scored_separately():
    h200 = job_windows(8, 4, 4, gpu_kind="NVIDIA H200", seed=3)
    a100 = job_windows(8, 4, 4, gpu_kind="NVIDIA A100", launch_us=14.0, seed=4,
                       slow={"node-0003": 1.3})
    for w in a100:                                   # same job, other nodes
        w.node = w.node.replace("node-", "a100-")
        w.agent_id += "-a100"
    e = _engine_with(h200 + a100)
    v = _verdicts(e, "job-1")
    stragglers = {k[0] for k, x in v.items() if x == "straggler"}
    assert stragglers == {"a100-0003"}               # the slower kind as a whole is not flagged


def test_insufficient_samples_give_insufficient_data():
    ws = job_windows(8, 4, 3, samples_by_node={"node-0005": 10}, slow={"node-0005": 1.5}, seed=5)
    e = _engine_with(ws)
    v = _verdicts(e, "job-1")
    assert {x for k, x in v.items() if k[0] == "node-0005"} == {"insufficient_data"}
    assert {x for k, x in v.items() if k[0] != "node-0005"} <= {"healthy", "suspect"}
    rep = build_report(e, "job-1", now_ns=0)
    node = next(n for n in rep.jobs[0].nodes if n.node == "node-0005")
    assert node.verdict == "insufficient_data" and node.scope == ""


def test_config_validation_and_toml(tmp_path):
    with pytest.raises(ConfigError, match="persist_k"):
        ScoringConfig(persist_k=6, persist_n=5)
    with pytest.raises(ConfigError, match="host_effect_sigmas"):
        ScoringConfig(host_effect_sigmas=-1.0)
    with pytest.raises(ConfigError, match="host_min_gpus"):
        ScoringConfig(host_min_gpus=1)
    with pytest.raises(ConfigError, match="unknown scoring setting"):
        ScoringConfig.from_mapping({"z_treshold": 3})
    f = tmp_path / "a.toml"
    f.write_text("[scoring]\nz_threshold = 4.0\nmin_samples = 20\n")
    cfg = load_settings(ScoringConfig, f, {"min_samples": 30})
    assert cfg.z_threshold == 4.0 and cfg.min_samples == 30
    f.write_text("z_threshold = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(ScoringConfig, f)


def test_bucket_major_quantiles_equal_the_reference():
    """The scorer's quantile kernel (bucket-major, compact range) equals buckets.quantiles_us."""
    rng = np.random.default_rng(2)
    dense = np.zeros((300, buckets.NUM_BUCKETS))
    for i in range(300):
        n = int(rng.integers(1, 3000))
        sample = rng.lognormal(rng.uniform(8, 16), rng.uniform(0.01, 2), n)
        dense[i] = buckets.histogram_of_ns(sample)
    dense[::17] = 0.0                                      # empty GPUs give NaN in both
    qs = [0.0, 0.01, 0.5, 0.9, 0.99, 1.0]
    nz = np.flatnonzero(dense.sum(axis=0))
    lo, hi = nz[0], nz[-1] + 1
    ours = Hists(np.ascontiguousarray(dense[:, lo:hi].T), int(lo)).quantiles_us(qs)
    np.testing.assert_allclose(ours, buckets.quantiles_us(dense, qs), rtol=1e-12)
    assert np.isnan(ours[::17]).all()


def test_a_host_whose_p99_spikes_gets_no_allowance():
    # host 0's p50 is 4.7% up AND its p99 is 3x the hosts' (a second mode: cold reads, a GC
    # pause): the p50 shift is the mixture's doing, so the host keeps the plain 5% gate
    v, layout = _hosts(256, 8, 0.006, seed=3, slow=0.047)
    p99 = v * 3.0
    p99[layout.host == layout.host[0]] *= 3.0
    both = np.hstack([v, p99])
    stats = ("p50", "p99")
    gpu = score_values(both, np.full(both.shape[0], 1000), CFG, stats)
    hs, _ = score_hosts(both, gpu.scored, layout, CFG, stats)
    assert not hs.high[layout.host[0], 0]                    # p50: no allowance this window
    assert hs.high[layout.host[0], 1]                        # the p99 spike itself is reported
    calm = np.hstack([v, v * 3.0])
    hs2, _ = score_hosts(calm, gpu.scored, layout, CFG, stats)
    assert hs2.high[layout.host[0], 0]                       # same p50 without the spike: flagged


def test_absolute_gate_replaces_the_relative_effect_for_shares_near_zero():
    """A run-queue share of 3% against a 0.2% median is 15x "slower" but under a 5%-of-wall-time
    gate; 40% passes it. The relative gate alone would flag both."""
    from hypertrace.analyzer.score.scoring import score_values

    cfg = ScoringConfig()
    base = np.array([0.002, 0.0021, 0.0019, 0.002, 0.0022, 0.0018, 0.002])
    for share, flagged in ((0.03, False), (0.4, True)):
        x = np.append(base, share)[:, None]
        count = np.full(x.shape[0], cfg.min_samples)
        relative = score_values(x, count, cfg, ("share",))
        absolute = score_values(x, count, cfg, ("share",), absolute_gate=cfg.min_effect)
        assert relative.high[-1, 0]
        assert bool(absolute.high[-1, 0]) is flagged
        assert not absolute.high[:-1].any()


def test_a_quarter_of_the_gpus_slow_does_not_hide_behind_the_fence():
    """Two slow nodes of eight: 25% of the values form a cluster 9-20% up. Q3 sits inside it,
    so Q3 + 1.5 IQR would cover the whole cluster; the quartiles are re-read without the values
    beyond the z cut, and both clusters are flagged."""
    rng = np.random.default_rng(2)
    vals = list(10.0 * (1 + rng.normal(0, 0.01, 48))) + [10.9] * 8 + [12.0] * 8
    sc = _score(vals)
    assert sc.high[48:, 0].all() and not sc.high[:48, 0].any()


def test_sorted_percentiles_and_median_are_numpys_bit_for_bit():
    """The one-sort quantiles the scorer reads equal np.percentile / np.median exactly, for
    every sample size (odd, even, one value) and with ties (quantized histogram reads)."""
    from hypertrace.analyzer.score.scoring import sorted_median, sorted_percentiles
    rng = np.random.default_rng(3)
    for n in list(range(1, 40)) + [255, 256, 2048, 16383]:
        for tied in (False, True):
            x = rng.lognormal(2.0, 0.3, (2, n))
            if tied:
                x = np.round(x, 1)
            xs = np.sort(x, axis=1)
            want = np.percentile(x, [25.0, 50.0, 75.0], axis=1)
            assert np.array_equal(sorted_percentiles(xs, (0.25, 0.5, 0.75)), want)
            dev = np.sort(np.abs(x - want[1][:, None]), axis=1)
            assert np.array_equal(sorted_median(dev),
                                  np.median(np.abs(x - want[1][:, None]), axis=1))


def test_quantile_bucket_search_counts_the_buckets_below_the_target():
    """The binary search behind Hists.quantiles_us finds, per column, how many cumulative
    counts lie below the target (capped at K - 1), as a full comparison would."""
    from hypertrace.analyzer.score.cross_section import _first_reaching
    rng = np.random.default_rng(5)
    for k in (1, 2, 3, 7, 8, 9, 38, 64, 226):
        counts = rng.integers(0, 3, (k, 500)).astype(np.float64)
        counts[:, :50] = 0.0                             # empty columns
        cum = np.cumsum(counts, axis=0)
        for q in (0.0, 0.1, 0.5, 0.99, 1.0, 1.5):
            t = cum[-1] * q
            want = np.minimum((cum < t).sum(axis=0), k - 1)
            got = _first_reaching(cum.ravel(), k, 500, np.arange(500), t)
            assert np.array_equal(got, want)


def test_far_count_equals_counting_every_robust_z():
    """The binary-search count of values beyond the z cut (behind the fence re-read) equals
    the full count, at ties, at the cut and with most values beyond it."""
    from hypertrace.analyzer.score.scoring import _far_count
    rng = np.random.default_rng(9)
    for n in (1, 2, 5, 32, 1000):
        for spread in (0.0, 0.01, 1.0, 30.0):
            row = np.sort(np.round(rng.normal(10.0, spread, n), 2))
            med, mad = float(np.median(row)), max(float(np.median(np.abs(row - np.median(row)))),
                                                   1e-9)
            # the cut's own values too: 3.5 MADs from the median sit exactly at +-z 3.5
            for z_cut in (0.0, 1.0, 3.5, float(np.abs(0.6745 * (row[-1] - med) / mad))):
                want = int((np.abs(0.6745 * (row - med) / mad) > z_cut).sum())
                assert _far_count(row, np.float64(med), np.float64(mad), z_cut) == want


def test_sampling_se_from_the_quantiles_buckets_equals_the_full_search():
    """The bucket each quantile was read from, checked and searched only where the value lies
    outside it, gives the same standard errors as the search over every edge (values at a
    bucket's upper edge, empty GPUs, single-bucket histograms included)."""
    rng = np.random.default_rng(0)
    for _ in range(100):
        g, k = int(rng.integers(1, 2000)), int(rng.integers(1, 40))
        first = int(rng.integers(0, 226 - k))
        counts = rng.integers(0, 5, size=(k, g)).astype(float) * (rng.random((k, g)) < 0.5)
        h = Hists(counts, first)
        q, near = h.quantiles_and_buckets([0.5, 0.99])
        assert np.array_equal(sampling_se_us(h, q, ("p50", "p99")),
                              sampling_se_us(h, q, ("p50", "p99"), near), equal_nan=True)


def test_quantile_bucket_search_outside_the_sampled_bracket():
    """Columns whose quantile lies outside the buckets the sampled columns bracket (a slow
    GPU, an empty one, between the sampled ones) get the same bucket as a full comparison."""
    from hypertrace.analyzer.score.cross_section import BRACKET_SAMPLE, _first_reaching
    rng = np.random.default_rng(6)
    g, k = 50 * BRACKET_SAMPLE, 40
    counts = np.zeros((k, g))
    counts[18:22] = rng.integers(0, 50, (4, g))        # a job's GPUs within four buckets
    odd = rng.choice(np.flatnonzero(np.arange(g) % 50), 40, replace=False)  # never sampled
    counts[:, odd[:20]] = np.roll(counts[:, odd[:20]], 12, axis=0)          # slow
    counts[:, odd[20:30]] = np.roll(counts[:, odd[20:30]], -15, axis=0)     # fast
    counts[:, odd[30:]] = 0.0                                               # empty
    cum = np.cumsum(counts, axis=0)
    for q in (0.0, 0.01, 0.5, 0.99, 1.0, 1.5):
        t = cum[-1] * q
        want = np.minimum((cum < t).sum(axis=0), k - 1)
        assert np.array_equal(_first_reaching(cum.ravel(), k, g, np.arange(g), t), want)


def test_a_job_whose_last_host_has_fewer_gpus_is_scored():
    # Hosts listed in order with only the last one short (a node with fewer GPUs, or a GPU's
    # window missing this epoch) is not a full (hosts, slots) grid: scoring must not reshape it
    layout = HostLayout.of(np.array([0] * 8 + [1] * 4))
    assert not layout.full
    windows = job_windows(3, 8, 3, seed=11)
    short = max(w.node for w in windows)               # the last host in the job's order
    for w in windows:
        if w.node == short:
            del w.processes[4:]
    engine = Engine()
    for w in windows:
        engine.ingest(w)
    results = engine.flush(None)
    assert [r.epoch for r in results] == sorted({r.epoch for r in results}) and len(results) == 3
    assert all(len(r.verdicts) == 20 for r in results)  # 8 + 8 + 4 GPUs, each with a verdict


def test_quantiles_into_scratch_with_bucket_totals_equal_the_plain_read():
    """A quantile read into a reused buffer, summing each bucket on the way, gives the plain
    read's quantiles and buckets, and the pooled histogram of a matrix-vector product."""
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 50, size=(30, 3000)).astype(np.float64)
    counts[:, 5] = 0                                  # a GPU without samples
    scratch = np.full(40 * 3000, np.nan)              # stale values must not leak in
    plain = Hists(counts, 60).quantiles_and_buckets([0.5, 0.99])
    h = Hists(counts, 60)
    read = h.quantiles_and_buckets([0.5, 0.99], scratch, bucket_totals=True)
    assert np.array_equal(plain[0], read[0], equal_nan=True)
    assert np.array_equal(plain[1], read[1])
    assert np.array_equal(h.bucket_sums, counts @ np.ones(counts.shape[1]))


def test_scale_reads_a_missing_sampling_error_as_zero():
    """The z scale is max(MAD, 0.6745 x SE) with NaN SE as 0 and an infinite SE as the
    largest float, as ``np.nan_to_num`` has it."""
    from hypertrace.analyzer.score.scoring import _scale
    mad = np.array([0.5, 2.0])
    for extra in (np.nan, np.inf):
        se = np.array([[0.1, 4.0], [np.nan, 1.0], [3.0, extra]])
        want = np.maximum(mad[:, None], 0.6745 * np.nan_to_num(se.T))
        assert np.array_equal(_scale(mad, se), want)


def test_hosts_alike_score_as_without_weights():
    """8 hosts of 8 GPUs (some with a GPU short of data): the plain statistics, unchanged."""
    rng = np.random.default_rng(3)
    v = 100 + rng.normal(0, 1, (64, 2))
    v[5, 0] = 130.0
    count = np.full(64, 1000)
    count[9] = 10                                   # one GPU short of samples
    hosts = np.repeat(np.arange(8), 8)
    plain = score_values(v, count, CFG, ("p50", "p99"))
    weighted = score_values(v, count, CFG, ("p50", "p99"), hosts=hosts)
    assert node_weights(hosts) is None
    for name in ("median_us", "mad_us", "robust_z", "high", "low"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(weighted, name))


def test_a_host_with_more_gpus_than_the_others_weighs_as_a_typical_one():
    """8 hosts of 4 GPUs near 100 µs and one host of 40 GPUs at 80: unweighted, the 40 own
    the job's median (80: a real GPU at 100 reads 25% slow, a slow one normal); weighted, that
    host counts as 4 GPUs, the median stays near 100 and only its own GPUs read off (low)."""
    rng = np.random.default_rng(4)
    real = 100 + rng.normal(0, 0.5, 32)
    fake = 80 + rng.normal(0, 0.5, 40)
    v = np.concatenate([real, fake])[:, None]
    count = np.full(v.shape[0], 1000)
    hosts = np.concatenate([np.repeat(np.arange(8), 4), np.full(40, 8)])
    w = node_weights(hosts)
    assert w is not None and w[:32].tolist() == [1.0] * 32 and np.allclose(w[32:], 4 / 40)
    plain = score_values(v, count, CFG, ("p50",))
    assert plain.median_us[0] < 85                  # the attack: the fakes own the median
    weighted = score_values(v, count, CFG, ("p50",), hosts=hosts)
    assert 98 < weighted.median_us[0] < 102
    assert not weighted.high[:32, 0].any()
    assert weighted.low[32:, 0].all()
