"""The straggler theory, computed from histograms: spike probability, E[max] and the what-if.

Synchronous training waits for its slowest rank every step, so

* ``P(cluster spike) = 1 − Π (1 − p_i)`` over ranks, ``1 − (1 − p)^N`` for N equal ranks;
* ``E[max_i T_i] = ∫_0^∞ (1 − Π_i F_i(t)) dt`` for independent ranks with CDFs ``F_i``.

The what-if of a job with step data (:func:`what_if_step`) is measured, not integrated: the
job's step now is what its ranks measured, and evicting ranks takes away their lead over the
slowest rank that stays. E[max] over ranks of independent per-step draws was biased high: a
rank's busy time per step spreads wider than its time to the step's end (the split between CPU
work and GPU waits moves from step to step), and spikes come in racks, not one rank at a time.
E[max] remains the model of ``hypertrace predict`` and the what-if of a job without steps.

``F_i`` is the piecewise-linear CDF of a rank's histogram on the wire bucket scheme
(:func:`hypertrace.proto.buckets.cdf_on_grid`), i.e. the distribution "bucket by its count, uniform
inside the bucket". :func:`sample_histogram_ns` draws from exactly that distribution, which is
what the Monte Carlo check in the tests compares against.

How the integral is taken: ``Π F_i`` is 0 below ``a = max_i(lowest edge of rank i)`` and 1 above
``b = max_i(highest edge of rank i)``, so ``E[max] = a + ∫_a^b (1 − Π F_i)``. On ``[a, b]`` the
grid is every bucket edge, each bucket cut into ``SUBDIV`` pieces, and the trapezoid rule is
applied to ``1 − exp(Σ m_i log F_i)`` (``m_i``: how many ranks share histogram i). Ranks are
processed in chunks so memory stays bounded at any job size.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from hypertrace.proto import buckets

SUBDIV = 32
_CHUNK_ELEMENTS = 4_000_000
_EDGES = np.concatenate(([0.0], buckets.UPPER_NS))        # edge j = lower edge of bucket j
_WIDTHS = _EDGES[1:] - _EDGES[:-1]                        # bucket j's width


def cluster_spike_probability(p: np.ndarray | float, n: np.ndarray | int) -> np.ndarray:
    """``1 − (1 − p)^n``, broadcast over arrays of p and n (computed stably in log space)."""
    p = np.asarray(p, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if np.any((p < 0) | (p > 1)):
        raise ValueError("spike probability p must be in [0, 1]")
    if np.any(n < 0):
        raise ValueError("number of ranks must be >= 0")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -np.expm1(n * np.log1p(-p))
    return np.where(n == 0, 0.0, out) + 0.0              # + 0.0 turns -0.0 into 0.0


def job_spike_probability(p_i: np.ndarray) -> float:
    """``1 − Π (1 − p_i)`` over the ranks of a job (NaN rates are ignored)."""
    p = np.asarray(p_i, dtype=np.float64)
    p = np.clip(p[np.isfinite(p)], 0.0, 1.0)
    if p.size == 0:
        return 0.0
    with np.errstate(divide="ignore"):
        return float(-np.expm1(np.sum(np.log1p(-p)))) + 0.0


def _support(counts: np.ndarray, first_bucket: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lowest and highest bucket edge (ns) holding mass, per row (column j: bucket
    ``first_bucket + j``)."""
    nz = counts > 0
    first = np.argmax(nz, axis=1)
    last = counts.shape[1] - 1 - np.argmax(nz[:, ::-1], axis=1)
    return _EDGES[first + first_bucket], _EDGES[last + 1 + first_bucket]


def _grid(a: float, b: float) -> np.ndarray:
    inner = _EDGES[(_EDGES > a) & (_EDGES < b)]
    knots = np.concatenate(([a], inner, [b]))
    steps = np.linspace(0.0, 1.0, SUBDIV, endpoint=False)
    fine = (knots[:-1, None] + np.diff(knots)[:, None] * steps[None, :]).ravel()
    return np.concatenate((fine, [b]))


