"""One compressed block holding many stored windows: how windows of one epoch are kept at rest
once they are old enough that nothing writes them any more.

Why a block and not one payload per window: compressed alone, a window's histogram counts take
about 1.3 KB, and no per-window codec of the standard library does much better. The GPUs of a
job have histograms of similar shapes, so the counts of every window of an epoch, laid out
column-wise (one API's bucket ``b`` of every GPU side by side), compress to about two thirds of
that; the rest of each message (names, ids, the overhead report) repeats from window to window
and LZMA, with its large dictionary, keeps one copy (BENCHMARKS.md, "Storage at rest, schema 5").

The rest of the messages is mostly numbers, different for every GPU (sums and extremes of
the call times, the overhead report, the run-queue and step totals): interleaved with field
tags, LZMA kept about 590 B of them per window. They are taken out too, one column per field of
each message type (every window's ``ApiStats.sum_us`` side by side, then ``min_us`` ...): the
doubles whole, in an 8-byte-aligned LZMA stream, the integers as byte planes; what is left of
the messages (names, ids, tags) is a few dozen bytes a window. ``ApiStats.count``, the total of
its histogram, is kept as its difference from that total (BENCHMARKS.md, "Storage at rest,
schema 5, numbers column-wise").

A double column whose every value is a whole number of thousandths (``k / 1000`` gives it back
bit for bit: the µs times agents send as nanoseconds over 1000) is kept as the integers ``k``
with the integers: about 3.5 bytes a value where the double's mantissa took 6 to 7. A
histogram's first bucket and length are found from its counts, since agents send histograms
trimmed (no zero at either end): what is kept of them is the number of zeros at each end, zero
for such a histogram (one without a count is kept as it is). Together about 70 B a window
(BENCHMARKS.md, "Storage at rest, schema 6").

Lossless: a block gives back each window's exact wire bytes. The counts and the numbers are
taken out of each message and the message re-serialized; only plain proto3 numbers are taken
(a zero leaves them out of the wire, so putting the number back gives the same bytes). A window
whose re-serialization is not its received bytes (another serializer's field order, unknown
fields) is kept verbatim in the block instead, and so is one that a decode of the new block does
not give back as it came (each block is decoded once when it is written).

Layout: ``b"HB3"``, then four LZMA streams (their lengths first, ``<4I``):

* the index: window count ``n``, the ``n`` window ids (``<q``), per window its kind (0 taken
  apart, 1 verbatim, ``u1``) and its message length (``<u4``), the messages; the number of
  histograms taken apart and each one's trailing zeros (``<u4``); the number of double
  columns and how each is kept (0 doubles, 1 thousandths, ``u1``); the number of histogram
  columns and each one's (lowest first bucket, highest end) (``<q`` pairs); the number of
  histograms without a count and each one's (histogram, first bucket, length) (``<u8``);
* the doubles: for each column (a field of a message type; the types in order of first
  appearance in the windows taken apart, each walked depth first) kept as doubles, its values
  (``<f8``);
* the integers: for each column likewise (a type's columns of thousandths before its integer
  fields), its values as 8 byte planes of ``<u8`` (two's complement for the signed fields, the
  thousandths and the counts' differences); a histogram's ``first_bucket`` is its leading
  zeros;
* the counts: for each histogram column (a kind of histogram and API name, in order of first
  appearance), a matrix of (histograms of that column, buckets of its span), its rows ordered
  by the numbers beside each histogram (the API's ``max_us``, ``min_us`` then ``sum_us``, the
  run queue's ``runq_ns``: :func:`_order`), bucket-major, as ``width``-byte little-endian byte
  planes, ``width`` the fewest of 1, 2, 4, 8 bytes that hold the largest count (one byte
  before the planes).

Blocks of the earlier layouts are still read: ``b"HB2"`` (every double column whole, each
histogram's first bucket in the integers and its length in the index instead of its trailing
zeros, no spans, an API's rows ordered by ``sum_us`` alone) and ``b"HB1"`` (the index and the
counts only, the numbers left in the messages).
"""
from __future__ import annotations

import functools
import lzma
import struct
from typing import Any, Iterator

import numpy as np
from google.protobuf.descriptor import FieldDescriptor as FD

from hypertrace.proto import hypertrace_pb2 as pb

