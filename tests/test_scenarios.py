"""The scenario catalog: every scenario builds, is seeded, and its truth and model hold."""
import numpy as np
import pytest

from hypertrace.cli.main import main
from hypertrace.proto import buckets
from hypertrace.proto.wire import read_jsonl, validate_window
from hypertrace.sim import scenarios
from hypertrace.sim.simulate import burst_matrices, generate, simulate_counts, slowdown_matrix

REQUIRED = {"clean", "host-3", "host-5", "host-10", "host-20", "host-30", "single-gpu",
            "collective", "heavy-tail", "gc-spikes", "cold-read", "onset", "flapping", "sparse",
            "dropout", "two-stragglers", "mixed-kinds", "cpu-hog", "gpu-slow"}


def test_catalog_covers_the_issue_and_every_entry_is_documented():
    assert REQUIRED <= set(scenarios.CATALOG)
    for s in scenarios.CATALOG.values():
        assert s.summary and s.group in ("clean", "below-gate", "straggler")
        cfg = s.config(gpus=64, windows=6, seed=1)
        assert (s.group == "clean") == (scenarios.truth(cfg) == {})


@pytest.mark.parametrize("name", sorted(scenarios.CATALOG))
def test_every_scenario_yields_valid_windows(name):
    cfg = scenarios.get(name).config(gpus=32, windows=4, seed=3)
    ws = list(generate(cfg))
    assert ws
    for w in ws:
        validate_window(w)


def test_seed_picks_the_slow_node_and_same_seed_same_job():
    s = scenarios.get("host-10")
    nodes = {tuple(scenarios.truth(s.config(gpus=512, seed=k))) for k in range(6)}
    assert len(nodes) > 1
    assert s.config(gpus=512, seed=4) == s.config(gpus=512, seed=4)


def test_unknown_scenario_names_the_known_ones():
    with pytest.raises(ValueError, match="known: clean"):
        scenarios.get("nope")


def _p50(counts):
    return np.array([buckets.quantiles_us(c, [0.5])[0] for c in counts])


def test_collective_straggler_waits_least_but_launches_normally():
    cfg = scenarios.get("collective").config(gpus=64, windows=2, seed=2)
    node = next(iter(scenarios.truth(cfg)))
    g = cfg.nodes.index(node) * 8
    c = simulate_counts(cfg)
    launch, sync = _p50(c["cudaLaunchKernel"][1]), _p50(c["cudaStreamSynchronize"][1])
    others = np.delete(np.arange(64), np.arange(g, g + 8))
    assert sync[g:g + 8].max() < 0.6 * np.median(sync[others])
    assert abs(np.median(launch[g:g + 8]) / np.median(launch[others]) - 1) < 0.03


def test_launch_only_straggler_does_not_move_sync_waits():
    cfg = scenarios.get("launch-10").config(gpus=64, windows=2, seed=2)
    assert np.all(slowdown_matrix(cfg, "compute") == 1.0)
    assert slowdown_matrix(cfg, "host").max() == pytest.approx(1.10)


