"""The minimal-numpy floor of one epoch's scoring: what :meth:`Engine.flush` could cost at best.

Why: "fast" needs a reference that is not the code itself. This is the same core statistics the
analyzer computes, done the simplest fast way in numpy on the same ingested data (the
epoch's :class:`~hypertrace.analyzer.score.cross_section.EpochAccumulator`, read by :func:`raw_histograms`),
with nothing else:

* per API, the dense bucket-major (K, G) count matrix of the buckets that hold data, built from
  the wire histograms with one ``np.bincount`` (several processes of one GPU add up);
* per GPU, each configured quantile (p50, p99) by linear interpolation inside the bucket that
  holds it, from the cumulative counts over the buckets (the analyzer's definition);
* across GPUs with ``min_samples`` calls, per stat: median, MAD (floored at ``mad_floor`` x
  |median|), quartiles by ``np.percentile``; the robust z, the Tukey fence, the effect gate
  (``min_effect``); the high and low flags.

What it leaves out, and the analyzer does: each value's sampling error, hosts (median GPU per
host, its allowance and fence), the fence re-read under contamination, the shift check behind a
verdict, kind and workload groups, the signals beside the latencies (run queue, steps, clocks),
persistence and verdicts, score rows and findings, spike rates and the what-if sums. So the
analyzer cannot reach the floor; the bench prints how far above it it is.
"""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.score.config import KNOWN_STATS, ScoringConfig
from hypertrace.analyzer.score.cross_section import EpochAccumulator
from hypertrace.proto import buckets


def raw_histograms(acc: EpochAccumulator
                   ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """{api: (job rows, first buckets, lengths, counts as uint64)}, one entry per process
    histogram as ingested. Read from the accumulator's internals on purpose:
    tests/gpu/scoring_ab.sh runs this bench against older analyzers, which have no accessor for
    them (they kept the counts decoded: views of their flat arrays)."""
    out = {}
    for api, flat in sorted(acc._apis.items()):
        if hasattr(flat, "raw"):                  # counts kept as the wire encoded them
            rows, firsts, lens, vals, _ = flat.raw()
            if rows.size:
                out[api] = (rows, firsts, lens, vals)
        elif flat.rows:
            out[api] = (np.frombuffer(flat.rows, dtype=np.int64),
                        np.frombuffer(flat.firsts, dtype=np.int64),
                        np.frombuffer(flat.lens, dtype=np.int64),
                        np.frombuffer(flat.vals, dtype=np.uint64))
    return out


def floor_flags(acc: EpochAccumulator, cfg: ScoringConfig
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{api: ((S, G) high flags, (S, G) low flags)} of one epoch's GPUs (module docstring)."""
    present = acc.rows_present()
    mask = np.zeros(int(present.max()) + 1, dtype=bool)
    mask[present] = True
    position = np.cumsum(mask) - 1
    n = int(mask.sum())
    cols = np.arange(n)
    qs = [KNOWN_STATS[s] for s in cfg.stats]
    out = {}
    for api, (rows, firsts, lens, counts) in raw_histograms(acc).items():
        lo = int(firsts.min())
        width = int((firsts + lens).max()) - lo
        starts = np.cumsum(lens) - lens
        flat = (np.arange(counts.size, dtype=np.int64) * n
                + np.repeat((firsts - lo - starts) * n + position[rows], lens))
        dense = np.bincount(flat, weights=counts.astype(np.float64),
                            minlength=width * n).reshape(width, n)
        cum = dense                                # cumulative counts in place, bucket by
        for k in range(1, width):                  # bucket: K vector adds over G contiguous
            cum[k] += cum[k - 1]                   # values (np.cumsum(axis=0) is ~5x slower)
        total = cum[-1]
        x = np.empty((len(qs), n))
        for j, q in enumerate(qs):
            t = total * q
            idx = np.minimum((cum < t).sum(axis=0), width - 1)
            below = np.where(idx > 0, cum[idx - 1, cols], 0.0)
            inside = cum[idx, cols] - below
            with np.errstate(invalid="ignore", divide="ignore"):
                frac = np.clip((t - below) / inside, 0.0, 1.0)
            b = idx + lo
            x[j] = (buckets.LOWER_NS[b] + frac * (buckets.UPPER_NS[b] - buckets.LOWER_NS[b])) / 1e3
        ok = total >= cfg.min_samples
        xs = x[:, ok]
        q1, med, q3 = np.percentile(xs, [25.0, 50.0, 75.0], axis=1)
        mad = np.median(np.abs(xs - med[:, None]), axis=1)
        mad = np.maximum(mad, cfg.mad_floor * np.abs(med))[:, None]
        med, iqr = med[:, None], (q3 - q1)[:, None]
        z = 0.6745 * (x - med) / mad
        effect = np.abs(x / med - 1.0) >= cfg.min_effect
        high = (z > cfg.z_threshold) & (x > q3[:, None] + cfg.iqr_k * iqr) & effect & ok
        low = (z < -cfg.z_threshold) & (x < q1[:, None] - cfg.iqr_k * iqr) & effect & ok
        out[api] = (high, low)
    return out
