"""What one agent identity may send: GPUs per window and per job, processes per window, jobs at
once, bytes per minute.

Why: a node's certificate proves which node a window comes from (analyzer/ingest/checks.py
``Access``), not that what it says is true. One stolen agent key could otherwise speak for
hundreds of fake GPUs of a job (enough to outvote the real nodes and convict healthy ones), or
open tens of thousands of job ids (each held in the Engine's memory until it expires, and
listed in every job listing). The node's own certificate bounds the node: at most
``max_gpus_per_node`` GPUs in a window (fewer where the window says NVML counts fewer on the
node: a node may lower its own bound, never raise it) and the same GPUs (at most
``max_gpus_per_node``) through a job, at
most ``max_jobs_per_node`` jobs at once, ``max_processes_per_window`` process entries, and
``max_bytes_per_minute`` of windows. Each refusal names the limit and the setting that raises
it; each is counted under its own reason (``hypertrace_windows_rejected_total``). A job past
the quota, or whose GPUs changed, costs only its own process entries where the window holds
other jobs (dropped, the Ack says why, as for a bad entry): a node's many unattributed
processes (each its own ``unattributed:NODE:PID`` job) must not cost its real job the window.

The identity is the window's node, which ``Access`` has checked against the certificate (on a
plaintext listener, the node the window claims). The state lives on the server's event loop
(one thread, no lock) and is bounded: per node, at most ``max_jobs_per_node`` jobs with at most
``max_gpus_per_node`` GPUs each. A job stops counting against its node once the node has sent
none of its windows for ``job_seconds`` (the Engine's job expiry: so the jobs one key makes the
analyzer hold are bounded by this quota, not only by their expiry). It is not stored: after a
restart every node starts with none counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import grpc

from hypertrace.analyzer.ingest.checks import Refused, WindowShape
from hypertrace.proto.wire import MAX_PROCESSES_PER_WINDOW, MAX_WINDOW_BYTES

#: Defaults of the settings (cli/analyzer.py declares them; docs/design.md says why).
MAX_GPUS_PER_NODE = 8
#: The most ``max_gpus_per_node`` may be set to: the largest GPU nodes sold hold 16.
MAX_GPUS_PER_NODE_ALLOWED = 16
MAX_JOBS_PER_NODE = 8
MAX_PROCESSES = 64
MAX_BYTES_PER_MINUTE = 64 * 1024 * 1024
#: How long a job counts against a node after the node's last window of it, when the Engine
#: keeps every job (``job_expiry_seconds`` 0).
JOB_SECONDS_WITHOUT_EXPIRY = 3600.0


@dataclass(frozen=True)
class QuotaSettings:
    """The per-agent limits (module docstring); 0 for ``max_bytes_per_minute`` turns that one
    off."""

    max_gpus_per_node: int = MAX_GPUS_PER_NODE
    max_jobs_per_node: int = MAX_JOBS_PER_NODE
    max_processes_per_window: int = MAX_PROCESSES
    max_bytes_per_minute: int = MAX_BYTES_PER_MINUTE
    job_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_gpus_per_node <= MAX_GPUS_PER_NODE_ALLOWED:
            raise ValueError(f"max_gpus_per_node must be 1 to {MAX_GPUS_PER_NODE_ALLOWED}, got "
                             f"{self.max_gpus_per_node}")
        if not self.max_jobs_per_node >= 1:
            raise ValueError(f"max_jobs_per_node must be >= 1, got {self.max_jobs_per_node}")
        if not 1 <= self.max_processes_per_window <= MAX_PROCESSES_PER_WINDOW:
            raise ValueError(f"max_processes_per_window must be 1 to {MAX_PROCESSES_PER_WINDOW} "
                             f"(the wire's limit), got {self.max_processes_per_window}")
        if self.max_bytes_per_minute and self.max_bytes_per_minute < MAX_WINDOW_BYTES:
            raise ValueError(f"max_bytes_per_minute must be 0 (off) or at least one window's "
                             f"limit, {MAX_WINDOW_BYTES} bytes, got {self.max_bytes_per_minute}")
        if not self.job_seconds >= 0:
            raise ValueError(f"job_seconds must be >= 0, got {self.job_seconds}")

    @classmethod
    def for_expiry(cls, job_expiry_seconds: float, **limits: int) -> "QuotaSettings":
        """The limits, with jobs counted as long as the Engine keeps them."""
        return cls(job_seconds=job_expiry_seconds or JOB_SECONDS_WITHOUT_EXPIRY, **limits)


@dataclass
class _NodeLedger:
    """One node's jobs (job id -> when its newest window was admitted, its GPUs) and bytes."""

    seen: dict[str, float] = field(default_factory=dict)
    gpus: dict[str, set[str]] = field(default_factory=dict)
    tokens: float = 0.0
    tokens_at: float = -math.inf


