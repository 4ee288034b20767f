"""Which agents the analyzer hears from: each node's newest window, for ``hypertrace nodes``
(Query.ListNodes) and the series ``hypertrace_agent_last_window_timestamp_seconds{node}``.

Why: an agent that stops sending looks, in the report, like a node with fewer windows; an SRE
needs to see that it is silent, and Prometheus needs one series per node to alert on. An agent
sends a window at every window boundary (an empty one when nothing trains), so a healthy node's
newest window ended at most one window ago, plus its delivery. A node is **down** when its
newest window ended more than ``down_after_windows`` windows ago (1.5 by default: an agent
stopped at time t is down from t + 1.5 windows, and a healthy one has half a window of slack for
its delivery).

The table is fed by the ingest path (a dict update per window) and, after a restart, seeded from
the windows stored in the last hour, so a node that went silent before the restart is still
listed (and still alerts). Nodes silent for longer than that are forgotten at a restart.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hypertrace.proto import hypertrace_pb2 as pb

#: A node is down when its newest window ended more than this many windows ago.
DOWN_AFTER_WINDOWS = 1.5
#: After a restart, the nodes of the windows that ended in this span are listed (s).
SEED_SPAN_S = 3600.0


def _ns(ts: Any) -> int:
    return ts.seconds * 1_000_000_000 + ts.nanos


@dataclass
class NodeState:
    """What the analyzer knows of one node's agent."""

    node: str
    agent_id: str
    last_end_ns: int
    last_seen_ns: int
    agent_version: str = ""
    agent_backend: str = ""
    probe_mode: str = ""
    windows: int = 0


class NodeTable:
    """Each node's newest window (thread-safe; :meth:`seen` is called per window)."""

    def __init__(self, window_s: float, down_after_windows: float = DOWN_AFTER_WINDOWS):
        self.window_s = float(window_s)
        self.down_after_windows = float(down_after_windows)
        self._nodes: dict[str, NodeState] = {}
        self._lock = threading.Lock()

    def seen(self, w: Any, new: bool = True, now_ns: int | None = None) -> None:
        """Note a window (a NodeWindow or its header) that was stored (``new``) or was a
        duplicate; the newest one per node wins."""
        end = _ns(w.end)
        now = time.time_ns() if now_ns is None else now_ns
        with self._lock:
            s = self._nodes.get(w.node)
            if s is None:
                s = self._nodes[w.node] = NodeState(w.node, w.agent_id, end, now)
            if end >= s.last_end_ns:
                s.agent_id, s.last_end_ns, s.last_seen_ns = w.agent_id, end, now
                if w.agent_version or w.agent_backend:          # "" from older agents
                    s.agent_version, s.agent_backend, s.probe_mode = (
                        w.agent_version, w.agent_backend, w.probe_mode)
            s.windows += int(new)

    def seed(self, rows: Iterable[tuple[str, str, int, int]]) -> None:
        """(node, agent_id, end ns, received ns) of stored windows (Storage.newest_by_node)."""
        with self._lock:
            for node, agent_id, end, received in rows:
                s = self._nodes.get(node)
                if s is None or end > s.last_end_ns:
                    self._nodes[node] = NodeState(node, agent_id, end, received)

    def down(self, s: NodeState, now_ns: int) -> bool:
        return now_ns - s.last_end_ns > self.down_after_windows * self.window_s * 1e9

    def states(self) -> list[NodeState]:
        with self._lock:
            return [NodeState(**vars(s)) for s in self._nodes.values()]

    def listing(self, now_ns: int | None = None) -> pb.ListNodesResponse:
        """Every node, the down ones first, then by name."""
        now = time.time_ns() if now_ns is None else now_ns
        out = pb.ListNodesResponse(window_seconds=self.window_s,
                                   down_after_windows=self.down_after_windows)
        for s in sorted(self.states(), key=lambda s: (not self.down(s, now), s.node)):
            n = out.nodes.add(node=s.node, agent_id=s.agent_id, agent_version=s.agent_version,
                              agent_backend=s.agent_backend, probe_mode=s.probe_mode,
                              windows=s.windows, down=self.down(s, now))
            n.last_window_end.FromNanoseconds(s.last_end_ns)
            n.last_seen.FromNanoseconds(s.last_seen_ns)
        return out

    def collector(self) -> Collector:
        return _LastWindow(self)


class _LastWindow(Collector):
    """``hypertrace_agent_last_window_timestamp_seconds{node}``: one series per node, so
    ``time() - hypertrace_agent_last_window_timestamp_seconds > 60`` names the silent ones."""

    def __init__(self, table: NodeTable):
        self._table = table

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("hypertrace_agent_last_window_timestamp_seconds",
                              "Unix time at which the newest window of the node's agent ended",
                              labels=["node"])
        for s in sorted(self._table.states(), key=lambda s: s.node):
            g.add_metric([s.node], s.last_end_ns / 1e9)
        yield g


__all__ = ["DOWN_AFTER_WINDOWS", "NodeState", "NodeTable", "SEED_SPAN_S"]
