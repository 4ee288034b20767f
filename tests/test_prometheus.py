"""A real Prometheus scrapes a real analyzer during a simulated 512-GPU job with one straggler.

All real: the analyzer (`hypertrace analyzer --metrics-listen`), the windows (`hypertrace
simulate --analyzer`, over gRPC), Prometheus (Debian's `prometheus`, started here on loopback)
and its HTTP API, and node_exporter's textfile collector serving an agent metrics file written
by the agent's own writer (daemon/metrics_file.py). The one mock is dcgm-exporter, which cannot
run without NVIDIA GPUs: a small HTTP server (``hypertrace.sim.prom_stack``, which starts the
rest of this stack too, for this test and for ``make dashboard-png``) serves its exposition lines
(its metric and label names) for the straggler's node and a healthy one, so the dashboard's DCGM
join panels have something to join.

Checked: the straggler's ratio series carries the documented labels, and every query of
``deploy/grafana/hypertrace.json`` (and its job variable) returns data.
"""
from __future__ import annotations

import subprocess
import time

from conftest import missing_prerequisite
from test_agent_e2e import (
    hypertrace,
    procs,  # noqa: F401  (the fixture: started processes, stopped after)
)

from hypertrace.analyzer.report.metrics import GPU_LABELS
from hypertrace.sim import prom_stack
from hypertrace.sim.prom_stack import query as _query

STRAGGLER = "node-0011"


def _dashboard_queries() -> list[str]:
    exprs = prom_stack.dashboard_queries(prom_stack.dashboard())
    assert len(exprs) >= 10
    return exprs


def test_prometheus_scrapes_the_straggler_and_every_dashboard_query_has_data(tmp_path, procs):
    prometheus, node_exporter = prom_stack.binaries()
    if prometheus is None or node_exporter is None:
        missing_prerequisite("prometheus or prometheus-node-exporter is not installed (Debian "
                             "packages; tests/install-test-deps.sh installs them as root)")
    analyzer = prom_stack.start_analyzer(tmp_path, procs, "--grace-seconds", "1",
                                         "--flush-interval", "0.5")
    port, log = analyzer.port, analyzer.log

    dcgm = prom_stack.start_dcgm((STRAGGLER, "node-0001"))
    try:
        sim = subprocess.run(
            hypertrace("simulate", "--gpus", "512", "--windows", "6", "--seed", "3",
                       "--straggler", f"{STRAGGLER}:1.3", "--job", "prom-job",
                       "--analyzer", f"127.0.0.1:{port}", "--insecure"),
            capture_output=True, text=True, timeout=300)
        assert sim.returncode == 0, sim.stderr

        from hypertrace.daemon.metrics_file import AgentMetrics, write
        textfiles = tmp_path / "textfile"
        textfiles.mkdir()
        write(textfiles / "hypertrace.prom",
              AgentMetrics(node=STRAGGLER, windows_sent=6, windows_acked=6, processes=8,
                           overhead_fraction=0.0031, budget_fraction=0.005, duty=0.01,
                           tiers={"cudaLaunchKernel": "sliced"}))
        ne_port = prom_stack.start_node_exporter(node_exporter, textfiles, tmp_path, procs)
        prom, prom_port = prom_stack.start_prometheus(
            prometheus, tmp_path, {"hypertrace": analyzer.metrics_port,
                                   "dcgm": dcgm.server_port, "node": ne_port}, procs)

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
        # the dashboard's job variable
        assert "prom-job" in prom_stack.label_values(prom_port, "job_id", "hypertrace_job_gpus")
    finally:
        dcgm.shutdown()
        dcgm.server_close()
