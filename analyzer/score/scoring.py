"""Robust cross-sectional scoring of one API across the GPUs of one job (and kind) in one epoch.

Why these rules together:

* **robust z** = 0.6745·(x − median)/MAD: median and MAD are not dragged by the outliers we look
  for, unlike mean and standard deviation (a mean ± 3σ rule is blind when a whole node is slow).
* **MAD = 0** (identical values, quantized histograms): the MAD is floored at
  ``mad_floor`` x |median| (and at 1e-9 µs), so identical values score 0 and nothing divides by 0.
* **each GPU's own sampling error**: a quantile read from a histogram of n calls has standard
  error ``SE ≈ sqrt(q(1−q)n) · bucket width / (calls in the quantile's bucket)`` (order statistics
  with the density read off the histogram). The scale of GPU i is ``max(MAD, 0.6745·SE_i)``, so a
  p99 that rests on a handful of calls in a wide bucket cannot look significant just because the
  cross-section happens to cluster (measured: without it ~4% of GPUs of a clean 16,384-GPU job
  flag on p99 every window; with it ~0.1%).
* **Tukey fences** ``Q1 − k·IQR`` / ``Q3 + k·IQR``: a second, quantile-based opinion; a value must
  be beyond both the z cut and the fence. Where more than a tenth of the values are beyond the z
  cut, the quartiles are read without them (:func:`_fence_quartiles`): quartiles break down at a
  quarter of the values, the MAD at half. Hosts of a job with fewer than :data:`HOST_FENCE_MIN`
  hosts are not fenced (:func:`score_hosts` says why).
* **minimum effect**: |x/median − 1| >= ``min_effect``; statistical significance without practical
  significance (0.5% on a tight distribution) is not a finding.
* **hosts as well as GPUs** (:func:`score_hosts`): a slow host slows all of its GPUs, so the same
  rules also score each host's *median* GPU value against the job's other hosts. The median of 8
  GPUs carries far less window and GPU noise than one GPU, which buys one thing: an allowance.
  A host that truly is ``min_effect`` slow measures under it in half of the windows (its
  measurement noise), so the host gate is ``min_effect`` less ``host_effect_sigmas`` standard
  errors of a host median (:func:`host_allowance`), and never more than
  :data:`MAX_HOST_ALLOWANCE` below it. Why the standard error and not the hosts' spread: hosts
  differ persistently (0.5-1.5% is common), and an allowance read from that spread shrank the
  gate as the spread grew, until naturally 3%-slow hosts were convicted (simulated, 2,048 GPUs).
  The noise of one host's median is what the allowance is for. The same allowance on single
  GPUs convicts healthy GPUs of a 16,384-GPU job (measured; docs/design.md), so single GPUs keep
  the plain gate.
* **minimum samples**: a GPU with fewer than ``min_samples`` calls of this API in the epoch is not
  scored for it (NaN value, never flagged).
* **both tails**: ``high`` and ``low`` are returned separately; what each means depends on the
  API (:func:`meaning`, :func:`implicates`).

Everything is vectorized over GPUs and stats: one call scores 16,384 GPUs without a Python loop
over them.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hypertrace.analyzer.score.config import KNOWN_STATS, ScoringConfig
from hypertrace.analyzer.score.cross_section import Hists
from hypertrace.proto import buckets

#: What each tail means, per API kind. Shown in every finding, because "low" is the bad tail for
#: synchronize calls and people get this backwards.
MEANINGS: dict[tuple[str, str], str] = {
    ("launch", "high"): "launch calls slower than the rest of the job: this host issues work "
                        "slowly (CPU contention, NUMA placement, PCIe, throttled clocks)",
    ("launch", "low"): "launch calls faster than the rest of the job: not a problem by itself",
    ("sync", "low"): "shortest synchronize waits in the job: this rank arrives last at the "
                     "collective, it is the one everybody waits for (supporting evidence: "
                     "convicts only with a direct signal)",
    ("sync", "high"): "longer synchronize waits than the job: this rank waits on others; it is "
                      "not itself slow",
    ("other", "high"): "slower than the rest of the job",
    ("other", "low"): "faster than the rest of the job: not a problem by itself",
}


def meaning(kind: str, direction: str) -> str:
    return MEANINGS[(kind, direction)]


def implicates(kind: str, direction: str) -> bool:
    """Does a finding in this tail make *this* GPU suspect? (launch high, other high; never a
    sync tail).

    A sync low tail (arrives last at the collective) is supporting evidence only: on an H200 with
    8 independent ranks sharing one GPU, healthy ranks' synchronize p50 sat at 0.44-0.48 of the
    job's with step times equal to the job's. The waited-for rank is convicted by direct signals
    (busy time, run-queue share, waits on its own GPU: :mod:`hypertrace.analyzer.score.signals`). The
    engine further requires a launch high tail to be corroborated by the steps where the GPU has
    any (:func:`hypertrace.analyzer.score.signals.launch_corroboration`)."""
    return kind != "sync" and direction == "high"


@dataclass
class StatScores:
    """Scores of one API for G GPUs and S stats; arrays are (G, S), per-stat arrays (S,)."""

    stats: tuple[str, ...]
    value_us: np.ndarray       # (G, S) NaN where not scored
    count: np.ndarray          # (G,) calls of this API per GPU
    scored: np.ndarray         # (G,) bool: enough samples and part of a big-enough cross-section
    median_us: np.ndarray      # (S,)
    mad_us: np.ndarray         # (S,) effective MAD (after the floor)
    effect_gate: np.ndarray    # (S,) relative deviation needed (min_effect, less any allowance)
    robust_z: np.ndarray       # (G, S)
    ratio: np.ndarray          # (G, S)
    high: np.ndarray           # (G, S) bool
    low: np.ndarray            # (G, S) bool


#: Per bucket, the lowest and the first excluded value (ns) that :func:`_bucket_holding` places
#: in it: ``LOWER_NS`` with the first bucket open below and the last open above.
_HOLD_FROM = np.concatenate(([-np.inf], buckets.LOWER_NS[1:]))
_HOLD_UNTIL = np.concatenate((buckets.LOWER_NS[1:], [np.inf]))


def _bucket_holding(x_ns: np.ndarray, near: np.ndarray | None) -> np.ndarray:
    """The bucket of each value (ns): ``searchsorted(LOWER_NS, x, "right") - 1`` clipped to the
    scheme. ``near``: a guess per value (the bucket a quantile was read from), taken where the
    value lies inside it; only the other values are searched for (at a bucket's upper edge a
    quantile's value belongs to the next bucket). Why: a search over all 226 edges costs
    several times the check."""
    def search(x: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(buckets.LOWER_NS, x, side="right") - 1, 0,
                       buckets.NUM_BUCKETS - 1)

    if near is None:
        return search(x_ns)
    b = np.clip(near, 0, buckets.NUM_BUCKETS - 1)
    miss = ~((_HOLD_FROM.take(b) <= x_ns) & (x_ns < _HOLD_UNTIL.take(b)))
    if miss.any():
        b[miss] = search(x_ns[miss])
    return b


#: Each bucket's width (µs).
_WIDTH_US = (buckets.UPPER_NS - buckets.LOWER_NS) / 1e3


def sampling_se_us(hists: Hists, values_us: np.ndarray, stats: tuple[str, ...],
                   near: np.ndarray | None = None) -> np.ndarray:
    """Standard error (µs) of each quantile in ``values_us`` (G, S), read off the GPUs'
    histograms (see the module docstring). NaN values give NaN. ``near`` (S, G): the buckets
    the values were read from (:meth:`Hists.quantiles_and_buckets`), a guess that saves the
    search for the bucket holding each value."""
    v = np.ascontiguousarray(np.asarray(values_us, dtype=np.float64).T)     # (S, G)
    finite = np.isfinite(v)
    b = _bucket_holding(np.where(finite, v * 1e3, 0.0), near)
    k, g = hists.counts_t.shape
    col = np.clip(b - hists.first, 0, k - 1)
    in_bucket = hists.counts_t.ravel().take(col * g + np.arange(g))
    width_us = _WIDTH_US.take(b)
    q = np.asarray([KNOWN_STATS[s] for s in stats])[:, None]
    n = hists.total()
    se = np.sqrt(q * (1.0 - q) * n) * width_us / np.maximum(in_bucket, 1.0)
    return np.where(finite, se, np.nan).T     # (G, S), a view of the (S, G) result


def _finite_rows(values: np.ndarray) -> np.ndarray:
    """(G,) rows of a (G, S) array with every value finite. Column by column: numpy reduces a
    short last axis row by row, ~15x slower at 16,384 x 2."""
    ok = np.ones(values.shape[0], dtype=bool)
    for j in range(values.shape[1]):
        ok &= np.isfinite(values[:, j])
    return ok


#: The host gate is never more than this below ``min_effect`` (a host under 4% slow is never
#: convicted as a host, however noisy the job's GPUs are).
MAX_HOST_ALLOWANCE = 0.01


def host_allowance(values: np.ndarray, scored: np.ndarray, layout: "HostLayout",
                   median: np.ndarray, cfg: ScoringConfig,
                   host_meds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """(S,) how far below ``min_effect`` a host median may measure and still count: 
    ``host_effect_sigmas`` standard errors of a host median, capped at
    :data:`MAX_HOST_ALLOWANCE`. The standard error is read off the GPUs *within* hosts: the
    typical (median over hosts) robust spread of a host's GPUs around their host median,
    relative to the job median, times 1.2533 / sqrt(GPUs per host) (the standard error of a
    median). It includes the GPUs' own persistent spread, so it errs on the generous side; the
    cap bounds that. ``host_meds``: :func:`host_medians` of the same values, when known."""
    v = np.asarray(values, dtype=np.float64)
    ok = scored & _finite_rows(v)
    med_h, n = host_medians(v, ok, layout) if host_meds is None else host_meds
    use = n >= cfg.host_min_gpus
    out = np.zeros(v.shape[1])
    if not use.any() or cfg.host_effect_sigmas <= 0:
        return out
    mine = ok & use[layout.host]
    # (G, S) around the own host, computed per stat over contiguous GPUs
    if layout.full:                          # GPU i is cell i: its host's median broadcasts
        s, h = v.shape[1], layout.hosts
        dev = np.abs(np.ascontiguousarray(v.T).reshape(s, h, layout.slots)
                     - np.ascontiguousarray(med_h.T)[:, :, None]).reshape(s, -1).T
    else:
        dev = np.abs(np.ascontiguousarray(v.T)
                     - np.ascontiguousarray(med_h.T).take(layout.host, axis=1)).T
    spread, _ = host_medians(dev, mine, layout)              # per-host MAD
    spread = spread[use]
    mad = np.array([np.median(c[np.isfinite(c)]) if np.isfinite(c).any() else 0.0
                    for c in spread.T])
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(np.abs(median) > 0, mad / (0.6745 * np.abs(median)), 0.0)
    se = 1.2533 * np.nan_to_num(rel) / np.sqrt(float(np.median(n[use])))
    return np.minimum(cfg.host_effect_sigmas * se, MAX_HOST_ALLOWANCE)


#: Hosts are fenced only in cross-sections of at least this many hosts (:func:`score_hosts`).
HOST_FENCE_MIN = 32


#: Share of a cross-section beyond the z cut above which the fences' quartiles are re-read
#: without those values, in cross-sections of at least FENCE_RECOUNT_MIN values.
FENCE_RECOUNT_SHARE = 0.10
FENCE_RECOUNT_MIN = 32


def _far_count(row: np.ndarray, med: float, mad: float, z_cut: float) -> int:
    """How many values of ``row`` (sorted ascending) have a robust z beyond +-``z_cut``:
    ``(np.abs(0.6745 * (row - med) / mad) > z_cut).sum()`` with ``mad > 0``, found by two
    searches for where the z crosses the cut (it never decreases along a sorted row), each
    step the same float operations on one value, instead of four passes over the row."""
    n = row.size

    def z(i: int) -> float:
        return 0.6745 * (row[i] - med) / mad

    # where the cut's values would sit: a guess, confirmed with the z itself
    span = z_cut * mad / 0.6745
    below = _first_true(lambda i: not z(i) < -z_cut, n,
                        int(np.searchsorted(row, med - span, side="left")))
    above = _first_true(lambda i: z(i) > z_cut, n,
                        int(np.searchsorted(row, med + span, side="right")))
    return below + n - above


def _first_true(pred: Callable[[int], bool], n: int, guess: int) -> int:
    """The first i in 0..n-1 where ``pred`` (False, then True along 0..n-1) holds, n where it
    never does. Two evaluations confirm a right ``guess`` (the index before it fails, its own
    holds); a wrong one (rounding, ties at the cut) falls back to a binary search."""
    if (guess == 0 or not pred(guess - 1)) and (guess == n or pred(guess)):
        return guess
    return bisect.bisect_left(range(n), True, key=pred)


def _fence_quartiles(x: np.ndarray, q1: np.ndarray, q3: np.ndarray, med: np.ndarray,
                     mad: np.ndarray, z_cut: float) -> tuple[np.ndarray, np.ndarray]:
    """(Q1, Q3) for the Tukey fences of ``x`` (S, n, each row sorted). The quartiles break down at 25%
    contamination: with two slow nodes of eight, a quarter of the GPUs are slow, Q3 sits inside
    the slow cluster and the fence hides both (simulated: a 10%-slow node convicted at window 6
    instead of 3). The MAD holds up to 50%, so where more than ``FENCE_RECOUNT_SHARE`` (and
    less than a third) of the values are beyond the z cut in either direction, the quartiles are
    read again without them. A third or more beyond the cut is the cross-section's own spread
    (a collapsed MAD), which is what the fence is there to see. A clean cross-section has a
    handful beyond the cut and keeps its quartiles (and its cost). Under
    ``FENCE_RECOUNT_MIN`` values the quartiles of what would remain are too coarse (measured: in
    an 8-rank job a rank whose step p50 read 7% high from its 12.5%-wide bucket was convicted),
    and the fences stay as they are."""
    n = x.shape[1]
    if n < FENCE_RECOUNT_MIN:
        return q1, q3
    count = np.array([_far_count(x[j], med[j], mad[j], z_cut) for j in range(x.shape[0])])
    for j in np.flatnonzero((count > FENCE_RECOUNT_SHARE * n) & (3 * count < n)):
        far = np.abs(0.6745 * (x[j] - med[j]) / mad[j]) > z_cut
        rest = x[j, ~far]
        if rest.size >= 4:
            q1[j], q3[j] = np.percentile(rest, [25.0, 75.0])
    return q1, q3


def sorted_percentiles(x: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """(len(qs), S) quantiles of each row of ``x`` (S, n), rows sorted ascending, n >= 1: the
    numbers ``np.percentile(x, 100 * q, axis=1)`` gives (its default "linear" method, the same
    float operations), read off one sort instead of a partition per call. Why: a sort of
    16,384 values costs less than numpy's percentile machinery around its partitions (measured
    at 16,384 GPUs x 2 stats: 0.2 ms against 1.0 ms), and the MAD needs the median anyway."""
    n = x.shape[1]
    out = np.empty((len(qs), x.shape[0]))
    for i, q in enumerate(qs):
        v = (n - 1) * q                       # numpy's virtual index
        lo = min(int(math.floor(v)), n - 1)
        hi = min(lo + 1, n - 1)
        gamma = v - math.floor(v)
        a, b = x[:, lo], x[:, hi]
        diff = b - a
        out[i] = b - diff * (1.0 - gamma) if gamma >= 0.5 else a + diff * gamma
    return out


def sorted_median(x: np.ndarray) -> np.ndarray:
    """(S,) median of each row of ``x`` (S, n), rows sorted ascending: ``np.median(x, axis=1)``
    (the middle value, or the mean of the two middle values)."""
    n = x.shape[1]
    if n % 2:
        return x[:, n // 2].copy()
    return (x[:, n // 2 - 1] + x[:, n // 2]) / 2.0


def node_weights(hosts: np.ndarray) -> np.ndarray | None:
    """Each scored GPU's weight in the cross-section, from its host (``hosts``, (n,) host
    codes, small non-negative integers): 1, but
    on a host with more scored GPUs than the median host, the median host's count over its own,
    so that no host weighs more than a typical one; None where every weight is 1 (the plain
    statistics, the usual case: hosts alike).

    Why: the median and the MAD resist outlying GPUs, not a block of GPUs that all speak for
    one host. A host that sends more GPUs than the others (a misconfigured agent, or a stolen
    key speaking for fake GPUs) would otherwise move the job's median by its own weight and
    convict the real hosts, or hide a slow one (docs/design.md, "The trust model")."""
    if hosts.size == 0:
        return None
    per_host = np.bincount(hosts)            # host codes: small non-negative integers
    counts = per_host[per_host > 0]
    typical = float(np.median(counts))
    if counts.max() <= typical:
        return None
    return np.minimum(1.0, typical / per_host[hosts])


def weighted_quantiles(x: np.ndarray, w: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """Quantiles ``qs`` of the values ``x`` (n,) with weights ``w`` (n,): each value stands at
    the middle of its weight's span of the cumulative weight, linear in between."""
    order = np.argsort(x, kind="stable")
    xs, ws = x[order], w[order]
    at = (np.cumsum(ws) - ws / 2.0) / ws.sum()
    return np.interp(qs, at, xs)


