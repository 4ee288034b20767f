"""What a probe backend hands the window loop (daemon/window_loop.py) at a window's end.

Both backends, the uprobes on the node's processes (collector/uprobe_backend.py) and the CUPTI
callbacks inside one training process (collector/cupti/probes.py), read their counters into
these records; the loop turns them into steps, the account and the wire's window.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from hypertrace.collector.attribution import Attribution
from hypertrace.collector.nvml import NvmlSnapshot
from hypertrace.collector.steps import BoundaryEvents
from hypertrace.proto import hypertrace_pb2 as pb

#: Probe tiers (Overhead.tiers): attached for the process's life, or only in coordinated slices.
TIER_ALWAYS = "always"
TIER_SLICED = "sliced"


class SampleLike(Protocol):
    """What a window needs of one (pid, api) sample (collector.ebpf.ApiSample)."""
    api: str
    pid: int
    count: int

    def to_proto(self) -> pb.ApiStats: ...


def probe_hits(sample: SampleLike) -> int:
    """Probe firings behind a sample: its calls plus the nested driver calls inside them, which
    are counted once in the histogram but each paid a probe (ApiSample.probe_hits)."""
    return int(getattr(sample, "probe_hits", sample.count))


@dataclass
class ProcessRecord:
    """Who one process is: its job, rank and GPU, and the GPU's NVML context."""
    pid: int
    attribution: Attribution
    gpu_kind: str = ""
    nvml: NvmlSnapshot | None = None


@dataclass
class ProcessReading:
    """One process as its backend read it at a window's end."""
    pid: int
    key: int                         # with pid: this process, not another that reuses the pid
    record: ProcessRecord | None     # None: not attributed (its samples are dropped)
    samples: dict[str, SampleLike] = field(default_factory=dict)    # api -> this window's
    tiers: dict[str, str] = field(default_factory=dict)             # api -> TIER_*
    boundaries: BoundaryEvents | None = None   # its step-boundary calls, for the step finder
    sched: Any = None                # collector.ebpf.SchedSample, or None
    loader: Any = None               # collector.loaders.LoaderSample, or None (no workers)
    fixed_cost_s: float = 0.0        # attach/detach (or enable/disable) and other fixed costs
    covered_s: float = 0.0           # seconds of the window it was tracked (0: all of it)
    live: bool = True                # False: it exited in this window (nothing to demote)


@dataclass
class SliceOn:
    """What switching the sliced tier on did: per process, the probes it took, or why not."""
    attached: dict[int, int] = field(default_factory=dict)  # pid -> probes attached (>= 0)
    failed: dict[int, str] = field(default_factory=dict)    # pid -> unsampled reason

    @property
    def empty(self) -> bool:
        """No process was there to take the slice."""
        return not self.attached and not self.failed
