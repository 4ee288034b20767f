"""Without step data: the rank the job waits for, read from the time its synchronize calls take.

Why: a collective that synchronizes on the GPU (NCCL) ends when its last rank arrives, so every
other rank waits inside its synchronize call for that one, and the rank everybody waits for
waits least. With step records the own time per step convicts it (analyzer/signals.py). Without
them (a loop whose step the agent cannot find) the synchronize calls are all there is, and a
shorter p50 alone is no verdict: a rank 2% slow waits 0.8x the job's median (its wait shrinks
many times faster than its work grows), and healthy ranks sharing one GPU had p50s at 0.44-0.48
of the job's (an H200, synchronize calls that find the stream idle reweighting the p50). So the
rule reads two things, both against the rank's peers:

* **The time, in step terms.** The share of wall time a GPU spends in synchronize calls
  (:func:`measure`: the calls' time, read from the histograms, over the seconds its probes
  covered: the whole window for the always tier, the slice for the sliced one). The job's median
  share less the rank's is the time per second the job's ranks wait for it beyond what they wait
  for the median rank: its effect on the step. It must be at least ``min_effect``, like the
  absolute gates of the other waits. Spikes are left out (calls from :data:`SPIKE_CUT` times
  the peers' :data:`BODY_QUANTILE` of synchronize time on): a heavy tail (waits of seconds among
  thousands of calls) is a rank's own hiccup, and a rank that happened to draw none must not
  read as the one everybody waits for.
* **The shape.** Its waits must be shorter across the board, not only fewer: the deciles of its
  *time* in synchronize calls (each call weighted by its duration, so calls that find the stream
  idle weigh nothing) must sit at least ``min_effect`` below its peers' pooled ones
  (:func:`shape_ratios`, the estimator of analyzer/shift.py on those weights, spikes cut off).
  A rank that makes fewer waiting calls of the same length has a low share and an unmoved shape.

And one guard: the rank keeps the job's pace (:func:`pace_ratios`). In an independent job a
faster GPU also waits less, but it launches more per second; the waited-for rank of a collective
launches at the job's pace. A rank whose launch rate is above the job's by half its share
deficit or more is fast, not waited for. A job read (or set) as independent is not scored by
this rule at all.

Failure modes: a CPU-side collective (gloo) waits outside the synchronize calls, so its slow GPU
waits *longer* in them and is not seen here (the rule never convicts a high share: in a GPU-side
collective that is a rank waiting for others). A job whose sliced synchronize API got fewer than
``min_samples`` calls in a window is not scored in it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hypertrace.analyzer.config import ScoringConfig
from hypertrace.analyzer.cross_section import CrossSection, Hists
from hypertrace.analyzer.shift import pooled_deciles, shift_ratios
from hypertrace.proto import buckets

#: The name of the signal (analyzer/signals.py).
SIGNAL = "sync.wait_share"
#: The peers' synchronize time is read at this quantile for the spike cut: the lower part of
#: their time lies in the body of their waits even when a heavy tail holds most of it (up to
#: 90%).
BODY_QUANTILE = 0.1
#: Calls from this many times that quantile on are spikes, not the rank's typical wait (about
#: 6x the median wait of a body as spread as a collective's).
SPIKE_CUT = 8.0


@dataclass
class SyncTime:
    """Per GPU (G,): its share of covered wall time in synchronize calls below the spike cut
    (NaN: unknown), its synchronize calls, and the time-weighted histogram of all of them (µs
    per bucket), None when the epoch has no synchronize calls."""

    share: np.ndarray
    calls: np.ndarray
    time: Hists | None


def measure(cs: CrossSection, cfg: ScoringConfig, groups: list[np.ndarray]) -> SyncTime:
    """The synchronize time of every GPU of ``cs`` (module docstring). Each sync API's calls are
    counted over its own covered seconds: ``CrossSection.always_s`` where the agent probed it
    in the always tier, else the sliced tier's ``attached_s``. Calls in buckets from
    :data:`SPIKE_CUT` times the peers' pooled :data:`BODY_QUANTILE` of synchronize time on are
    spikes, left out of the share."""
    n = cs.size
    parts: list[tuple[Hists, np.ndarray]] = []
    calls = np.zeros(n)
    time: Hists | None = None
    attached = cs.signals.attached_s if cs.signals is not None else np.zeros(n)
    for api, h in cs.apis.items():
        if cfg.api_kind(api) != "sync":
            continue
        always = cs.always_s.get(api)
        covered = np.where(always > 0, always, attached) if always is not None else attached
        weights = _as_time(h)
        parts.append((weights, np.where((h.total() > 0) & (covered > 0), covered, np.nan)))
        calls += np.where(covered > 0, h.total(), 0.0)
        time = weights if time is None else _add(time, weights)
    share = np.full(n, np.nan)
    if time is None:
        return SyncTime(share, calls, None)
    cut = np.full(n, buckets.NUM_BUCKETS)
    for sel in groups:                   # the peers' body: where their time's lower part lies
        pooled = Hists(time.counts_t[:, sel].sum(axis=1, keepdims=True), time.first)
        q = float(pooled.quantiles_us([BODY_QUANTILE])[0, 0])
        if np.isfinite(q):
            cut[sel] = np.searchsorted(buckets.LOWER_NS, SPIKE_CUT * q * 1e3, side="left")
    known = np.zeros(n, dtype=bool)
    total = np.zeros(n)
    for weights, covered in parts:
        index = np.arange(weights.first, weights.first + weights.counts_t.shape[0])[:, None]
        below = np.where(index < cut[None, :], weights.counts_t, 0.0).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            part = below / (covered * 1e6)
        ok = np.isfinite(part)
        total += np.where(ok, part, 0.0)
        known |= ok
    share[known] = total[known]
    return SyncTime(share, calls, time)


def _as_time(h: Hists) -> Hists:
    """``h`` as time: µs per bucket (calls x the bucket's midpoint)."""
    mid_us = buckets.MID_NS[h.first:h.first + h.counts_t.shape[0]][:, None] / 1e3
    return Hists(h.counts_t * mid_us, h.first)


def _add(a: Hists, b: Hists) -> Hists:
    """The bucket-wise sum of two histograms of the same GPUs."""
    lo = min(a.first, b.first)
    hi = max(a.first + a.counts_t.shape[0], b.first + b.counts_t.shape[0])
    out = np.zeros((hi - lo, a.size))
    for h in (a, b):
        out[h.first - lo:h.first - lo + h.counts_t.shape[0]] += h.counts_t
    return Hists(out, lo)


def shape_ratios(time: Hists, cols: np.ndarray, peers: np.ndarray) -> np.ndarray:
    """(len(cols),) how far the time-weighted deciles of each GPU in ``cols`` sit from its
    ``peers``' pooled ones (analyzer/shift.py): 0.6 = its waits are 40% shorter across the
    board. NaN for a GPU without calls."""
    if cols.size == 0:
        return np.zeros(0)
    return shift_ratios(time, cols, pooled_deciles(time, peers))


def pace_ratios(launch_calls: np.ndarray, attached_s: np.ndarray, peers: np.ndarray,
                cfg: ScoringConfig) -> np.ndarray:
    """(G,) each GPU's launch calls per attached second over its ``peers``' median (NaN where
    either is unknown, or fewer than ``min_gpus`` peers have a rate)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where((attached_s > 0) & (launch_calls >= cfg.min_samples),
                        launch_calls / np.maximum(attached_s, 1e-300), np.nan)
    ref = rate[peers]
    ref = ref[np.isfinite(ref)]
    if ref.size < cfg.min_gpus or not np.median(ref) > 0:
        return np.full(rate.shape, np.nan)
    return rate / float(np.median(ref))


def waited_for(time: SyncTime, low: np.ndarray, deficit: np.ndarray, launch_calls: np.ndarray,
               attached_s: np.ndarray, groups: list[np.ndarray], cfg: ScoringConfig
               ) -> tuple[np.ndarray, np.ndarray]:
    """((G,) which of the GPUs whose share was flagged ``low`` the job waits for, (G,) their
    shape ratios, NaN elsewhere): the shape is at least ``min_effect`` below the peers', and
    the launch pace is not above the peers' by half the share ``deficit`` (module docstring).
    An unknown pace does not veto."""
    n = low.size
    ok = np.zeros(n, dtype=bool)
    ratios = np.full(n, np.nan)
    if time.time is None or not low.any():
        return ok, ratios
    for sel in groups:
        cand = sel[low[sel]]
        if cand.size == 0:
            continue
        peers = sel[np.isfinite(time.share[sel])]
        r = shape_ratios(time.time, cand, peers)
        pace = pace_ratios(launch_calls, attached_s, sel, cfg)[cand]
        ratios[cand] = r
        keeps_pace = ~(pace - 1.0 >= 0.5 * deficit[cand])      # NaN pace: no veto
        ok[cand] = (r <= 1.0 - cfg.min_effect) & keeps_pace
    return ok, ratios


__all__ = ["BODY_QUANTILE", "SPIKE_CUT", "SIGNAL", "SyncTime", "measure", "pace_ratios", "shape_ratios", "waited_for"]