MAGIC = b"HB3"
#: Blocks written before double columns could be kept as thousandths and histograms by their
#: counts: still read (and copied).
MAGIC_V2 = b"HB2"
#: Blocks written before the numbers were taken out of the messages: still read.
MAGIC_V1 = b"HB1"
#: LZMA2 with optimal parsing (what makes the counts small) but a hash-chain match finder of
#: short depth: within 1% of preset 6's bytes at about a quarter of its CPU (BENCHMARKS.md,
#: "Storage at rest, schema 5"). XZ framing: its CRC32 tells a damaged block from a good one.
_FILTERS = [{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 22, "mode": lzma.MODE_NORMAL,
             "mf": lzma.MF_HC4, "nice_len": 32, "depth": 8, "lc": 0, "lp": 0, "pb": 0}]
#: The doubles' stream: 8-byte aligned (``lp``, ``pb`` 3), so LZMA's literal and match models
#: keep a state per byte of the double (sign and exponent apart from the mantissa's low bytes):
#: about 7% smaller than the unaligned model on the same column-wise doubles.
_DOUBLE_FILTERS = [{**_FILTERS[0], "lp": 3, "pb": 3}]
#: The counts' stream: the previous byte's high bits as the literal's context (``lc`` 4).
_COUNT_FILTERS = [{**_FILTERS[0], "lc": 4}]
_VERBATIM, _SPLIT = 1, 0
#: How a double column is kept (:func:`_take_numbers`).
_RAW_DOUBLES, _THOUSANDTHS = 0, 1
_DOUBLE, _INT = FD.TYPE_DOUBLE, {FD.TYPE_UINT64, FD.TYPE_UINT32, FD.TYPE_INT64, FD.TYPE_INT32}
#: ApiStats.count is the total of its histogram: kept as its difference from that total (0 in a
#: well-formed window, so a column of zeros).
_API_COUNT = "hypertrace.v1.ApiStats.count"
_MASK = (1 << 64) - 1
_SIGNED = {FD.TYPE_INT64, FD.TYPE_INT32}


class BlockError(ValueError):
    """A stored block that does not decode (a damaged page): its windows are lost, not the
    database."""


def _histograms(p: pb.ProcessWindow) -> Iterator[tuple[str, pb.Histogram, tuple[float, ...]]]:
    """Each histogram of a process window with the column it belongs to and the numbers its
    message holds beside it that order the column's rows in a block (:func:`_order`; the
    last one is the total that ordered them in ``HB2``), in a fixed order."""
    for a in p.apis:
        if a.HasField("histogram"):
            yield "api:" + a.api, a.histogram, (a.max_us, a.min_us, a.sum_us)
    if p.HasField("step_time"):
        yield "step", p.step_time, ()
    if p.HasField("sched") and p.sched.HasField("runq_latency"):
        yield "runq", p.sched.runq_latency, (float(p.sched.runq_ns),)
    if p.HasField("steps") and p.steps.HasField("busy_time"):
        yield "busy", p.steps.busy_time, ()


def _order(keys: list[tuple[float, ...]]) -> np.ndarray:
    """The order of a column's rows in a block: by the numbers beside their histograms, the
    first first (an API's largest call time, then its smallest, then the total; the run
    queue's total). GPUs with like numbers have like histograms, which LZMA then meets side
    by side: the counts' stream about 7% smaller than in the windows' order, 2% smaller than
    by the total alone. Computed from numbers decoded before the counts, so it costs no
    bytes."""
    width = len(keys[0]) if keys else 0
    if not width:
        return np.arange(len(keys))
    return np.lexsort(np.array(keys, np.float64).T[::-1])


def _order_v2(keys: list[tuple[float, ...]]) -> np.ndarray:
    """The order of ``HB2`` blocks: by the total alone (the keys' last number, 0 without)."""
    return np.argsort(np.array([k[-1] if k else 0.0 for k in keys], np.float64), kind="stable")