class AgentQuotas:
    """The per-node ledger and its checks (module docstring); used on the event loop only."""

    def __init__(self, settings: QuotaSettings = QuotaSettings()):
        self.settings = settings
        self._nodes: dict[str, _NodeLedger] = {}

    def jobs_of(self, node: str) -> list[str]:
        """The jobs counted against ``node`` now (oldest first)."""
        ledger = self._nodes.get(node)
        return [] if ledger is None else list(ledger.seen)

    def admit(self, node: str, shape: WindowShape, size: int, now_s: float
              ) -> dict[str, Refused]:
        """Count a window of ``size`` bytes from ``node``: {job: why} for the jobs of the window
        whose process entries must be dropped (a job past the node's quota of jobs, or whose GPUs
        changed), the rest of the window being kept as a bad entry's window is; or raise
        :class:`Refused` when nothing of the window may be stored (nothing is counted then)."""
        s = self.settings
        if shape.processes > s.max_processes_per_window:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "quota_processes",
                          f"node {node[:64]!r}: the window has {shape.processes} process "
                          f"entries, over the limit of {s.max_processes_per_window} per window "
                          "(analyzer setting max_processes_per_window)")
        has = s.max_gpus_per_node
        if 0 < shape.nvml_gpus < has:           # the node says it has fewer: that bounds it
            has = shape.nvml_gpus
        if shape.node_gpus > has:
            told = (f"NVML counts {has} on it" if has < s.max_gpus_per_node else
                    f"a node has at most {has}, analyzer setting max_gpus_per_node (at most "
                    f"{MAX_GPUS_PER_NODE_ALLOWED})")
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "quota_gpus",
                          f"node {node[:64]!r}: the window carries {shape.node_gpus} GPUs, more "
                          f"than the node has ({told})")
        ledger = self._nodes.setdefault(node, _NodeLedger())
        tokens = 0.0
        if s.max_bytes_per_minute:
            rate = s.max_bytes_per_minute / 60.0
            tokens = min(float(s.max_bytes_per_minute),
                         ledger.tokens + (now_s - ledger.tokens_at) * rate)
            if size > tokens:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota_bytes",
                              f"node {node[:64]!r} sent more than {s.max_bytes_per_minute:,} "
                              "bytes of windows in a minute (analyzer setting "
                              "max_bytes_per_minute); the agent keeps this window and retries")
        horizon = now_s - s.job_seconds
        for job in [j for j, t in ledger.seen.items() if t < horizon]:
            del ledger.seen[job]
            ledger.gpus.pop(job, None)
        refused: dict[str, Refused] = {}
        room = s.max_jobs_per_node - len(ledger.seen)
        for job in shape.jobs:
            if job in ledger.seen:
                continue
            if room > 0:
                room -= 1
                continue
            refused[job] = Refused(
                grpc.StatusCode.FAILED_PRECONDITION, "quota_jobs",
                f"node {node[:64]!r} already has {s.max_jobs_per_node} jobs, the limit per "
                f"node (analyzer setting max_jobs_per_node); job {job[:64]!r} is refused. A job "
                f"stops counting {s.job_seconds:g} s after the node's last window of it")
        grown: dict[str, set[str]] = {}
        for job, gpu in shape.gpus:
            if job in refused or gpu.startswith("pid:"):   # pid: no GPU identity (no index,
                continue                                   # no UUID), bounded per window only
            known = ledger.gpus.get(job, set())
            if gpu not in known:
                grown.setdefault(job, set(known)).add(gpu)
        for job, gpus in list(grown.items()):
            if len(gpus) > s.max_gpus_per_node:
                was = sorted(ledger.gpus.get(job, set()), key=_natural)
                now = sorted(gpus - set(was), key=_natural)
                refused[job] = Refused(
                    grpc.StatusCode.FAILED_PRECONDITION, "gpu_set",
                    f"node {node[:64]!r}: its GPUs in job {job[:64]!r} changed (it sent GPUs "
                    f"{', '.join(was)[:200]} before, now also {', '.join(now)[:200]}): "
                    f"{len(gpus)} in one job, more than a node has ({s.max_gpus_per_node}, "
                    "analyzer setting max_gpus_per_node). A node's GPUs do not change within "
                    "a job")
                del grown[job]
        if refused and len(refused) == len(shape.jobs):
            raise next(iter(refused.values()))
        if s.max_bytes_per_minute:
            ledger.tokens, ledger.tokens_at = tokens - size, now_s
        for job in shape.jobs:
            if job not in refused:
                ledger.seen.pop(job, None)
                ledger.seen[job] = now_s                 # newest last
        for job, gpus in grown.items():
            ledger.gpus[job] = gpus
        return refused


def _natural(gpu: str) -> tuple[int, str]:
    return len(gpu), gpu


__all__ = ["AgentQuotas", "QuotaSettings", "MAX_GPUS_PER_NODE", "MAX_GPUS_PER_NODE_ALLOWED",
           "MAX_JOBS_PER_NODE", "MAX_PROCESSES", "MAX_BYTES_PER_MINUTE"]
