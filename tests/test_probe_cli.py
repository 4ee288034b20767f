"""`hypertrace probe` end to end: real uprobes on the stand-in runtime, JSON fields, errors."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import require_ebpf

CLI = [sys.executable, "-m", "hypertrace.cli.main", "probe"]


def test_probe_json_reports_latency_and_probe_cost(fakecuda, run_worker):
    require_ebpf()
    w = run_worker("--api", "devsync", "--rate", "1000", "--duration", "30",
                   env={"FAKECUDA_DEVSYNC_NS": "100000"})
    out = subprocess.run(CLI + ["--lib", str(fakecuda.cudart), "--sym", "cudaDeviceSynchronize",
                                "--pid", str(w.pid), "--duration", "1", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    for key in ("count", "p50_us", "p90_us", "p99_us", "mean_us", "max_us", "probe_cost_ns",
                "buckets"):
        assert key in res, key
    assert 500 <= res["count"] <= 1200                     # ~1 s at 1,000 calls/s
    assert 100 <= res["p50_us"] <= 115 + res["probe_cost_ns"] / 1e3
    assert res["p50_us"] <= res["p90_us"] <= res["p99_us"] <= res["max_us"]
    assert res["probe_cost_ns"] > 0
    assert sum(b["count"] for b in res["buckets"]) == res["count"]
    assert res["processes"] == [{"pid": w.pid, "count": res["count"]}]


def test_probe_table_and_symbol_errors(fakecuda):
    require_ebpf()
    out = subprocess.run(CLI + ["--lib", str(fakecuda.nosyms_cudart), "--sym", "cudaLaunchKernel",
                                "--duration", "0.1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "does not export the symbol cudaLaunchKernel" in out.stderr


def test_probe_bad_input_is_rejected_before_loading_anything(tmp_path):
    out = subprocess.run(CLI + ["--lib", str(tmp_path / "nope.so"), "--sym", "f", "--duration", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such file" in out.stderr
    out = subprocess.run(CLI + ["--lib", sys.executable, "--sym", "f", "--duration", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--duration must be > 0" in out.stderr