#: The fields a block's columns hold, per message type: those up to this field number. A block
#: is decoded with the plan of the code that reads it, so the plan must not grow when the wire
#: format does: a field added later (a higher number) stays inside its message's own bytes, and
#: a block written before it decodes the same (and a message type that only such a field holds is
#: never reached). Types not listed (other messages than windows) take all their fields.
COLUMN_FIELDS_UP_TO = {
    "hypertrace.v1.NodeWindow": 8, "google.protobuf.Timestamp": 2,
    "hypertrace.v1.ProcessWindow": 15, "hypertrace.v1.ApiStats": 6, "hypertrace.v1.Histogram": 3,
    "hypertrace.v1.NvmlContext": 10, "hypertrace.v1.Overhead": 13, "hypertrace.v1.ApiTier": 3,
    "hypertrace.v1.SchedStats": 6, "hypertrace.v1.StepStats": 7,
}


@functools.lru_cache(maxsize=None)
def _plan(desc: Any) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, bool], ...],
                              tuple[str, ...], tuple[str, ...]]:
    """A message type's doubles (field, column), integers (field, column, signed), singular
    and repeated messages (field): the numbers taken out are the scalar ones without presence
    (proto3's plain fields, which a zero leaves out of the wire), so putting a number back
    gives the same bytes. Only the fields of :data:`COLUMN_FIELDS_UP_TO`."""
    dbl, ints, one, many = [], [], [], []
    last = COLUMN_FIELDS_UP_TO.get(desc.full_name, float("inf"))
    for fd in desc.fields:
        if fd.number > last:
            continue
        col = f"{desc.full_name}.{fd.name}"
        if fd.type == FD.TYPE_MESSAGE:
            if fd.is_repeated and fd.message_type.GetOptions().map_entry:
                continue                    # a map: kept in the message as it is
            (many if fd.is_repeated else one).append(fd.name)
        elif fd.is_repeated or fd.has_presence:
            continue
        elif fd.type == _DOUBLE:
            dbl.append((fd.name, col))
        elif fd.type in _INT:
            ints.append((fd.name, col, fd.type in _SIGNED))
    return tuple(dbl), tuple(ints), tuple(one), tuple(many)


def _walk(m: Any, by_type: dict[Any, list[Any]]) -> None:
    """Append ``m`` and every message it holds to ``by_type`` (descriptor -> messages), in one
    fixed order (that of the fields, depth first)."""
    desc = m.DESCRIPTOR
    got = by_type.get(desc)
    if got is None:
        by_type[desc] = [m]
    else:
        got.append(m)
    _, _, one, many = _plan(desc)
    for name in one:
        if m.HasField(name):
            _walk(getattr(m, name), by_type)
    for name in many:
        for sub in getattr(m, name):
            _walk(sub, by_type)


def _by_type(messages: list[pb.NodeWindow]) -> dict[Any, list[Any]]:
    """Every message the windows hold, grouped by type: a column of numbers is one field of
    one type, over every window of a block (window by window, each depth first)."""
    by_type: dict[Any, list[Any]] = {}
    for m in messages:
        _walk(m, by_type)
    return by_type


def _thousandths(values: np.ndarray) -> np.ndarray | None:
    """``values`` as integers ``k`` with ``k / 1000`` the very same doubles, bit for bit; None
    when one is not (a NaN, -0.0, a value not a whole number of thousandths). The agents send
    times in µs as their nanosecond totals over 1000 (``sum_ns / 1e3``): as integers those take
    the bits of the number, not the 8 bytes of a double whose mantissa looks random."""
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(values * 1e3)
        ok = np.abs(k) < 2.0 ** 53
    if not ok.all():
        return None
    ki = k.astype("<i8")                      # compared as the integers: -0.0 becomes 0
    if not np.array_equal((ki / 1e3).view("<u8"), values.view("<u8")):
        return None
    return ki


def _take_numbers(messages: list[pb.NodeWindow]) -> tuple[bytes, bytes, bytes]:
    """Move the plain numbers out of ``messages`` (they keep zeros): (the doubles, the
    integers) streams' bytes, a column after the other, and per double column how it is kept
    (``u1``: 0 in the doubles' stream, 1 as thousandths in the integers' stream, the first
    of its type's integer columns). Called with the histograms' counts still in:
    ``ApiStats.count`` is kept as its difference from their total."""
    doubles, ints, kinds = [], [], []
    for desc, msgs in _by_type(messages).items():
        dbl, its, _, _ = _plan(desc)
        for field, _ in dbl:
            values = np.array([getattr(x, field) for x in msgs], "<f8")
            k = _thousandths(values)
            kinds.append(_RAW_DOUBLES if k is None else _THOUSANDTHS)
            if k is None:
                doubles.append(values.tobytes())
            else:
                ints.append(_int_planes(k))
            for x in msgs:
                setattr(x, field, 0.0)
        for field, col, _ in its:
            values = [getattr(x, field) for x in msgs]
            if col == _API_COUNT:
                values = [v - sum(x.histogram.counts) for v, x in zip(values, msgs)]
            ints.append(_int_planes(np.array([v & _MASK for v in values], "<u8")))
            for x in msgs:
                setattr(x, field, 0)
    return b"".join(doubles), b"".join(ints), bytes(kinds)


