"""Without step data: the rank the job waits for, read from the time its synchronize calls take.

Why: a collective that synchronizes on the GPU (NCCL) ends when its last rank arrives, so every
other rank waits inside its synchronize call for that one, and the rank everybody waits for
waits least. With step records the own time per step convicts it (analyzer/score/signals.py). Without
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
  (:func:`shape_ratios`, the estimator of analyzer/score/shift.py on those weights, spikes cut off).
  A rank that makes fewer waiting calls of the same length has a low share and an unmoved shape.

And the ranks must step together (:func:`keeps_pace`). Only in a collective does a shorter
wait mean that the others wait for this rank; in an independent job a faster GPU waits less
too, and so does a GPU-bound rank whose CPU side is slower (it issues later, its GPU finishes
sooner after), while nobody waits for anybody. A collective's ranks make as many synchronize
calls per second as each other (one step each, and the same calls per step); independent ranks
make as many as their own pace allows. So the rule applies where at least
:data:`COLLECTIVE_SHARE` of the group's GPUs synchronize as often as its median GPU (within
``collective_spread``, or two calls), and only to a GPU that does too (a rank that runs ahead
is fast, not waited for). Simulated at 16,384 GPUs, an independent GPU-bound rank with a host 3%
slower and a GPU 2.5% faster read a 5.1% deficit and was convicted under a guard on the launch
rate (its pace 2.6% ahead, within that guard's noise). A job read (or set) as independent is not
scored by this rule at all.

Failure modes: a CPU-side collective (gloo) waits outside the synchronize calls, so its slow GPU
waits *longer* in them and is not seen here (the rule never convicts a high share: in a GPU-side
collective that is a rank waiting for others). A job whose sliced synchronize API got fewer than
``min_samples`` calls in a window is not scored in it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import CrossSection, Hists
from hypertrace.analyzer.score.shift import pooled_deciles, shift_ratios
from hypertrace.analyzer.score.signal import Evidence, Measured, Signal, SignalInputs, share_text
from hypertrace.proto import buckets

#: The name of the signal (analyzer/score/signals.py).
SIGNAL = "sync.wait_share"
#: Share of a group's GPUs that must synchronize as often as its median one for the group to
#: be read as stepping together (the step-based mode inference's share, analyzer/score/signals.py).
COLLECTIVE_SHARE = 0.95
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
    #: (G,) synchronize calls per covered second (NaN: unknown)
    rate: np.ndarray = field(default_factory=lambda: np.zeros(0))


def covered_s(cs: CrossSection, api: str) -> np.ndarray:
    """(G,) seconds the agent probed ``api`` for each GPU: ``CrossSection.always_s`` where it
    was in the always tier, else the sliced tier's ``attached_s``."""
    attached = cs.signals.attached_s if cs.signals is not None else np.zeros(cs.size)
    always = cs.always_s.get(api)
    return np.where(always > 0, always, attached) if always is not None else attached


def launch_ratio(cs: CrossSection, cfg: ScoringConfig, groups: list[np.ndarray]) -> np.ndarray:
    """(G,) each GPU's launch p50 over its group's median GPU's, the mean over the launch APIs
    it called (NaN: none): how much slower its host is at issuing work (:func:`cpu_excess`)."""
    n = cs.size
    total = np.zeros(n)
    count = np.zeros(n)
    for api, h in cs.apis.items():
        if cfg.api_kind(api) != "launch":
            continue
        p50 = h.quantiles_us([0.5])[:, 0]
        for sel in groups:
            v = p50[sel]
            ok = np.isfinite(v) & (v > 0)
            if ok.any():
                r = v / float(np.median(v[ok]))
                total[sel] += np.where(ok, r, 0.0)
                count[sel] += ok
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def cpu_excess(ratio: np.ndarray, typical_share: float) -> np.ndarray:
    """(G,) the time a rank's CPU side takes beyond a typical rank's, as a share of the typical
    rank's interval between two waiting synchronizations, without step data.

    The model: a typical rank spends ``typical_share`` of its time waiting in synchronize
    calls (its GPU work the CPU side did not cover) and the rest on its CPU side; a host whose
    launches take ``ratio`` times the typical p50 is ``ratio`` times slower at all of its CPU
    work (the launch calls are a fraction of that work: a host 10% slower read as launches 5%
    slower, the rest of its CPU work unprobed, so the time inside the calls undercounts). Of
    that excess, up to ``typical_share`` comes out of the rank's wait for its GPU; the rest
    lengthens its interval (:func:`hypertrace.analyzer.score.signals.launch_effect`)."""
    s = min(max(float(typical_share), 0.0), 1.0) if np.isfinite(typical_share) else 0.0
    return (np.asarray(ratio, dtype=np.float64) - 1.0) * (1.0 - s)


