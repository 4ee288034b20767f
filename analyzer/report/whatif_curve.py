"""The what-if over job sizes: the step at N ranks of the job's composition, now and after
evicting the convicted nodes (ClusterPrediction.curve, the HTML report's what-if chart).

Jobs with steps (:func:`step_curve`): the measured what-if (theory.what_if_step) at the job's
own size, and how the step grows with N from the spread of the ranks' own times per step: E[max]
of N draws among them (the empirical distribution's order statistics), added to the measured
step as a difference, so the curve passes through the measured what-if at N = ranks. Jobs
without steps (:func:`what_if_curve`): E[max] of the latency histograms, as below.

Why classes of ranks: E[max] over the job's R rank histograms takes about 0.1 s at 16,384
ranks (analyzer/score/theory.py); a curve of a dozen sizes, twice, would add seconds to every report.
So the ranks are sorted by their mean and pooled into at most :data:`CLASSES` groups of
neighbours (each group's normalised histograms averaged, its shifts averaged), the evicted ranks
into groups of their own, and a size N counts each group N x its share of the ranks. Pooling
neighbours keeps the spread between groups, which is what the maximum reads; at N = R the curve
is within a few tenths of a percent of the exact what-if on the simulator's jobs (tested).
After the eviction the evicted ranks are replaced by spares like the average remaining rank, as
:func:`hypertrace.analyzer.score.theory.what_if` replaces them.
"""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.score import theory
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


def rank_values(epochs, ranks: np.ndarray, collective: bool) -> np.ndarray:
    """(R,) each of ``ranks``' own time per step (collective) or step (independent), µs, over the
    recent epochs weighted as theory.what_if_step weighs them; NaN for a rank without steps."""
    ranks = np.asarray(ranks, dtype=np.int64)
    pos = {int(r): i for i, r in enumerate(ranks)}
    sums = np.zeros(ranks.size)
    steps = np.zeros(ranks.size)
    n = len(epochs)
    for k, (rows, n_steps, pace, own, *_) in enumerate(epochs):
        w = theory.WHATIF_KEEP ** (n - 1 - k)
        value = np.where(np.isfinite(own), own, pace) if collective else pace
        for r, c, v in zip(np.asarray(rows).tolist(), np.asarray(n_steps).tolist(),
                           np.asarray(value, dtype=np.float64).tolist()):
            i = pos.get(int(r))
            if i is not None and c > 0 and np.isfinite(v):
                sums[i] += w * c * v
                steps[i] += w * c
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(steps > 0, sums / np.where(steps > 0, steps, 1.0), np.nan)


def expected_max_of(values: np.ndarray, n: int) -> float:
    """E[max] of ``n`` draws (with replacement) among ``values``: sum over the sorted values of
    x_k ((k/R)^n - ((k-1)/R)^n)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    r = x.size
    k = np.arange(1, r + 1, dtype=np.float64)
    return float(((k / r) ** n - ((k - 1) / r) ** n) @ x)


def step_curve(epochs, ranks: np.ndarray, evict: np.ndarray, collective: bool, now: float,
               after: float) -> list[tuple[int, float, float]]:
    """[(N, step now, step after evicting)] in µs for N in :func:`sizes`, through (``now``,
    ``after``) at the job's size (module docstring); after eviction the spares are drawn like
    the remaining ranks. Empty without steps or a finite ``now``."""
    v = rank_values(epochs, ranks, collective)
    ok = np.isfinite(v)
    if not ok.any() or not np.isfinite(now):
        return []
    stay = ok & ~np.asarray(evict, dtype=bool)
    r = int(ok.sum())
    base_now = expected_max_of(v[ok], r)
    can_after = bool(stay.any()) and np.isfinite(after)
    base_after = expected_max_of(v[stay], r) if can_after else 0.0
    out = []
    for n in sizes(r):
        a = now + expected_max_of(v[ok], n) - base_now
        b = after + expected_max_of(v[stay], n) - base_after if can_after else a
        out.append((n, a, b))
    return out


def what_if_curve(counts: np.ndarray, evict: np.ndarray, shift_ns: np.ndarray | None = None,
                  first_bucket: int = 0) -> list[tuple[int, float, float]]:
    """[(N, E[max] now in µs, after evicting in µs)] for N in :func:`sizes` of the ranks with
    data. ``counts`` (R, B): each rank's histogram (column j is bucket ``first_bucket + j``);
    ``evict`` (R,): the ranks the what-if evicts; ``shift_ns``: as in
    :func:`hypertrace.analyzer.score.theory.what_if`. Empty when no rank has data."""
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
