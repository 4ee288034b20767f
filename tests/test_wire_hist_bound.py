"""The quick pass's histogram limit check, which bounds a total by the encoded size, answers
exactly what adding up the counts answers."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hypertrace.proto import buckets, wire
from hypertrace.proto import hypertrace_pb2 as pb

#: counts from one-byte ones to 10-byte varints, so the bound is sometimes enough and sometimes not
COUNTS = st.one_of(st.integers(0, 127), st.integers(0, 2 ** 14), st.integers(0, 2 ** 64 - 1))
LIMITS = st.sampled_from([0, 1, 127, 10 ** 4, wire.MAX_STEPS_PER_WINDOW, wire.MAX_HISTOGRAM_COUNT,
                          2 ** 40])


def _exact(h: pb.Histogram, limit: int) -> bool:
    return (h.scheme == buckets.SCHEME_ID
            and h.first_bucket + len(h.counts) <= buckets.NUM_BUCKETS
            and sum(h.counts) <= limit)


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(scheme=st.sampled_from([buckets.SCHEME_ID, 0, 2]),
       first=st.sampled_from([0, 1, 127, 128, 200, 225, 226, 300, 2 ** 14]),
       counts=st.lists(COUNTS, max_size=240), limit=LIMITS, unknown=st.booleans())
def test_hist_within_answers_what_adding_up_answers(scheme, first, counts, limit, unknown):
    h = pb.Histogram(scheme=scheme, first_bucket=first, counts=counts)
    if unknown:                               # an unknown field makes the message longer
        h = pb.Histogram.FromString(h.SerializeToString() + b"\x20\x05")
    assert wire._hist_within(h, limit) == _exact(h, limit)


def test_hist_within_near_the_limit():
    """Totals one below, at and one above a limit, with small counts (the bound decides)."""
    for first in (0, 5, 150):
        for total in (wire.MAX_STEPS_PER_WINDOW - 1, wire.MAX_STEPS_PER_WINDOW,
                      wire.MAX_STEPS_PER_WINDOW + 1):
            counts = [100] * 50 + [total - 5000]
            h = pb.Histogram(scheme=buckets.SCHEME_ID, first_bucket=first, counts=counts)
            assert wire._hist_within(h, wire.MAX_STEPS_PER_WINDOW) == (
                total <= wire.MAX_STEPS_PER_WINDOW)