def measure(cs: CrossSection, cfg: ScoringConfig, groups: list[np.ndarray]) -> SyncTime:
    """The synchronize time of every GPU of ``cs`` (module docstring). Each sync API's calls are
    counted over its own covered seconds: ``CrossSection.always_s`` where the agent probed it
    in the always tier, else the sliced tier's ``attached_s``. Calls in buckets from
    :data:`SPIKE_CUT` times the peers' pooled :data:`BODY_QUANTILE` of synchronize time on are
    spikes, left out of the share."""
    n = cs.size
    parts: list[tuple[Hists, np.ndarray]] = []
    calls = np.zeros(n)
    rate = np.zeros(n)
    time: Hists | None = None
    for api, h in cs.apis.items():
        if cfg.api_kind(api) != "sync":
            continue
        covered = covered_s(cs, api)
        weights = _as_time(h)
        parts.append((weights, np.where((h.total() > 0) & (covered > 0), covered, np.nan)))
        calls += np.where(covered > 0, h.total(), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate += np.where(covered > 0, h.total() / covered, 0.0)
        time = weights if time is None else _add(time, weights)
    share = np.full(n, np.nan)
    if time is None:
        return SyncTime(share, calls, None, share.copy())
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
    return SyncTime(share, calls, time, np.where(known, rate, np.nan))


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
    ``peers``' pooled ones (analyzer/score/shift.py): 0.6 = its waits are 40% shorter across the
    board. NaN for a GPU without calls."""
    if cols.size == 0:
        return np.zeros(0)
    return shift_ratios(time, cols, pooled_deciles(time, peers))


def keeps_pace(time: SyncTime, peers: np.ndarray, cfg: ScoringConfig) -> np.ndarray:
    """(G,) which GPUs synchronize as often per covered second as their ``peers``' median one,
    within ``collective_spread`` (or two calls, for a GPU with few): the ranks of a collective
    step together, so they make as many synchronize calls; a rank that runs ahead makes more.
    False where unknown or where fewer than ``min_gpus`` peers have a rate."""
    rate = time.rate
    ref = rate[peers]
    ref = ref[np.isfinite(ref)]
    if ref.size < cfg.min_gpus or not np.median(ref) > 0:
        return np.zeros(rate.shape, dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        room = np.maximum(cfg.collective_spread, 2.0 / time.calls)
        return np.abs(rate / float(np.median(ref)) - 1.0) <= room


def waited_for(time: SyncTime, low: np.ndarray, groups: list[np.ndarray], cfg: ScoringConfig,
               launch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """((G,) which of the GPUs whose share was flagged ``low`` the job waits for, (G,) their
    shape ratios, NaN elsewhere): the group synchronizes in step (at least
    :data:`COLLECTIVE_SHARE` of its GPUs keep its pace), the GPU keeps that pace, its shape
    is at least ``min_effect`` below the peers' (module docstring), and its wait fell by at
    least ``min_effect`` more than its own CPU side explains (:func:`unexplained_wait`, with
    ``launch``, :func:`launch_ratio`; None: the whole deficit)."""
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
        pace = keeps_pace(time, peers, cfg)
        if pace[peers].mean() < COLLECTIVE_SHARE:
            continue                     # the ranks do not synchronize in step: no collective
        r = shape_ratios(time.time, cand, peers)
        ratios[cand] = r
        ok[cand] = (r <= 1.0 - cfg.min_effect) & pace[cand] & (
            unexplained_wait(time, cand, peers, launch) >= cfg.min_effect)
    return ok, ratios


def unexplained_wait(time: SyncTime, cols: np.ndarray, peers: np.ndarray,
                     launch: np.ndarray | None) -> np.ndarray:
    """(len(cols),) the share of wall time each GPU in ``cols`` waits less than its ``peers``'
    median, less what its own slower CPU side took out of that wait (:func:`cpu_excess`, never
    less than nothing).

    Why: a rank whose host is slower, in a job whose GPU sets the pace, spends the extra time
    issuing work and finds its GPU closer to done when it synchronizes: its wait shrinks by
    what its CPU side grew, and nobody waits for it (on the simulator, healthy hosts with
    launches 12% slower waited 6-11% of wall time less than the job, as the model predicts).
    Where the rank's slower host does hold its peers up, the launch finding is what says so
    (:func:`hypertrace.analyzer.score.signals.launch_effect`). What is left is time the others
    wait that the rank's CPU side does not account for: its GPU's. ``launch``: each GPU's
    :func:`launch_ratio`; a rank whose launches are unknown keeps the whole deficit."""
    base = float(np.nanmedian(time.share[peers])) if peers.size else float("nan")
    deficit = base - time.share[cols]
    if launch is None:
        return deficit
    excess = np.maximum(np.nan_to_num(cpu_excess(launch[cols], base), nan=0.0), 0.0)
    return deficit - excess


__all__ = ["BODY_QUANTILE", "COLLECTIVE_SHARE", "SIGNAL", "SPIKE_CUT", "SyncTime", "keeps_pace",
           "covered_s", "cpu_excess", "launch_ratio", "measure", "shape_ratios", "unexplained_wait", "waited_for"]


def _measure(i: SignalInputs) -> Measured | None:
    """The GPUs whose processes sent no step are scored by their synchronize share, among
    themselves; not in a job read (or set) as independent."""
    no_steps = (i.steps <= 0) & (i.step_n <= 0)
    if int(no_steps.sum()) < i.cfg.min_gpus or i.mode == "independent":
        return None
    t = measure(i.cs, i.cfg, i.groups)
    i.notes[SIGNAL + ".every"] = t.share.copy()  # every GPU's, for the launch rule's peers
    t.share[~no_steps] = np.nan
    i.notes[SIGNAL + ".time"] = t
    return Measured(t.share, np.isfinite(t.share) & (t.calls >= i.cfg.min_samples), None,
                    i.cfg.min_effect)


def _implicate(s: Any, i: SignalInputs) -> np.ndarray:
    low: np.ndarray = s.low
    # the launch p50s only where some GPU waits less than its peers (most epochs: none)
    launch = launch_ratio(i.cs, i.cfg, i.groups) if low.any() else None
    ok, shape = waited_for(i.notes[SIGNAL + ".time"], low, i.groups, i.cfg, launch)
    i.notes[SIGNAL] = shape                  # the evidence's sync.shape
    return low & ok


def _cause(ev: Evidence) -> str:
    v, m = ev[SIGNAL]
    shape = ev.get("sync.shape", (float("nan"), float("nan")))[0]
    across = (f", its waits {share_text(1.0 - shape)} shorter across the board"
              if np.isfinite(shape) else "")
    return (f"spends {share_text(v)} of wall time in synchronize calls vs {share_text(m)} "
            f"job median{across}: the rank the others wait for (no step data; they wait "
            f"about {share_text(m - v)} of their time for it)")


#: The signal (analyzer/score/signal.py), listed in analyzer/score/registry.py.
SYNC_SHARE: Signal = Signal(
    SIGNAL, "share", "share", "synchronize time",
    {"low": "spends less of its time in synchronize calls than the job, its waits shorter "
            "across the board: the rank the others wait for (no step data)",
     "high": "spends more of its time in synchronize calls than the job: it waits on others, "
             "or on its own GPU; not convicting by itself"},
    measure=_measure, implicate=_implicate, cause=_cause,
    brief="synchronize time {v} of wall time vs {m} (waited for)", slow_when_low=True)
