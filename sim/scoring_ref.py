"""The compiled reference pass of one epoch's GPU scoring: sim/scoring_ref.c, loaded by ctypes.

Why: the numpy floor (:mod:`hypertrace.sim.scoring_floor`) is numpy's cost, not the machine's.
This pass computes, in plain single-threaded C, the statistics the analyzer's
:func:`~hypertrace.analyzer.score.scoring.score_api` computes per API on the GPU basis
(quantiles, their sampling errors, median / quartiles / MAD, the fence re-read, robust z,
fences, effect gate, high and low flags) from the epoch's accumulator as ingested (the
serialized histograms), and flags the same GPUs bit for bit (:func:`agree` checks it). What it
leaves out, and the analyzer does: hosts, the shift check, signals, groups, persistence,
findings, the what-if sums. The bench times the analyzer's whole flush against it.

Built at first use with the system C compiler into the per-user cache
(:func:`hypertrace.proto.cbuild.build_c`, as the agent builds its C helpers): no build
step, no package from an index.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from hypertrace.analyzer.score.config import KNOWN_STATS, ScoringConfig
from hypertrace.analyzer.score.cross_section import EpochAccumulator
from hypertrace.proto import buckets, hist_native
from hypertrace.proto.cbuild import build_c

SOURCE = Path(__file__).with_name("scoring_ref.c")
#: -ffp-contract=off: no fused multiply-add, so every value is numpy's to the last bit
FLAGS = ["-O2", "-shared", "-fPIC", "-ffp-contract=off", "-lm"]
#: the message header, as the analyzer's decoder reads it (proto/hist_wire.h)
HEADER = Path(hist_native.__file__).with_name("hist_wire.h")


class _Params(ctypes.Structure):
    _fields_ = [("z_threshold", ctypes.c_double), ("iqr_k", ctypes.c_double),
                ("min_effect", ctypes.c_double), ("mad_floor", ctypes.c_double),
                ("min_samples", ctypes.c_double), ("min_gpus", ctypes.c_int64)]


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


class ReferencePass:
    """The loaded library, and what each call passes that does not change."""

    def __init__(self, cfg: ScoringConfig):
        self.lib = ctypes.CDLL(str(build_c(SOURCE, "scoring-ref", FLAGS + ["-I", str(HEADER.parent)],
                                        suffix=".so", depends=(HEADER,))))
        fn = self.lib.ref_score_api
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] + [ctypes.c_void_p] * 2 + [
            ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [
            ctypes.POINTER(_Params)] + [ctypes.c_void_p] * 4 + [ctypes.c_int64]
        self.cfg = cfg
        self.params = _Params(cfg.z_threshold, cfg.iqr_k, cfg.min_effect, cfg.mad_floor,
                              float(cfg.min_samples), cfg.min_gpus)
        self.qs = np.asarray([KNOWN_STATS[s] for s in cfg.stats], dtype=np.float64)
        self.lower = np.ascontiguousarray(buckets.LOWER_NS, dtype=np.float64)
        self.upper = np.ascontiguousarray(buckets.UPPER_NS, dtype=np.float64)
        self._buffer = np.zeros(0)

    def _scratch(self, size: int) -> np.ndarray:
        """A float64 buffer of at least ``size`` values, kept from call to call (its pages
        are faulted in once)."""
        if self._buffer.size < size:
            self._buffer = np.zeros(size)
        return self._buffer

    def flags(self, acc: EpochAccumulator
              ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """{api: ((S, G) values µs, (S, G) high, (S, G) low)} of the epoch's GPUs, in the
        order of their job rows, for every API but the step markers. Reads the accumulator's
        serialized histograms (``_Flat.wire``): the bench ingests window by window, so none
        was decoded before (a sealed accumulator is refused)."""
        present = acc.rows_present()
        mask = np.zeros(int(present.max()) + 1, dtype=bool)
        mask[present] = True
        position = np.cumsum(mask) - 1
        g = int(mask.sum())
        s = self.qs.size
        out = {}
        scratch = self._scratch(g * 48)            # the matrix of up to 48 buckets, reused
        for api, flat in sorted(acc._apis.items()):
            if self.cfg.api_kind(api) == "marker":
                continue
            if flat.decoded:
                raise ValueError("the reference pass reads serialized histograms; this "
                                 "accumulator was sealed (decoded ahead): ingest windows one "
                                 "by one")
            wire = np.frombuffer(flat.wire, dtype=np.uint8)
            ends = np.frombuffer(flat.ends, dtype=np.int64)
            local = position.take(np.frombuffer(flat.rows, dtype=np.int64))
            totals = np.frombuffer(flat.totals, dtype=np.float64)
            values = np.empty((s, g))
            high = np.empty((s, g), dtype=np.uint8)
            low = np.empty((s, g), dtype=np.uint8)
            rc = self.lib.ref_score_api(
                _ptr(wire), _ptr(ends), ends.size, _ptr(local), _ptr(totals), g,
                _ptr(self.lower), _ptr(self.upper), _ptr(self.qs), s,
                ctypes.byref(self.params), _ptr(values), _ptr(high), _ptr(low),
                _ptr(scratch), scratch.size)
            if rc == -1:
                raise ValueError(f"{api}: a Histogram message the reference pass cannot read "
                                 "(fields out of the protobuf runtime's order)")
            if rc != 0:
                raise MemoryError(f"{api}: the reference pass ran out of memory")
            out[api] = (values, high.view(bool), low.view(bool))
        return out
