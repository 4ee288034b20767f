"""Assemble one :class:`pb.NodeWindow` from what a window measured.

Numbering is not done here: the analyzer deduplicates on ``(agent_id, seq)``, so ``seq`` must keep
increasing across agent restarts. The uplink's spool already persists its high-water seq next to
the spooled windows (daemon/uplink.py, ``Uplink.next_seq()``), and the agent takes seqs from it.

Why the overhead per process: the probe's cost lands on the process that makes the calls, so
each process reports the price *it* paid this window: ``probe cost x its probe firings / window
length`` (collector.governor.measured_overhead: counted firings, so it includes probes still
live while a detach was in progress). ``call_rate_hz`` counts probe firings per attached
second, nested driver calls included; ``duty`` is the attached share of the window.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Protocol

from google.protobuf.timestamp_pb2 import Timestamp

from hypertrace.collector.attribution import Attribution
from hypertrace.collector.governor import measured_overhead
from hypertrace.collector.nvml import NvmlSnapshot
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import WIRE_VERSION

log = logging.getLogger(__name__)


class SampleLike(Protocol):
    """What a window needs of one (pid, api) sample (collector.ebpf.ApiSample)."""
    api: str
    pid: int
    count: int

    def to_proto(self) -> pb.ApiStats: ...


@dataclass
class ProcessRecord:
    """What the agent knows about one process for a window."""
    pid: int
    attribution: Attribution
    gpu_kind: str = ""
    nvml: NvmlSnapshot | None = None


@dataclass(frozen=True)
class WindowOverhead:
    """Agent-wide probe accounting for one window."""
    attached_seconds: float     # how long the probes were attached during the window
    probe_cost_ns: float        # measured cost of one probed call (entry + return)
    budget: float               # configured budget (fraction of wall time)


def probe_hits(sample: SampleLike) -> int:
    """Probe firings behind a sample: its calls plus the nested driver calls inside them, which
    are counted once in the histogram but each paid a probe (ApiSample.probe_hits)."""
    return int(getattr(sample, "probe_hits", sample.count))


def _ts(ns: int) -> Timestamp:
    t = Timestamp()
    t.FromNanoseconds(int(ns))
    return t


def build_window(agent_id: str, node: str, seq: int, start_ns: int, end_ns: int,
                 samples: Mapping[tuple[int, str], SampleLike],
                 processes: Mapping[int, ProcessRecord],
                 overhead: WindowOverhead) -> pb.NodeWindow:
    """One NodeWindow: every process in ``processes`` (sorted by pid), with its samples.

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
    duty = attached / window_s
    for pid in sorted(processes):
        rec = processes[pid]
        a = rec.attribution
        pw = w.processes.add(job_id=a.job_id, rank=a.rank, local_rank=a.local_rank,
                             gpu_index=a.gpu_index, gpu_uuid=a.gpu_uuid, pid=pid,
                             gpu_kind=rec.gpu_kind)
        hits = 0
        for sample in sorted(by_pid.get(pid, ()), key=lambda s: s.api):
            pw.apis.append(sample.to_proto())
            hits += probe_hits(sample)
        rate = hits / attached if attached > 0 else 0.0
        pw.overhead.CopyFrom(pb.Overhead(
            estimated_fraction=measured_overhead(overhead.probe_cost_ns, hits, window_s),
            duty=duty,
            probe_cost_ns=overhead.probe_cost_ns, call_rate_hz=rate, budget=overhead.budget))
        if rec.nvml is not None:
            ctx = rec.nvml.to_proto()
            if ctx.ByteSize():
                pw.nvml.CopyFrom(ctx)
    return w
