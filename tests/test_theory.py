"""Theory: the spike-probability table, and E[max] from histograms against Monte Carlo
sampling of the very same histograms (must agree within 2%)."""
from __future__ import annotations

import numpy as np
import pytest

from hypertrace.analyzer import theory
from hypertrace.proto import buckets


def _lognormal_hist(median_us: float, sigma: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return buckets.histogram_of_ns(rng.lognormal(np.log(median_us * 1e3), sigma, n)).astype(float)


@pytest.mark.parametrize("p,n,expected", [
    (0.04, 64, 0.927), (0.01, 100, 0.634), (0.005, 512, 0.923), (0.03, 64, 0.858),
    (0.005, 64, 0.274)])
def test_cluster_spike_probability_matches_the_brief(p, n, expected):
    assert float(theory.cluster_spike_probability(p, n)) == pytest.approx(expected, abs=0.0005)


def test_cluster_spike_probability_edges_and_errors():
    assert float(theory.cluster_spike_probability(0.3, 0)) == 0.0
    assert float(theory.cluster_spike_probability(1.0, 5)) == 1.0
    grid = theory.cluster_spike_probability(np.array([[0.01], [0.02]]), np.array([[1, 10]]))
    assert grid.shape == (2, 2)
    with pytest.raises(ValueError, match="must be in"):
        theory.cluster_spike_probability(1.5, 3)


def test_job_spike_probability_is_one_minus_product():
    p = np.array([0.01, 0.02, 0.0, np.nan, 0.5])
    assert theory.job_spike_probability(p) == pytest.approx(1 - 0.99 * 0.98 * 1.0 * 0.5)
    assert theory.job_spike_probability(np.array([])) == 0.0


def test_expected_max_of_one_rank_is_its_mean():
    h = _lognormal_hist(10.0, 0.3, 20_000, 1)
    assert theory.expected_max_us(h, 1) == pytest.approx(float(buckets.mean_us(h)), rel=1e-3)


@pytest.mark.parametrize("n", [8, 64, 512, 2048])
def test_expected_max_of_n_iid_ranks_matches_monte_carlo(n):
    h = _lognormal_hist(10.0, 0.4, 50_000, n)
    rng = np.random.default_rng(n)
    exact = theory.expected_max_us(h, n)
    mc = theory.monte_carlo_max_us(h, n, trials=max(400, 400_000 // n), rng=rng)
    assert exact == pytest.approx(mc, rel=0.02)
    assert exact > buckets.quantiles_us(h, [0.5])[0]


def test_expected_max_of_mixed_ranks_matches_monte_carlo():
    healthy = _lognormal_hist(10.0, 0.3, 20_000, 2)
    slow = _lognormal_hist(13.0, 0.3, 20_000, 3)
    counts = np.vstack([healthy, slow])
    exact = theory.expected_max_us(counts, np.array([120, 8]))
    mc = theory.monte_carlo_max_us(counts, np.array([120, 8]), 3000, np.random.default_rng(4))
    assert exact == pytest.approx(mc, rel=0.02)
    # the same as listing all 128 rows one by one (multiplicity is only a shortcut)
    rows = np.vstack([healthy] * 120 + [slow] * 8)
    assert theory.expected_max_us(rows) == pytest.approx(exact, rel=1e-9)


def test_what_if_evicting_the_slow_ranks_predicts_the_healthy_job():
    rng = np.random.default_rng(5)
    healthy = [_lognormal_hist(10.0, 0.3, 5000, int(s)) for s in rng.integers(0, 1e6, 56)]
    slow = [_lognormal_hist(14.0, 0.3, 5000, int(s)) for s in rng.integers(0, 1e6, 8)]
    counts = np.vstack(healthy + slow)
    evict = np.array([False] * 56 + [True] * 8)
    now, after = theory.what_if(counts, evict)
    assert now > after * 1.1                           # the slow node dominates the max
    pooled = np.vstack(healthy).sum(axis=0)
    assert after == pytest.approx(theory.expected_max_us(pooled, 64), rel=0.02)
    same_now, same_after = theory.what_if(counts, np.zeros(64, dtype=bool))
    assert same_now == same_after == pytest.approx(now)


def test_samples_come_from_the_histogram():
    h = _lognormal_hist(10.0, 0.3, 5000, 6)
    s = theory.sample_histogram_ns(h, 10_000, np.random.default_rng(0))
    nz = np.flatnonzero(h)
    assert s.min() >= buckets.LOWER_NS[nz[0]] and s.max() <= buckets.UPPER_NS[nz[-1]]
    assert np.median(s) / 1e3 == pytest.approx(buckets.quantiles_us(h, [0.5])[0], rel=0.02)
    with pytest.raises(ValueError, match="empty"):
        theory.sample_histogram_ns(np.zeros(buckets.NUM_BUCKETS), 3, np.random.default_rng(0))
