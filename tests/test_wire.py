"""Wire validation names the offending field; JSON lines round-trip."""
import io
import math

import numpy as np
import pytest

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import wire


def _window(**overrides) -> pb.NodeWindow:
    w = pb.NodeWindow(version=1, agent_id="a1", node="node-0001", seq=1)
    w.start.FromNanoseconds(1_000_000_000)
    w.end.FromNanoseconds(11_000_000_000)
    p = w.processes.add(job_id="job", rank=0, local_rank=0, gpu_index=0, pid=42)
    p.apis.append(wire.api_stats_from_ns("cudaLaunchKernel", np.full(100, 10_000.0)))
    return w


def test_valid_window_passes():
    wire.validate_window(_window())


@pytest.mark.parametrize("mutate,field", [
    (lambda w: setattr(w, "version", 7), "version"),
    (lambda w: setattr(w, "agent_id", ""), "agent_id"),
    (lambda w: setattr(w.processes[0].apis[0], "sum_us", math.nan), "processes[0].apis[0].sum_us"),
    (lambda w: setattr(w.processes[0].apis[0], "min_us", -1.0), "processes[0].apis[0].min_us"),
    (lambda w: setattr(w.processes[0].apis[0], "count", 99), "processes[0].apis[0].count"),
    (lambda w: setattr(w.processes[0].apis[0].histogram, "scheme", 2),
     "processes[0].apis[0].histogram.scheme"),
    (lambda w: setattr(w.processes[0].apis[0].histogram, "first_bucket", 226),
     "processes[0].apis[0].histogram.counts"),
    (lambda w: setattr(w.processes[0], "job_id", ""), "processes[0].job_id"),
])
def test_invalid_window_names_field(mutate, field):
    w = _window()
    mutate(w)
    with pytest.raises(wire.WireError) as err:
        wire.validate_window(w)
    assert err.value.field == field


def test_oversized_window_rejected():
    with pytest.raises(wire.WireError, match="byte limit"):
        wire.validate_window(_window(), encoded_size=wire.MAX_WINDOW_BYTES + 1)


def test_histogram_pack_roundtrip_trims_zeros():
    dense = np.zeros(226, dtype=np.uint64)
    dense[40:43] = [1, 0, 5]
    h = wire.pack_histogram(dense)
    assert h.first_bucket == 40 and list(h.counts) == [1, 0, 5]
    assert np.array_equal(wire.unpack_histogram(h), dense)


def test_jsonl_roundtrip(tmp_path):
    path = tmp_path / "w.jsonl"
    with open(path, "w") as fh:
        assert wire.write_jsonl([_window(), _window()], fh) == 2
    back = list(wire.read_jsonl(path))
    assert back == [_window(), _window()]


def test_jsonl_bad_line_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(wire.window_to_json(_window()) + "\n{\"nope\": 1}\n")
    with pytest.raises(wire.WireError, match=r"bad.jsonl:2"):
        list(wire.read_jsonl(path))


def test_out_of_range_timestamp_names_field():
    w = _window()
    w.end.seconds = 10**13          # year ~318,000: ToNanoseconds() would overflow
    with pytest.raises(wire.WireError) as err:
        wire.validate_window(w)
    assert err.value.field == "end"
