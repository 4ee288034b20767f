"""`make bench-flood` runs, small: with the quotas the flood is refused, the jobs held stay
within the quota and the honest job's slow node is still convicted (its exit status)."""
from __future__ import annotations

from hypertrace.sim import bench_flood


def test_the_flood_benchmark_passes_small(capsys):
    assert bench_flood.main(["--flood", "4", "--jobs-per-window", "16"]) == 0
    out = capsys.readouterr().out
    on = next(line for line in out.splitlines() if line.startswith("on "))
    assert on.split()[1] == "4" and on.split()[2] == "1"      # all 4 refused, 1 job held
