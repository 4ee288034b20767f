"""`python -m hypertrace.sim.bench_analyze` in miniature: `hypertrace analyze` runs in fresh
subprocesses with and without workers, and equal runs print the same table."""
from __future__ import annotations

from hypertrace.proto import records
from hypertrace.sim import bench_analyze
from hypertrace.sim.simulate import SimConfig, generate


def test_sides_are_measured_and_print_the_same_table(tmp_path, capsys):
    path = tmp_path / "w.pb"
    with records.open_for_write(str(path)) as fh:
        records.write_windows(generate(SimConfig(gpus=64, gpus_per_node=8, windows=3, seed=2)),
                              fh, binary=True)
    assert bench_analyze.main([str(path), "--rounds", "1", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "workers 0 round 1" in out and "workers 2 round 1" in out
    assert "same report on every run: yes" in out
    assert "| first chunk, s | after the last chunk, s |" in out
    r = bench_analyze.run_side(str(path), "", "0")
    assert r["rc"] in (0, 3) and r["wall"] > 0 and r["reader"] > 0
