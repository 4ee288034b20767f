"""Wire validation names the offending field; JSON lines round-trip."""
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


def _second_api(w: pb.NodeWindow, name: str = "cudaStreamSynchronize") -> pb.ApiStats:
    a = w.processes[0].apis.add()
    a.CopyFrom(wire.api_stats_from_ns(name, np.full(10, 5_000.0)))
    return a


@pytest.mark.parametrize("mutate,field", [
    (lambda w: setattr(w.processes[0].apis[0], "max_us", math.inf), "processes[0].apis[0].max_us"),
    (lambda w: setattr(w.processes[0].apis[0], "min_us", 99.0), "processes[0].apis[0].min_us"),
    (lambda w: setattr(_second_api(w), "sum_us", -2.0), "processes[0].apis[1].sum_us"),
    (lambda w: _second_api(w, "cudaLaunchKernel"), "processes[0].apis[1].api"),
    (lambda w: _second_api(w, "bad name!"), "processes[0].apis[1].api"),
    (lambda w: setattr(w.processes[0].overhead, "duty", math.nan), "processes[0].overhead.duty"),
    (lambda w: setattr(w.processes[0].overhead, "step_fraction", -0.1),
     "processes[0].overhead.step_fraction"),
])
def test_the_quick_pass_over_well_formed_entries_still_names_each_broken_field(mutate, field):
    """Well-formed entries take a quick pass that builds no field paths; anything it does not
    accept goes through the detailed checks, which name the field as before."""
    w = _window()
    w.processes[0].overhead.CopyFrom(pb.Overhead(sampled=True, attached_s=2.0))
    assert wire._apis_plainly_valid(w.processes[0].apis)
    wire.validate_window(w)
    mutate(w)
    assert not wire._apis_plainly_valid(w.processes[0].apis) or "overhead" in field
    with pytest.raises(wire.WireError) as err:
        wire.validate_window(w)
    assert err.value.field == field


def test_an_unprobed_api_name_takes_the_detailed_checks_and_passes():
    w = _window()
    _second_api(w, "myLib.customLaunch")
    assert not wire._apis_plainly_valid(w.processes[0].apis)
    wire.validate_window(w)


def _with_signals() -> pb.NodeWindow:
    w = _window()
    p = w.processes[0]
    p.sched.CopyFrom(pb.SchedStats(runq_ns=10, window_s=10.0,
                                   runq_latency=wire.pack_histogram(np.ones(226))))
    p.steps.CopyFrom(pb.StepStats(source="marker", steps=3, gpu_wait_us=1.0, peer_wait_us=2.0,
                                  step_sum_us=3.0, busy_time=wire.pack_histogram(np.ones(226))))
    p.overhead.CopyFrom(pb.Overhead(sampled=True, attached_s=2.0, fixed_cost_s=0.1))
    p.overhead.tiers.add(api="cudaLaunchKernel", tier="sliced", rate_hz=100.0)
    return w


def test_valid_window_with_signals_passes():
    wire.validate_window(_with_signals())


@pytest.mark.parametrize("mutate,field", [
    (lambda p: setattr(p.sched, "window_s", math.nan), "processes[0].sched.window_s"),
    (lambda p: setattr(p.sched, "window_s", -1.0), "processes[0].sched.window_s"),
    (lambda p: setattr(p.sched.runq_latency, "scheme", 3),
     "processes[0].sched.runq_latency.scheme"),
    (lambda p: setattr(p.steps, "gpu_wait_us", math.inf), "processes[0].steps.gpu_wait_us"),
    (lambda p: setattr(p.steps, "peer_wait_us", -5.0), "processes[0].steps.peer_wait_us"),
    (lambda p: setattr(p.steps, "step_sum_us", math.nan), "processes[0].steps.step_sum_us"),
    (lambda p: setattr(p.steps.busy_time, "first_bucket", 225),
     "processes[0].steps.busy_time.counts"),
    (lambda p: setattr(p.steps, "refused", "x" * 5000), "processes[0].steps.refused"),
    (lambda p: setattr(p.steps, "source", "x" * 5000), "processes[0].steps.source"),
    (lambda p: setattr(p.overhead, "attached_s", -0.5), "processes[0].overhead.attached_s"),
    (lambda p: setattr(p.overhead, "fixed_cost_s", math.nan),
     "processes[0].overhead.fixed_cost_s"),
    (lambda p: setattr(p.overhead, "unsampled_reason", "y" * 2000),
     "processes[0].overhead.unsampled_reason"),
    (lambda p: setattr(p.overhead.tiers[0], "tier", "sometimes"),
     "processes[0].overhead.tiers[0].tier"),
    (lambda p: setattr(p.overhead.tiers[0], "rate_hz", math.nan),
     "processes[0].overhead.tiers[0].rate_hz"),
    (lambda p: setattr(p.overhead.tiers[0], "api", ""), "processes[0].overhead.tiers[0].api"),
    (lambda p: setattr(p.overhead, "step_fraction", -0.1), "processes[0].overhead.step_fraction"),
    (lambda p: setattr(p.overhead, "step_basis", "z" * 2000), "processes[0].overhead.step_basis"),
    (lambda p: setattr(p, "group", "g" * 300), "processes[0].group"),
])
def test_invalid_signal_fields_name_the_field(mutate, field):
    w = _with_signals()
    mutate(w.processes[0])
    with pytest.raises(wire.WireError) as err:
        wire.validate_window(w)
    assert err.value.field == field
    assert field in str(err.value)


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


def test_absurd_counts_are_refused():
    from hypertrace.proto import wire
    w = _window()
    w.processes[0].apis[0].histogram.counts[0] = wire.MAX_HISTOGRAM_COUNT + 1
    w.processes[0].apis[0].count = sum(w.processes[0].apis[0].histogram.counts)
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.validate_window(w)
    w = _with_signals()
    w.processes[0].steps.steps = wire.MAX_STEPS_PER_WINDOW + 1
    with pytest.raises(wire.WireError, match="steps"):
        wire.validate_window(w)
