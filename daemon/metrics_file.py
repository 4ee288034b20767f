"""The agent's own metrics as a Prometheus text file, for node_exporter's textfile collector.

node_exporter already runs on GPU nodes and reads such files, where a port would need its own
firewall rule, service discovery and TLS. The file is written once per window (to a temporary
name, then renamed), so node_exporter never reads half of it. Every series carries ``Hostname``,
dcgm-exporter's label for the node. ``_SERIES`` lists the one-value series with their help text;
``hypertrace_agent_api_tier`` (1 per API and tier) and ``hypertrace_agent_backend`` (1, with
``backend`` "ebpf" or "cupti") carry labels.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass
class AgentMetrics:
    """One window's figures, as :func:`write` puts them in the file."""

    node: str
    windows_sent: int = 0
    windows_acked: int = 0
    windows_rejected: int = 0
    spool_windows: int = 0
    spool_bytes: int = 0
    last_ack_s: float = 0.0
    processes: int = 0
    probe_hits: int = 0
    overhead_fraction: float = 0.0
    budget_fraction: float = 0.0
    duty: float = 0.0
    cadence: int = 1
    tiers: dict[str, str] = field(default_factory=dict)
    backend: str = "ebpf"                   # "ebpf" | "cupti" (no uprobes: in-process only)
    inprocess_connected: int = 0            # CUPTI backends connected to the agent's socket
    inprocess_late_frames: int = 0          # their windows that came after the agent's window
    inprocess_dropped_frames: int = 0       # refused, superseded, or counted by uprobes already
    resident_bytes: int = 0                 # the agent's own resident set (VmRSS)
    cpu_seconds: float = 0.0                # the agent's own CPU time, all threads


#: (name, kind, help, AgentMetrics field) of the one-value series, in the file's order.
_SERIES = (
    ("hypertrace_agent_windows_sent", "counter", "Windows handed to the uplink", "windows_sent"),
    ("hypertrace_agent_windows_acked", "counter", "Windows the analyzer acknowledged",
     "windows_acked"),
    ("hypertrace_agent_windows_rejected", "counter", "Windows the analyzer refused",
     "windows_rejected"),
    ("hypertrace_agent_spool_windows", "gauge", "Windows not yet acknowledged", "spool_windows"),
    ("hypertrace_agent_spool_bytes", "gauge", "Bytes of the spooled windows", "spool_bytes"),
    ("hypertrace_agent_last_ack_timestamp_seconds", "gauge",
     "Unix time of the last acknowledgement (0: none yet)", "last_ack_s"),
    ("hypertrace_agent_processes", "gauge", "Training processes probed", "processes"),
    ("hypertrace_agent_probe_hits", "gauge", "Probe firings in the last window", "probe_hits"),
    ("hypertrace_agent_overhead_fraction", "gauge",
     "Estimated probe cost of the most charged process over wall time", "overhead_fraction"),
    ("hypertrace_agent_budget_fraction", "gauge", "The configured overhead budget",
     "budget_fraction"),
    ("hypertrace_agent_duty", "gauge", "Share of the last window the launch tier was attached",
     "duty"),
    ("hypertrace_agent_cadence", "gauge", "The launch tier is sampled every k-th window",
     "cadence"),
    ("hypertrace_agent_inprocess_connected", "gauge",
     "Training processes with the in-process CUPTI backend connected", "inprocess_connected"),
    ("hypertrace_agent_inprocess_late_frames", "counter",
     "In-process windows that arrived after the agent had sent its window",
     "inprocess_late_frames"),
    ("hypertrace_agent_inprocess_dropped_frames", "counter",
     "In-process windows dropped (superseded, or of a process the uprobes measure)",
     "inprocess_dropped_frames"),
    ("hypertrace_agent_resident_bytes", "gauge", "The agent's own resident memory (VmRSS)",
     "resident_bytes"),
    ("hypertrace_agent_cpu_seconds", "counter", "The agent's own CPU time, all its threads",
     "cpu_seconds"),
)


class _Collector(Collector):
    """One window's :class:`AgentMetrics` as Prometheus metric families."""

    def __init__(self, m: AgentMetrics):
        self._m = m

    def collect(self) -> Iterator[Metric]:
        m = self._m
        for name, kind, help_, attr in _SERIES:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, help_, labels=["Hostname"])
            family.add_metric([m.node], float(getattr(m, attr)))
            yield family
        backend = GaugeMetricFamily("hypertrace_agent_backend", "1 for the probes this agent runs",
                                    labels=["Hostname", "backend"])
        backend.add_metric([m.node, m.backend], 1.0)
        yield backend
        if m.tiers:
            tiers = GaugeMetricFamily("hypertrace_agent_api_tier", "1 per probed API and its tier",
                                      labels=["Hostname", "api", "tier"])
            for api, tier in sorted(m.tiers.items()):
                tiers.add_metric([m.node, api, tier], 1.0)
            yield tiers


def registry(m: AgentMetrics) -> CollectorRegistry:
    """A registry holding ``m``'s series (what :func:`write` puts in the file)."""
    r = CollectorRegistry(auto_describe=False)
    r.register(_Collector(m))
    return r


def render(m: AgentMetrics) -> str:
    """The Prometheus text exposition of ``m``."""
    return generate_latest(registry(m)).decode("utf-8")


def write(path: str | Path, m: AgentMetrics) -> None:
    """Write the file atomically with ``prometheus_client.write_to_textfile`` (a temporary
    file, then a rename). Readable by all (0644) whatever the agent's umask: node_exporter runs
    as its own user. The temporary name does not end in ``.prom``, so node_exporter never reads
    it."""
    path = Path(path)
    staged = path.with_name(f".{path.name}.staged")
    try:
        write_to_textfile(str(staged), registry(m))
        os.chmod(staged, 0o644)
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


__all__ = ["AgentMetrics", "registry", "render", "write"]