def _int_planes(values: np.ndarray) -> bytes:
    """A column of 64-bit integers (two's complement) as 8 byte planes, lowest first: their
    high bytes mostly zero."""
    return values.view(np.uint8).reshape(-1, 8).T.tobytes()


def _parse(data: bytes) -> pb.NodeWindow | None:
    """The window's message, or None when serializing it again would not give ``data`` (kept
    verbatim then)."""
    try:
        m = pb.NodeWindow.FromString(data)
    except Exception:                     # not a message this code reads
        return None
    return m if m.SerializeToString() == data else None


def encode(windows: list[tuple[int, bytes]]) -> bytes:
    """A block of ``(id, wire bytes)`` windows (any order: kept as given). Decoded once before
    it is returned: a window that would not come back as it came (a field this code does not
    know how to take apart) is kept verbatim instead."""
    verbatim: set[int] = set()
    for _ in range(2):
        blob = _encode(windows, verbatim)
        try:
            back = decode(blob)
        except BlockError:                  # which window is not known: all kept verbatim
            back = {}
        wrong = {i for i, (_, data) in enumerate(windows) if back.get(windows[i][0]) != data}
        if not wrong:
            return blob
        verbatim |= wrong
    raise AssertionError("a block of verbatim windows did not decode to them")


def _encode(windows: list[tuple[int, bytes]], verbatim: set[int]) -> bytes:
    parsed = [None if i in verbatim else _parse(data) for i, (_, data) in enumerate(windows)]
    split = [m for m in parsed if m is not None]
    # the histograms with their counts and keys, read before the numbers are taken out
    hists = [(col, int(h.first_bucket), list(h.counts), key, h)
             for m in split for p in m.processes for col, h, key in _histograms(p)]
    columns: dict[str, list[int]] = {}
    for i, (col, *_) in enumerate(hists):
        columns.setdefault(col, []).append(i)
    mats, spans, trails, odd = [], [], np.zeros(len(hists), np.int64), []
    for rows in columns.values():
        lo, hi = _span([(hists[i][1], len(hists[i][2])) for i in rows])
        m = _matrix([(hists[i][1], hists[i][2]) for i in rows], lo, hi)
        j0, j1, has = _ends(m)
        for r, i in enumerate(rows):
            _, first, counts, _, h = hists[i]
            if has[r]:      # the first bucket becomes its leading zeros, the length its trailing
                h.first_bucket = int(lo + j0[r] - first)
                trails[i] = first + len(counts) - 1 - (lo + j1[r])
            else:           # no count to find it by: kept as it is
                h.first_bucket = 0
                odd.append((i, first, len(counts)))
        spans.append((lo, hi))
        mats.append(m[_order([hists[i][3] for i in rows])])
    doubles, ints, kinds = _take_numbers(split)
    for *_, h in hists:
        del h.counts[:]
    messages = [data if m is None else m.SerializeToString()
                for m, (_, data) in zip(parsed, windows)]
    index = b"".join((
        struct.pack("<I", len(windows)),
        np.array([i for i, _ in windows], "<i8").tobytes(),
        np.array([_VERBATIM if m is None else _SPLIT for m in parsed], "u1").tobytes(),
        np.array([len(m) for m in messages], "<u4").tobytes(),
        *messages,
        struct.pack("<I", len(hists)),
        trails.astype("<u4").tobytes(),
        struct.pack("<I", len(kinds)), kinds,
        struct.pack("<I", len(spans)), np.array(spans, "<i8").tobytes(),
        struct.pack("<I", len(odd)), np.array(odd, "<u8").tobytes()))
    streams = (_compress(index), _compress(doubles, _DOUBLE_FILTERS), _compress(ints),
               _compress(_planes(mats), _COUNT_FILTERS))
    return MAGIC + struct.pack("<4I", *map(len, streams)) + b"".join(streams)


