"""The bucket scheme: edges, exact indexing at power-of-two boundaries, quantile accuracy."""
import numpy as np
import pytest

from hypertrace.proto import buckets


def test_edges_are_contiguous_and_increasing():
    assert buckets.NUM_BUCKETS == 226
    assert np.all(buckets.UPPER_NS[:-1] == buckets.LOWER_NS[1:])
    assert np.all(np.diff(buckets.LOWER_NS) > 0)


@pytest.mark.parametrize("ns,expected", [
    (0, 0), (255, 0), (256, 1), (287, 1), (288, 2), (511, 8), (512, 9),
    (2**36 - 1, buckets.NUM_BUCKETS - 2), (2**36, buckets.NUM_BUCKETS - 1),
    (10**15, buckets.NUM_BUCKETS - 1),
])
def test_bucket_index_boundaries(ns, expected):
    assert int(buckets.bucket_of_ns(ns)) == expected


def test_every_value_falls_inside_its_bucket():
    rng = np.random.default_rng(1)
    v = np.unique(rng.integers(256, 2**36, size=20000))
    # include exact powers of two and their neighbours: float log2 is wrong just below them
    p2 = 2 ** np.arange(8, 36, dtype=np.int64)
    v = np.concatenate([v, p2, p2 - 1, p2 + 1])
    idx = buckets.bucket_of_ns(v)
    assert np.all(buckets.LOWER_NS[idx] <= v) and np.all(v < buckets.UPPER_NS[idx])


def test_bucket_width_at_most_one_eighth_of_value():
    inner = slice(1, buckets.NUM_BUCKETS - 1)
    width = buckets.UPPER_NS[inner] - buckets.LOWER_NS[inner]
    assert np.all(width / buckets.LOWER_NS[inner] <= 0.125 + 1e-12)


def test_quantiles_recoverable_within_one_bucket():
    rng = np.random.default_rng(2)
    samples = rng.lognormal(np.log(12_000), 0.4, 200_000)
    hist = buckets.histogram_of_ns(samples)
    est = buckets.quantiles_us(hist, [0.5, 0.9, 0.99])
    true = np.quantile(samples, [0.5, 0.9, 0.99]) / 1000
    assert np.all(np.abs(est - true) / true <= 0.125)


def test_quantiles_vectorized_over_rows_and_empty_rows_are_nan():
    rng = np.random.default_rng(3)
    rows = np.stack([buckets.histogram_of_ns(rng.lognormal(np.log(m), 0.2, 5000))
                     for m in (5_000, 10_000, 20_000)] + [np.zeros(buckets.NUM_BUCKETS)])
    q = buckets.quantiles_us(rows, [0.5])
    assert q.shape == (4, 1)
    assert q[0, 0] < q[1, 0] < q[2, 0]
    assert np.isnan(q[3, 0])


def test_negative_or_nan_latency_rejected():
    with pytest.raises(ValueError):
        buckets.bucket_of_ns([-1])
    with pytest.raises(ValueError):
        buckets.bucket_of_ns([float("nan")])


def test_cdf_on_grid_matches_empirical_cdf():
    rng = np.random.default_rng(4)
    samples = rng.lognormal(np.log(10_000), 0.3, 100_000)
    hist = buckets.histogram_of_ns(samples)
    grid = np.array([5_000.0, 10_000.0, 15_000.0, 30_000.0])
    cdf = buckets.cdf_on_grid(hist[None, :], grid)[0]
    emp = np.array([(samples <= g).mean() for g in grid])
    assert np.all(np.abs(cdf - emp) < 0.03)
