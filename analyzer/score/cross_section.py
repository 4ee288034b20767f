"""Turn the windows of one job and one epoch into numpy arrays: one row per GPU.

Why a separate step: scoring must be vectorized across thousands of GPUs, but windows arrive one
node at a time as protobuf messages. Ingest only appends the wire histograms' raw counts to flat
C arrays (no per-bucket Python work); :meth:`EpochAccumulator.build` turns them into one
bucket-major ``(K, GPUs)`` matrix per API with one scatter, where K covers only the buckets that
hold data in this epoch (:class:`Hists`). Launch latencies of 16,384 GPUs occupy ~20 of the 226
buckets, so everything downstream does ~10x less work than on dense histograms.

A GPU is identified by ``(node, gpu)`` where ``gpu`` is the GPU index when the agent knew it, else
the GPU UUID, else ``pid:<pid>``. Its *row* is assigned by the job when the GPU is first seen (the
accumulator never loops over GPUs again). Several processes on one GPU, or several windows of one
node in one epoch (short or duty-cycled windows), are merged by adding their histograms, which is
exact on the fixed bucket scheme.

Besides the API histograms, each process may carry scheduler evidence (``sched``), step
statistics (``steps``), its sliced tier's attached time and sampled flag (``overhead``) and its
GPU's SM clock (``nvml``). They are appended the same way (flat arrays, no per-GPU objects) and
merged per GPU at build into :class:`ProcessSignals`: totals add up, histograms merge, the SM clock
ratio is the latest window's.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hypertrace.analyzer.score.hist_wire import parse_histograms
from hypertrace.proto import buckets, hist_native
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import TIERS

GpuKey = tuple[str, str]
#: ``ApiTier.tier`` of an API probed for the process's whole life ("always").
TIER_ALWAYS = TIERS[0]
#: Orders windows deterministically (end time, agent, seq) whatever order they arrived in, so
#: "the latest NVML context" does not depend on network timing.
OrderKey = tuple[int, str, int]


def gpu_label(p: pb.ProcessWindow) -> str:
    """The ``gpu`` part of a GPU's identity, as shown in reports."""
    if p.gpu_index >= 0:
        return str(p.gpu_index)
    if p.gpu_uuid:
        return p.gpu_uuid
    return f"pid:{p.pid}"