def _ends(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a counts matrix: its first and last non-zero bucket, and whether it has
    one (where a well-formed histogram starts and ends: it is sent trimmed)."""
    nz = m != 0
    if not m.shape[1]:
        z = np.zeros(len(m), np.int64)
        return z, z, np.zeros(len(m), bool)
    return (nz.argmax(axis=1), m.shape[1] - 1 - nz[:, ::-1].argmax(axis=1), nz.any(axis=1))


def _planes(mats: list[np.ndarray]) -> bytes:
    """The counts' matrices bucket-major, as ``width``-byte little-endian byte planes (``width``
    the fewest of 1, 2, 4, 8 bytes that hold the largest count, one byte before the planes)."""
    top = max((int(m.max()) for m in mats if m.size), default=0)
    width = next(w for w in (1, 2, 4, 8) if top < 1 << (8 * w))
    return bytes([width]) + b"".join(
        np.ascontiguousarray(m.T, f"<u{width}").view(np.uint8).reshape(-1, width).T.tobytes()
        for m in mats)


def _compress(data: bytes, filters: list[dict] = _FILTERS) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32, filters=filters)


def _matrix(hists: list[tuple[int, list[int]]], lo: int, hi: int) -> np.ndarray:
    """One column's histograms as rows of a (histograms, buckets ``lo`` .. ``hi``) uint64
    matrix, bucket ``j`` of every row the same bucket."""
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
    if blob[:3] in (MAGIC, MAGIC_V2):
        sizes = struct.unpack_from("<4I", blob, 3)
        index, doubles, ints, raw = _streams(blob, 3 + 16, sizes)
    elif blob[:3] == MAGIC_V1:
        index, raw = _streams(blob, 3 + 8, struct.unpack_from("<II", blob, 3))
        doubles = ints = None
    else:
        raise BlockError("not a window block")
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
    off += 4 + 4 * nh
    dkinds = spans = odd = None         # HB1, HB2: every double whole, histograms as sent
    if blob[:3] == MAGIC:
        (nk,) = struct.unpack_from("<I", index, off)
        dkinds = index[off + 4:off + 4 + nk]
        off += 4 + nk
        (nc,) = struct.unpack_from("<I", index, off)
        spans = np.frombuffer(index, "<i8", 2 * nc, off + 4).reshape(nc, 2).tolist()
        off += 4 + 16 * nc
        (no,) = struct.unpack_from("<I", index, off)
        odd = {i: (f, k) for i, f, k in
               np.frombuffer(index, "<u8", 3 * no, off + 4).reshape(no, 3).tolist()}
    parsed: list[pb.NodeWindow | None] = [
        None if kind == _VERBATIM else pb.NodeWindow.FromString(msg)
        for kind, msg in zip(kinds, messages)]
    counted = []
    if doubles is not None:
        counted = _put_numbers([m for m in parsed if m is not None], doubles, ints, dkinds)
    # the messages name each histogram's column: the matrices' shapes follow
    slots: dict[str, list[tuple[pb.Histogram, int, tuple[float, ...]]]] = {}
    gi = 0
    for m in parsed:
        for p in (m.processes if m is not None else ()):
            for col, h, key in _histograms(p):
                slots.setdefault(col, []).append((h, gi, key))
                gi += 1
    if gi != nh or (spans is not None and len(spans) != len(slots)):
        raise BlockError("the index does not match the messages")
    width, pos = raw[0], 1
    for c, hs in enumerate(slots.values()):
        lo, hi = (_span([(int(h.first_bucket), lengths[i]) for h, i, _ in hs]) if spans is None
                  else spans[c])
        size = len(hs) * (hi - lo)
        planes = np.frombuffer(raw, np.uint8, size * width, pos).reshape(width, size)
        pos += size * width
        m = np.ascontiguousarray(planes.T).view(f"<u{width}").reshape(hi - lo, len(hs)).T
        keys = [key for *_, key in hs]
        order = (range(len(hs)) if doubles is None else _order(keys) if spans is not None
                 else _order_v2(keys))
        j0, j1, has = _ends(m) if spans is not None else (None, None, None)
        for r, (row, i) in enumerate(zip(m.tolist(), order)):
            h, g, _ = hs[i]
            if spans is None:                           # as sent
                f, k = int(h.first_bucket), lengths[g]
            elif g in odd:
                f, k = odd[g]
            elif has[r]:            # from its leading zeros, its trailing ones and the counts
                lead = int(h.first_bucket)
                f, k = lo + int(j0[r]) - lead, int(j1[r] - j0[r]) + 1 + lead + lengths[g]
            else:
                raise BlockError("a histogram without counts that is not kept as it is")
            h.first_bucket = f
            h.counts.extend(row[f - lo:f - lo + k])
    for api, diff in counted:
        api.count = (diff + sum(api.histogram.counts)) & _MASK
    return {i: (msg if m is None else m.SerializeToString())
            for i, msg, m in zip(ids, messages, parsed)}


def _streams(blob: bytes, off: int, sizes: tuple[int, ...]) -> list[bytes]:
    """The LZMA streams that follow a block's header, decompressed."""
    out = []
    for size in sizes:
        out.append(lzma.decompress(blob[off:off + size]))
        off += size
    return out


