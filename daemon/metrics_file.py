"""The agent's own metrics as a Prometheus text file, for node_exporter's textfile collector.

Why a file and not a port: node_exporter already runs on GPU nodes and already has a place for
such files (``--collector.textfile.directory``); a second scrape target per node would need its
own firewall rule, service discovery and TLS. The file is written once per window, to a temporary
name and then renamed, so node_exporter never reads half of it.

Series (all carry ``Hostname``, dcgm-exporter's label for the node, to join on):

=============================================  ==============================================
``hypertrace_agent_windows_sent_total``        windows handed to the uplink
``hypertrace_agent_windows_acked_total``       windows the analyzer acknowledged
``hypertrace_agent_windows_rejected_total``    windows the analyzer refused
``hypertrace_agent_spool_windows``             windows not yet acknowledged (spooled)
``hypertrace_agent_spool_bytes``               bytes they take
``hypertrace_agent_last_ack_timestamp_seconds``  Unix time of the last acknowledgement (0: none)
``hypertrace_agent_processes``                 training processes probed in the last window
``hypertrace_agent_probe_hits``                probe firings in the last window
``hypertrace_agent_overhead_fraction``         the most charged process's estimated probe
                                               cost over the last window's wall time
``hypertrace_agent_budget_fraction``           the configured overhead budget
``hypertrace_agent_duty``                      share of the last window the launch tier was
                                               attached
``hypertrace_agent_cadence``                   the launch tier is sampled every k-th window
``hypertrace_agent_api_tier``                  1 per (``api``, ``tier``): always or sliced
``hypertrace_agent_backend``                   1, with ``backend`` "ebpf" or "cupti" (no uprobes)
``hypertrace_agent_inprocess_connected``       training processes whose CUPTI backend is
                                               connected to the agent's socket
``hypertrace_agent_inprocess_late_frames_total``  their windows that came too late to merge
``hypertrace_agent_inprocess_dropped_frames_total``  their windows dropped (superseded, or of a
                                               process the uprobes measure)
=============================================  ==============================================
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(m: AgentMetrics) -> str:
    """The Prometheus text exposition of ``m``."""
    host = f'Hostname="{_label(m.node)}"'
    out: list[str] = []

    def series(name: str, kind: str, help_: str, value: float, extra: str = "") -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name}{{{host}{extra}}} {float(value)!r}")

    series("hypertrace_agent_windows_sent_total", "counter", "Windows handed to the uplink",
           m.windows_sent)
    series("hypertrace_agent_windows_acked_total", "counter",
           "Windows the analyzer acknowledged", m.windows_acked)
    series("hypertrace_agent_windows_rejected_total", "counter",
           "Windows the analyzer refused", m.windows_rejected)
    series("hypertrace_agent_spool_windows", "gauge", "Windows not yet acknowledged",
           m.spool_windows)
    series("hypertrace_agent_spool_bytes", "gauge", "Bytes of the spooled windows",
           m.spool_bytes)
    series("hypertrace_agent_last_ack_timestamp_seconds", "gauge",
           "Unix time of the last acknowledgement (0: none yet)", m.last_ack_s)
    series("hypertrace_agent_processes", "gauge", "Training processes probed", m.processes)
    series("hypertrace_agent_probe_hits", "gauge", "Probe firings in the last window",
           m.probe_hits)
    series("hypertrace_agent_overhead_fraction", "gauge",
           "Estimated probe cost of the most charged process over wall time",
           m.overhead_fraction)
    series("hypertrace_agent_budget_fraction", "gauge", "The configured overhead budget",
           m.budget_fraction)
    series("hypertrace_agent_duty", "gauge",
           "Share of the last window the launch tier was attached", m.duty)
    series("hypertrace_agent_cadence", "gauge",
           "The launch tier is sampled every k-th window", m.cadence)
    series("hypertrace_agent_backend", "gauge", "1 for the probes this agent runs",
           1.0, f',backend="{_label(m.backend)}"')
    series("hypertrace_agent_inprocess_connected", "gauge",
           "Training processes with the in-process CUPTI backend connected", m.inprocess_connected)
    series("hypertrace_agent_inprocess_late_frames_total", "counter",
           "In-process windows that arrived after the agent had sent its window",
           m.inprocess_late_frames)
    series("hypertrace_agent_inprocess_dropped_frames_total", "counter",
           "In-process windows dropped (superseded, or of a process the uprobes measure)",
           m.inprocess_dropped_frames)
    if m.tiers:
        out.append("# HELP hypertrace_agent_api_tier 1 per probed API and its tier")
        out.append("# TYPE hypertrace_agent_api_tier gauge")
        for api, tier in sorted(m.tiers.items()):
            out.append(f'hypertrace_agent_api_tier{{{host},api="{_label(api)}",'
                       f'tier="{_label(tier)}"}} 1.0')
    return "\n".join(out) + "\n"


def write(path: str | Path, m: AgentMetrics) -> None:
    """Write the file atomically (a temporary file in the same directory, then a rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".hypertrace-", suffix=".prom.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(render(m))
        os.chmod(tmp, 0o644)                     # node_exporter runs as its own user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["AgentMetrics", "render", "write"]
