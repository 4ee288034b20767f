"""The analyzer's plain-HTTP health endpoints on its metrics port (what the Kubernetes probes
ask): /healthz while the gRPC loop answers, /readyz only while it serves with a usable
database; any other path is the Prometheus metrics."""
from __future__ import annotations

import urllib.error
import urllib.request

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_and_readyz_say_what_kubelet_needs(tmp_path):
    storage = Storage.open(tmp_path / "a.db", synchronous="NORMAL")
    server = AnalyzerServer(Analyzer(storage, ScoringConfig()),
                            ServerOptions(listen="127.0.0.1:0", insecure=True,
                                          metrics_listen="127.0.0.1:0", shutdown_grace_s=0.2))
    server.start()
    try:
        port = server.metrics_port
        assert _get(port, "/healthz") == (200, "ok\n")
        assert _get(port, "/readyz") == (200, "ok\n")
        assert "hypertrace_windows_received_total" in _get(port, "/metrics")[1]
        server.analyzer.broken = "database disk image is malformed"
        status, text = _get(port, "/readyz")
        assert status == 503 and "malformed" in text
        assert _get(port, "/healthz")[0] == 200       # alive: restarting would not fix it
    finally:
        server.stop()
        storage.close()
