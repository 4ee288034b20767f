"""analyzer/score/hist_wire.py decodes serialized Histogram messages exactly as the protobuf runtime
reads them: first buckets, lengths and every count, including counts that take several varint
bytes, empty histograms, a zero first bucket, and messages carrying fields it does not know."""
from __future__ import annotations

from array import array

import numpy as np

from hypertrace.analyzer.score.cross_section import _Flat
from hypertrace.analyzer.score.hist_wire import parse_histograms
from hypertrace.proto import hypertrace_pb2 as pb


def _hists() -> list[pb.Histogram]:
    rng = np.random.default_rng(7)
    out = [pb.Histogram(scheme=1, first_bucket=0, counts=[3, 0, 1]),
           pb.Histogram(scheme=1, first_bucket=12),                      # no counts
           pb.Histogram(first_bucket=5, counts=[2**63 + 5, 2**35, 127, 128, 16383, 16384]),
           pb.Histogram(counts=[0, 0, 9]),                               # scheme 0, bucket 0
           pb.Histogram()]                                               # zero bytes
    for _ in range(50):
        out.append(pb.Histogram(scheme=1, first_bucket=int(rng.integers(0, 60)),
                                counts=rng.integers(0, 5000, int(rng.integers(0, 45))).tolist()))
    return out


def _wire(hists: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    data = b"".join(hists)
    ends = np.cumsum([len(h) for h in hists]).astype(np.int64)
    return np.frombuffer(data, dtype=np.uint8), ends


def _expected(hists: list[pb.Histogram]):
    return (np.array([h.first_bucket for h in hists], dtype=np.int64),
            np.array([len(h.counts) for h in hists], dtype=np.int64),
            np.array([c for h in hists for c in h.counts], dtype=np.uint64))


def _assert_same(got, want) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_parse_matches_the_protobuf_reader():
    hists = _hists()
    _assert_same(parse_histograms(*_wire([h.SerializeToString() for h in hists])),
                 _expected(hists))


def test_histograms_of_zero_bytes():
    hists = [pb.Histogram(), pb.Histogram()]
    _assert_same(parse_histograms(*_wire([h.SerializeToString() for h in hists])),
                 _expected(hists))


def test_unknown_fields_are_read_by_the_protobuf_parser():
    hists = _hists()
    # a newer sender's field 9 (varint 300) after the counts: kept and re-serialized
    odd = pb.Histogram.FromString(hists[2].SerializeToString() + bytes([0x48, 0xAC, 0x02]))
    blobs = [h.SerializeToString() for h in hists]
    blobs[2] = odd.SerializeToString()
    assert blobs[2] != hists[2].SerializeToString()
    _assert_same(parse_histograms(*_wire(blobs)), _expected(hists))


def test_flat_drops_empty_histograms_and_sums_unstated_totals():
    flat = _Flat()
    hists = _hists()
    for row, h in enumerate(hists):
        flat.add(row, h, total=None if row % 2 else 17)
    rows, firsts, lens, vals, totals = flat.raw()
    kept = [r for r, h in enumerate(hists) if len(h.counts)]
    np.testing.assert_array_equal(rows, kept)
    _assert_same((firsts, lens, vals), _expected([hists[r] for r in kept]))
    np.testing.assert_array_equal(
        totals, [float(sum(hists[r].counts)) if r % 2 else 17.0 for r in kept])
    assert isinstance(flat.wire, array)
