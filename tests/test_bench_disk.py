"""``make bench-storage`` (sim/bench_disk.py): what it counts as the disk of a live analyzer and
when it says the file shrank."""
from hypertrace.sim.bench_disk import DiskRun, Sample, on_disk


def test_per_node_window_counts_every_file_at_steady_state_only():
    r = DiskRun("head", 2048, steady_from=10.0)
    r.samples = [Sample(5.0, 10_000, 5_000, 32_768, 10),        # before steady state
                 Sample(10.0, 100_000, 20_000, 4_000, 100),
                 Sample(11.0, 120_000, 0, 4_000, 100)]
    mean, worst = r.per_window()
    assert worst == 1240.0 and mean == (1240.0 + 1240.0) / 2
    assert r.part("wal") == 100.0


def test_the_file_shrank_only_when_its_size_fell_below_an_earlier_peak():
    grows = DiskRun("base", 2048)
    grows.samples = [Sample(t, 1000 * (t + 1), 0, 0, 1) for t in range(5)]
    assert grows.shrank() == (5000, 5000)
    falls = DiskRun("head", 2048)
    falls.samples = [Sample(0, 1000, 0, 0, 1), Sample(1, 4000, 0, 0, 1),
                     Sample(2, 2500, 0, 0, 1), Sample(3, 3000, 0, 0, 1)]
    assert falls.shrank() == (4000, 2500)


def test_on_disk_is_what_du_counts(tmp_path):
    f = tmp_path / "sparse"
    with open(f, "wb") as fh:
        fh.truncate(10 * 1024 * 1024)            # a hole: size without blocks
    assert on_disk(f) < 10 * 1024 * 1024
    assert on_disk(tmp_path / "absent") == 0
