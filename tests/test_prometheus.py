"""A real Prometheus scrapes a real analyzer during a simulated 512-GPU job with one straggler.

All real: the analyzer (`hypertrace analyzer --metrics-listen`), the windows (`hypertrace
simulate --analyzer`, over gRPC), Prometheus (Debian's `prometheus`, started here on loopback)
and its HTTP API, and node_exporter's textfile collector serving an agent metrics file written
by the agent's own writer (daemon/metrics_file.py). The one mock is dcgm-exporter, which cannot run without NVIDIA GPUs: a small
HTTP server here serves its exposition lines (its metric and label names) for the straggler's
node and a healthy one, so the dashboard's DCGM join panels have something to join.

Checked: the straggler's ratio series carries the documented labels, and every query of
``deploy/grafana/hypertrace.json`` (and its job variable) returns data.
"""
from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from conftest import missing_prerequisite
from test_agent_e2e import _wait_for_port, hypertrace
from test_agent_e2e import procs  # noqa: F401  (the fixture: started processes, stopped after)

from hypertrace.analyzer.metrics import GPU_LABELS

REPO = Path(__file__).resolve().parent.parent
STRAGGLER = "node-0011"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dcgm_lines() -> bytes:
    """dcgm-exporter's exposition for two nodes (its names: DCGM_FI_DEV_*, Hostname, gpu...)."""
    out = ["# TYPE DCGM_FI_DEV_SM_CLOCK gauge", "# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
    for node in (STRAGGLER, "node-0001"):
        for gpu in range(8):
            labels = (f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",device="nvidia{gpu}",'
                      f'modelName="NVIDIA H200",Hostname="{node}"')
            out.append(f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1980")
            out.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 0")
    return ("\n".join(out) + "\n").encode()


class _Dcgm(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = _dcgm_lines()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _query(prom: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _dashboard_queries() -> list[str]:
    dash = json.loads((REPO / "deploy" / "grafana" / "hypertrace.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    return [e.replace("$job", ".*") for e in exprs]


def test_prometheus_scrapes_the_straggler_and_every_dashboard_query_has_data(tmp_path, procs):
    prometheus = shutil.which("prometheus")
    node_exporter = shutil.which("prometheus-node-exporter")
    if prometheus is None or node_exporter is None:
        missing_prerequisite("prometheus or prometheus-node-exporter is not installed (Debian "
                             "packages; tests/install-test-deps.sh installs them as root)")
    log = tmp_path / "analyzer.log"
    analyzer = subprocess.Popen(
        hypertrace("analyzer", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                   "--db", str(tmp_path / "a.db"), "--insecure", "--grace-seconds", "1",
                   "--flush-interval", "0.5"),
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(analyzer)
    port = _wait_for_port(log, analyzer)
    metrics_port = int(re.search(r"metrics on http://[^\s]*:(\d+)/metrics", log.read_text())
                       .group(1))

    dcgm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dcgm)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    try:
        sim = subprocess.run(
            hypertrace("simulate", "--gpus", "512", "--windows", "6", "--seed", "3",
                       "--straggler", f"{STRAGGLER}:1.3", "--job", "prom-job",
                       "--analyzer", f"127.0.0.1:{port}"),
            capture_output=True, text=True, timeout=300)
        assert sim.returncode == 0, sim.stderr

        from hypertrace.daemon.metrics_file import AgentMetrics, write
        textfiles = tmp_path / "textfile"
        textfiles.mkdir()
        write(textfiles / "hypertrace.prom",
              AgentMetrics(node=STRAGGLER, windows_sent=6, windows_acked=6, processes=8,
                           overhead_fraction=0.0031, budget_fraction=0.005, duty=0.01,
                           tiers={"cudaLaunchKernel": "sliced"}))
        ne_port = _free_port()
        exporter = subprocess.Popen(
            [node_exporter, "--collector.disable-defaults", "--collector.textfile",
             f"--collector.textfile.directory={textfiles}",
             f"--web.listen-address=127.0.0.1:{ne_port}"],
            stdout=open(tmp_path / "node_exporter.log", "w"), stderr=subprocess.STDOUT)
        procs.append(exporter)
        prom_port = _free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            f"  - job_name: hypertrace\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{metrics_port}']\n"
            f"  - job_name: dcgm\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{dcgm.server_port}']\n"
            f"  - job_name: node\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{ne_port}']\n")
        prom = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(tmp_path / "prometheus.log", "w"), stderr=subprocess.STDOUT)
        procs.append(prom)

        ratio = f'hypertrace_gpu_ratio{{Hostname="{STRAGGLER}",job_id="prom-job"}}'
        deadline = time.monotonic() + 90
        series: list[dict] = []
        while time.monotonic() < deadline and not series:
            time.sleep(1)
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                series = _query(prom_port, ratio)
            except OSError:              # not listening yet
                continue
        assert series, ((tmp_path / "prometheus.log").read_text()[-2000:], log.read_text()[-2000:])
        for s in series:
            labels = s["metric"]
            assert set(GPU_LABELS) <= set(labels), labels
            assert labels["job"] == "hypertrace"                 # Prometheus' own scrape label
            assert labels["modelName"] and labels["UUID"] and labels["rank"].isdigit()
            assert float(s["value"][1]) >= 1.2
        assert {s["metric"]["gpu"] for s in series} == {str(g) for g in range(8)}
        verdict = _query(prom_port, f'hypertrace_gpu_verdict{{Hostname="{STRAGGLER}"}} == 2')
        assert len(verdict) == 8
        states = {s["metric"]["state"] for s in _query(prom_port, "hypertrace_eviction_proposals")}
        assert {"dry_run", "pending", "done"} <= states      # every state, 0 or not

        time.sleep(3)                    # rate() over the dashboard's windows needs 2 scrapes
        empty = [e for e in _dashboard_queries() if not _query(prom_port, e)]
        assert empty == [], empty
        url = (f"http://127.0.0.1:{prom_port}/api/v1/label/job_id/values?"
               + urllib.parse.urlencode({"match[]": "hypertrace_job_gpus"}))
        with urllib.request.urlopen(url, timeout=10) as r:
            assert "prom-job" in json.load(r)["data"]        # the dashboard's job variable
    finally:
        dcgm.shutdown()
