"""Which agents are down: the analyzer's table of nodes over real localhost gRPC with a real
SQLite file. Windows carry the agent's version, backend and probe mode; `hypertrace nodes`
lists every node with its newest window and says which are down (no window for 1.5 windows),
Prometheus gets hypertrace_agent_last_window_timestamp_seconds{node}, and a restarted analyzer
still lists the nodes of the last hour's stored windows."""
from __future__ import annotations

import json
import time
import urllib.request

import grpc

from hypertrace.analyzer.ingest.nodes import NodeTable
from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.cli.main import main
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc

WINDOW_S = 10.0


def _window(node: str, seq: int, end_ns: int, **agent: str) -> pb.NodeWindow:
    w = pb.NodeWindow(version=1, agent_id=node, node=node, seq=seq, **agent)
    w.start.FromNanoseconds(end_ns - int(WINDOW_S * 1e9))
    w.end.FromNanoseconds(end_ns)
    return w


def _serve(db) -> AnalyzerServer:
    storage = Storage.open(db, synchronous="NORMAL")
    analyzer = Analyzer(storage, ScoringConfig(window_seconds=WINDOW_S))
    analyzer.resume()
    server = AnalyzerServer(analyzer, ServerOptions(listen="127.0.0.1:0", flush_interval=0.0,
                                                    shutdown_grace_s=0.5, insecure=True,
                                                    metrics_listen="127.0.0.1:0"))
    server.start()
    return server


def _stop(server: AnalyzerServer) -> None:
    server.stop()
    server.analyzer.storage.close()


def _send(port: int, windows: list[pb.NodeWindow]) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        assert len(list(pb_grpc.IngestStub(ch).Stream(iter(windows), timeout=30))) == len(windows)


def test_nodes_lists_the_silent_node_as_down_and_exits_3(tmp_path, capsys):
    now = time.time_ns()
    server = _serve(tmp_path / "a.db")
    try:
        agent = {"agent_version": "0.1.0", "agent_backend": "ebpf", "probe_mode": "uprobe_multi"}
        _send(server.port, [_window("gpu-a", 1, now - int(40e9), **agent),
                            _window("gpu-a", 2, now - int(30e9), **agent),      # then silent
                            _window("gpu-b", 1, now - int(2e9), **agent)])
        target = f"127.0.0.1:{server.port}"
        assert main(["nodes", "--analyzer", target, "--insecure"]) == 3
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[0].split() == ["NODE", "STATE", "LAST", "WINDOW", "VERSION", "BACKEND",
                                    "PROBES", "WINDOWS"]
        assert lines[1].split()[:2] == ["gpu-a", "down"] and "uprobe_multi" in lines[1]
        assert lines[2].split()[:2] == ["gpu-b", "up"]
        assert "2 nodes, 1 down" in out
        assert main(["nodes", "--analyzer", target, "--insecure", "--format", "json"]) == 3
        doc = json.loads(capsys.readouterr().out)
        assert [(n["node"], n["down"], n["windows"]) for n in doc["nodes"]] == \
            [("gpu-a", True, "2"), ("gpu-b", False, "1")]
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        line = next(x for x in metrics.splitlines() if x.startswith(
            'hypertrace_agent_last_window_timestamp_seconds{node="gpu-a"}'))
        assert abs(float(line.split()[-1]) - (now - 30e9) / 1e9) < 1e-3
    finally:
        _stop(server)
    restarted = _serve(tmp_path / "a.db")          # a restart still knows the silent node
    try:
        listing = restarted.analyzer.nodes.listing()
        assert [(n.node, n.down) for n in listing.nodes] == [("gpu-a", True), ("gpu-b", False)]
    finally:
        _stop(restarted)


def test_a_node_is_down_after_one_and_a_half_windows():
    table = NodeTable(window_s=10.0)
    w = _window("n", 1, 100 * 10**9, agent_version="v", agent_backend="cupti")
    table.seen(w, now_ns=100 * 10**9)
    assert not table.listing(now_ns=114 * 10**9).nodes[0].down
    assert table.listing(now_ns=116 * 10**9).nodes[0].down
    table.seen(_window("n", 0, 50 * 10**9), new=False, now_ns=117 * 10**9)   # an old replay
    n = table.listing(now_ns=117 * 10**9).nodes[0]
    assert n.down and n.agent_backend == "cupti" and n.windows == 1


def test_a_real_agents_windows_say_its_version_and_backend(tmp_path):
    """An agent without uprobes (backend cupti: no eBPF needed here) streams empty windows at
    every boundary; the analyzer's table shows its version and backend."""
    import subprocess
    import sys
    from importlib import metadata
    server = _serve(tmp_path / "a.db")
    agent = subprocess.Popen(
        [sys.executable, "-m", "hypertrace.cli.main", "agent", "--insecure", "--analyzer",
         f"127.0.0.1:{server.port}", "--backend", "cupti", "--no-nvml", "--window", "1",
         "--cupti-socket", str(tmp_path / "c.sock"), "--probe-cost-ns", "1000",
         "--spool-dir", str(tmp_path / "spool"), "--node", "gpu-c"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            nodes = server.analyzer.nodes.listing().nodes
            if nodes and nodes[0].windows >= 2:
                break
            time.sleep(0.2)
        assert [(n.node, n.agent_backend, n.probe_mode, n.agent_version) for n in nodes] == \
            [("gpu-c", "cupti", "", metadata.version("hypertrace"))]
    finally:
        agent.terminate()
        err = agent.communicate(timeout=30)[1]
        _stop(server)
    assert agent.returncode == 0, err[-2000:]
