"""Theory: the spike-probability table, and E[max] from histograms against Monte Carlo
sampling of the very same histograms (must agree within 2%)."""
from __future__ import annotations

import numpy as np
import pytest

from hypertrace.analyzer.score import theory
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


def test_what_if_is_exactly_its_two_integrals_whichever_thread_computes_them():
    """The what-if computes E[max] now and after eviction side by side; each is bit for bit
    the integral of its own rows (spares pooled from the remaining ranks, shifts included)."""
    rng = np.random.default_rng(11)
    counts = np.vstack([_lognormal_hist(10.0 + 4.0 * (i >= 60), 0.3, 3000, int(s))
                        for i, s in enumerate(rng.integers(0, 1e6, 64))])
    counts[3] = 0                                       # a rank without samples is left out
    shift = rng.uniform(0.0, 2e3, 64)
    evict = np.arange(64) >= 60
    now, after = theory.what_if(counts, evict, shift)
    has = counts.sum(axis=1) > 0
    keep = has & ~evict
    rest = counts[keep]
    pooled = (rest / rest.sum(axis=1, keepdims=True)).mean(axis=0)
    assert now == theory.expected_max_us(counts[has], None, shift[has])
    assert after == theory.expected_max_us(
        np.vstack((rest, pooled)), np.concatenate((np.ones(rest.shape[0]), [4])),
        np.concatenate((shift[keep], [shift[keep].mean()])))
    assert after < now
    gone_all = theory.what_if(counts, has, shift)       # nobody left to replace them with
    assert gone_all[0] == now and np.isnan(gone_all[1])


def test_samples_come_from_the_histogram():
    h = _lognormal_hist(10.0, 0.3, 5000, 6)
    s = theory.sample_histogram_ns(h, 10_000, np.random.default_rng(0))
    nz = np.flatnonzero(h)
    assert s.min() >= buckets.LOWER_NS[nz[0]] and s.max() <= buckets.UPPER_NS[nz[-1]]
    assert np.median(s) / 1e3 == pytest.approx(buckets.quantiles_us(h, [0.5])[0], rel=0.02)
    with pytest.raises(ValueError, match="empty"):
        theory.sample_histogram_ns(np.zeros(buckets.NUM_BUCKETS), 3, np.random.default_rng(0))


def _cdf_shifted_direct(c: np.ndarray, grid: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The shifted CDF written the direct way (every bucket's cumulative share, 2-D indexing)."""
    edges = theory._EDGES
    total = c.sum(axis=1, keepdims=True)
    at_edges = np.zeros((c.shape[0], c.shape[1] + 1))
    np.cumsum(c / np.where(total > 0, total, 1.0), axis=1, out=at_edges[:, 1:])
    x = grid[None, :] - shift[:, None]
    k = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, c.shape[1] - 1)
    frac = np.clip((x - edges[k]) / (edges[k + 1] - edges[k]), 0.0, 1.0)
    rows = np.arange(c.shape[0])[:, None]
    lo = at_edges[rows, k]
    return lo + frac * (at_edges[rows, k + 1] - lo)


def test_shifted_cdf_is_bit_for_bit_the_direct_form():
    """The report's what-if reads the shifted CDF through flat indexing and a cumulative sum
    cut to the buckets the grid reaches; every value must be the direct form's, to the bit."""
    rng = np.random.default_rng(7)
    for case in range(40):
        r = int(rng.integers(1, 300))
        c = (rng.poisson(rng.uniform(0, 50), size=(r, buckets.NUM_BUCKETS))
             * (rng.random((r, buckets.NUM_BUCKETS)) < rng.uniform(0.02, 0.5))).astype(float)
        first = int(rng.integers(0, 200)) if case % 2 else 0
        c[:, :first] = 0
        shift = rng.exponential(1e4 * 10 ** rng.integers(0, 5), r) * (rng.random(r) < 0.8)
        shift[0] = max(shift[0], 1.0)                      # a shift, so the shifted path runs
        lo, hi = theory._support(c[c.sum(axis=1) > 0]) if c.any() else (np.zeros(1), np.ones(1))
        grid = theory._grid(float(lo.max()), float(hi.max() + shift.max()) + 1.0)
        want = _cdf_shifted_direct(c, grid, shift)
        for got in (theory._cdf_shifted(c, grid, shift),
                    theory._cdf_shifted(c, grid, shift, c.sum(axis=1)[:, None], first)):
            assert np.array_equal(got.view(np.int64), want.view(np.int64)), case


@pytest.mark.parametrize("shifted", [True, False])
def test_the_what_if_of_the_used_buckets_alone_equals_all_buckets(shifted):
    """A caller may pass only the buckets a job uses (``first_bucket``): the buckets after the
    last column are empty. Shifted rows put grid points beyond the job's last bucket, where
    every row's CDF is its whole share, and a row with little shift reaches them. Whole
    counts sum alike over any columns, so the shifted integrals are bit for bit the same; the
    unshifted ones (one grid for all rows) agree to 1e-12."""
    rng = np.random.default_rng(5)
    counts = np.vstack([_lognormal_hist(10.0 * (1.5 if i >= 60 else 1.0), 0.3, 2000, int(s))
                        for i, s in enumerate(rng.integers(0, 1e6, 64))])
    shift = rng.uniform(0.0, 30e3, 64) if shifted else np.zeros(64)
    shift[7] = 0.0                                   # reaches furthest past the last bucket
    used = np.flatnonzero(counts.any(axis=0))
    lo, hi = int(used[0]), int(used[-1]) + 1
    assert lo > 0 and hi < buckets.NUM_BUCKETS       # empty buckets on both sides
    evict = np.arange(64) >= 60
    full = theory.what_if(counts, evict, shift)
    part = theory.what_if(counts[:, lo:hi], evict, shift, first_bucket=lo)
    if shifted:
        assert part == full
    else:
        assert part == pytest.approx(full, rel=1e-12)
    assert full[1] < full[0]
    # a job whose buckets run to the last one has no empty bucket after it
    top = np.zeros_like(counts)
    top[:, -(hi - lo):] = counts[:, lo:hi]
    first = buckets.NUM_BUCKETS - (hi - lo)
    assert theory.what_if(top[:, first:], evict, shift, first_bucket=first) == \
        theory.what_if(top, evict, shift)
