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


# ---- the what-if of ranks whose own time varies from step to step ---------------------------

def test_expected_max_of_normals_matches_monte_carlo():
    """One rank 15% slower than seven whose own times spread 10%: E[max] as a million draws
    give it; a steady rank (sd 0) is a floor; no spread at all is the largest mean."""
    rng = np.random.default_rng(5)
    m = np.array([100.0] * 7 + [115.0])
    s = np.full(8, 10.0)
    draws = (m + s * rng.standard_normal((1_000_000, 8))).max(axis=1).mean()
    assert theory.expected_max_normal(m, s) == pytest.approx(draws, rel=2e-3)
    assert theory.expected_max_normal(np.array([100.0, 150.0]), np.array([10.0, 0.0])) == \
        pytest.approx(150.0, rel=1e-6)
    assert theory.expected_max_normal(np.array([100.0, 110.0]), np.zeros(2)) == 110.0


def test_expected_max_of_16384_normals_groups_the_ranks():
    """16,384 ranks with scattered means: the grouped integral agrees with the draws."""
    rng = np.random.default_rng(6)
    m = rng.normal(100.0, 1.0, 16_384)
    s = np.full(m.size, 3.0)
    draws = np.array([(m + s * rng.standard_normal(m.size)).max() for _ in range(2_000)])
    assert theory.expected_max_normal(m, s) == pytest.approx(draws.mean(), rel=3e-3)


def test_variance_of_the_largest_normal_draw():
    # two draws: 1 - 1/pi exactly; it shrinks as the draws grow in number
    assert theory.max_of_normals_variance(2) == pytest.approx(1.0 - 1.0 / np.pi, rel=1e-4)
    v = [theory.max_of_normals_variance(n) for n in (1, 8, 64, 16_384)]
    assert v[0] == 1.0 and v[0] > v[1] > v[2] > v[3] > 0.0


def test_the_own_spread_of_a_collective_is_told_from_the_shared_one():
    """Own times that spread 20% on their own and 30% together: the step shows the shared 30%
    and only the largest of the own parts, so the decomposition finds 20% again; a step as
    spread as the own times (everything shared) leaves no own part; below the histograms'
    resolution nothing is claimed."""
    n = 64
    own_cv2 = np.full(n, 0.2 ** 2 + 0.3 ** 2)
    step_cv2 = 0.3 ** 2 + theory.max_of_normals_variance(n) * 0.2 ** 2
    alone, whole = theory.independent_spread(own_cv2, step_cv2, n)
    assert alone == pytest.approx(0.2, rel=1e-6) and whole == pytest.approx(np.hypot(0.2, 0.3))
    assert theory.independent_spread(own_cv2, float(own_cv2[0]), n)[0] == 0.0
    small = np.full(n, 0.03 ** 2)
    assert theory.independent_spread(small, 0.0, n)[0] == 0.0


def test_the_what_if_of_a_jittered_collective_takes_the_expected_last_arrival():
    """Eight ranks whose own times spread 15% on their own; one of them 15% slower on average.
    Evicting it shortens the step by what it adds to E[max], far less than its 15 ms lead over
    the mean (each step already waits for some rank's long draw), and the prediction agrees
    with drawing the steps; without spreads (older agents) it is the lead over the slowest
    that stays."""
    rng = np.random.default_rng(7)
    own = np.array([100.0] * 7 + [115.0])
    sd = np.full(8, 15.0)
    rest = 10.0
    steps_now = (own + sd * rng.standard_normal((400_000, 8))).max(axis=1) + rest
    spare = np.array([100.0] * 8)
    steps_after = (spare + sd * rng.standard_normal((400_000, 8))).max(axis=1) + rest
    rows = np.arange(8)
    epoch = (rows, np.full(8, 100.0), np.full(8, steps_now.mean()), own, sd)
    evict = rows == 7
    now, after = theory.what_if_step([epoch], rows, evict, collective=True)
    assert now == pytest.approx(steps_now.mean())
    assert after == pytest.approx(steps_after.mean(), rel=0.01)
    assert now - after < 0.6 * 15.0
    _, after_steady = theory.what_if_step([epoch[:4]], rows, evict, collective=True)
    assert now - after_steady == pytest.approx(15.0)


def test_the_body_variance_of_histograms_corrects_for_the_buckets_width():
    """A step time spread 10% (lognormal), histogrammed on buckets up to 12.5% wide: its spread
    read back within a tenth, not the ~12% the midpoints alone give; the spikes above the limit
    are left out; a rank with one step has no variance."""
    from hypertrace.analyzer.score.cross_section import Hists

    rng = np.random.default_rng(8)
    rows = []
    for median_ms in np.linspace(20.0, 40.0, 16):          # everywhere relative to the edges
        x = rng.lognormal(np.log(median_ms * 1e6), 0.10, 4_000)
        x[:40] *= 5.0                                       # stalls
        rows.append(buckets.histogram_of_ns(x))
    rows.append(buckets.histogram_of_ns(np.array([30e6])))
    dense = np.array(rows, dtype=np.float64)
    h = Hists(dense.T.copy(), 0)
    mean, var = h.body_moments_us(100_000.0)
    cv = np.sqrt(var[:-1]) / mean[:-1]
    assert np.median(cv) == pytest.approx(0.10, rel=0.1)
    assert np.isnan(var[-1])


def test_the_last_draws_quantile_is_where_regular_steps_end():
    """The 99th percentile of the largest of 64 lognormal draws (mean 100, 45% spread): 1 in
    100 of drawn steps lands above it; without spread it is the mean."""
    rng = np.random.default_rng(9)
    sigma = np.sqrt(np.log1p(0.45 ** 2))
    draws = (100.0 * rng.lognormal(-sigma ** 2 / 2, sigma, (100_000, 64))).max(axis=1)
    q = theory.last_draw_quantile(100.0, 0.45, 64)
    assert (draws > q).mean() == pytest.approx(0.01, abs=0.002)
    assert theory.last_draw_quantile(100.0, 0.0, 64) == 100.0
