"""`python -m hypertrace.sim.bench_ingest` in miniature: every phase of `analyze` is measured in
a fresh subprocess, and the report it scored is named by a digest that equal runs share."""
from __future__ import annotations

from hypertrace.proto import records
from hypertrace.sim import bench_ingest
from hypertrace.sim.simulate import SimConfig, generate


def test_phases_are_measured_and_equal_runs_give_the_same_report(tmp_path, capsys):
    path = tmp_path / "w.pb"
    with records.open_for_write(str(path)) as fh:
        records.write_windows(generate(SimConfig(gpus=64, gpus_per_node=8, windows=3, seed=2)),
                              fh, binary=True)
    assert bench_ingest.main([str(path), "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("head round") == 2 and "24 windows" in out
    assert "| validate |" in out and "same report on every run: yes" in out
    r = bench_ingest.run_side(str(path), "")
    assert set(bench_ingest.PHASES) <= set(r) and all(r[p] >= 0 for p in bench_ingest.PHASES)