def _put_numbers(messages: list[pb.NodeWindow], doubles: bytes, ints: bytes,
                 kinds: bytes | None) -> list[tuple[pb.ApiStats, int]]:
    """Put back the numbers :func:`_take_numbers` took out of ``messages`` (``kinds``: how
    each double column is kept, None for all in the doubles' stream); returns the ApiStats
    whose count is still to be set, each with its difference from its histogram's total (the
    counts are put back after)."""
    counted: list[tuple[pb.ApiStats, int]] = []
    dpos = ipos = col_no = 0
    for desc, msgs in _by_type(messages).items():
        k = len(msgs)
        dbl, its, _, _ = _plan(desc)
        for field, _ in dbl:
            kind = _RAW_DOUBLES if kinds is None else kinds[col_no]
            col_no += 1
            if kind == _THOUSANDTHS:
                got = _int_column(ints, ipos, k, "<i8") / 1e3
                ipos += 8 * k
            elif kind == _RAW_DOUBLES:
                got = np.frombuffer(doubles, "<f8", k, dpos)
                dpos += 8 * k
            else:
                raise BlockError(f"a double column of unknown kind {kind}")
            for x, v in zip(msgs, got.tolist()):
                setattr(x, field, v)
        for field, col, signed in its:
            values = _int_column(ints, ipos, k, "<i8" if signed else "<u8").tolist()
            ipos += 8 * k
            if col == _API_COUNT:
                counted.extend(zip(msgs, values))
                continue
            for x, v in zip(msgs, values):
                setattr(x, field, v)
    if dpos != len(doubles) or ipos != len(ints) or (kinds is not None
                                                     and col_no != len(kinds)):
        raise BlockError("the numbers' streams do not match the messages")
    return counted


def _int_column(ints: bytes, pos: int, k: int, dtype: str) -> np.ndarray:
    """The ``k`` integers of a column whose 8 byte planes start at ``pos`` (:func:`_int_planes`)."""
    return np.frombuffer(ints, np.uint8, 8 * k, pos).reshape(8, k).T.copy().view(dtype).ravel()


def with_ids(blob: bytes, ids: list[int]) -> bytes:
    """The same windows under other ids (``ids`` in the order the block holds its windows):
    a copy of a block for another stretch of a benchmark's history, at the cost of its index
    stream only (the numbers and counts are copied as they are, not decoded)."""
    if blob[:3] not in (MAGIC, MAGIC_V2):
        raise BlockError("not a window block of a layout with its numbers apart")
    sizes = struct.unpack_from("<4I", blob, 3)
    (index,) = _streams(blob, 3 + 16, sizes[:1])
    (n,) = struct.unpack_from("<I", index, 0)
    if len(ids) != n:
        raise ValueError(f"{len(ids)} ids for a block of {n} windows")
    a = _compress(index[:4] + np.array(ids, "<i8").tobytes() + index[4 + 8 * n:])
    return blob[:3] + struct.pack("<4I", len(a), *sizes[1:]) + a + blob[3 + 16 + sizes[0]:]