@dataclass
class Hists:
    """Histograms of G GPUs over buckets ``first .. first + K - 1``, stored **bucket-major**.

    ``counts_t`` has shape (K, G): row k holds bucket ``first + k`` of every GPU. Why this layout:
    every per-GPU reduction (totals, cumulative counts, "which bucket holds the quantile") becomes
    K vector operations over G contiguous values instead of G tiny reductions over K values, which
    numpy runs several times slower (measured: a cumsum along the short axis of (16384, 40) costs
    more than the whole rest of quantile extraction).
    """

    counts_t: np.ndarray
    first: int
    totals: np.ndarray | None = None
    #: (K,) each bucket's calls over all G GPUs, once :meth:`bucket_totals` or a quantile read
    #: asked for them (the ``bucket_totals`` of :meth:`quantiles_and_buckets`)
    bucket_sums: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.counts_t.shape[1])

    def total(self) -> np.ndarray:
        if self.totals is None:
            self.totals = self.counts_t.sum(axis=0)
        return self.totals

    def cumulative(self) -> np.ndarray:
        """(K, G) cumulative counts along the buckets (K vector adds; one cumsum for a few
        columns, where the K Python-level adds would cost more than the sums)."""
        return self._cumulative_below()[1:]

    def bucket_totals(self) -> np.ndarray:
        """(K,) each bucket's calls summed over the G GPUs (the pooled histogram): exact, the
        counts being whole numbers, whichever order adds them."""
        if self.bucket_sums is None:
            self.bucket_sums = self.counts_t @ np.ones(self.size)
        return self.bucket_sums

    def _cumulative_below(self, scratch: np.ndarray | None = None,
                          bucket_totals: bool = False) -> np.ndarray:
        """(K + 1, G): row 0 zeros, row k + 1 the cumulative counts through bucket k. Why the
        zero row: the calls below bucket k are row k for every k, bucket 0 included, so a
        quantile reads them with one gather instead of a gather, a clamp and a select.
        ``scratch``: a float64 buffer of at least (K + 1) x G values to write it into (a
        fresh matrix of 131,072 GPUs pays ~5,000 page faults). ``bucket_totals``: also sum
        each bucket over the GPUs (:meth:`bucket_totals`) while its row is in cache, instead
        of another pass over the matrix."""
        k, g = self.counts_t.shape
        if scratch is not None and scratch.size >= (k + 1) * g \
                and self.counts_t.dtype == np.float64:
            out = scratch[:(k + 1) * g].reshape(k + 1, g)
        else:
            out = np.empty((k + 1, g), dtype=self.counts_t.dtype)
        out[0] = 0
        sums = None
        if bucket_totals and self.bucket_sums is None and g > 64:
            sums = self.bucket_sums = np.empty(k)
        if g <= 64:
            np.cumsum(self.counts_t, axis=0, out=out[1:])
            return out
        rows = self.counts_t
        ones = np.ones(g) if sums is not None else None
        if k:
            out[1] = rows[0]
            if sums is not None:
                sums[0] = rows[0] @ ones
        add = np.add
        for b in range(1, k):
            row = rows[b]
            add(out[b], row, out=out[b + 1])
            if sums is not None:
                sums[b] = row @ ones
        return out

    def quantiles_us(self, qs: list[float]) -> np.ndarray:
        """(G, len(qs)) quantiles in µs; NaN for GPUs with no samples. A transposed view of a
        (len(qs), G) array: each quantile's G values are contiguous, as the scorer reads them.

        Same definition as :func:`hypertrace.proto.buckets.quantiles_us` (linear interpolation
        inside the bucket that holds the quantile; tests/test_scoring.py checks they agree to
        1e-12), computed in the bucket-major layout.
        """
        return self.quantiles_and_buckets(qs)[0]

    def quantiles_and_buckets(self, qs: list[float], scratch: np.ndarray | None = None,
                              bucket_totals: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`quantiles_us`, (len(qs), G) the bucket each was read from). Why the buckets:
        a quantile's sampling error needs the bucket that holds its value, which is this one
        or, at a bucket's edge, its neighbour (:func:`~hypertrace.analyzer.score.scoring.
        sampling_se_us` checks); searching all edges again costs more than the check.
        ``scratch`` and ``bucket_totals``: see :meth:`_cumulative_below` (the cumulative
        counts live only during this call)."""
        below_rows = self._cumulative_below(scratch, bucket_totals)
        cum = below_rows[1:]
        k, g = cum.shape
        total = cum[-1]
        flat = cum.ravel()
        flat_below = below_rows.ravel()              # cum[idx - 1] (0 for bucket 0) at idx*g
        cols = np.arange(g)
        out = np.empty((len(qs), g))                 # filled per quantile; returned as (G, Q)
        held = np.empty((len(qs), g), dtype=np.int64)
        frac = np.empty(g)
        for j, q in enumerate(qs):                   # a handful of quantiles
            t = total * q
            idx = (_first_reaching(flat, k, g, cols, t) if g >= SEARCH_MIN_COLUMNS
                   else np.minimum((cum < t).sum(axis=0), k - 1))
            at = idx * g
            at += cols                               # cum[idx, cols], as a flat take
            below = flat_below.take(at)
            inside = flat.take(at)
            inside -= below
            frac.fill(0.5)                           # an empty bucket: its middle
            np.divide(t - below, inside, out=frac, where=inside > 0)
            np.clip(frac, 0.0, 1.0, out=frac)
            b = held[j] = idx + self.first
            np.multiply(frac, _WIDTH_NS.take(b), out=out[j])
            out[j] += buckets.LOWER_NS.take(b)
        out /= 1000.0
        out[:, total <= 0] = np.nan
        return out.T, held

    def excess_above_us(self, base_us: np.ndarray, factor: float) -> np.ndarray:
        """(G,) mean excess per sample (µs) over ``base_us`` (G,) of the samples in buckets that
        start at or above ``factor`` x ``base_us``: the share a second mode (a pause) adds to
        the mean. Exactly 0 for a distribution with no such mode, where a midpoint mean less a
        quantile would carry the buckets' rounding. NaN for GPUs with no samples."""
        count, sum_us = self.tail_from(base_us, factor)
        total = self.total().astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (sum_us - count * np.nan_to_num(base_us)) / total
        out[total <= 0] = np.nan
        return out

    def tail_from(self, base_us: np.ndarray, factor: float) -> tuple[np.ndarray, np.ndarray]:
        """((G,) samples, (G,) their sum in µs from the bucket midpoints) of the buckets that
        start at or above ``factor`` x ``base_us`` (G,); none where ``base_us`` is NaN."""
        count, low, high = self.tail_bounds(factor * np.asarray(base_us, dtype=np.float64))
        return count, (low + high) / 2.0

    def tail_bounds(self, limit_us: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """((G,) samples, (G,) their least and (G,) their greatest possible sum in µs) of the
        buckets that start at or above ``limit_us`` (G,; NaN: none): each sample lies between its
        bucket's edges. Zeros for a GPU with none there; ``limit_us`` 0 gives the whole
        histogram."""
        k = self.counts_t.shape[0]
        lower = buckets.LOWER_NS[self.first:self.first + k][:, None] / 1000.0
        upper = buckets.UPPER_NS[self.first:self.first + k][:, None] / 1000.0
        above = lower >= np.nan_to_num(np.asarray(limit_us, dtype=np.float64),
                                       nan=np.inf)[None, :]
        counts = np.where(above, self.counts_t, 0).astype(np.float64)
        return counts.sum(axis=0), (counts * lower).sum(axis=0), (counts * upper).sum(axis=0)

    def body_moments_us(self, limit_us: float) -> tuple[np.ndarray, np.ndarray]:
        """((G,) mean in µs, (G,) variance in µs²) of each GPU's samples in the buckets that end
        at or below ``limit_us`` (the body, its spikes left out), NaN for a GPU with fewer than
        two there.

        Read at the buckets' midpoints, less each bucket's width² / 12 (Sheppard's correction):
        a bucket is up to 12.5% of its value wide, so the midpoints alone would give a tight
        loop's steps a spread of about 3% that they do not have. Clipped at 0."""
        k = self.counts_t.shape[0]
        lower = buckets.LOWER_NS[self.first:self.first + k] / 1000.0
        upper = buckets.UPPER_NS[self.first:self.first + k] / 1000.0
        keep = (upper <= limit_us)[:, None]
        c = np.where(keep, self.counts_t, 0).astype(np.float64)
        mid = ((lower + upper) / 2.0)[:, None]
        n = c.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (c * mid).sum(axis=0) / n
            var = ((c * (mid - mean) ** 2).sum(axis=0)
                   - (c * ((upper - lower) ** 2 / 12.0)[:, None]).sum(axis=0)) / n
        return (np.where(n >= 2, mean, np.nan), np.where(n >= 2, np.maximum(var, 0.0), np.nan))

    def dense(self) -> np.ndarray:
        """(G, NUM_BUCKETS) counts, for code that needs the whole scheme (theory, tests)."""
        out = np.zeros((self.size, buckets.NUM_BUCKETS))
        out[:, self.first:self.first + self.counts_t.shape[0]] = self.counts_t.T
        return out

    def select(self, sel: np.ndarray) -> "Hists":
        return Hists(self.counts_t[:, sel], self.first,
                     None if self.totals is None else self.totals[sel])


#: Each bucket's width (ns), as ``UPPER_NS - LOWER_NS`` gives it.
_WIDTH_NS = buckets.UPPER_NS - buckets.LOWER_NS

#: From this many columns on, :meth:`Hists.quantiles_us` finds the bucket of a quantile by a
#: binary search; under it (a pooled histogram, a handful of GPUs) by one comparison of the
#: whole matrix, which costs less than the search's log2(K) rounds of numpy calls.
SEARCH_MIN_COLUMNS = 1024


#: Columns sampled by :func:`_first_reaching` to bracket the buckets a quantile can lie in.
BRACKET_SAMPLE = 256
#: Up to this many buckets in the bracket, :func:`_first_reaching` counts the cumulative rows
#: below the target (two vector operations a bucket) instead of searching (six a round).
COUNT_MAX_BUCKETS = 8


def _first_reaching(flat: np.ndarray, k: int, g: int, cols: np.ndarray,
                    t: np.ndarray) -> np.ndarray:
    """(G,) per column, the first bucket whose cumulative count reaches ``t`` (the number of
    buckets below it), capped at K - 1. ``flat`` is the (K, G) cumulative matrix raveled and
    ``cols`` is ``arange(G)``. A binary search over the buckets, all columns at once: rounds of
    G gathers instead of a (K, G) comparison (cumulative counts never decrease along the
    buckets). The search runs over the buckets where a sample of columns reaches ``t``, one
    bucket of margin either side, checked on every column with two row comparisons; the
    columns outside that bracket (an empty GPU, a slow one the sample missed) are searched
    again over all K buckets. Why: a job's GPUs hold a quantile within a few of the K
    buckets (at 16,384 GPUs: p50 in 2, p99 in 4 of 39), where counting the rows below the
    target over the bracket costs a handful of row comparisons instead of log2(K) rounds."""
    rows = flat.reshape(k, g)
    step = max(1, g // BRACKET_SAMPLE)              # a strided view: no gathered copy
    hit = (rows[:, ::step] < t[::step]).sum(axis=0)
    lo, hi = max(int(hit.min()) - 1, 0), min(int(hit.max()) + 1, k - 1)
    outside = np.zeros(g, dtype=bool)
    if lo > 0:                                       # the answer is >= lo: cum[lo - 1] < t
        outside |= rows[lo - 1] >= t
    if hi < k - 1:                                   # and <= hi: cum[hi] >= t
        outside |= rows[hi] < t
    if hi - lo <= COUNT_MAX_BUCKETS:                 # count the buckets below t in the bracket
        out = np.full(g, lo, dtype=np.int64)
        for b in range(lo, hi):
            out += rows[b] < t
    else:
        out = _search_buckets(flat, g, cols, t, lo, hi)
    if outside.any():
        o = np.flatnonzero(outside)
        out[o] = _search_buckets(flat, g, cols[o], t[o], 0, k - 1)
    return out


def _search_buckets(flat: np.ndarray, g: int, cols: np.ndarray, t: np.ndarray, lo: int,
                    hi: int) -> np.ndarray:
    """Per column of ``cols``, the first bucket in ``lo .. hi`` whose cumulative count reaches
    ``t``, ``hi`` when none does (the answer must lie in ``lo .. hi``): the binary search of
    :func:`_first_reaching`."""
    n = cols.size
    lo_a = np.full(n, lo, dtype=np.int64)
    hi_a = np.full(n, hi, dtype=np.int64)          # the answer lies in [lo_a, hi_a]
    span = hi - lo
    while span > 0:
        mid = (lo_a + hi_a) >> 1
        less = flat.take(mid * g + cols) < t
        np.copyto(lo_a, mid + 1, where=less)
        np.copyto(hi_a, mid, where=~less)
        span >>= 1
    return np.minimum(lo_a, hi, out=lo_a)          # a target above every count: ``hi``


@dataclass(frozen=True)
class Input:
    """A per-GPU sum a signal reads off each process window beyond what the cross-section
    always keeps: ``read`` gives a process's number (None: it has none); the GPU's processes
    and windows in the epoch add up (``ProcessSignals.extra[name]``)."""

    name: str
    read: Callable[[pb.ProcessWindow], float | None]


@dataclass
class ProcessSignals:
    """Per-GPU (G,) totals of the evidence beside the API latencies; zeros where absent.

    Several processes or windows of one GPU add up, so ratios built from these (a run-queue share,
    a wait per step, a call rate) are averages over what was measured."""

    sched_s: np.ndarray            # seconds of scheduler evidence (SchedStats.window_s summed)
    runq_ns: np.ndarray
    offcpu_ns: np.ndarray
    switches: np.ndarray           # involuntary + voluntary
    involuntary: np.ndarray
    runq_latency: Hists | None
    steps: np.ndarray              # StepStats.steps summed
    gpu_wait_us: np.ndarray
    peer_wait_us: np.ndarray
    step_sum_us: np.ndarray
    busy: Hists | None
    attached_s: np.ndarray         # Overhead.attached_s summed (sliced tier)
    sampled: np.ndarray            # bool: some process of this GPU held this epoch's slice
    sm_clock_ratio: np.ndarray     # sm_clock / max_sm_clock of the latest window; NaN unknown
    step_sources: tuple[str, ...] = ()   # distinct StepStats.source values ("marker", ...)
    #: per signal input (analyzer/score/signal.py ``Input``) its (G,) sums
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    #: per step: its duration less the wait for peers (StepStats.own_time); None without
    own_time: Hists | None = None


@dataclass
class CrossSection:
    """Everything scoring needs about one job's GPUs in one epoch, as arrays (row = GPU).

    ``rows[i]`` is the job-wide row of local GPU i; names, ranks, kinds and NVML context live in
    the job's registry under that row.
    """

    job_id: str
    epoch: int
    rows: np.ndarray                     # (G,) int64, sorted, unique
    apis: dict[str, Hists]
    step_time: Hists | None
    windows: int = 0
    signals: ProcessSignals | None = None
    #: per API probed in the always tier by processes without steps: (G,) seconds it was
    #: probed (0 where the GPU's processes had it in the sliced tier, whose seconds are
    #: ``signals.attached_s``, or had steps)
    always_s: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.rows.size)


_SUM = float("nan")      # a histogram's total to add up from its counts (_Flat.totals)


@dataclass
class _Flat:
    """Histograms of many rows as the wire sent them, until :meth:`hists` is called."""

    rows: array[int] = field(default_factory=lambda: array("q"))
    #: the sample count of each histogram as its sender stated it; NaN: add up its counts
    totals: array[float] = field(default_factory=lambda: array("d"))
    #: the serialized ``Histogram`` messages back to back (analyzer/score/hist_wire.py: one C call
    #: per histogram here, every count decoded at once in :meth:`raw`), and where each ends
    wire: array[int] = field(default_factory=lambda: array("B"))
    ends: array[int] = field(default_factory=lambda: array("q"))
    #: histograms decoded already (:meth:`seal`), each set as :meth:`raw` gives it; they come
    #: before those still in ``wire``
    decoded: list[tuple[np.ndarray, ...]] = field(default_factory=list)

    def add(self, row: int, hist: pb.Histogram, total: int | None = None) -> None:
        """``total``: the sample count when the sender stated it (ApiStats.count, validated to
        equal the histogram's sum), so totals need no pass over the matrix."""
        self.rows.append(row)
        self.totals.append(_SUM if total is None else float(total))
        self.wire.frombytes(hist.SerializeToString())
        self.ends.append(len(self.wire))

    def extend(self, other: "_Flat", rows: np.ndarray) -> None:
        """Append ``other``'s histograms in their order, its row ``r`` becoming ``rows[r]``."""
        if other.decoded:
            self.seal()                              # what this holds stays in front
            self.decoded.extend((rows.take(r), *rest) for r, *rest in other.decoded)
        self.rows.frombytes(_remapped(other.rows, rows))
        self.totals.extend(other.totals)
        base = len(self.wire)
        self.wire.extend(other.wire)
        ends = np.frombuffer(other.ends, dtype=np.int64)
        self.ends.frombytes((ends + base).tobytes() if base else ends.tobytes())

    def seal(self) -> None:
        """Decode the histograms still in ``wire`` now (into ``decoded``). Why: a worker
        process reading a file decodes its chunk's (:func:`hypertrace.analyzer.score.engine.
        prepare_windows`), so the reader that builds the epoch does not."""
        if self.rows:
            rows, firsts, lens, vals, totals = self._decode_wire()
            if vals.size and int(vals.max()) < 2 ** 32:    # half the bytes to hand over
                vals = vals.astype(np.uint32)
            self.decoded.append((rows, firsts, lens, vals, totals))
            self.rows, self.totals = array("q"), array("d")
            self.wire, self.ends = array("B"), array("q")

    def raw(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rows, first buckets, lengths, counts as uint64, totals) of the histograms that hold
        counts, in the order added (an empty histogram adds nothing)."""
        if not self.decoded:
            return self._decode_wire()
        sets = self.decoded + ([self._decode_wire()] if self.rows else [])
        if len(sets) == 1:
            return sets[0]                           # type: ignore[return-value]
        return tuple(np.concatenate(parts) for parts in zip(*sets))   # type: ignore[return-value]

    def _decode_wire(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`raw` of the histograms in ``wire``."""
        firsts, lens, vals = parse_histograms(np.frombuffer(self.wire, dtype=np.uint8),
                                              np.frombuffer(self.ends, dtype=np.int64))
        keep = lens > 0
        rows = np.frombuffer(self.rows, dtype=np.int64)
        totals = np.frombuffer(self.totals, dtype=np.float64)
        if not keep.all():
            rows, firsts, lens, totals = rows[keep], firsts[keep], lens[keep], totals[keep]
        missing = np.isnan(totals)
        if missing.any():                            # exact: integer sums, then one rounding
            sums = np.add.reduceat(vals, np.cumsum(lens) - lens) if lens.size else vals[:0]
            totals = totals.copy()
            totals[missing] = sums[missing].astype(np.float64)
        return rows, firsts, lens, vals, totals

    def hists(self, position: np.ndarray, n_local: int,
              scratch: "_Scratch | None" = None) -> Hists:
        """Merge into bucket-major (K, n_local); ``position`` maps job rows to local
        indices. ``scratch``: buffers shared with the other histogram sets of one build.
        No histogram with counts: a single empty bucket."""
        out = self.hists_or_none(position, n_local, scratch)
        return Hists(np.zeros((1, n_local)), 0, np.zeros(n_local)) if out is None else out

    def hists_or_none(self, position: np.ndarray, n_local: int,
                      scratch: "_Scratch | None" = None) -> Hists | None:
        """:meth:`hists`, or None when no histogram added holds a count."""
        if not self.rows and not self.decoded:
            return None
        if not self.decoded:                         # the compiled path (hist_native.py)
            built = hist_native.wire_hists(
                np.frombuffer(self.wire, dtype=np.uint8), np.frombuffer(self.ends, dtype=np.int64),
                position.take(np.frombuffer(self.rows, dtype=np.int64)),
                np.frombuffer(self.totals, dtype=np.float64), n_local)
            if built is not None:
                dense_kn, first, calls = built
                return Hists(dense_kn, first, calls) if dense_kn.shape[0] else None
        return self.numpy_hists(position, n_local, scratch)

    def numpy_hists(self, position: np.ndarray, n_local: int,
                    scratch: "_Scratch | None" = None) -> Hists | None:
        """:meth:`hists_or_none` by numpy alone: histograms decoded ahead, or where the
        compiled path does not apply (hist_native.py says when)."""
        rows, firsts, lens, vals, totals = self.raw()
        if not rows.size:
            return None
        local = position[rows]
        lo = int(firsts.min())
        width = int((firsts + lens).max()) - lo
        starts = np.cumsum(lens) - lens
        size = int(lens.sum())
        # count j of histogram h (j counted over all histograms) goes to bucket
        # (first[h] - lo + j - start[h]), GPU local[h]: flat index bucket * n_local + local[h] in
        # the (K, n_local) matrix, i.e. j * n_local + ((first[h] - lo - start[h]) * n_local +
        # local[h]). One repeat and one in-place add of the shared j * n_local: every fresh
        # temporary of this size costs its page faults (~1 ms per 3 MB at 16,384 GPUs)
        scratch = scratch if scratch is not None else _Scratch(n_local)
        flat = np.repeat((firsts - lo - starts) * n_local + local, lens)
        flat += scratch.stride(size)
        counts = scratch.floats(vals)
        if lens.size == n_local and _one_each(local, n_local):
            dense: np.ndarray = np.zeros(width * n_local)   # one histogram per GPU: scatter
            dense[flat] = counts
            per_gpu: np.ndarray = np.empty(n_local)
            per_gpu[local] = totals
        else:                                        # merge several windows/processes per GPU
            dense = np.bincount(flat, weights=counts, minlength=width * n_local)
            per_gpu = np.bincount(local, weights=totals, minlength=n_local)
        return Hists(dense.reshape(width, n_local), lo, per_gpu)


class _Scratch:
    """Buffers that the histogram sets of one build share (:meth:`_Flat.hists`): the flat
    offsets ``j * n_local`` and the counts as floats. Why: at 16,384 GPUs each is ~3 MB per
    API, and a fresh array of that size pays its page faults every time."""

    def __init__(self, n_local: int):
        self.n_local = n_local
        self._stride = np.zeros(0, dtype=np.int64)
        self._floats = np.zeros(0)

    def stride(self, size: int) -> np.ndarray:
        """``arange(size) * n_local`` (a view: read only)."""
        if self._stride.size < size:
            self._stride = np.arange(0, size * self.n_local, self.n_local, dtype=np.int64)
        return self._stride[:size]

    def floats(self, counts: np.ndarray) -> np.ndarray:
        """``counts`` converted to float64, in the shared buffer (valid until the next call;
        a scatter that converts on the way is slower than the conversion and a plain one)."""
        if self._floats.size < counts.size:
            self._floats = np.empty(counts.size)
        out = self._floats[:counts.size]
        np.copyto(out, counts, casting="unsafe")
        return out


def _remapped(local: array[int], rows: np.ndarray) -> bytes:
    """The int64 bytes of ``rows[local]``: rows numbered in another accumulator, renumbered."""
    if not local:
        return b""
    return rows.take(np.frombuffer(local, dtype=np.int64)).astype(np.int64, copy=False).tobytes()


def _one_each(local: np.ndarray, n: int) -> bool:
    """Does ``local`` (n values in 0..n-1) name every index exactly once? Strictly increasing
    (the common order: GPUs registered as they arrive) says so without counting."""
    if local.size < 2 or bool((local[1:] > local[:-1]).all()):
        return True
    return bool(np.bincount(local, minlength=n).max() <= 1)


@dataclass
class _Scalars:
    """Per-process numbers, one row of ``names`` each, until :meth:`sums` adds them up per GPU.
    Kept interleaved in one array: one extend per process instead of an append per number."""

    names: tuple[str, ...]
    rows: array[int] = field(default_factory=lambda: array("q"))
    values: array[float] = field(default_factory=lambda: array("d"))

    def add(self, row: int, *values: float) -> None:
        self.rows.append(row)
        self.values.extend(values)

    def extend(self, other: "_Scalars", rows: np.ndarray) -> None:
        """Append ``other``'s processes in their order, its row ``r`` becoming ``rows[r]``."""
        self.rows.frombytes(_remapped(other.rows, rows))
        self.values.extend(other.values)

    def column(self, name: str) -> np.ndarray:
        """The values of ``name``, one per process added (a strided view)."""
        table = np.frombuffer(self.values, dtype=np.float64).reshape(-1, len(self.names))
        return table[:, self.names.index(name)]

    def sums(self, position: np.ndarray, n: int) -> dict[str, np.ndarray]:
        if not self.rows:
            return {name: np.zeros(n) for name in self.names}
        local = position[np.frombuffer(self.rows, dtype=np.int64)]
        return {name: np.bincount(local, weights=self.column(name), minlength=n)
                for name in self.names}


class EpochAccumulator:
    """Collects the processes of one job in one epoch; ``build`` gives the :class:`CrossSection`."""

    def __init__(self, job_id: str, epoch: int):
        self.job_id = job_id
        self.epoch = epoch
        self.windows = 0
        self._present = array("q")
        self._apis: dict[str, _Flat] = {}
        self._steps = _Flat()
        self._sched = _Scalars(("sched_s", "runq_ns", "offcpu_ns", "switches", "involuntary"))
        self._runq_hist = _Flat()
        self._stepstats = _Scalars(("steps", "gpu_wait_us", "peer_wait_us", "step_sum_us"))
        self._busy = _Flat()
        self._own = _Flat()
        self._overhead = _Scalars(("attached_s", "sampled"))
        self._clock = _Scalars(("ratio", "order"))
        self._sources: set[str] = set()
        #: per API of the always tier: the seconds each process had it probed
        self._always: dict[str, _Scalars] = {}
        #: per signal input (analyzer/score/signal.py ``Input``): each process's number
        self._extra: dict[str, _Scalars] = {}

    def rows_present(self) -> np.ndarray:
        """The job rows this epoch holds data of (with repeats)."""
        return np.frombuffer(self._present, dtype=np.int64)

    def add_process(self, row: int, p: pb.ProcessWindow, end_ns: int = 0,
                    inputs: tuple[Input, ...] = ()) -> None:
        """Add one process window whose GPU has job-wide row ``row``; ``end_ns`` (the window's
        end) picks the latest NVML clock reading when a GPU has several windows in the epoch;
        ``inputs``: what the registered signals read off it besides (their sums per GPU go to
        ``ProcessSignals.extra``)."""
        self._present.append(row)
        apis = self._apis
        for a in p.apis:                 # _Flat.add written out: it runs per latency histogram
            name = a.api
            flat = apis.get(name)
            if flat is None:
                flat = apis[name] = _Flat()
            flat.rows.append(row)
            flat.totals.append(float(a.count))
            wire = flat.wire
            wire.frombytes(a.histogram.SerializeToString())
            flat.ends.append(len(wire))
        has = p.HasField
        if has("step_time"):
            self._steps.add(row, p.step_time)
        if has("sched"):
            sc = p.sched
            inv = sc.involuntary_switches
            sched = self._sched
            sched.rows.append(row)                   # _Scalars.add without packing *values
            sched.values.extend((sc.window_s, sc.runq_ns, sc.offcpu_ns,
                                 inv + sc.voluntary_switches, inv))
            if sc.HasField("runq_latency"):
                self._runq_hist.add(row, sc.runq_latency)
        steps = 0
        if has("steps"):
            st = p.steps
            steps = st.steps
            if steps:
                stats = self._stepstats
                stats.rows.append(row)
                stats.values.extend((steps, st.gpu_wait_us, st.peer_wait_us, st.step_sum_us))
                if st.HasField("busy_time"):
                    self._busy.add(row, st.busy_time)
                if st.HasField("own_time"):
                    self._own.add(row, st.own_time)
                source = st.source
                if source:
                    self._sources.add(source)
        if has("overhead"):
            o = p.overhead
            ov = self._overhead
            ov.rows.append(row)
            ov.values.extend((o.attached_s, 1.0 if o.sampled else 0.0))
            if not steps and o.tiers and has("sched"):
                # a process without steps: its synchronize time is read per second of wall
                # time (analyzer/score/sync_share.py), and an always-tier API is probed for as long
                # as the process was covered
                covered = p.sched.window_s
                for t in o.tiers:
                    if t.tier == TIER_ALWAYS:
                        acc = self._always.get(t.api)
                        if acc is None:
                            acc = self._always[t.api] = _Scalars(("seconds",))
                        acc.rows.append(row)
                        acc.values.append(covered)
        if has("nvml"):
            nv = p.nvml
            if nv.HasField("sm_clock_mhz") and nv.HasField("max_sm_clock_mhz"):
                top = nv.max_sm_clock_mhz
                if top > 0:
                    self._clock.add(row, nv.sm_clock_mhz / top, float(end_ns))
        for inp in inputs:
            value = inp.read(p)
            if value is not None:
                acc = self._extra.get(inp.name)
                if acc is None:
                    acc = self._extra[inp.name] = _Scalars(("value",))
                acc.rows.append(row)
                acc.values.append(float(value))

    def extend(self, other: "EpochAccumulator", rows: np.ndarray) -> None:
        """Append what ``other`` collected (another process's accumulator of the same job and
        epoch, its processes numbered 0, 1, ... as it added them: see
        :func:`hypertrace.analyzer.score.engine.prepare_windows`), process ``i`` becoming job row
        ``rows[i]``. Everything lands in the order ``add_process`` would have appended it, so
        the cross-section built is the same bit for bit. The windows are not counted here:
        ``Engine`` counts them as it registers their GPUs."""
        self._present.frombytes(_remapped(other._present, rows))
        for name, flat in other._apis.items():
            mine = self._apis.get(name)
            if mine is None:
                mine = self._apis[name] = _Flat()
            mine.extend(flat, rows)
        for mine, theirs in ((self._steps, other._steps), (self._runq_hist, other._runq_hist),
                             (self._busy, other._busy), (self._own, other._own)):
            mine.extend(theirs, rows)
        for mine_s, theirs_s in ((self._sched, other._sched), (self._stepstats, other._stepstats),
                                 (self._overhead, other._overhead), (self._clock, other._clock)):
            mine_s.extend(theirs_s, rows)
        self._sources |= other._sources
        for api, theirs_a in other._always.items():
            mine_a = self._always.get(api)
            if mine_a is None:
                mine_a = self._always[api] = _Scalars(("seconds",))
            mine_a.extend(theirs_a, rows)
        for name, theirs_x in other._extra.items():
            mine_x = self._extra.get(name)
            if mine_x is None:
                mine_x = self._extra[name] = _Scalars(("value",))
            mine_x.extend(theirs_x, rows)

    def seal(self) -> None:
        """Decode every histogram added so far (:meth:`_Flat.seal`)."""
        for flat in (*self._apis.values(), self._steps, self._runq_hist, self._busy,
                     self._own):
            flat.seal()

    def build(self) -> CrossSection:
        present_rows = np.frombuffer(self._present, dtype=np.int64)
        mask = np.zeros(int(present_rows.max()) + 1 if present_rows.size else 0, dtype=bool)
        mask[present_rows] = True                    # O(rows), cheaper than np.unique's sort
        rows = np.flatnonzero(mask)
        position = np.cumsum(mask) - 1               # job row -> local index
        n = rows.size

        scratch = _Scratch(n)
        apis = {api: flat.hists(position, n, scratch)
                for api, flat in sorted(self._apis.items())}
        steps = self._steps.hists_or_none(position, n, scratch)
        always = {api: acc.sums(position, n)["seconds"] for api, acc in self._always.items()}
        return CrossSection(self.job_id, self.epoch, rows, apis, steps, self.windows,
                            self._signals(position, n), always)

    def _signals(self, position: np.ndarray, n: int) -> ProcessSignals:
        sched = self._sched.sums(position, n)
        st = self._stepstats.sums(position, n)
        ov = self._overhead.sums(position, n)
        ratio = np.full(n, np.nan)
        if self._clock.rows:                         # latest reading per GPU: sort by (GPU, end)
            who = position[np.frombuffer(self._clock.rows, dtype=np.int64)]
            val = self._clock.column("ratio")
            when = self._clock.column("order")
            order = np.lexsort((when, who))
            last = np.ones(order.size, dtype=bool)
            last[:-1] = who[order][1:] != who[order][:-1]
            ratio[who[order][last]] = val[order][last]
        return ProcessSignals(
            sched_s=sched["sched_s"], runq_ns=sched["runq_ns"], offcpu_ns=sched["offcpu_ns"],
            switches=sched["switches"], involuntary=sched["involuntary"],
            runq_latency=self._runq_hist.hists_or_none(position, n),
            steps=st["steps"], gpu_wait_us=st["gpu_wait_us"], peer_wait_us=st["peer_wait_us"],
            step_sum_us=st["step_sum_us"],
            busy=self._busy.hists_or_none(position, n),
            attached_s=ov["attached_s"], sampled=ov["sampled"] > 0, sm_clock_ratio=ratio,
            step_sources=tuple(sorted(self._sources)),
            extra={name: acc.sums(position, n)["value"] for name, acc in self._extra.items()},
            own_time=self._own.hists_or_none(position, n))
