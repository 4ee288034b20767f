"""``make bench-storage``'s figure at 16,384 GPUs: the rows that follow the scored epochs are
shared by 2,048 nodes' windows, everything else is kept per window as measured."""
from hypertrace.sim import bench_storage


def test_the_figure_at_16k_gpus_shares_the_per_epoch_rows_among_2048_nodes():
    sizes = {"blocks": 1000 * 100, "compacted": 70 * 100, "scores": 16384 * 2,
             "sqlite_autoindex_scores_1": 16384, "epochs": 16384, "snapshot": 4000}
    used = {**sizes, "scores": 9000, "sqlite_autoindex_scores_1": 3000, "epochs": 200}
    # 100 node-windows of 10 epochs (10 nodes): the per-epoch rows' used bytes, 12,200, are
    # 1,220 B an epoch, over 2,048 nodes
    got = bench_storage._at_target_gpus(sizes, used, windows=100, epochs=10, nodes=2048)
    assert got == (1000 * 100 + 70 * 100 + 4000) / 100 + 12200 / 10 / 2048
