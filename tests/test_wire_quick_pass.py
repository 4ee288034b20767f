"""The quick pass over well-formed process entries changes nothing the validator decides.

``wire._process_plainly_valid`` lets a well-formed process skip the detailed checks. These tests
run every validator entry point twice on the same mutated windows, once as shipped and once with
the quick pass turned off (every entry through :func:`wire.check_process`, the validator as it
was), and require the same outcome: the same error with the same field and text, or the same
accepted window and the same dropped entries.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import wire
from hypertrace.sim.simulate import SimConfig, generate

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def _seed() -> pb.NodeWindow:
    """A simulated 8-GPU window with every optional part a process may carry."""
    w = next(iter(generate(SimConfig(gpus=8, gpus_per_node=8, windows=1, seed=11))))
    p = w.processes[0]
    p.nvml.CopyFrom(pb.NvmlContext(sm_clock_mhz=1900, max_sm_clock_mhz=1980, temperature_c=60.0,
                                   power_w=500.0, power_limit_w=700.0))
    p.step_time.CopyFrom(wire.pack_histogram(np.arange(30, dtype=np.uint64)))
    p.sched.runq_latency.CopyFrom(wire.pack_histogram(np.ones(226)))
    p.steps.busy_time.CopyFrom(wire.pack_histogram(np.ones(226)))
    p.overhead.tiers.add(api="cudaLaunchKernel", tier="sliced", rate_hz=10.0)
    return w


SEED = _seed()
BAD_FLOATS = [math.nan, math.inf, -math.inf, -1.0, -0.0, 1e308]
BAD_INTS = [-2, -1, 0, 2 ** 31 - 1]
TEXTS = ["", "x" * 300, "x" * 2000, "myLib.customLaunch", "bad name!", "cudaLaunchKernel",
         "cudaStreamSynchronize", "sliced", "always", "cupti", "nope"]


def _api(p, j):
    return p.apis[j % len(p.apis)] if len(p.apis) else p.apis.add()


def _tier(p):
    return p.overhead.tiers[0] if len(p.overhead.tiers) else p.overhead.tiers.add()


#: (how to reach a field of process p, its name, values to put there)
EDITS = [
    (lambda p: p, "job_id", TEXTS), (lambda p: p, "group", TEXTS),
    (lambda p: p, "gpu_uuid", TEXTS), (lambda p: p, "gpu_kind", TEXTS),
    (lambda p: p, "backend", TEXTS), (lambda p: p, "rank", BAD_INTS),
    (lambda p: p, "local_rank", BAD_INTS), (lambda p: p, "gpu_index", BAD_INTS),
    (lambda p: _api(p, 0), "api", TEXTS), (lambda p: _api(p, 1), "api", TEXTS),
    (lambda p: _api(p, 0), "count", [0, 1, 10 ** 10]),
    (lambda p: _api(p, 1), "sum_us", BAD_FLOATS), (lambda p: _api(p, 0), "min_us", BAD_FLOATS),
    (lambda p: _api(p, 0), "max_us", BAD_FLOATS + [0.0]),
    (lambda p: _api(p, 0).histogram, "scheme", [0, 2]),
    (lambda p: _api(p, 1).histogram, "first_bucket", [0, 200, 225, 226, 2 ** 32 - 1]),
    (lambda p: p.step_time, "first_bucket", [0, 225]), (lambda p: p.step_time, "scheme", [3]),
    (lambda p: p.sched, "window_s", BAD_FLOATS),
    (lambda p: p.sched.runq_latency, "scheme", [0, 7]),
    (lambda p: p.sched.runq_latency, "first_bucket", [0, 1, 100]),
    (lambda p: p.steps, "gpu_wait_us", BAD_FLOATS), (lambda p: p.steps, "peer_wait_us", BAD_FLOATS),
    (lambda p: p.steps, "step_sum_us", BAD_FLOATS), (lambda p: p.steps, "source", TEXTS),
    (lambda p: p.steps, "refused", TEXTS),
    (lambda p: p.steps, "steps", [0, wire.MAX_STEPS_PER_WINDOW, wire.MAX_STEPS_PER_WINDOW + 1]),
    (lambda p: p.steps.busy_time, "first_bucket", [0, 1, 226]),
    (lambda p: p.overhead, "duty", BAD_FLOATS), (lambda p: p.overhead, "budget", BAD_FLOATS),
    (lambda p: p.overhead, "step_fraction", BAD_FLOATS),
    (lambda p: p.overhead, "unsampled_reason", TEXTS),
    (lambda p: p.overhead, "blocked_by", TEXTS), (lambda p: p.overhead, "step_basis", TEXTS),
    (_tier, "api", TEXTS), (_tier, "tier", TEXTS),
    (_tier, "rate_hz", BAD_FLOATS),
    (lambda p: p.nvml, "temperature_c", BAD_FLOATS), (lambda p: p.nvml, "power_w", BAD_FLOATS),
    (lambda p: p.nvml, "power_limit_w", BAD_FLOATS),
    (lambda p: p.sched, "runq_ns", [0, 10**9, 21 * 10**9, 2 ** 64 - 1]),
    (lambda p: p.sched, "offcpu_ns", [0, 10**9, 21 * 10**9, 2 ** 64 - 1]),
    (lambda p: p.sched, "window_s", [0.0, 10.0, 21.0, 1e9]),
    (lambda p: p.sched, "involuntary_switches", [0, 10**6, 2 ** 64 - 1]),
    (lambda p: p.overhead, "attached_s", [0.0, 10.0, 22.0]),
]
#: edits of a whole process: counts past the limits, extra names, too many entries
SHAPES = [
    lambda p: p.apis[0].histogram.counts.__setitem__(0, wire.MAX_HISTOGRAM_COUNT + 1),
    lambda p: p.step_time.counts.__setitem__(0, wire.MAX_STEPS_PER_WINDOW + 1),
    lambda p: p.sched.runq_latency.counts.__setitem__(0, wire.MAX_HISTOGRAM_COUNT + 1),
    lambda p: p.steps.busy_time.counts.__setitem__(0, 2 ** 64 - 1),
    lambda p: [p.apis.add().CopyFrom(wire.api_stats_from_ns(f"lib.f{k}", [1e3]))
               for k in range(3)],
    lambda p: [p.apis.add().CopyFrom(wire.api_stats_from_ns("cudaMemcpy", [1e3]))
               for _ in range(40)],
    lambda p: [p.overhead.tiers.add(api=f"lib.t{k}", tier="always") for k in range(5)],
    lambda p: [p.overhead.tiers.add(api="cudaMemcpy", tier="always") for _ in range(40)],
    lambda p: p.nvml.xid_errors.extend([79] * wire.MAX_XID_ERRORS),
    lambda p: p.nvml.xid_errors.extend([79] * (wire.MAX_XID_ERRORS + 1)),
    lambda p: p.ClearField("nvml"), lambda p: p.ClearField("overhead"),
    lambda p: p.ClearField("apis"),
]

edit = st.one_of(
    st.tuples(st.integers(0, 7), st.sampled_from(range(len(EDITS))), st.integers(0, 20)),
    st.tuples(st.integers(0, 7), st.sampled_from(range(len(SHAPES))).map(lambda k: -1 - k),
              st.just(0)))
windows = st.tuples(st.lists(edit, max_size=5), st.integers(1, 40))


def _build(edits: list[tuple[int, int, int]], copies: int) -> pb.NodeWindow:
    """The seed window with ``copies`` copies of its processes (the window-wide API budget),
    then the edits applied."""
    w = pb.NodeWindow()
    w.CopyFrom(SEED)
    procs = list(SEED.processes)
    for _ in range(copies - 1):
        w.processes.extend(procs)
    for i, what, pick in edits:
        p = w.processes[i % len(w.processes)]
        if what < 0:
            SHAPES[-1 - what](p)
            continue
        reach, name, values = EDITS[what]
        target = reach(p)
        value = values[pick % len(values)]
        try:
            setattr(target, name, value)
        except (TypeError, ValueError):   # out of the field's type: not a window one can send
            pass
    return w


def _outcome(check, w: pb.NodeWindow):
    w = pb.NodeWindow.FromString(w.SerializeToString())
    try:
        dropped = check(w)
    except wire.WireError as exc:
        return ("refused", exc.field, exc.problem)
    dropped = [(e.field, e.problem) for e in dropped or []]
    return ("accepted", dropped, w.SerializeToString())


@SETTINGS
@given(windows)
def test_the_quick_pass_decides_as_the_detailed_checks(case):
    w = _build(*case)
    quick = [_outcome(check, w) for check in (wire.validate_window, wire.accept_window)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wire, "_process_plainly_valid", lambda p, budget_left, limit_s=0.0: False)
        detailed = [_outcome(check, w) for check in (wire.validate_window, wire.accept_window)]
    assert quick == detailed


def test_a_simulated_window_takes_the_quick_pass():
    """What the simulator (and the agent) sends is well formed the common way."""
    assert all(wire._process_plainly_valid(p, wire.MAX_API_STATS_PER_WINDOW)
               for p in SEED.processes)
    wire.validate_window(SEED)


def test_the_budget_of_api_entries_is_spent_by_quick_entries_too():
    """Entries that pass quickly still count against the window's 1,024 API entries."""
    w = _build([], 1)
    p = w.processes[0]
    del p.apis[:]
    for name in sorted(wire.KNOWN_APIS):
        p.apis.add().CopyFrom(wire.api_stats_from_ns(name, [1e3]))
    fits = wire.MAX_API_STATS_PER_WINDOW // len(p.apis)
    del w.processes[1:]
    for _ in range(fits - 1):
        w.processes.add().CopyFrom(p)
    wire.validate_window(w)
    w.processes.add().CopyFrom(p)
    with pytest.raises(wire.WireError, match="API entries in all") as err:
        wire.validate_window(w)
    assert err.value.field == f"processes[{fits}].apis"