def _cdf_shifted(c: np.ndarray, grid: np.ndarray, shift: np.ndarray,
                 total: np.ndarray | None = None, first: int = 0,
                 first_bucket: int = 0) -> np.ndarray:
    """(R, len(grid)) CDF of row i's histogram moved by ``shift[i]`` ns: F_i(grid - shift_i).
    ``total``: the rows' sums (R, 1) when the caller has them; ``first``: a column before
    which every row is 0 (their cumulative shares are 0 there; the sum from it on is the same);
    ``first_bucket``: column j is bucket ``first_bucket + j``, and the buckets after the last
    column are empty.

    Each value is ``lo + frac * (hi - lo)``: bucket ``k`` of the point,
    ``frac = clip((x - lower edge) / bucket width)``, ``lo``, ``hi`` the row's cumulative share
    at the bucket's edges. Why the details: this runs on every rank of a job for each report
    (131,072 ranks x ~100 grid points, twice), and 2-D fancy indexing, temporaries and the
    cumulative sum past the last bucket any point reaches were most of its time. Flat ``take``
    reads the same elements; a cumulative sum stopped early holds the same prefix. The empty
    buckets after the given columns all stand at the row's whole share: one column past the
    last (``pad``) stands for all of them, where ``hi - lo`` is exactly 0 as it is there. When
    no row is shifted, the grid's buckets are found once for all rows (the same values)."""
    r, cols = c.shape
    shifted = bool(np.any(shift))
    x = grid[None, :] - shift[:, None] if shifted else grid.copy()
    # the point's column among the given ones, ``cols`` (the pad) for any later bucket: a
    # search among the columns' edges alone, not all 227 (at 131,072 ranks the largest step)
    last = min(first_bucket + cols, buckets.NUM_BUCKETS - 1)
    col = np.searchsorted(_EDGES[first_bucket:last + 1], x, side="right")
    col -= 1
    np.clip(col, 0, last - first_bucket, out=col)
    k = col + first_bucket                        # the point's bucket, for its edges
    width = int(col.max()) + 2                    # edges 0..max column + 1 are read
    if total is None:
        total = c.sum(axis=1, keepdims=True)
    at_edges = np.zeros((r, width))
    first = min(first, width - 1)
    stop = min(width - 1, cols)
    np.cumsum(c[:, first:stop] / np.where(total > 0, total, 1.0), axis=1,
              out=at_edges[:, first + 1:stop + 1])
    if width - 1 > cols:                          # the pad's edges: the row's whole share
        at_edges[:, cols + 1:] = at_edges[:, cols:cols + 1]
    x -= _EDGES.take(k)
    x /= _WIDTHS.take(k)
    frac = np.clip(x, 0.0, 1.0, out=x)
    if not shifted:                               # the same columns for every row
        lo = at_edges[:, col]
        hi = at_edges[:, col + 1]
    else:
        col += (np.arange(r) * width)[:, None]    # flat index of (row, column)
        flat = at_edges.ravel()
        lo = flat.take(col)
        col += 1
        hi = flat.take(col)
    hi -= lo
    hi *= frac
    hi += lo
    return hi


