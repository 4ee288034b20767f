"""The what-if over job sizes: E[max] of the step at N ranks of the job's composition, now and
after evicting the convicted nodes (ClusterPrediction.curve, the HTML report's what-if chart).

Why classes of ranks: E[max] over the job's R rank histograms takes about 0.1 s at 16,384
ranks (analyzer/theory.py); a curve of a dozen sizes, twice, would add seconds to every report.
So the ranks are sorted by their mean and pooled into at most :data:`CLASSES` groups of
neighbours (each group's normalised histograms averaged, its shifts averaged), the evicted ranks
into groups of their own, and a size N counts each group N x its share of the ranks. Pooling
neighbours keeps the spread between groups, which is what the maximum reads; at N = R the curve
is within a few tenths of a percent of the exact what-if on the simulator's jobs (tested).
After the eviction the evicted ranks are replaced by spares like the average remaining rank, as
:func:`hypertrace.analyzer.theory.what_if` replaces them.
"""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer import theory
from hypertrace.proto import buckets

#: Groups the remaining ranks are pooled into (the evicted ranks: :data:`EVICTED_CLASSES`).
CLASSES = 128
EVICTED_CLASSES = 8
#: The curve reaches this many times the job's ranks.
REACH = 4


def sizes(ranks: int) -> list[int]:
    """Powers of two from 1 to ``REACH`` x ``ranks``, and ``ranks`` itself."""
    out = {1, ranks}
    n = 1
    while n < REACH * ranks:
        n *= 2
        out.add(n)
    return sorted(out)


def what_if_curve(counts: np.ndarray, evict: np.ndarray, shift_ns: np.ndarray | None = None,
                  first_bucket: int = 0) -> list[tuple[int, float, float]]:
    """[(N, E[max] now in µs, after evicting in µs)] for N in :func:`sizes` of the ranks with
    data. ``counts`` (R, B): each rank's histogram (column j is bucket ``first_bucket + j``);
    ``evict`` (R,): the ranks the what-if evicts; ``shift_ns``: as in
    :func:`hypertrace.analyzer.theory.what_if`. Empty when no rank has data."""
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    sh = np.zeros(c.shape[0]) if shift_ns is None else np.maximum(
        np.asarray(shift_ns, dtype=np.float64), 0.0)
    total = c.sum(axis=1)
    has = total > 0
    if not has.any():
        return []
    pmf = c[has] / total[has, None]
    sh, gone = sh[has], np.asarray(evict, dtype=bool)[has]
    ranks = int(has.sum())
    keep = ~gone
    if not keep.any():                     # nobody would remain: no eviction to draw
        gone = np.zeros_like(gone)
        keep = ~gone
    mid = buckets.MID_NS[first_bucket:first_bucket + c.shape[1]]
    kept = _grouped(pmf[keep], sh[keep], mid, CLASSES)
    spare_hist = pmf[keep].mean(axis=0, keepdims=True)
    spare_shift = np.array([sh[keep].mean()])
    n_gone = int(gone.sum())
    if n_gone:
        evicted = _grouped(pmf[gone], sh[gone], mid, EVICTED_CLASSES)
        now_parts = [np.concatenate(x) for x in zip(kept, evicted)]
        after_parts = [np.concatenate((kept[0], spare_hist)),
                       np.concatenate((kept[1], spare_shift)),
                       np.concatenate((kept[2], [float(n_gone)]))]
    else:
        now_parts = after_parts = list(kept)
    out = []
    for n in sizes(ranks):
        scale = n / ranks
        now = theory.expected_max_us(now_parts[0], now_parts[2] * scale, now_parts[1],
                                     first_bucket)
        after = now if not n_gone else theory.expected_max_us(
            after_parts[0], after_parts[2] * scale, after_parts[1], first_bucket)
        out.append((n, now, after))
    return out


def _grouped(pmf: np.ndarray, shift: np.ndarray, mid: np.ndarray,
             k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(histograms, shifts, sizes) of at most ``k`` groups of ranks neighbouring by mean."""
    order = np.argsort(pmf @ mid + shift, kind="stable")
    groups = [g for g in np.array_split(order, min(k, order.size)) if g.size]
    return (np.stack([pmf[g].mean(axis=0) for g in groups]),
            np.array([float(shift[g].mean()) for g in groups]),
            np.array([float(g.size) for g in groups]))


__all__ = ["CLASSES", "sizes", "what_if_curve"]
