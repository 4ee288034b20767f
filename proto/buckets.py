"""The one latency bucket scheme of the wire format (scheme id 1).

Log-linear: 8 sub-buckets per power of two of nanoseconds, starting at 256 ns (0.256 µs).

* bucket 0 holds everything below 256 ns (underflow);
* for v >= 256 ns with e = floor(log2 v) and s = the 3 bits below the leading one,
  bucket = 1 + 8 * (e - 8) + s, covering [2^e * (1 + s/8), 2^e * (1 + (s+1)/8)) ns;
* the last bucket (NUM_BUCKETS - 1) holds everything from 2^36 ns (about 68.7 s) up.

A bucket is at most 12.5% of its lower edge wide, so any quantile read back from a histogram is
within one bucket's width (<= 12.5%) of the true sample quantile. The same arithmetic runs in the
BPF program (collector/ebpf_program.c) with shifts only, so the kernel and the analyzer agree by
construction; tests/test_buckets.py checks both.

Why this and not HDR or DDSketch: it is computable in a verifier-friendly BPF program with no
floating point, fixed-size (226 counters per API), and mergeable by plain addition.
"""
from __future__ import annotations

import numpy as np

SCHEME_ID = 1
SUB_BUCKET_BITS = 3
SUB_BUCKETS = 1 << SUB_BUCKET_BITS          # 8 per octave
MIN_EXP = 8                                 # 2^8 ns = 256 ns
MAX_EXP = 36                                # 2^36 ns ~ 68.7 s: overflow from here
NUM_BUCKETS = 1 + (MAX_EXP - MIN_EXP) * SUB_BUCKETS + 1   # 226

_exps = np.repeat(np.arange(MIN_EXP, MAX_EXP), SUB_BUCKETS)
_subs = np.tile(np.arange(SUB_BUCKETS), MAX_EXP - MIN_EXP)
_inner_lower = np.ldexp(1.0 + _subs / SUB_BUCKETS, _exps)
_inner_upper = np.ldexp(1.0 + (_subs + 1) / SUB_BUCKETS, _exps)

#: Lower edge of every bucket in nanoseconds (bucket 0 starts at 0).
LOWER_NS = np.concatenate(([0.0], _inner_lower, [float(2 ** MAX_EXP)]))
#: Upper edge of every bucket in nanoseconds (the overflow bucket is closed at 2 * 2^36 for
#: interpolation; values there are clamped, and ApiStats.max_us keeps the true maximum).
UPPER_NS = np.concatenate(([float(2 ** MIN_EXP)], _inner_upper, [float(2 ** (MAX_EXP + 1))]))
#: Representative value of each bucket (geometric-ish midpoint), in nanoseconds.
MID_NS = (LOWER_NS + UPPER_NS) / 2.0


def bucket_of_ns(values_ns: np.ndarray | float | int) -> np.ndarray:
    """Bucket index of each latency in nanoseconds (vectorized; integers or floats >= 0)."""
    v = np.asarray(values_ns, dtype=np.float64)
    if np.any(~np.isfinite(v)) or np.any(v < 0):
        raise ValueError("latencies must be finite and >= 0 ns")
    v = np.floor(v).astype(np.uint64)
    out = np.zeros(v.shape, dtype=np.int64)
    big = v >= (1 << MIN_EXP)
    if np.any(big):
        vb = v[big]
        e = np.floor(np.log2(vb.astype(np.float64))).astype(np.int64)
        # log2 in float can be off by one just below a power of two: fix exactly with shifts.
        e = np.where((vb >> e.astype(np.uint64)) == 0, e - 1, e)
        e = np.where((vb >> (e + 1).astype(np.uint64)) > 0, e + 1, e)
        sub = ((vb >> (e - SUB_BUCKET_BITS).astype(np.uint64)) & (SUB_BUCKETS - 1)).astype(np.int64)
        idx = 1 + (e - MIN_EXP) * SUB_BUCKETS + sub
        out[big] = np.minimum(idx, NUM_BUCKETS - 1)
    return out


def histogram_of_ns(values_ns: np.ndarray) -> np.ndarray:
    """Dense histogram (NUM_BUCKETS counts) of latencies in nanoseconds."""
    return np.bincount(bucket_of_ns(values_ns).ravel(), minlength=NUM_BUCKETS).astype(np.uint64)


def quantiles_us(counts: np.ndarray, qs: np.ndarray | list[float],
                 first_bucket: int = 0) -> np.ndarray:
    """Quantiles, in microseconds, of one or many dense histograms.

    ``counts`` has shape (..., NUM_BUCKETS); the result has shape (..., len(qs)). Within the
    bucket that holds the quantile the value is interpolated linearly, which keeps the error
    well inside one bucket width. Rows with no samples give NaN.

    ``counts`` may also cover only buckets ``first_bucket .. first_bucket + K - 1`` (shape
    (..., K)): the analyzer passes just the occupied range of 16k GPUs, ~10x less work.
    """
    c = np.asarray(counts, dtype=np.float64)
    qs = np.asarray(qs, dtype=np.float64)
    cum = np.cumsum(c, axis=-1)
    total = cum[..., -1:]
    targets = total * qs                               # (..., Q)
    nb = c.shape[-1]
    flat_cum = cum.reshape(-1, nb)
    flat_t = targets.reshape(-1, qs.size)
    out = np.empty(flat_t.shape)
    for j in range(qs.size):                           # loop over a handful of quantiles only
        t = flat_t[:, j]
        idx = (flat_cum < t[:, None]).sum(axis=1)
        idx = np.minimum(idx, nb - 1)
        rows = np.arange(flat_cum.shape[0])
        below = np.where(idx > 0, flat_cum[rows, np.maximum(idx - 1, 0)], 0.0)
        inside = flat_cum[rows, idx] - below
        frac = np.where(inside > 0, (t - below) / np.where(inside > 0, inside, 1.0), 0.5)
        b = idx + first_bucket
        out[:, j] = LOWER_NS[b] + np.clip(frac, 0.0, 1.0) * (UPPER_NS[b] - LOWER_NS[b])
    out = out.reshape(targets.shape) / 1000.0
    return np.where(total > 0, out, np.nan)


def mean_us(counts: np.ndarray) -> np.ndarray:
    """Mean latency (µs) estimated from bucket midpoints; NaN for empty rows."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (c @ MID_NS) / np.where(total > 0, total, 1) / 1000.0, np.nan)


def cdf_on_grid(counts: np.ndarray, grid_ns: np.ndarray) -> np.ndarray:
    """Piecewise-linear CDF of dense histograms evaluated at ``grid_ns`` (vectorized).

    Shape (..., NUM_BUCKETS) -> (..., len(grid)). Used for E[max] = ∫ (1 - Π F_i(t)) dt.
    """
    c = np.asarray(counts, dtype=np.float64)
    grid = np.asarray(grid_ns, dtype=np.float64)
    total = c.sum(axis=-1, keepdims=True)
    cum = np.cumsum(c, axis=-1) / np.where(total > 0, total, 1.0)
    edges = np.concatenate(([0.0], UPPER_NS))                      # NUM_BUCKETS + 1 edges
    at_edges = np.concatenate((np.zeros(cum.shape[:-1] + (1,)), cum), axis=-1)
    k = np.clip(np.searchsorted(edges, grid, side="right") - 1, 0, NUM_BUCKETS - 1)
    frac = np.clip((grid - edges[k]) / (edges[k + 1] - edges[k]), 0.0, 1.0)
    lo = at_edges[..., k]
    hi = at_edges[..., k + 1]
    return lo + frac * (hi - lo)
