"""One compressed block holding many stored windows: how windows of one epoch are kept at rest
once they are old enough that nothing writes them any more.

Why a block and not one payload per window: compressed alone, a window's histogram counts take
about 1.3 KB, and no per-window codec of the standard library does much better. The GPUs of a
job have histograms of similar shapes, so the counts of every window of an epoch, laid out
column-wise (one API's bucket ``b`` of every GPU side by side), compress to about two thirds of
that; the rest of each message (names, ids, the overhead report) repeats from window to window
and LZMA, with its large dictionary, keeps one copy (BENCHMARKS.md, "Storage at rest, schema 5").

Lossless: a block gives back each window's exact wire bytes. The counts are taken out of each
message and the message re-serialized; a window whose re-serialization is not its received
bytes (another serializer's field order, unknown fields) is kept verbatim in the block instead.

Layout: ``b"HB1"``, then two LZMA streams (their lengths first, ``<II``):

* the index: window count ``n``, the ``n`` window ids (``<q``), per window its kind (0 counts
  taken out, 1 verbatim, ``u1``) and its message length (``<u4``), the messages, then the
  number of histograms whose counts were taken out and each one's length (``<u4``);
* the counts: for each histogram column (a kind of histogram and API name, in order of first
  appearance), a matrix of (histograms of that column, buckets from the lowest first bucket to
  the highest last one), bucket-major, as ``width``-byte little-endian byte planes, ``width``
  the fewest of 1, 2, 4, 8 bytes that hold the largest count (one byte before the planes).
"""
from __future__ import annotations

import lzma
import struct
from typing import Iterator

import numpy as np

from hypertrace.proto import hypertrace_pb2 as pb

MAGIC = b"HB1"
#: LZMA2 with optimal parsing (what makes the counts small) but a hash-chain match finder of
#: short depth: within 1% of preset 6's bytes at about a quarter of its CPU (BENCHMARKS.md,
#: "Storage at rest, schema 5"). XZ framing: its CRC32 tells a damaged block from a good one.
_FILTERS = [{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 22, "mode": lzma.MODE_NORMAL,
             "mf": lzma.MF_HC4, "nice_len": 32, "depth": 8, "lc": 0, "lp": 0, "pb": 0}]
_VERBATIM, _SPLIT = 1, 0


class BlockError(ValueError):
    """A stored block that does not decode (a damaged page): its windows are lost, not the
    database."""


def _histograms(p: pb.ProcessWindow) -> Iterator[tuple[str, pb.Histogram]]:
    """Each histogram of a process window with the column it belongs to, in a fixed order."""
    for a in p.apis:
        if a.HasField("histogram"):
            yield "api:" + a.api, a.histogram
    if p.HasField("step_time"):
        yield "step", p.step_time
    if p.HasField("sched") and p.sched.HasField("runq_latency"):
        yield "runq", p.sched.runq_latency
    if p.HasField("steps") and p.steps.HasField("busy_time"):
        yield "busy", p.steps.busy_time


def _split(data: bytes) -> tuple[bytes, list[tuple[str, int, list[int]]]] | None:
    """(the message without its counts, [(column, first bucket, counts)]), or None when putting
    the counts back would not give ``data`` again."""
    try:
        m = pb.NodeWindow.FromString(data)
    except Exception:                     # not a message this code reads: kept verbatim
        return None
    if m.SerializeToString() != data:
        return None
    hists = []
    for p in m.processes:
        for col, h in _histograms(p):
            hists.append((col, int(h.first_bucket), list(h.counts)))
            del h.counts[:]
    return m.SerializeToString(), hists


