"""The compiled path of building an epoch's histogram matrices (proto/hist_native.c).

Why: at 16,384 GPUs x 10 APIs, decoding the wire histograms and scattering their counts into
the (bucket, GPU) matrices was over half of a flush in numpy (a dozen passes over ~5 MB per
API); one C pass for the headers and one for the counts do it in a few milliseconds. The
numpy path (:func:`hypertrace.analyzer.score.hist_wire.parse_histograms` and
``_Flat.hists_or_none``) stays: it is taken where no C compiler is found, for a message laid
out otherwise than the protobuf runtime writes it, and for histograms decoded ahead in a worker
process. Both give the same matrix bit for bit (tests/test_hist_native.py).

Built at first use into the per-user cache (:func:`hypertrace.proto.cbuild.build_c`, as
the agent's C helpers), so an analyzer put on ``PYTHONPATH`` without pip gets it too.
"""
from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import numpy as np

from hypertrace.proto.cbuild import BuildError, build_c

SOURCE = Path(__file__).with_name("hist_native.c")
#: the message header it shares with the benchmarks' reference pass
HEADER = Path(__file__).with_name("hist_wire.h")
FLAGS = ["-O2", "-shared", "-fPIC"]

log = logging.getLogger(__name__)

#: messages per block of ht_wire_scatter (hist_native.c: BLOCK)
BLOCK = 256

_P = ctypes.c_void_p
_I = ctypes.c_int64


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled helper, built once per source version; None (the numpy path, logged once)
    where it cannot be built."""
    try:
        lib = ctypes.CDLL(str(build_c(SOURCE, "hist-native", FLAGS, suffix=".so",
                                       depends=(HEADER,))))
    except (BuildError, OSError, RuntimeError) as e:   # scoring never fails for want of it
        log.warning("histograms are decoded by numpy, about 10x slower: %s", e)
        return None
    lib.ht_wire_headers.restype = ctypes.c_int
    lib.ht_wire_headers.argtypes = [_P, _P, _I, _P, _P, _P]
    lib.ht_wire_scatter.restype = ctypes.c_int
    lib.ht_wire_scatter.argtypes = [_P, _P, _I, _P, _P, _P, _P, _P, _I, _I, _I, _P, _P, _P]
    return lib


def _ptr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def wire_hists(wire: np.ndarray, ends: np.ndarray, local: np.ndarray, totals: np.ndarray,
               n: int) -> tuple[np.ndarray, int, np.ndarray] | None:
    """Of the serialized ``Histogram`` messages in ``wire`` (uint8) ending at ``ends`` (int64),
    message i belonging to GPU ``local[i]`` (0..n-1) with ``totals[i]`` calls (NaN: the sum of
    its counts): (the (K, n) bucket-major matrix of the buckets from the first that holds a
    count, that first bucket, (n,) calls per GPU). K is 0 when no message holds a count.
    None: take the numpy path (no compiler, or a message this parser does not read)."""
    lib = library()
    if lib is None:
        return None
    m = int(ends.size)
    wire = np.ascontiguousarray(wire, dtype=np.uint8)
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    local = np.ascontiguousarray(local, dtype=np.int64)
    totals = np.ascontiguousarray(totals, dtype=np.float64)
    firsts, lens, cstarts = (np.empty(m, dtype=np.int64) for _ in range(3))
    if m and lib.ht_wire_headers(_ptr(wire), _ptr(ends), m, _ptr(firsts), _ptr(lens),
                                 _ptr(cstarts)) != 0:
        return None
    keep = lens > 0
    per_gpu = np.zeros(n)
    if not keep.any():
        return np.zeros((0, n)), 0, per_gpu
    lo = int(firsts[keep].min())
    width = int((firsts + lens)[keep].max()) - lo
    dense = np.zeros((width, n))
    tmp = np.empty(BLOCK * width)
    if lib.ht_wire_scatter(_ptr(wire), _ptr(ends), m, _ptr(firsts), _ptr(lens), _ptr(cstarts),
                           _ptr(local), _ptr(totals), lo, width, n, _ptr(dense), _ptr(per_gpu),
                           _ptr(tmp)) != 0:
        return None
    return dense, lo, per_gpu