def expected_max_us(counts: np.ndarray, multiplicity: np.ndarray | int | None = None,
                    shift_ns: np.ndarray | None = None, first_bucket: int = 0) -> float:
    """E[max] (µs) of independent ranks; row i of ``counts`` is the histogram of ``m_i`` ranks.

    ``counts`` is (R, NUM_BUCKETS) (or one histogram); rows with no samples are ignored.
    ``multiplicity`` defaults to 1 per row; ``expected_max_us(h, 512)`` is 512 ranks like ``h``.
    ``shift_ns`` (R,), when given, moves row i's distribution by that many ns (X_i + s_i): a
    rank's busy time plus its mean wait on its own GPU is when it reaches the end of a step.
    The shift is applied to the CDF, not re-binned, so it adds no bucket width.
    ``first_bucket``: column j of ``counts`` is bucket ``first_bucket + j`` and the buckets
    after its last column are empty, so a caller passes only the buckets a job uses (at
    131,072 ranks the wire's 226 buckets are most of the work, and a job's step times fill a
    few dozen of them).
    """
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    m = np.ones(c.shape[0]) if multiplicity is None else np.broadcast_to(
        np.asarray(multiplicity, dtype=np.float64), (c.shape[0],))
    sh = np.zeros(c.shape[0]) if shift_ns is None else np.maximum(
        np.broadcast_to(np.asarray(shift_ns, dtype=np.float64), (c.shape[0],)), 0.0)
    total = c.sum(axis=1)
    keep = (total > 0) & (m > 0)
    m, sh = m[keep], sh[keep]
    if not keep.all():                    # a copy of every row only when some are dropped
        c, total = c[keep], total[keep]
    if c.shape[0] == 0:
        return float("nan")
    lo, hi = _support(c, first_bucket)
    # columns before it are 0 in every row
    first = int(np.searchsorted(_EDGES, lo.min())) - first_bucket
    lo, hi = lo + sh, hi + sh
    a, b = float(lo.max()), float(hi.max())
    if b <= a:
        return a / 1e3
    grid = _grid(a, b)
    log_prod = np.zeros(grid.size)
    chunk = max(1, _CHUNK_ELEMENTS // grid.size)
    for start in range(0, c.shape[0], chunk):          # chunks of ranks, not one loop per rank
        f = _cdf_shifted(c[start:start + chunk], grid, sh[start:start + chunk],
                         total[start:start + chunk, None], first, first_bucket)
        with np.errstate(divide="ignore"):
            log_prod += m[start:start + chunk] @ np.log(f)
    integrand = 1.0 - np.exp(log_prod)
    area = float(np.sum((integrand[1:] + integrand[:-1]) * np.diff(grid)) / 2.0)
    return (a + area) / 1e3


def sample_histogram_ns(counts: np.ndarray, size: int | tuple[int, ...],
                        rng: np.random.Generator) -> np.ndarray:
    """Draw from a histogram's piecewise-uniform distribution (what ``cdf_on_grid`` describes)."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    if c.sum() <= 0:
        raise ValueError("histogram is empty: nothing to sample")
    idx = rng.choice(c.size, size=size, p=c / c.sum())
    return _EDGES[idx] + rng.random(idx.shape) * (_EDGES[idx + 1] - _EDGES[idx])


def monte_carlo_max_us(counts: np.ndarray, multiplicity: np.ndarray | int, trials: int,
                       rng: np.random.Generator) -> float:
    """Monte Carlo E[max] (µs) with the same inputs as :func:`expected_max_us` (for checking)."""
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    m = np.broadcast_to(np.asarray(multiplicity, dtype=np.int64), (c.shape[0],))
    best = np.zeros(trials)
    for row, k in zip(c, m):                            # a handful of distinct histograms
        if k > 0 and row.sum() > 0:
            best = np.maximum(best, sample_histogram_ns(row, (trials, int(k)), rng).max(axis=1))
    return float(best.mean() / 1e3)


#: The what-if's ``basis`` when it stands on step data (a ClusterPrediction.basis starts with
#: one of them): a collective job's own time per step, an independent job's step time.
STEP_BASES = ("step.own", "step.time")
#: Weight an epoch keeps in the what-if per later epoch (half-life one window), and how many
#: epochs it reads (the ninth would weigh 0.4%): the what-if is about the job as it is now, so
#: a rank slow for the last few windows is predicted as slow, not averaged with the hours it
#: was healthy (docs/design.md).
WHATIF_KEEP = 0.5
WHATIF_EPOCHS = 8


def what_if_step(epochs: Sequence[tuple[np.ndarray, ...]],
                 ranks: np.ndarray, evict: np.ndarray, collective: bool) -> tuple[float, float]:
    """The job's step (µs) now and after evicting ``ranks[evict]``, from its recent epochs.

    ``epochs``: oldest first, each (job rows, their steps without spikes, their mean such step
    in µs, their own time per step in µs: the step less the wait for peers, the time the rank
    takes to reach the step's end[, the standard deviation of that own time that is the rank's
    alone, µs: :func:`independent_spread`]); epoch ``k`` of ``n`` weighs
    ``WHATIF_KEEP ** (n - 1 - k)``. ``ranks``: the job rows to predict on (those with data),
    ``evict`` (bool) for each.

    * **collective**: every rank times the job's step, so an epoch's step is its ranks' median,
      and evicting takes away what the evicted ranks add to the expected maximum of the ranks'
      own times per step (:func:`expected_max_normal`): with steady ranks, the slowest evicted
      rank's lead over the slowest that stays; with ranks whose own time varies from step to
      step, less, because each step waits for that step's slowest rank. Epochs without
      spreads (older agents) read steady ranks.
    * **independent**: ranks that wait for nobody go at their own pace (their mean over the
      epochs), and the job at its slowest rank's (ranks that meet now and then wait for it
      there): now the largest pace, after the largest pace of the ranks that stay.

    Evicted ranks are replaced by spares like the typical remaining rank (its median own time
    and spread). (nan, nan) without a rank with a pace; after is NaN when none would stay."""
    ranks = np.asarray(ranks, dtype=np.int64)
    evict = np.asarray(evict, dtype=bool)
    pos = np.full(int(ranks.max()) + 1 if ranks.size else 0, -1, dtype=np.int64)
    pos[ranks] = np.arange(ranks.size)
    n = len(epochs)
    now = after = weight = 0.0
    sums = np.zeros(ranks.size)
    steps = np.zeros(ranks.size)
    for k, epoch in enumerate(epochs):
        rows, n_steps, pace, own = (np.asarray(x) for x in epoch[:4])
        rows = rows.astype(np.int64)
        at = np.where(rows < pos.size, pos[np.minimum(rows, pos.size - 1)], -1) \
            if pos.size else np.full(rows.size, -1)
        ok = (at >= 0) & np.isfinite(pace) & (n_steps > 0)
        if not ok.any():
            continue
        w = WHATIF_KEEP ** (n - 1 - k)
        at, p, o = at[ok], np.asarray(pace[ok], np.float64), np.asarray(own[ok], np.float64)
        o = np.where(np.isfinite(o), o, p)
        if collective:
            spread = (np.asarray(epoch[4], np.float64)[ok] if len(epoch) > 4
                      else np.zeros(o.size))
            spread = np.where(np.isfinite(spread), spread, 0.0)
            stay = ~evict[at]
            step = float(np.median(p))
            lead = (_evicted_lead(o, spread, stay) if stay.any() else float("nan"))
            now += w * step
            after += w * (step - max(lead, 0.0))
            weight += w
        else:
            np.add.at(sums, at, w * n_steps[ok] * p)
            np.add.at(steps, at, w * n_steps[ok])
    if collective:
        return (now / weight, after / weight) if weight > 0 else (float("nan"), float("nan"))
    has = steps > 0
    if not has.any():
        return float("nan"), float("nan")
    pace = np.where(has, sums / np.where(has, steps, 1.0), np.nan)
    stay = has & ~evict
    return (float(np.nanmax(pace)),
            float(np.nanmax(pace[stay])) if stay.any() else float("nan"))


def _evicted_lead(own: np.ndarray, spread: np.ndarray, stay: np.ndarray) -> float:
    """What the ranks not in ``stay`` add to E[max] of the ranks' own times per step (µs):
    E[max] over all of them less E[max] over those that stay and as many spares (the median
    staying rank's own time and spread). Without spreads: the slowest evicted rank's lead over
    the slowest staying one, exactly."""
    gone = int((~stay).sum())
    if not gone:
        return 0.0
    if not (spread > 0).any():
        return float(own.max() - own[stay].max())
    spare_o, spare_s = float(np.median(own[stay])), float(np.median(spread[stay]))
    after = expected_max_normal(np.concatenate((own[stay], np.full(gone, spare_o))),
                                np.concatenate((spread[stay], np.full(gone, spare_s))))
    return expected_max_normal(own, spread) - after


#: The grid :func:`expected_max_normal` integrates on, and the standard deviations it spans.
NORMAL_GRID = 1025
NORMAL_SPAN = 8.0


def expected_max_normal(mean: np.ndarray, sd: np.ndarray) -> float:
    """E[max] of independent normal draws, one per rank (``mean`` and ``sd``, same unit; an sd of
    0 is a rank that always takes its mean).

    ``a + ∫_a^b (1 − Π Φ((x − m_i)/s_i)) dx`` on a grid from ``a`` (the largest of the steady
    ranks' means and of ``m_i − 8 s_i``: no maximum lies below it) to ``b`` (the largest
    ``m_i + 8 s_i``). Ranks are grouped on a lattice of a sixteenth of the smallest spread first,
    so a job of 16,384 ranks costs a few hundred rows of the grid, not 16,384."""
    from scipy.special import log_ndtr  # the log of the normal CDF, stable in its tail

    m = np.asarray(mean, dtype=np.float64)
    s = np.maximum(np.asarray(sd, dtype=np.float64), 0.0)
    varies = s > 0
    floor = float(m[~varies].max()) if (~varies).any() else -np.inf
    if not varies.any():
        return floor
    mv, sv = m[varies], s[varies]
    a = max(floor, float((mv - NORMAL_SPAN * sv).max()))
    b = float((mv + NORMAL_SPAN * sv).max())
    if b <= a:
        return a
    q = float(sv.min()) / 16.0
    cells, count = np.unique(np.stack((np.rint(mv / q), np.rint(sv / q)), axis=1), axis=0,
                             return_counts=True)
    mu, sig = cells[:, 0] * q, np.maximum(cells[:, 1], 1.0) * q
    x = np.linspace(a, b, NORMAL_GRID)
    log_f = np.zeros(x.size)
    step = max(1, _CHUNK_ELEMENTS // x.size)
    for i in range(0, mu.size, step):
        z = (x[None, :] - mu[i:i + step, None]) / sig[i:i + step, None]
        log_f += count[i:i + step] @ log_ndtr(z)
    gap = 1.0 - np.exp(log_f)
    return a + float(((gap[1:] + gap[:-1]) / 2.0 * np.diff(x)).sum())


def last_draw_quantile(mean: float, cv: float, n: int, q: float = 0.99) -> float:
    """The ``q`` quantile of the largest of ``n`` independent lognormal draws of mean ``mean``
    and coefficient of variation ``cv``: how long the last of a job's ranks can take in a
    regular step. Lognormal, because a time spreads by factors (a batch 30% longer takes 30%
    longer) and its right tail is longer than a normal's."""
    from scipy.special import ndtri

    if not (cv > 0 and n >= 1):
        return mean
    sigma = float(np.sqrt(np.log1p(cv * cv)))
    z = float(ndtri(q ** (1.0 / n)))
    return mean * float(np.exp(sigma * z - sigma * sigma / 2.0))


def max_of_normals_variance(n: int) -> float:
    """The variance of the largest of ``n`` independent standard normal draws (1 for one draw,
    0.37 for 8, 0.2 for 64): how much of the ranks' own spread a collective step shows."""
    from scipy.special import log_ndtr

    if n <= 1:
        return 1.0
    x = np.linspace(-NORMAL_SPAN - 2.0, NORMAL_SPAN + 2.0, 8001)
    pdf = n * np.exp(-x * x / 2.0 - 0.5 * np.log(2.0 * np.pi) + (n - 1) * log_ndtr(x))
    dx = float(x[1] - x[0])
    mean = float((x * pdf).sum() * dx)
    return max(float((x * x * pdf).sum() * dx) - mean * mean, 0.0)


#: The smallest relative spread of a rank's own time per step that :func:`independent_spread`
#: reports: below it the histograms cannot tell a spread from where the steps fall among
#: buckets 6-12.5% wide (steps 1.5% apart straddle an edge, steps 1.5% apart inside one bucket
#: read as none), and a spread read there from noise would take a 512-rank job's E[max] 4% up.
RESOLVED_SPREAD = 0.05


def independent_spread(own_cv2: np.ndarray, step_cv2: float, ranks: int) -> tuple[float, float]:
    """(the relative standard deviation of a typical rank's own time per step that is its own,
    not shared with its peers; its whole relative standard deviation), NaN without a rank's.
    ``own_cv2``: each rank's squared coefficient of variation of its own time per step;
    ``step_cv2``: the job's step's.

    A collective rank's own time per step is ``a_i S Y_i``: a factor ``S`` every rank shares in a
    step (the sequence length of a batch all ranks pad to, the host's load) and one ``Y_i`` of
    its own (its batch, its loader). Only ``Y`` makes a step wait for a different rank each
    time; read as its own, ``S`` would have the what-if take a steady lead for noise. Relative
    variances add: the typical rank's is ``v = var S + var Y``, the step's ``u = var S +
    c_n var Y`` (``c_n``: :func:`max_of_normals_variance`), so ``var Y = (v − u) / (1 − c_n)``,
    within ``[0, v]``. Relative, because sharing scales work (a longer batch on every rank)
    and the step's collective part scales with it. The typical rank's (the median), not each
    rank's: a histogram bucket is up to 12.5% wide, and one rank's steps that straddle an edge
    read as a 5% spread that a rank inside a bucket does not show. Below
    :data:`RESOLVED_SPREAD` the own part reads 0: steady ranks."""
    own_cv2 = np.asarray(own_cv2, dtype=np.float64)
    known = np.isfinite(own_cv2)
    if not known.any():
        return float("nan"), float("nan")
    v = float(np.median(own_cv2[known]))
    c = max_of_normals_variance(ranks)
    alone = (min(max((v - step_cv2) / (1.0 - c), 0.0), v) if np.isfinite(step_cv2) and c < 1.0
             else v)
    if alone < RESOLVED_SPREAD ** 2:
        alone = 0.0
    return float(np.sqrt(alone)), float(np.sqrt(v))


def what_if(counts: np.ndarray, evict: np.ndarray,
            shift_ns: np.ndarray | None = None, first_bucket: int = 0) -> tuple[float, float]:
    """E[max] now and after evicting rows ``evict`` (bool), in µs.

    Evicted ranks are replaced by spares that behave like the pooled remaining ranks (the job keeps
    its size, as after a real eviction), so the gain measures removing the slow ranks, not shrinking
    the job. ``shift_ns`` (R,) moves each row (see :func:`expected_max_us`); the spares get the
    remaining ranks' mean shift. ``first_bucket``: as in :func:`expected_max_us`.
    """
    c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    sh = np.zeros(c.shape[0]) if shift_ns is None else np.asarray(shift_ns, dtype=np.float64)
    evict = np.asarray(evict, dtype=bool)
    has = c.sum(axis=1) > 0
    gone = evict & has
    keep = has & ~evict
    if not gone.any() or not keep.any():
        now = expected_max_us(c if has.all() else c[has], None, sh[has], first_bucket)
        return now, (now if not gone.any() else float("nan"))
    # the two integrals side by side: numpy lets go of the interpreter lock inside each step,
    # so on a second core the what-if takes about the time of one. Nothing else runs meanwhile:
    # a thread that holds the lock in Python (building the report's messages) would keep each
    # numpy step waiting for it
    with ThreadPoolExecutor(1) as pool:
        now_f = pool.submit(expected_max_us, c if has.all() else c[has], None, sh[has],
                          first_bucket)
        n_rest = int(keep.sum())
        spares = np.empty((n_rest + 1, c.shape[1]))       # the remaining ranks, then a spare
        # a gather by index: np.compress into ``out`` took 3x as long
        rest = np.take(c, np.flatnonzero(keep), axis=0, out=spares[:n_rest])
        totals = rest.sum(axis=1, keepdims=True)
        spares[n_rest] = (rest / totals).mean(axis=0)     # an average healthy rank
        after = expected_max_us(spares, np.concatenate((np.ones(n_rest), [int(gone.sum())])),
                                np.concatenate((sh[keep], [float(sh[keep].mean())])),
                                first_bucket)
        return now_f.result(), after
