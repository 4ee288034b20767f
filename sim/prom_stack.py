"""A real Prometheus stack on loopback around a real hypertrace analyzer, for the dashboard's
test (tests/test_prometheus.py: every query of the dashboard has data) and its preview
(:mod:`hypertrace.sim.dashboard_preview`: the panels drawn from those queries).

Why one module: both need the same pieces, started the same way, so that what the test proves
(the queries have data) is what the preview draws.

* the analyzer, ``hypertrace analyzer --metrics-listen`` on free ports, read back from its log;
* Prometheus (Debian's ``prometheus``) scraping every second, from a written prometheus.yml;
* node_exporter (Debian's ``prometheus-node-exporter``) with only its textfile collector, which
  serves the agent's metrics file (``hypertrace.daemon.metrics_file``);
* a stand-in for dcgm-exporter, the one mock: dcgm-exporter cannot run without NVIDIA GPUs, so a
  small HTTP server serves its exposition lines (its metric and label names: ``DCGM_FI_DEV_*``,
  ``Hostname``, ``gpu``, ``UUID``...) for the nodes asked, so that the dashboard's DCGM join
  panels have something to join;
* Prometheus' HTTP API (``/api/v1/query`` and ``/api/v1/query_range``) and the dashboard's
  queries with its ``$job`` variable set to All (``.*``).

Processes are appended to a caller's list as soon as they start, so the caller stops them even
when a later step fails (the test's ``procs`` fixture, :func:`stop_all`).
"""
from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

#: The dashboard in the source tree (deploy/ is not part of the installed package).
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "hypertrace.json"

def free_port() -> int:
    """A port nobody listens on now (for the programs that cannot be asked for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binaries() -> tuple[str | None, str | None]:
    """(prometheus, node_exporter) paths, None where not installed."""
    return shutil.which("prometheus"), shutil.which("prometheus-node-exporter")


def hypertrace(*args: str) -> list[str]:
    """The command line of ``hypertrace ARGS`` with this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "hypertrace.cli.main", *args]


@dataclass
class Analyzer:
    proc: subprocess.Popen
    port: int                 # gRPC (plaintext)
    metrics_port: int         # /metrics
    log: Path


def start_analyzer(workdir: Path, procs: list[subprocess.Popen], *flags: str,
                   timeout: float = 30.0) -> Analyzer:
    """``hypertrace analyzer --insecure`` on free gRPC and metrics ports, database and log in
    ``workdir``; ``flags`` are more of its flags (scoring, flush interval). Raises RuntimeError
    with its log when it exits or does not say where it listens within ``timeout``."""
    log = workdir / "analyzer.log"
    proc = subprocess.Popen(
        hypertrace("analyzer", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                   "--db", str(workdir / "a.db"), "--insecure", *flags),
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text()
        grpc = re.search(r"listening on [^\s]*:(\d+)", text)
        metrics = re.search(r"metrics on http://[^\s]*:(\d+)/metrics", text)
        if grpc and metrics:
            return Analyzer(proc, int(grpc.group(1)), int(metrics.group(1)), log)
        if proc.poll() is not None:
            raise RuntimeError(f"analyzer exited: {text[-2000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"analyzer did not start: {log.read_text()[-2000:]}")


def dcgm_exposition(nodes: Iterable[str], gpus_per_node: int = 8) -> bytes:
    """dcgm-exporter's exposition for ``nodes`` (its names: DCGM_FI_DEV_*, Hostname, gpu...)."""
    out = ["# TYPE DCGM_FI_DEV_SM_CLOCK gauge", "# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
    for node in nodes:
        for gpu in range(gpus_per_node):
            labels = (f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",device="nvidia{gpu}",'
                      f'modelName="NVIDIA H200",Hostname="{node}"')
            out.append(f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1980")
            out.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 0")
    return ("\n".join(out) + "\n").encode()


def start_dcgm(nodes: Iterable[str]) -> http.server.ThreadingHTTPServer:
    """The dcgm-exporter stand-in on a free loopback port (``server_port``), served from a
    daemon thread until ``shutdown()``."""
    body = dcgm_exposition(tuple(nodes))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_node_exporter(exe: str, textfiles: Path, workdir: Path,
                        procs: list[subprocess.Popen]) -> int:
    """node_exporter with only its textfile collector, reading ``textfiles``; returns its port."""
    port = free_port()
    procs.append(subprocess.Popen(
        [exe, "--collector.disable-defaults", "--collector.textfile",
         f"--collector.textfile.directory={textfiles}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=open(workdir / "node_exporter.log", "w"), stderr=subprocess.STDOUT))
    return port


def prometheus_config(targets: Mapping[str, int]) -> str:
    """prometheus.yml scraping every second one loopback port per scrape job name."""
    jobs = "".join(f"  - job_name: {name}\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{port}']\n" for name, port in targets.items())
    return ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n" + jobs)


def start_prometheus(exe: str, workdir: Path, targets: Mapping[str, int],
                     procs: list[subprocess.Popen]) -> tuple[subprocess.Popen, int]:
    """Prometheus scraping ``targets`` (scrape job name -> port), its data and log
    (prometheus.log) in ``workdir``; returns (process, port). It takes a few seconds to
    answer: see :func:`wait_ready`."""
    port = free_port()
    (workdir / "prometheus.yml").write_text(prometheus_config(targets))
    proc = subprocess.Popen(
        [exe, f"--config.file={workdir / 'prometheus.yml'}",
         f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=open(workdir / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    procs.append(proc)
    return proc, port


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float = 60.0) -> None:
    """Block until Prometheus answers ``/-/ready``; RuntimeError with its log otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"prometheus not ready after {timeout:g} s: {log.read_text()[-2000:]}")


def _api(port: int, path: str, params: Mapping[str, object]) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        raise RuntimeError(f"{path} failed: {doc}")
    return doc["data"]["result"]


def query(port: int, expr: str) -> list[dict]:
    """An instant query: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
    return _api(port, "query", {"query": expr})


def query_range(port: int, expr: str, start: float, end: float, step: float) -> list[dict]:
    """A range query: ``[{"metric": {...}, "values": [[t, "v"], ...]}, ...]``."""
    return _api(port, "query_range", {"query": expr, "start": start, "end": end, "step": step})


def label_values(port: int, label: str, match: str) -> list[str]:
    """Values of ``label`` on the series ``match`` selects (what a Grafana variable lists)."""
    url = (f"http://127.0.0.1:{port}/api/v1/label/{label}/values?"
           + urllib.parse.urlencode({"match[]": match}))
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)["data"]


def dashboard(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def with_all_jobs(expr: str) -> str:
    """A dashboard query with its ``$job`` variable set to All (its ``allValue``, ``.*``)."""
    return expr.replace("$job", ".*")


def dashboard_queries(dash: dict) -> list[str]:
    """Every target's query of every panel, ``$job`` set to All."""
    return [with_all_jobs(t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def stop_all(procs: list[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGTERM each started process, last started first; SIGKILL what does not stop."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


__all__ = ["Analyzer", "DASHBOARD", "binaries", "dashboard", "dashboard_queries",
           "dcgm_exposition", "free_port", "hypertrace", "label_values", "prometheus_config",
           "query", "query_range", "start_analyzer", "start_dcgm", "start_node_exporter",
           "start_prometheus", "stop_all", "wait_ready", "with_all_jobs"]
