"""Assemble one :class:`pb.NodeWindow` from what a window measured.

Each process reports the overhead it paid itself: ``(probe cost x its firings + its fixed
attach/detach costs) / window`` (collector.governor.measured_overhead), because the probe's cost
lands on the process that makes the calls. Beside the API latencies a process window carries
what the always tier saw (:class:`ProcessProbe`): scheduler evidence, steps, loader workers and
whether the slice sampled it, or why not. Numbering is the uplink's (``Uplink.next_seq``): the
analyzer dedups on ``(agent_id, seq)``, so seq must keep increasing across restarts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from google.protobuf.timestamp_pb2 import Timestamp

from hypertrace.collector.governor import measured_overhead
from hypertrace.collector.readings import (
    TIER_ALWAYS,
    TIER_SLICED,
    ProcessRecord,
    SampleLike,
    probe_hits,
)
from hypertrace.collector.steps import StepInference
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import WIRE_VERSION, pack_histogram

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class WindowOverhead:
    """Agent-wide probe accounting for one window."""
    attached_seconds: float     # how long the sliced tier was attached during the window
    probe_cost_ns: float        # measured cost of one probed call (entry + return)
    budget: float               # configured budget (fraction of wall time)


@dataclass
class ProcessProbe:
    """What the probes did for, and saw of, one process in one window (the window loop fills
    it)."""
    sampled: bool = False            # its sliced tier was attached in this window's slice
    unsampled_reason: str = ""       # why not (daemon/window_loop.py lists the reasons)
    tiers: dict[str, str] = field(default_factory=dict)   # api -> TIER_ALWAYS | TIER_SLICED
    attached_s: float = 0.0          # seconds its sliced tier was attached
    fixed_cost_s: float = 0.0        # attach/detach probe time charged to it
    covered_s: float = 0.0           # seconds of the window it was tracked (0: all of it)
    sched: Any = None                # collector.ebpf.SchedSample, or None
    steps: StepInference | None = None
    loader: Any = None               # collector.loaders.LoaderSample, or None (no workers)
    step_fraction: float = 0.0       # share of step time the probes cost it (step_basis says how)
    step_basis: str = "cpu"          # "steps": measured in place; "cpu": not yet, see the charge


def _ts(ns: int) -> Timestamp:
    t = Timestamp()
    t.FromNanoseconds(int(ns))
    return t


def build_window(agent_id: str, node: str, seq: int, start_ns: int, end_ns: int,
                 samples: Mapping[tuple[int, str], SampleLike],
                 processes: Mapping[int, ProcessRecord],
                 overhead: WindowOverhead,
                 probes: Mapping[int, ProcessProbe] | None = None) -> pb.NodeWindow:
    """One NodeWindow: every process in ``processes`` (sorted by pid), with its samples and,
    when ``probes`` has an entry for it, its tiers, sampling, scheduler evidence and steps.

    Samples of pids without a record are dropped with a debug log (the agent attributes every
    sampled pid before calling this; a pid it could not attribute has nothing to be compared
    with).
    """
    w = pb.NodeWindow(version=WIRE_VERSION, agent_id=agent_id, node=node, seq=seq,
                      start=_ts(start_ns), end=_ts(end_ns))
    by_pid: dict[int, list[SampleLike]] = {}
    for (pid, _api), sample in samples.items():
        if sample.count > 0:
            by_pid.setdefault(pid, []).append(sample)
    for pid in sorted(set(by_pid) - set(processes)):
        log.debug("dropping samples of pid %d: no attribution", pid)
    window_s = max((end_ns - start_ns) / 1e9, 1e-9)
    attached = min(max(overhead.attached_seconds, 0.0), window_s)
    for pid in sorted(processes):
        rec = processes[pid]
        a = rec.attribution
        probe = (probes or {}).get(pid)
        pw = w.processes.add(job_id=a.job_id, rank=a.rank, local_rank=a.local_rank,
                             gpu_index=a.gpu_index, gpu_uuid=a.gpu_uuid, pid=pid,
                             gpu_kind=rec.gpu_kind, group=a.group)
        tiers = probe.tiers if probe is not None else {}
        own_attached = min(max(probe.attached_s, 0.0), window_s) if probe is not None else attached
        calls: dict[str, int] = {}
        sliced_hits = always_hits = 0
        for sample in sorted(by_pid.get(pid, ()), key=lambda s: s.api):
            pw.apis.append(sample.to_proto())
            calls[sample.api] = sample.count
            if tiers.get(sample.api) == TIER_ALWAYS:
                always_hits += probe_hits(sample)
            else:
                sliced_hits += probe_hits(sample)
        rate = (sliced_hits / own_attached if own_attached > 0 else 0.0) + always_hits / window_s
        fixed = probe.fixed_cost_s if probe is not None else 0.0
        ov = pb.Overhead(
            estimated_fraction=measured_overhead(overhead.probe_cost_ns,
                                                 sliced_hits + always_hits, window_s, fixed),
            duty=own_attached / window_s, probe_cost_ns=overhead.probe_cost_ns,
            call_rate_hz=rate, budget=overhead.budget, attached_s=own_attached,
            fixed_cost_s=fixed)
        if probe is not None:
            ov.step_fraction = (probe.step_fraction if probe.step_basis == "steps"
                                else ov.estimated_fraction)
            ov.step_basis = probe.step_basis
            ov.sampled = probe.sampled
            ov.unsampled_reason = "" if probe.sampled else probe.unsampled_reason
            for api in sorted(tiers):
                span = window_s if tiers[api] == TIER_ALWAYS else own_attached
                ov.tiers.add(api=api, tier=tiers[api],
                             rate_hz=calls.get(api, 0) / span if span > 0 else 0.0)
        pw.overhead.CopyFrom(ov)
        if probe is not None and probe.sched is not None:
            pw.sched.CopyFrom(sched_proto(probe.sched, probe.covered_s or window_s))
        if probe is not None and probe.loader is not None:
            pw.loader.CopyFrom(pb.LoaderStats(workers=int(probe.loader.workers),
                                              cpu_s=float(probe.loader.cpu_s),
                                              runq_s=float(probe.loader.runq_s)))
        if probe is not None and probe.steps is not None:
            step_time, steps = probe.steps.to_proto()
            pw.steps.CopyFrom(steps)
            if probe.steps.steps:
                pw.step_time.CopyFrom(step_time)
        if rec.nvml is not None:
            ctx = rec.nvml.to_proto()
            if ctx.ByteSize():
                pw.nvml.CopyFrom(ctx)
    return w


def sched_proto(sched: Any, window_s: float) -> pb.SchedStats:
    """SchedStats from a collector.ebpf.SchedSample covering ``window_s`` seconds."""
    return pb.SchedStats(runq_ns=int(sched.runq_ns), offcpu_ns=int(sched.offcpu_ns),
                         involuntary_switches=int(sched.involuntary),
                         voluntary_switches=int(sched.voluntary),
                         runq_latency=pack_histogram(sched.runq_hist), window_s=float(window_s))


__all__ = ["TIER_ALWAYS", "TIER_SLICED", "ProcessProbe", "ProcessRecord", "WindowOverhead",
           "build_window", "probe_hits", "sched_proto"]