def test_gc_spikes_are_out_of_phase_and_cold_reads_hit_one_node():
    cfg = scenarios.get("gc-spikes").config(gpus=64, windows=8, seed=0, wide=False)
    frac, _ = burst_matrices(cfg)
    per_window = (frac[:, ::8] > 0).sum(axis=1)            # nodes in GC per window
    assert per_window.max() <= 2 and (frac > 0).any(axis=0).all()
    cold = scenarios.get("cold-read").config(gpus=64, windows=30, seed=0, wide=False)
    frac, scale = burst_matrices(cold)
    hit_nodes = {i // 8 for i in np.flatnonzero((frac > 0).any(axis=0))}
    assert len(hit_nodes) == 1
    cold_gpu = 8 * hit_nodes.pop()
    assert 0 < (frac[:, cold_gpu] > 0).sum() < 30          # some windows, not all
    # spikes, not a shift: the body (p50) of the cold node barely moves, its p99 does
    c = simulate_counts(cold)["cudaLaunchKernel"]
    w = int(np.flatnonzero(frac[:, cold_gpu] > 0)[0])
    healthy = (cold_gpu + 8) % 64
    p = [buckets.quantiles_us(c[w, g], [0.5, 0.99]) for g in (cold_gpu, healthy)]
    assert p[0][0] / p[1][0] < 1.03 and p[0][1] / p[1][1] > 1.5


def test_dropout_agents_send_nothing_then_come_back_with_next_seq():
    cfg = scenarios.get("dropout").config(gpus=64, windows=9, seed=5)
    d = cfg.dropouts[0]
    seqs = [w.seq for w in generate(cfg) if w.node == d.node]
    assert len(seqs) == 9 - (d.stop - d.start) and seqs == list(range(1, len(seqs) + 1))


def test_mixed_kinds_label_nodes_and_slow_the_second_kind():
    cfg = scenarios.get("mixed-kinds").config(gpus=64, windows=1, seed=1)
    kinds = {p.gpu_kind for w in generate(cfg) for p in w.processes}
    assert kinds == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    node = next(iter(scenarios.truth(cfg)))
    assert cfg.nodes.index(node) % 2 == 1                  # the straggler is an H100 node


def test_flapping_truth_and_activity():
    cfg = scenarios.get("flapping").config(gpus=64, windows=8, seed=0)
    assert list(cfg.stragglers[0].active(8)) == [True, True, False, False] * 2
    onset = scenarios.get("onset").config(gpus=64, windows=12, seed=0)
    assert list(scenarios.truth(onset).values()) == [4]


def test_cli_scenario_and_list(tmp_path, capsys):
    assert main(["simulate", "--list-scenarios"]) == 0
    assert "collective" in capsys.readouterr().out
    out = tmp_path / "w.jsonl"
    assert main(["simulate", "--scenario", "sparse", "--gpus", "16", "--windows", "2",
                 "--output", str(out)]) == 0
    ws = list(read_jsonl(out))
    assert len(ws) == 4 and ws[0].processes[0].job_id == "sim-sparse"
    assert main(["simulate", "--scenario", "nope", "--output", str(out)]) == 2
    assert "unknown scenario" in capsys.readouterr().err
    assert main(["simulate", "--gpus", "16"]) == 2
    assert "--output" in capsys.readouterr().err


def _one_slow_rank(name: str, seed: int = 4):
    """(config, rank index, per-rank ProcessWindows of window 1) of a one-rank scenario."""
    cfg = scenarios.get(name).config(gpus=64, windows=2, seed=seed)
    (s,) = cfg.stragglers
    rank = cfg.nodes.index(s.node) * cfg.gpus_per_node + s.gpus[0]
    ws = list(generate(cfg))[cfg.n_nodes:]
    return cfg, rank, {p.rank: p for w in ws for p in w.processes}


def _hist_p50(h) -> float:
    from hypertrace.proto.wire import unpack_histogram
    return float(buckets.quantiles_us(unpack_histogram(h), [0.5])[0])


def _others(rank: int) -> list[int]:
    return [r for r in range(64) if r != rank]


def test_cpu_hog_waits_for_a_cpu_and_works_longer_but_launches_as_fast():
    cfg, rank, ps = _one_slow_rank("cpu-hog")
    share = {r: p.sched.runq_ns / (p.sched.window_s * 1e9) for r, p in ps.items()}
    assert 0.30 <= share[rank] <= 0.50
    assert max(share[r] for r in _others(rank)) < 0.2
    busy = {r: _hist_p50(p.steps.busy_time) for r, p in ps.items()}
    assert 1.3 < busy[rank] / np.median([busy[r] for r in _others(rank)]) < 1.5
    launch = {r: _hist_p50(next(a for a in p.apis if a.api == "cudaLaunchKernel").histogram)
              for r, p in ps.items()}
    assert abs(launch[rank] / np.median([launch[r] for r in _others(rank)]) - 1) < 0.04
    peer = {r: p.steps.peer_wait_us / p.steps.steps for r, p in ps.items()}
    assert peer[rank] < min(peer[r] for r in _others(rank))          # it arrives last
    hist = ps[rank].sched.runq_latency
    assert _hist_p50(hist) > 1_000                                        # ms-long waits for the CPU
    assert ps[rank].sched.involuntary_switches > ps[rank].sched.voluntary_switches


def test_gpu_slow_waits_on_its_gpu_with_equal_steps_and_least_peer_wait():
    cfg, rank, ps = _one_slow_rank("gpu-slow")
    per_step = {r: (p.steps.gpu_wait_us / p.steps.steps, p.steps.peer_wait_us / p.steps.steps)
                for r, p in ps.items()}
    gpu = np.median([per_step[r][0] for r in _others(rank)])
    step_us = cfg.step_ms * 1e3
    assert 0.25 < (per_step[rank][0] - gpu) / step_us < 0.35         # +30% of a step
    assert per_step[rank][1] < min(per_step[r][1] for r in _others(rank))
    steps = np.array([_hist_p50(ps[r].step_time) for r in range(64)])
    assert np.abs(steps / np.median(steps) - 1).max() < 0.02          # collective: equal
    busy = {r: _hist_p50(p.steps.busy_time) for r, p in ps.items()}
    assert abs(busy[rank] / np.median(list(busy.values())) - 1) < 0.05
    assert max(p.sched.runq_ns for p in ps.values()) < 0.2 * 10e9     # no CPU contention
