"""Window assembly: real ApiSample records in, a valid wire window out."""
from __future__ import annotations

import numpy as np

from hypertrace.collector.attribution import Attribution
from hypertrace.collector.ebpf import ApiSample
from hypertrace.collector.nvml import NvmlSnapshot
from hypertrace.daemon.windows import ProcessRecord, WindowOverhead, build_window
from hypertrace.proto import buckets
from hypertrace.proto.wire import validate_window


def _sample(pid: int, api: str, lat_ns: list[int], nested: int = 0) -> ApiSample:
    v = np.array(lat_ns)
    return ApiSample(api=api, pid=pid, counts=buckets.histogram_of_ns(v), count=len(v),
                     sum_ns=int(v.sum()), min_ns=int(v.min()), max_ns=int(v.max()), nested=nested)


def test_window_fields_overhead_and_validity():
    samples = {(10, "cudaLaunchKernel"): _sample(10, "cudaLaunchKernel", [8000] * 100, nested=100),
               (10, "cudaStreamSynchronize"): _sample(10, "cudaStreamSynchronize", [50000] * 10),
               (99, "cuLaunchKernel"): _sample(99, "cuLaunchKernel", [9000] * 5)}  # no record
    recs = {10: ProcessRecord(10, Attribution("job", 3, 1, 1, "", "HYPERTRACE_JOB", "local_rank"),
                              gpu_kind="NVIDIA H200", nvml=NvmlSnapshot(sm_clock_mhz=1400)),
            11: ProcessRecord(11, Attribution("job", 4, 2, 2))}
    w = build_window("agent-a", "node-1", 7, 10_000_000_000, 12_000_000_000, samples, recs,
                     WindowOverhead(attached_seconds=0.5, probe_cost_ns=8000.0, budget=0.005))
    validate_window(w)
    assert (w.agent_id, w.node, w.seq, w.version) == ("agent-a", "node-1", 7, 1)
    assert [p.pid for p in w.processes] == [10, 11]             # pid 99 had no attribution
    p = w.processes[0]
    assert (p.job_id, p.rank, p.local_rank, p.gpu_index, p.gpu_kind) == ("job", 3, 1, 1,
                                                                         "NVIDIA H200")
    assert [a.api for a in p.apis] == ["cudaLaunchKernel", "cudaStreamSynchronize"]
    assert p.apis[0].count == 100 and abs(p.apis[0].min_us - 8.0) < 1e-9
    # 210 probe hits (100 calls + 100 nested + 10) in 0.5 s attached of a 2 s window.
    assert abs(p.overhead.call_rate_hz - 420.0) < 1e-9 and p.overhead.duty == 0.25
    assert abs(p.overhead.estimated_fraction - 8000e-9 * 420 * 0.25) < 1e-12
    assert p.nvml.sm_clock_mhz == 1400 and not w.processes[1].HasField("nvml")
    assert len(w.processes[1].apis) == 0 and w.processes[1].overhead.call_rate_hz == 0


def test_window_carries_tiers_sampling_sched_and_steps():
    """The always-on tier's evidence (scheduler, steps) and the slice's sampling decision reach
    the wire: sampled and unsampled processes, tiers with their rates, fixed costs."""
    from hypertrace.collector.ebpf import SchedSample
    from hypertrace.collector.steps import BoundaryEvents, StepFinder
    from hypertrace.daemon.windows import TIER_ALWAYS, TIER_SLICED, ProcessProbe
    from hypertrace.proto.wire import unpack_histogram

    # 21 synchronize returns 50 ms apart: 20 steps of 15 ms synchronize time and 5 ms idle each.
    k = np.arange(21, dtype=np.uint64)
    boundaries = BoundaryEvents.of(10**9 + k * 50_000_000, ["cudaStreamSynchronize"] * 21,
                                   sync_ns=k * 15_000_000, offcpu_ns=k * 5_000_000)
    sched = SchedSample(runq_ns=250_000_000, offcpu_ns=100_000_000, involuntary=40, voluntary=900,
                        runq_hist=buckets.histogram_of_ns(np.full(40, 6.25e6)))
    inference = StepFinder().feed(boundaries)
    samples = {(10, "cudaLaunchKernel"): _sample(10, "cudaLaunchKernel", [8000] * 400),
               (10, "cudaStreamSynchronize"): _sample(10, "cudaStreamSynchronize", [50000] * 20),
               (11, "cudaStreamSynchronize"): _sample(11, "cudaStreamSynchronize", [50000] * 20)}
    tiers = {"cudaLaunchKernel": TIER_SLICED, "cuLaunchKernel": TIER_SLICED,
             "cudaStreamSynchronize": TIER_ALWAYS}
    recs = {10: ProcessRecord(10, Attribution("job", 0, 0, 0, "", "HYPERTRACE_JOB")),
            11: ProcessRecord(11, Attribution("job", 1, 1, 1, "", "HYPERTRACE_JOB"))}
    probes = {10: ProcessProbe(sampled=True, tiers=tiers, attached_s=0.5, fixed_cost_s=0.001,
                               sched=sched, steps=inference),
              11: ProcessProbe(sampled=False, unsampled_reason="new_process", tiers=tiers,
                               covered_s=1.0)}
    w = build_window("a", "n", 1, 10_000_000_000, 12_000_000_000, samples, recs,
                     WindowOverhead(attached_seconds=0.5, probe_cost_ns=1000.0, budget=0.005),
                     probes)
    validate_window(w)
    p, q = w.processes
    assert p.overhead.sampled and p.overhead.unsampled_reason == ""
    assert not q.overhead.sampled and q.overhead.unsampled_reason == "new_process"
    assert [(t.api, t.tier) for t in p.overhead.tiers] == [
        ("cuLaunchKernel", "sliced"), ("cudaLaunchKernel", "sliced"),
        ("cudaStreamSynchronize", "always")]
    rates = {t.api: t.rate_hz for t in p.overhead.tiers}
    assert rates["cudaLaunchKernel"] == 800.0 and rates["cudaStreamSynchronize"] == 10.0
    assert p.overhead.attached_s == 0.5 and p.overhead.duty == 0.25
    assert p.overhead.fixed_cost_s == 0.001
    # 420 firings at 1 us + 1 ms fixed over 2 s
    assert abs(p.overhead.estimated_fraction - (420e-6 + 0.001) / 2) < 1e-12
    assert abs(p.overhead.call_rate_hz - (800 + 10)) < 1e-9
    assert q.overhead.attached_s == 0 and q.overhead.call_rate_hz == 10.0
    assert p.sched.runq_ns == 250_000_000 and p.sched.involuntary_switches == 40
    assert p.sched.voluntary_switches == 900 and p.sched.window_s == 2.0
    assert int(unpack_histogram(p.sched.runq_latency).sum()) == 40
    assert not q.HasField("sched") and not q.HasField("steps")
    assert p.steps.source == "inferred:cudaStreamSynchronize" and p.steps.steps == 20
    assert int(unpack_histogram(p.step_time).sum()) == 20
    assert abs(p.steps.gpu_wait_us - 300_000) < 1e-6 and abs(p.steps.peer_wait_us - 100_000) < 1e-6
