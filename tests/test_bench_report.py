"""`make bench-report`: it times the reports of a scored job and fails when the job's verdicts
or its prediction are wrong (a benchmark that cannot fail is no benchmark)."""
from __future__ import annotations

from hypertrace.sim import bench_report


def test_the_report_bench_passes_on_a_job_whose_slow_node_is_convicted(capsys):
    assert bench_report.main(["--sizes", "256", "--epochs", "4", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("256 "))
    assert line.endswith("1 nodes") and "WRONG" not in out


def test_the_report_bench_fails_when_no_node_is_convicted(monkeypatch, capsys):
    monkeypatch.setattr(bench_report, "SLOW_FACTOR", 1.0)     # nobody is slow
    assert bench_report.main(["--sizes", "256", "--epochs", "4", "--rounds", "1"]) == 1
    assert "bench: FAILED" in capsys.readouterr().out