def encode(windows: list[tuple[int, bytes]]) -> bytes:
    """A block of ``(id, wire bytes)`` windows (any order: kept as given)."""
    kinds, messages, lengths = [], [], []
    columns: dict[str, list[tuple[int, list[int]]]] = {}
    for _, data in windows:
        split = _split(data)
        if split is None:
            kinds.append(_VERBATIM)
            messages.append(data)
            continue
        rest, hists = split
        kinds.append(_SPLIT)
        messages.append(rest)
        for col, first, counts in hists:
            lengths.append(len(counts))
            columns.setdefault(col, []).append((first, counts))
    index = b"".join((
        struct.pack("<I", len(windows)),
        np.array([i for i, _ in windows], "<i8").tobytes(),
        np.array(kinds, "u1").tobytes(),
        np.array([len(m) for m in messages], "<u4").tobytes(),
        *messages,
        struct.pack("<I", len(lengths)),
        np.array(lengths, "<u4").tobytes()))
    mats = [_matrix(hs) for hs in columns.values()]
    top = max((int(m.max()) for m in mats if m.size), default=0)
    width = next(w for w in (1, 2, 4, 8) if top < 1 << (8 * w))
    planes = b"".join(np.ascontiguousarray(m.T, f"<u{width}").view(np.uint8)
                      .reshape(-1, width).T.tobytes() for m in mats)
    a = _compress(index)
    b = _compress(bytes([width]) + planes)
    return MAGIC + struct.pack("<II", len(a), len(b)) + a + b


def _compress(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32, filters=_FILTERS)


def _matrix(hists: list[tuple[int, list[int]]]) -> np.ndarray:
    """One column's histograms as rows of a (histograms, buckets) uint64 matrix, bucket ``j`` of
    every row the same bucket (from the lowest first bucket of the column)."""
    lo, hi = _span([(f, len(c)) for f, c in hists])
    m = np.zeros((len(hists), hi - lo), np.uint64)
    for i, (f, c) in enumerate(hists):
        m[i, f - lo:f - lo + len(c)] = c
    return m


def _span(hists: list[tuple[int, int]]) -> tuple[int, int]:
    """(lowest first bucket, highest end) of a column's (first bucket, length) histograms."""
    return min(f for f, _ in hists), max(f + n for f, n in hists)


def decode(blob: bytes) -> dict[int, bytes]:
    """Window id -> wire bytes of every window of a block; BlockError if it is damaged."""
    try:
        return _decode(blob)
    except BlockError:
        raise
    except Exception as exc:              # lzma.LZMAError, struct.error, a short array ...
        raise BlockError(f"damaged block ({type(exc).__name__}: {exc})") from exc


def _decode(blob: bytes) -> dict[int, bytes]:
    if blob[:3] != MAGIC:
        raise BlockError("not a window block")
    la, lb = struct.unpack_from("<II", blob, 3)
    index = lzma.decompress(blob[11:11 + la])
    raw = lzma.decompress(blob[11 + la:11 + la + lb])
    (n,) = struct.unpack_from("<I", index, 0)
    off = 4
    ids = np.frombuffer(index, "<i8", n, off).tolist()
    off += 8 * n
    kinds = np.frombuffer(index, "u1", n, off).tolist()
    off += n
    sizes = np.frombuffer(index, "<u4", n, off).tolist()
    off += 4 * n
    messages = []
    for s in sizes:
        messages.append(index[off:off + s])
        off += s
    (nh,) = struct.unpack_from("<I", index, off)
    lengths = np.frombuffer(index, "<u4", nh, off + 4).tolist()
    # the messages name each histogram's column and first bucket: the matrices' shapes follow
    parsed: list[pb.NodeWindow | None] = []
    slots: dict[str, list[tuple[pb.Histogram, int, int]]] = {}
    it = iter(lengths)
    for kind, msg in zip(kinds, messages):
        if kind == _VERBATIM:
            parsed.append(None)
            continue
        m = pb.NodeWindow.FromString(msg)
        parsed.append(m)
        for p in m.processes:
            for col, h in _histograms(p):
                slots.setdefault(col, []).append((h, int(h.first_bucket), next(it)))
    width, pos = raw[0], 1
    for hs in slots.values():
        lo, hi = _span([(f, k) for _, f, k in hs])
        size = len(hs) * (hi - lo)
        planes = np.frombuffer(raw, np.uint8, size * width, pos).reshape(width, size)
        pos += size * width
        m = np.ascontiguousarray(planes.T).view(f"<u{width}").reshape(hi - lo, len(hs)).T
        for row, (h, f, k) in zip(m.tolist(), hs):
            h.counts.extend(row[f - lo:f - lo + k])
    return {i: (msg if m is None else m.SerializeToString())
            for i, msg, m in zip(ids, messages, parsed)}
