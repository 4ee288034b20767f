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

**Where it applies.** A high tail of a verdict stat (p50) of a launch or other API implicates a
GPU only when its shift is at least ``1 + min_effect`` too. On the host basis the median shift of
the host's GPUs must pass the host's effect gate, and never less than :data:`MIN_HOST_SHIFT`.
The host gate has an allowance for the hosts' own spread, read from the p50s. Under a kernel mix
the p50s spread widely, which would shrink the gate to nothing. The floor keeps the promise that
nothing under 3% slow convicts. Reweighting still moves the outer deciles a little: +0.03 of share
gave host shifts under 2% (simulated), while a 5%-slow host measured about 1.05. The shift is computed only for
the GPUs and hosts that a p50 flagged (a handful per epoch), so it costs nothing at 16k GPUs.

**Failure modes.** A slowdown confined to one kernel kind (a throttled copy engine that slows only
memcpy-heavy launches) moves only that mode. If that mode holds less than half the calls, the
shift misses it; the p50 finding is still reported, as evidence that does not convict. Pooled
deciles follow the class's mean mix, which is near the per-GPU median mix unless the class is
strongly bimodal across GPUs (two populations): then each population should be its own workload
group (analyzer/imbalance.py).
"""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.cross_section import Hists

#: The smallest host-basis shift that can back a verdict, whatever the host allowance.
MIN_HOST_SHIFT = 0.03
#: The deciles compared: the outer ones (the estimator in the module docstring).
DECILES: tuple[float, ...] = (0.1, 0.2, 0.8, 0.9)


def pooled_deciles(hists: Hists, peers: np.ndarray | None = None) -> np.ndarray:
    """(len(DECILES),) deciles (µs) of the pooled histogram of the ``peers`` columns (None: all
    of them, without copying the matrix)."""
    counts = hists.counts_t if peers is None else hists.counts_t[:, peers]
    return Hists(counts.sum(axis=1, keepdims=True), hists.first).quantiles_us(list(DECILES))[0]


def shift_ratios(hists: Hists, cols: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """exp(median over deciles of log(decile of the GPU / ``ref``, the peers' pooled deciles))
    for each GPU column in ``cols`` (indices into ``hists``). NaN for a GPU without samples."""
    cols = np.asarray(cols, dtype=np.int64)
    if cols.size == 0:
        return np.zeros(0)
    mine = Hists(hists.counts_t[:, cols], hists.first).quantiles_us(list(DECILES))
    with np.errstate(invalid="ignore", divide="ignore"):
        logs = np.log(mine / ref[None, :])
    out = np.full(cols.size, np.nan)
    ok = np.isfinite(logs).all(axis=1)
    out[ok] = np.exp(np.median(logs[ok], axis=1))
    return out
