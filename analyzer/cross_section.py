"""Turn the windows of one job and one epoch into numpy arrays: one row per GPU.

Why a separate step: scoring must be vectorized across thousands of GPUs, but windows arrive one
node at a time as protobuf messages. Ingest only appends the wire histograms' raw counts to flat
C arrays (no per-bucket Python work); :meth:`EpochAccumulator.build` turns them into one
``(GPUs, K)`` matrix per API with a single ``np.bincount``, where K covers only the buckets that
hold data in this epoch (:class:`Hists`). Launch latencies of 16,384 GPUs occupy ~20 of the 226
buckets, so everything downstream does ~10x less work than on dense histograms.

A GPU is identified by ``(node, gpu)`` where ``gpu`` is the GPU index when the agent knew it, else
the GPU UUID, else ``pid:<pid>``. Its *row* is assigned by the job when the GPU is first seen (the
accumulator never loops over GPUs again). Several processes on one GPU, or several windows of one
node in one epoch (short or duty-cycled windows), are merged by adding their histograms, which is
exact on the fixed bucket scheme.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb

GpuKey = tuple[str, str]
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
    """Histograms of many GPUs restricted to buckets ``first .. first + K - 1`` (shape (G, K))."""

    counts: np.ndarray
    first: int

    def total(self) -> np.ndarray:
        return self.counts.sum(axis=1)

    def quantiles_us(self, qs: list[float]) -> np.ndarray:
        return buckets.quantiles_us(self.counts, qs, first_bucket=self.first)

    def dense(self) -> np.ndarray:
        """(G, NUM_BUCKETS) counts, for code that needs the whole scheme (theory, tests)."""
        out = np.zeros((self.counts.shape[0], buckets.NUM_BUCKETS))
        out[:, self.first:self.first + self.counts.shape[1]] = self.counts
        return out

    def select(self, sel: np.ndarray) -> "Hists":
        return Hists(self.counts[sel], self.first)


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

    @property
    def size(self) -> int:
        return int(self.rows.size)


@dataclass
class _Flat:
    """Histograms of many rows as the wire sent them, until :meth:`hists` is called."""

    rows: array = field(default_factory=lambda: array("q"))
    firsts: array = field(default_factory=lambda: array("q"))
    lens: array = field(default_factory=lambda: array("q"))
    vals: array = field(default_factory=lambda: array("Q"))

    def add(self, row: int, hist: pb.Histogram) -> None:
        n = len(hist.counts)
        if n == 0:
            return
        self.rows.append(row)
        self.firsts.append(hist.first_bucket)
        self.lens.append(n)
        self.vals.extend(hist.counts)

    def hists(self, local: np.ndarray, n_local: int) -> Hists:
        """Merge into (n_local, K); ``local`` maps this object's rows to local indices."""
        if not self.rows:
            return Hists(np.zeros((n_local, 1)), 0)
        lens = np.frombuffer(self.lens, dtype=np.int64)
        firsts = np.frombuffer(self.firsts, dtype=np.int64)
        lo = int(firsts.min())
        width = int((firsts + lens).max()) - lo
        starts = np.cumsum(lens) - lens
        # flat index of count j of histogram h = local[h]*width + (first[h] - lo) + (j - start[h])
        offset = local * width + (firsts - lo) - starts
        flat = np.repeat(offset, lens) + np.arange(int(lens.sum()), dtype=np.int64)
        vals = np.frombuffer(self.vals, dtype=np.uint64)
        if lens.size == n_local and np.bincount(local, minlength=n_local).max() <= 1:
            dense = np.zeros(n_local * width)        # one histogram per GPU: plain scatter
            dense[flat] = vals
        else:                                        # merge several windows/processes per GPU
            dense = np.bincount(flat, weights=vals.astype(np.float64), minlength=n_local * width)
        return Hists(dense.reshape(n_local, width), lo)


class EpochAccumulator:
    """Collects the processes of one job in one epoch; ``build`` gives the :class:`CrossSection`."""

    def __init__(self, job_id: str, epoch: int):
        self.job_id = job_id
        self.epoch = epoch
        self.windows = 0
        self._present = array("q")
        self._apis: dict[str, _Flat] = {}
        self._steps = _Flat()

    def add_process(self, row: int, p: pb.ProcessWindow) -> None:
        """Add one process window whose GPU has job-wide row ``row``."""
        self._present.append(row)
        for a in p.apis:
            flat = self._apis.get(a.api)
            if flat is None:
                flat = self._apis[a.api] = _Flat()
            flat.add(row, a.histogram)
        if p.HasField("step_time"):
            self._steps.add(row, p.step_time)

    def build(self) -> CrossSection:
        present_rows = np.frombuffer(self._present, dtype=np.int64)
        mask = np.zeros(int(present_rows.max()) + 1 if present_rows.size else 0, dtype=bool)
        mask[present_rows] = True                    # O(rows), cheaper than np.unique's sort
        rows = np.flatnonzero(mask)
        position = np.cumsum(mask) - 1               # job row -> local index
        n = rows.size

        def local(flat: _Flat) -> np.ndarray:
            return position[np.frombuffer(flat.rows, dtype=np.int64)]

        apis = {api: flat.hists(local(flat), n) for api, flat in sorted(self._apis.items())}
        steps = self._steps.hists(local(self._steps), n) if self._steps.rows else None
        return CrossSection(self.job_id, self.epoch, rows, apis, steps, self.windows)
