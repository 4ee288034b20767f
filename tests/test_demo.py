"""`make demo` end to end: analyzer subprocess, simulated agents over gRPC, report, cleanup."""
from __future__ import annotations

import re
import subprocess
import sys


def test_demo_names_exactly_the_slow_node_and_cleans_up(tmp_path):
    page = tmp_path / "demo-report.html"
    proc = subprocess.run([sys.executable, "-m", "hypertrace.sim.demo", "--nodes", "8",
                           "--slow-node", "node-0005", "--html", str(page)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: the report names node-0005" in proc.stdout
    assert "node-0005" in proc.stdout.split("hypertrace report")[1]
    # at a glance: the slow node is the first row, its launch evidence in words, 100 columns
    lines = proc.stdout.splitlines()
    first = lines[next(i for i, x in enumerate(lines) if x.startswith("NODE ")) + 1]
    assert first.split()[:2] == ["node-0005", "straggler"]
    assert re.search(r"(launch p50|own time per step) 1\.\d\dx job median", first), first
    assert max(len(x) for x in lines if x != str(page)) <= 100
    # it ends with the dry-run proposal for the slow node, with its predicted gain
    log = proc.stdout.split("hypertrace evict log")[1]
    assert "dry_run" in log and "node node-0005" in log and "predicted gain +" in log
    # it wrote the HTML report and says where
    assert f"HTML report (open it in a browser; it works offline):\n{page}\n" in proc.stdout
    assert 'class="row-label straggler"' in page.read_text()
    assert page.read_text().count("node-0005") >= 2
    # the analyzer it started is gone
    assert "analyzer on" in proc.stdout
    pid = int(proc.stdout.split("(pid ")[1].split(")")[0])
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0


def test_simulate_streams_to_analyzer_like_agents(tmp_path):
    from hypertrace.cli.main import main
    from hypertrace.sim.demo import start_analyzer, stop_process
    proc, target = start_analyzer(str(tmp_path / "a.db"))
    try:
        assert main(["simulate", "--gpus", "32", "--windows", "4", "--seed", "9",
                     "--straggler", "node-0001:1.3", "--analyzer", target, "--insecure"]) == 0
        assert main(["report", "--analyzer", target, "--insecure"]) == 3
    finally:
        stop_process(proc)
    assert proc.returncode == 0           # SIGTERM is a clean shutdown
