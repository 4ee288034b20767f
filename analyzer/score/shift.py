"""Shift of a GPU's whole latency distribution, so that one quantile never convicts alone.

Why: a slow host shifts every call it makes, so its whole launch-latency distribution moves right
by about the same factor. A different kernel mix does not shift anything; it reweights the modes.
Take two kernel kinds at 10 and 30 µs with 47% of the calls the long kind: the p50 sits on the
steep step between the modes, and a GPU with 50% long calls has its p50 jump by 2-3x while every
other decile stays where it was. Simulated (256 GPUs, shares 0.44-0.47 +- 0.03 per GPU, no step
data): 5-11 healthy GPUs convicted per job on p50 alone.

**The estimator.** For a GPU, the log ratio of each outer decile (10th, 20th, 80th and 90th
percentile) to the same decile of its peer class's pooled histogram; the shift is exp of their
median. A true slowdown moves every decile by its factor, so the median is that factor. A
reweighting moves the deciles near the boundary between the modes a lot, and the others a little
(a decile inside a mode sits at a different level of that mode when the mode's weight changes).
The outer deciles move least: with shares 0.47 +- 0.03, the 20th-highest healthy GPU-window shift
of 1,536 was 1.027-1.032 on the outer four, and 1.035-1.045 on all nine, while a 5%-slow host's
GPUs measured 1.050 (simulated, 4 seeds, per 10-s window).

**Spikes are cut off first.** A hiccup (a shared switch, a storage stall, a GC pause) delays a
share of a GPU's calls several times over for a window or two; with 20% of the calls in such a
second mode every decile above the 20th is read off a different part of the body, and the whole
distribution looks shifted by 4-8% (simulated: a rack of four nodes hit together for two
windows was convicted). Calls slower than :data:`SPIKE_CUT` times the peers' pooled median are
a second mode, not a shifted body, so both sides' deciles are read from the calls below that
cut. A GPU with more than half of its calls above it is not spiking, it is that slow: its
deciles are read from all of its calls, and compared with the peers' deciles of all of theirs.

**Where it applies.** A high tail of a verdict stat (p50) of a launch or other API implicates a
GPU only when its shift is at least ``1 + min_effect`` too. On the host basis the median shift of
the host's GPUs must pass the host's effect gate (``min_effect`` less the host allowance, at
least 4%: analyzer/score/scoring.py). Reweighting still moves the outer deciles a little: +0.03 of share
gave host shifts under 2% (simulated), while a 5%-slow host measured about 1.05. The shift is
computed only for the GPUs and hosts that a p50 flagged (a handful per epoch), so it costs
nothing at 16k GPUs.

**Failure modes.** A slowdown confined to one kernel kind (a throttled copy engine that slows only
memcpy-heavy launches) moves only that mode. If that mode holds less than half the calls, the
shift misses it; the p50 finding is still reported, as evidence that does not convict. Pooled
deciles follow the class's mean mix, which is near the per-GPU median mix unless the class is
strongly bimodal across GPUs (two populations): then each population should be its own workload
group (analyzer/score/imbalance.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hypertrace.analyzer.score.cross_section import Hists
from hypertrace.proto import buckets

#: The deciles compared: the outer ones (the estimator in the module docstring).
DECILES: tuple[float, ...] = (0.1, 0.2, 0.8, 0.9)
#: Calls slower than this many times the peers' pooled median are a second mode (a spike).
SPIKE_CUT = 2.0


@dataclass(frozen=True)
class PeerDeciles:
    """The peers' pooled deciles (µs), read below ``cut`` (a bucket index: buckets from it on
    hold spikes), and read from all of their calls (``whole``)."""

    deciles: np.ndarray
    whole: np.ndarray
    cut: int


def pooled_deciles(hists: Hists, peers: np.ndarray | None = None) -> PeerDeciles:
    """The deciles of the pooled histogram of the ``peers`` columns (None: all of them, without
    copying the matrix), read below ``SPIKE_CUT`` x its median."""
    if peers is None:                   # each bucket summed over the GPUs: exact on whole counts
        pooled = Hists(hists.bucket_totals()[:, None], hists.first)
    else:
        pooled = Hists(hists.counts_t[:, peers].sum(axis=1, keepdims=True), hists.first)
    q = pooled.quantiles_us([0.5, *DECILES])[0]
    median_ns, whole = float(q[0]) * 1e3, q[1:]
    cut = int(np.searchsorted(buckets.LOWER_NS, SPIKE_CUT * median_ns, side="left")) \
        if np.isfinite(median_ns) else buckets.NUM_BUCKETS
    if cut - hists.first >= hists.counts_t.shape[0]:
        return PeerDeciles(whole, whole, cut)               # nothing lies above the cut
    below, _ = _below(pooled, cut)
    return PeerDeciles(below.quantiles_us(list(DECILES))[0], whole, cut)


def _below(hists: Hists, cut: int) -> tuple[Hists, np.ndarray]:
    """(``hists`` without the buckets from index ``cut`` on, (G,) which columns were cut): a
    column is cut where those buckets hold at most half of its calls (more than half above is a
    slow GPU, not a spike: kept whole)."""
    keep = max(0, min(cut - hists.first, hists.counts_t.shape[0]))
    if keep == hists.counts_t.shape[0]:
        return hists, np.ones(hists.size, dtype=bool)
    low = hists.counts_t[:keep]
    trim = 2 * low.sum(axis=0) >= hists.total()
    return Hists(np.where(trim[None, :], np.concatenate(
        (low, np.zeros_like(hists.counts_t[keep:]))), hists.counts_t), hists.first), trim


def shift_ratios(hists: Hists, cols: np.ndarray, ref: PeerDeciles) -> np.ndarray:
    """exp(median over deciles of log(decile of the GPU / the peers' pooled decile)) for each
    GPU column in ``cols`` (indices into ``hists``), both read below the spike cut. NaN for a
    GPU without samples."""
    cols = np.asarray(cols, dtype=np.int64)
    if cols.size == 0:
        return np.zeros(0)
    below, trimmed = _below(Hists(hists.counts_t[:, cols], hists.first), ref.cut)
    mine = below.quantiles_us(list(DECILES))
    theirs = np.where(trimmed[:, None], ref.deciles[None, :], ref.whole[None, :])
    with np.errstate(invalid="ignore", divide="ignore"):
        logs = np.log(mine / theirs)
    out = np.full(cols.size, np.nan)
    ok = np.isfinite(logs).all(axis=1)
    out[ok] = np.exp(np.median(logs[ok], axis=1))
    return out
