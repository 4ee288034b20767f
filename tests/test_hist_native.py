"""The compiled build of an epoch's histogram matrices (proto/hist_native.c) gives the
numpy path's matrices and totals bit for bit, and hands it what it does not read."""
from __future__ import annotations

import numpy as np
import pytest

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import _Flat
from hypertrace.analyzer.score.engine import Engine
from hypertrace.proto import hist_native
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.synthetic import job_windows, node_name


def _both(flat: _Flat, n: int):
    position = np.arange(n)
    native = flat.hists_or_none(position, n)
    numpy = flat.numpy_hists(position, n)
    return native, numpy


def _same(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.first == b.first
        assert a.counts_t.shape == b.counts_t.shape
        assert np.array_equal(a.counts_t, b.counts_t)
        assert np.array_equal(a.total(), b.total())


@pytest.fixture(scope="module")
def compiled():
    if hist_native.library() is None:
        pytest.fail("the compiled helper did not build (no C compiler? apt-get install gcc)")


def test_every_api_of_an_epoch_is_built_the_same(compiled):
    engine = Engine(ScoringConfig())
    # two windows per GPU in the epoch (they add up), a thin node, a slow one
    for w in job_windows(32, 8, 2, slow={node_name(3): 1.2}, seed=5, all_apis=True,
                         window_seconds=5.0, samples_by_node={node_name(7): 3}):
        engine.ingest(w)
    (acc,) = [a for job in engine._jobs.values() for a in job.pending.values()]
    assert len(acc._apis) == 10
    for flat in acc._apis.values():
        native, numpy = _both(flat, 256)
        assert native is not None and native.counts_t.shape[1] == 256
        _same(native, numpy)


def test_stated_totals_empty_histograms_and_large_counts(compiled):
    flat = _Flat()
    flat.add(0, pb.Histogram(scheme=1, first_bucket=40, counts=[3, 0, 2 ** 40, 7]))
    flat.add(2, pb.Histogram(scheme=1, first_bucket=12, counts=[1]), total=1)
    flat.add(1, pb.Histogram(scheme=1))                     # no counts: adds nothing
    flat.add(0, pb.Histogram(first_bucket=41, counts=[5, 300_000]))   # scheme left out
    native, numpy = _both(flat, 3)
    _same(native, numpy)
    assert native.first == 12 and native.counts_t.shape == (32, 3)
    assert native.total().tolist() == [3 + 2 ** 40 + 7 + 5 + 300_000, 0, 1]


def test_no_counts_at_all_is_no_matrix(compiled):
    flat = _Flat()
    flat.add(0, pb.Histogram(scheme=1))
    native, numpy = _both(flat, 1)
    assert native is None and numpy is None


def test_a_message_laid_out_otherwise_goes_to_the_numpy_path(compiled):
    h = pb.Histogram(scheme=1, first_bucket=10, counts=[1, 2, 3])
    # the same message with its fields in reverse order: valid protobuf, not the runtime's
    odd = b"\x1a\x03\x01\x02\x03" + b"\x10\x0a" + b"\x08\x01"
    assert pb.Histogram.FromString(odd) == h
    wire = np.frombuffer(odd, dtype=np.uint8)
    ends = np.array([len(odd)], dtype=np.int64)
    assert hist_native.wire_hists(wire, ends, np.zeros(1, np.int64), np.full(1, np.nan),
                                  1) is None
    flat = _Flat()
    flat.wire.frombytes(odd)
    flat.ends.append(len(odd))
    flat.rows.append(0)
    flat.totals.append(float("nan"))
    built = flat.hists_or_none(np.arange(1), 1)               # read by the protobuf parser
    assert built.first == 10 and built.counts_t[:, 0].tolist() == [1, 2, 3]
