"""`make bench-flood` runs, small: with the quotas the flood is refused, the jobs held stay
within the quota and the honest job's slow node is still convicted (its exit status). The
first flood window fills the node's quota (its honest job and 7 of the 16 new ones, the other
entries dropped); the next three are refused whole."""
from __future__ import annotations

from hypertrace.sim import bench_flood


def test_the_flood_benchmark_passes_small(capsys):
    assert bench_flood.main(["--flood", "4", "--jobs-per-window", "16"]) == 0
    out = capsys.readouterr().out
    on = next(line for line in out.splitlines() if line.startswith("on "))
    assert on.split()[1] == "3" and on.split()[2] == "8"      # 3 refused, 8 jobs held
