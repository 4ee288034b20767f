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