def _weighted_center(x: np.ndarray, w: np.ndarray, cfg: ScoringConfig
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(q1, median, q3, effective MAD), each (S,), of the rows of ``x`` (S, n) weighted by
    ``w`` (n,) (:func:`node_weights`); the quartiles of the values within the z cut as
    :func:`_fence_quartiles` takes them."""
    s = x.shape[0]
    q1, med, q3, mad_eff = (np.empty(s) for _ in range(4))
    for j in range(s):
        row = x[j]
        q1[j], med[j], q3[j] = weighted_quantiles(row, w, (0.25, 0.5, 0.75))
        mad = float(weighted_quantiles(np.abs(row - med[j]), w, (0.5,))[0])
        mad_eff[j] = max(mad, cfg.mad_floor * abs(med[j]), 1e-9)
        near = np.abs(0.6745 * (row - med[j]) / mad_eff[j]) <= cfg.z_threshold
        if near.sum() >= 4 and not near.all():
            q1[j], q3[j] = weighted_quantiles(row[near], w[near], (0.25, 0.75))
    return q1, med, q3, mad_eff


def _scale(mad: np.ndarray, se_us: np.ndarray) -> np.ndarray:
    """(S, G) each value's scale: ``max(MAD, 0.6745 x SE)`` with a NaN SE read as 0, for
    the (S,) ``mad`` (> 0) and the (G, S) ``se_us``. ``fmax`` passes over a NaN where
    ``nan_to_num`` would copy the array to replace it; only an infinite SE, which
    ``nan_to_num`` makes the largest float, needs that copy."""
    scaled = 0.6745 * se_us.T
    out = np.fmax(mad[:, None], scaled, out=scaled)
    if np.isinf(out).any():
        out = np.maximum(mad[:, None], 0.6745 * np.nan_to_num(se_us.T))
    return out


def score_values(values_us: np.ndarray, count: np.ndarray, cfg: ScoringConfig,
                 stats: tuple[str, ...], se_us: np.ndarray | None = None,
                 allowance: np.ndarray | None = None,
                 no_allowance: np.ndarray | None = None,
                 absolute_gate: float | None = None, fence: bool = True,
                 hosts: np.ndarray | None = None) -> StatScores:
    """Score precomputed quantiles ``values_us`` (G, S) of G GPUs with ``count`` calls each;
    ``hosts`` (G,), when given, is each GPU's host: a host with more scored GPUs than the
    typical host weighs only as much as it (:func:`node_weights`);
    ``se_us`` (G, S), when given, is each value's own sampling error (see module docstring);
    ``allowance`` (S,) lowers the effect gate (hosts only, see :func:`score_hosts`), except for
    the rows where ``no_allowance`` (G,) is True: they keep the plain ``min_effect``.

    ``absolute_gate``, when given, replaces the relative effect gate by an absolute one,
    ``|x - median| >= absolute_gate`` in the values' own unit: for shares of wall time whose job
    median is near 0 (a run-queue share of 0.2%), where any ratio is huge and means nothing."""
    values_us = np.asarray(values_us, dtype=np.float64)
    g, s = values_us.shape
    ok = (np.asarray(count) >= cfg.min_samples) & _finite_rows(values_us)
    if int(ok.sum()) < cfg.min_gpus:
        ok = np.zeros(g, dtype=bool)
    nan_s = np.full(s, np.nan)
    if not ok.any():
        empty = np.full((g, s), np.nan)
        no = np.zeros((g, s), dtype=bool)
        return StatScores(stats, np.where(ok[:, None], values_us, np.nan), np.asarray(count), ok,
                          nan_s, nan_s, nan_s, empty, empty.copy(), no, no.copy())
    # Every (G, S) operation below runs on the transpose, (S, G): numpy runs an elementwise
    # operation with a per-stat (S,) operand over a (G, 2) array as G inner loops of 2
    # (several times slower). The results are the transposes' views: the same values.
    vt = np.ascontiguousarray(values_us.T)
    x = np.compress(ok, vt, axis=1)                          # (S, n): contiguous per stat
    weights = None if hosts is None else node_weights(np.asarray(hosts)[ok])
    if weights is None:
        x.sort(axis=1)
        q1, med, q3 = sorted_percentiles(x, (0.25, 0.5, 0.75))
        dev = np.abs(x - med[:, None])
        dev.sort(axis=1)
        mad = sorted_median(dev)
        mad_eff = np.maximum(mad, np.maximum(cfg.mad_floor * np.abs(med), 1e-9))
        q1, q3 = _fence_quartiles(x, q1, q3, med, mad_eff, cfg.z_threshold)
    else:
        q1, med, q3, mad_eff = _weighted_center(x, weights, cfg)
    iqr = q3 - q1
    v = np.where(ok, vt, np.nan)
    med_c = med[:, None]
    scale = mad_eff[:, None] if se_us is None else _scale(mad_eff, se_us)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = 0.6745 * (v - med_c) / scale
        ratio = v / np.where(med > 0, med, np.nan)[:, None]
    gate = cfg.min_effect - (np.zeros(s) if allowance is None else np.asarray(allowance))
    row_gate = np.broadcast_to(gate[:, None], v.shape)
    if no_allowance is not None:
        row_gate = np.where(np.asarray(no_allowance)[None, :], cfg.min_effect, row_gate)
    if absolute_gate is None:
        effect = np.abs(ratio - 1.0) >= row_gate
    else:
        effect = np.abs(v - med_c) >= absolute_gate
    hi_fence = q3 + cfg.iqr_k * iqr if fence else np.full(s, -np.inf)
    lo_fence = q1 - cfg.iqr_k * iqr if fence else np.full(s, np.inf)
    high = (z > cfg.z_threshold) & (v > hi_fence[:, None]) & effect
    low = (z < -cfg.z_threshold) & (v < lo_fence[:, None]) & effect
    if not ok.all():                     # (an unscored value is NaN: no comparison holds)
        high &= ok
        low &= ok
    return StatScores(stats, v.T, np.asarray(count), ok, med, mad_eff, gate, z.T, ratio.T,
                      high.T, low.T)


def score_api(hists: Hists, cfg: ScoringConfig) -> StatScores:
    """Score one API of G GPUs on every stat of ``cfg`` (quantiles, sampling error, rules)."""
    q, near = hists.quantiles_and_buckets([KNOWN_STATS[s] for s in cfg.stats])
    return score_values(q, hists.total(), cfg, cfg.stats,
                        sampling_se_us(hists, q, cfg.stats, near))


@dataclass
class HostLayout:
    """Which host each of G GPUs sits on, as a (hosts x slots) grid: GPU i is cell
    ``(host[i], slot[i])``. Built once per job and set of GPUs (hosts rarely change), so the
    per-epoch host medians are one scatter and one sort of a small 2-D array."""

    host: np.ndarray     # (G,) host index 0..H-1
    slot: np.ndarray     # (G,) position of the GPU within its host
    hosts: int
    slots: int
    #: every host holds ``slots`` GPUs and GPU i is cell i (GPUs listed host by host, the
    #: common order): then the (H, slots) grid of a stat is its values reshaped, no scatter
    full: bool = False

    @property
    def cell(self) -> np.ndarray:
        """(G,) flat index ``host * slots + slot`` of each GPU in a row-major (H, slots) grid."""
        return self.host * self.slots + self.slot

    @classmethod
    def of(cls, host_codes: np.ndarray) -> "HostLayout":
        codes = np.asarray(host_codes, dtype=np.int64)
        uniq, host = np.unique(codes, return_inverse=True)
        order = np.argsort(host, kind="stable")
        sizes = np.bincount(host, minlength=uniq.size)
        starts = np.cumsum(sizes) - sizes
        slot = np.empty(codes.size, dtype=np.int64)
        slot[order] = np.arange(codes.size) - np.repeat(starts, sizes)
        slots = int(sizes.max()) if sizes.size else 0
        # full: every host has ``slots`` GPUs and they are listed host by host, so the values
        # reshape into the (hosts, slots) grid (a short host anywhere, the last one too, is not)
        full = bool(codes.size) and codes.size == uniq.size * slots and bool(
            np.array_equal(host * slots + slot, np.arange(codes.size)))
        return cls(host, slot, int(uniq.size), slots, full)


def host_medians(values: np.ndarray, scored: np.ndarray,
                 layout: HostLayout) -> tuple[np.ndarray, np.ndarray]:
    """((H, S) median of each host's scored GPUs, (H,) how many were scored); NaN for none."""
    v = np.asarray(values, dtype=np.float64)
    s = v.shape[1]
    ok = scored & _finite_rows(v)
    if layout.full and ok.all():             # every cell filled: the values are the grid
        grid = np.sort(np.ascontiguousarray(v.T).reshape(s, layout.hosts, layout.slots),
                       axis=2)
        lo, hi = (layout.slots - 1) // 2, layout.slots // 2
        return ((grid[:, :, lo] + grid[:, :, hi]) / 2.0).T, np.full(layout.hosts, layout.slots)
    cell = layout.cell[ok]
    # one (H, slots) grid per stat, filled by a 1-D scatter (a 2-D fancy scatter costs ~5x more)
    size = layout.hosts * layout.slots
    grid = np.full((s, size), np.nan)
    for j in range(s):
        grid[j, cell] = v[:, j][ok]
    grid = grid.reshape(s, layout.hosts, layout.slots)
    grid.sort(axis=2)                                   # NaNs sort last
    n = np.bincount(layout.host[ok], minlength=layout.hosts)
    at = np.arange(layout.hosts) * layout.slots         # each host's first cell, flat
    flat = grid.reshape(s, size)
    med = ((flat.take(at + np.maximum(n - 1, 0) // 2, axis=1)
            + flat.take(at + n // 2, axis=1)) / 2.0).T
    med[n == 0] = np.nan
    return med, n


def score_hosts(values_us: np.ndarray, scored: np.ndarray, layout: HostLayout,
                cfg: ScoringConfig, stats: tuple[str, ...]) -> tuple[StatScores, np.ndarray]:
    """Score each host's median GPU value against the other hosts (module docstring), with the
    effect gate lowered by :func:`host_allowance`.

    Hosts with fewer than ``host_min_gpus`` scored GPUs are not scored (a median of one or two
    GPUs is a GPU value, and gets no allowance). A host whose p99 is a spike this window (above
    ``1 + spike_threshold`` times the hosts' median p99) gets no allowance either: a second mode
    (a GC pause, cold reads) drags the p50 up by a percent or two without the body moving, and
    the allowance is for a shifted body measured with jitter. Returns the hosts' scores and, per
    GPU, its host's index (for mapping host flags back onto GPUs).

    Fewer than :data:`HOST_FENCE_MIN` hosts (a job of under 256 GPUs) are scored without the
    Tukey fence. Why: the quartiles of 8 host medians are the 2nd and 6th values, so one host
    that is naturally 3-4% slow lifts Q3 and the fence above +6% while the z cut (MAD) and the
    effect gate both see a 5.6%-slow neighbour (simulated, 64 GPUs: such hosts went unconvicted
    for 16 windows). The fence re-read (:func:`_fence_quartiles`) cannot help under 32 values.
    What still stands between a healthy host and a verdict: the z cut, the effect gate (never
    under 4%), corroboration by its steps, a shifted distribution, and 3 flags in 5 windows."""
    med, n = host_medians(values_us, scored, layout)
    # score_values gates rows on a sample count: give hosts with enough scored GPUs exactly the
    # minimum, the others none (their GPUs already passed min_samples one by one)
    count = np.where(n >= cfg.host_min_gpus, cfg.min_samples, 0)
    usable = count > 0
    job_median = (np.median(med[usable], axis=0) if usable.any()
                  else np.full(len(stats), np.nan))
    spiking = None
    if "p99" in stats:
        j = stats.index("p99")
        p99 = med[:, j]
        finite = usable & np.isfinite(p99)
        if finite.any():
            # the hosts' typical p99: the job median's own when every usable host has one
            typical = (job_median[j] if np.isfinite(job_median[j])
                       else np.median(p99[finite]))
            spiking = finite & (p99 > (1.0 + cfg.spike_threshold) * typical)
    allowance = host_allowance(values_us, scored, layout, job_median, cfg, (med, n))
    fence = int((count > 0).sum()) >= HOST_FENCE_MIN
    return (score_values(med, count, cfg, stats, None, allowance, spiking, fence=fence),
            layout.host)
