"""The simulator: valid, deterministic, realistic windows with the injected effects visible."""
from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.proto import buckets
from hypertrace.proto.wire import read_jsonl, validate_window, write_jsonl
from hypertrace.sim.simulate import (
    SimConfig,
    Straggler,
    generate,
    live_start_ns,
    parse_straggler,
    simulate_counts,
)

CFG = SimConfig(gpus=64, gpus_per_node=8, windows=3, seed=7,
                stragglers=(Straggler("node-0003", 1.10),))


def test_windows_are_valid_and_shaped_like_real_agents():
    ws = list(generate(CFG))
    assert len(ws) == CFG.n_nodes * CFG.windows
    for w in ws:
        validate_window(w)
    first = ws[: CFG.n_nodes]
    assert [w.node for w in first] == [f"node-{i:04d}" for i in range(8)]
    assert len({(w.start.ToNanoseconds(), w.end.ToNanoseconds()) for w in first}) == 1
    assert [p.rank for p in first[3].processes] == list(range(24, 32))
    assert {w.seq for w in ws if w.agent_id == "sim-node-0000"} == {1, 2, 3}
    apis = {a.api for a in ws[0].processes[0].apis}
    assert apis == {"cudaLaunchKernel", "cuLaunchKernel", "cudaStreamSynchronize"}
    launch = ws[0].processes[0].apis[0]
    assert launch.count >= 1000 and launch.min_us <= launch.max_us


def test_same_seed_same_bytes_other_seed_other_data():
    def dump(cfg):
        buf = io.StringIO()
        write_jsonl(generate(cfg), buf)
        return buf.getvalue()
    assert dump(CFG) == dump(CFG)
    other = SimConfig(gpus=64, gpus_per_node=8, windows=3, seed=8,
                      stragglers=CFG.stragglers)
    assert dump(other) != dump(CFG)


def test_straggler_launches_slowly_and_waits_least():
    counts = simulate_counts(CFG)
    slow = np.arange(24, 32)
    rest = np.setdiff1d(np.arange(64), slow)
    p50 = {api: buckets.quantiles_us(c[-1], [0.5])[:, 0] for api, c in counts.items()}
    ratio = np.median(p50["cudaLaunchKernel"][slow]) / np.median(p50["cudaLaunchKernel"][rest])
    assert 1.07 < ratio < 1.13                      # 10% slower, within the healthy spread
    sync = p50["cudaStreamSynchronize"]
    assert sync[slow].max() < sync[rest].min()      # everybody waits for the straggler


def test_heavy_tail_is_present():
    counts = simulate_counts(SimConfig(gpus=8, gpus_per_node=8, windows=1, seed=1))
    c = counts["cudaLaunchKernel"][0]
    p50, p99 = buckets.quantiles_us(c, [0.5, 0.99]).mean(axis=0)
    tail = c[:, buckets.bucket_of_ns(np.array([100_000]))[0]:].sum()
    assert p99 / p50 > 1.5 and tail > 0             # Pareto spikes beyond 10x the median


def test_onset_and_single_gpu_stragglers():
    cfg = SimConfig(gpus=16, gpus_per_node=8, windows=4, seed=2,
                    stragglers=(Straggler("node-0001", 1.5, gpus=(3,), onset=2),))
    c = simulate_counts(cfg)["cudaLaunchKernel"]
    p50 = buckets.quantiles_us(c, [0.5])[..., 0]    # (windows, gpus)
    assert p50[2:, 11].min() > 1.3 * np.median(p50[2:])
    assert p50[:2, 11].max() < 1.1 * np.median(p50[:2])


@pytest.mark.parametrize("text,msg", [("node-0001", "NODE:FACTOR"), ("node-1:x", "not a number"),
                                      ("node-1:-2", "positive")])
def test_bad_straggler_spec_says_what_is_wrong(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_straggler(text)


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="not in the job"):
        SimConfig(gpus=16, gpus_per_node=8, stragglers=(Straggler("node-0042", 1.1),))
    with pytest.raises(ValueError, match="multiple"):
        SimConfig(gpus=10, gpus_per_node=8)


def test_live_start_puts_every_window_in_the_past():
    now = 1_800_000_000 * 10**9
    start = live_start_ns(CFG, now)
    end = start + CFG.windows * int(CFG.window_seconds * 1e9)
    assert end <= now - 30 * 10**9 and start % int(CFG.window_seconds * 1e9) == 0


def test_simulate_cli_writes_jsonl(tmp_path, capsys):
    from hypertrace.cli.main import main
    out = tmp_path / "w.jsonl"
    rc = main(["simulate", "--gpus", "16", "--gpus-per-node", "8", "--straggler",
               "node-0001:1.2", "--windows", "2", "--seed", "4", "--output", str(out)])
    assert rc == 0
    ws = list(read_jsonl(out))
    assert len(ws) == 4 and ws[0].processes[0].job_id == "sim-job"
    json.loads(out.read_text().splitlines()[0])
    assert main(["simulate", "--gpus", "16", "--straggler", "node-9:1.2", "--windows", "2",
                 "--output", str(out)]) == 2
    assert "not in the job" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [7, 8])
def test_engine_flags_exactly_the_injected_node_and_nothing_in_a_clean_job(seed):
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.score.engine import Engine

    def stragglers(cfg):
        engine = Engine(ScoringConfig())
        for w in generate(cfg):
            engine.ingest(w)
        engine.flush(None)
        return sorted(n.node for j in build_report(engine).jobs for n in j.nodes
                      if n.verdict == "straggler")

    base = dict(gpus=256, gpus_per_node=8, windows=6, seed=seed)
    assert stragglers(SimConfig(**base, stragglers=(Straggler("node-0012", 1.10),))) == \
        ["node-0012"]
    assert stragglers(SimConfig(**base)) == []


# ---- always-on signals, steps and coordinated sampling ---------------------------------------

def _by_rank(ws, w: int = 0):
    """{rank: ProcessWindow} of window index w."""
    start = min(x.start.ToNanoseconds() for x in ws)
    span = ws[0].end.ToNanoseconds() - ws[0].start.ToNanoseconds()
    return {p.rank: p for x in ws if (x.start.ToNanoseconds() - start) // span == w
            for p in x.processes}


def _step_p50(p) -> float:
    return float(buckets.quantiles_us(_dense(p.step_time), [0.5])[0])


def _dense(h) -> np.ndarray:
    from hypertrace.proto.wire import unpack_histogram
    return unpack_histogram(h)


def test_every_process_carries_sched_steps_and_sampling_as_the_proto_says():
    ws = list(generate(CFG))
    for p in (p for w in ws for p in w.processes):
        assert p.sched.window_s == CFG.window_seconds and p.sched.runq_ns > 0
        assert sum(p.sched.runq_latency.counts) > 0
        assert p.steps.source == "inferred:cudaDeviceSynchronize" and p.steps.steps >= 50
        assert sum(p.steps.busy_time.counts) == p.steps.steps == sum(p.step_time.counts)
        assert p.steps.gpu_wait_us > 0 and p.steps.peer_wait_us > 0
        assert p.sched.offcpu_ns == int((p.steps.peer_wait_us + p.steps.loader_wait_us) * 1e3)
        o = p.overhead
        assert o.sampled and not o.unsampled_reason and o.attached_s == pytest.approx(0.1)
        assert {(t.api, t.tier) for t in o.tiers} == {
            ("cudaLaunchKernel", "sliced"), ("cuLaunchKernel", "sliced"),
            ("cudaStreamSynchronize", "sliced"), ("cudaDeviceSynchronize", "always")}
        assert 0 < o.estimated_fraction < o.budget


def test_collective_steps_are_equal_and_the_straggler_waits_least_for_peers():
    ranks = _by_rank(list(generate(CFG)), w=1)
    slow, rest = range(24, 32), [r for r in range(64) if not 24 <= r < 32]
    p50 = np.array([_step_p50(ranks[r]) for r in range(64)])
    assert np.abs(p50 / np.median(p50) - 1).max() < 0.02         # the collective equalizes
    per_step = {f: np.array([getattr(ranks[r].steps, f) / ranks[r].steps.steps
                             for r in range(64)]) for f in ("gpu_wait_us", "peer_wait_us")}
    peer = per_step["peer_wait_us"]
    assert peer[list(slow)].max() < peer[rest].min()              # it arrives last
    busy = np.array([buckets.quantiles_us(_dense(ranks[r].steps.busy_time), [0.5])[0]
                     for r in range(64)])
    assert 1.06 < np.median(busy[list(slow)]) / np.median(busy[rest]) < 1.14


def test_independent_mode_gives_each_rank_its_own_step():
    from dataclasses import replace
    ranks = _by_rank(list(generate(replace(CFG, mode="independent"))), w=1)
    p50 = np.array([_step_p50(ranks[r]) for r in range(64)])
    rest = [r for r in range(64) if not 24 <= r < 32]
    assert 1.06 < np.median(p50[24:32]) / np.median(p50[rest]) < 1.14
    peer = np.array([ranks[r].steps.peer_wait_us / ranks[r].steps.steps for r in range(64)])
    assert np.abs(peer / np.median(peer) - 1).max() < 0.1         # nobody waits for peers


def test_healthy_run_queue_share_is_small_with_rare_bursts_past_the_gate():
    from hypertrace.sim.simulate import simulate_sched
    share = simulate_sched(SimConfig(gpus=2048, windows=8, seed=3)).runq_share
    assert np.mean(share < 0.01) > 0.9                            # mostly 0-1%
    burst = share - np.median(share) >= 0.05                      # one window over the 5% gate
    assert 0 < burst.sum() < 0.005 * share.size
    assert (burst.sum(axis=0) >= 3).sum() == 0                    # never persistent


def test_cadence_samples_the_same_windows_on_every_agent_and_always_on_signals_stay():
    from dataclasses import replace
    cfg = replace(CFG, cadence=2, windows=4)
    win_ns = int(cfg.window_seconds * 1e9)
    for w in generate(cfg):
        on = (w.start.ToNanoseconds() // win_ns) % 2 == 0
        for p in w.processes:
            assert p.overhead.sampled == on and bool(p.apis) == on
            assert p.overhead.unsampled_reason == ("" if on else "off_cadence")
            assert (p.overhead.attached_s > 0) == on
            assert p.HasField("sched") and p.steps.steps > 0      # every window
    with pytest.raises(ValueError, match="integer >= 1"):
        replace(CFG, cadence=0)


def test_new_signals_do_not_move_the_api_draws():
    from dataclasses import replace
    other = replace(CFG, mode="independent", runq_share=0.01, busy_frac=0.5, cadence=4)
    a, b = simulate_counts(CFG), simulate_counts(other)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_simulate_cli_mode_and_cadence(tmp_path, capsys):
    from hypertrace.cli.main import main
    out = tmp_path / "w.jsonl"
    assert main(["simulate", "--scenario", "cpu-hog", "--gpus", "16", "--windows", "4",
                 "--mode", "independent", "--cadence", "2", "--output", str(out)]) == 0
    ws = list(read_jsonl(out))
    assert sorted({w.processes[0].overhead.sampled for w in ws}) == [False, True]
    assert main(["simulate", "--gpus", "16", "--cadence", "0", "--output", str(out)]) == 2
    assert "k must be an integer >= 1" in capsys.readouterr().err


def test_true_slowdown_combines_persistent_spread_and_injected_stragglers():
    """Wide, heavy-tailed spreads make some healthy hardware truly slow; an injected straggler
    reads as its factor times its hardware's own offset, over the job's median GPU."""
    from hypertrace.sim.simulate import true_slowdown

    base = SimConfig(gpus=512, windows=4, seed=7, node_jitter=0.015, compute_spread=0.015,
                     spread_df=3.0)
    t = true_slowdown(base)
    assert t.min() >= 0.0 and np.median(t) < 0.02
    assert (t >= 0.03).sum() > 0                      # heavy tails: a few truly slow GPUs
    slow = replace(base, stragglers=(Straggler("node-0005", 1.10, where="compute"),))
    ts = true_slowdown(slow)
    assert np.all(np.abs(ts[40:48] - 0.10) < 0.06) and ts[40:48].min() > 0.05
    tight = true_slowdown(SimConfig(gpus=512, windows=4, seed=7))
    assert tight.max() < 0.03                         # the tight defaults: nobody is


def test_clustered_hiccups_hit_whole_racks_of_contiguous_nodes():
    from hypertrace.sim.simulate import burst_matrices

    cfg = SimConfig(gpus=256, windows=12, seed=4, step_ms=0, hiccup_prob=0.1, hiccup_nodes=4)
    frac, scale = burst_matrices(cfg)
    hit = frac > 0
    assert hit.any() and not hit.all()
    racks = hit.reshape(12, 256 // 32, 32)            # 4 nodes x 8 GPUs per rack
    assert np.all(racks.all(axis=2) == racks.any(axis=2))     # a rack is hit whole or not
    assert np.all((scale[hit] >= 3.0) & (scale[hit] <= 8.0))
    assert np.all((frac[hit] >= 0.05) & (frac[hit] <= 0.20))


def test_idle_synchronizes_are_a_short_second_mode_of_the_sync_histogram():
    from hypertrace.proto import buckets

    cfg = SimConfig(gpus=16, windows=2, seed=1, step_ms=0, idle_syncs=1.5)
    c = simulate_counts(cfg)["cudaStreamSynchronize"].astype(np.float64)
    short = c[..., buckets.UPPER_NS <= 40_000].sum() / c.sum()     # calls under 40 us
    assert short == pytest.approx(1.5 / 2.5, abs=0.03)
    plain = simulate_counts(replace(cfg, idle_syncs=0.0))["cudaStreamSynchronize"]
    assert plain[..., buckets.UPPER_NS <= 40_000].sum() == 0


def test_simulate_cli_noise_flag_chooses_wide_or_tight(tmp_path):
    """--noise wide draws the spreads from the seed (the same windows as the scenario's
    default); tight gives the simulator's defaults; without --scenario the default is tight."""
    from hypertrace.cli.main import main
    from hypertrace.sim import scenarios

    paths = {n: tmp_path / f"{n}.jsonl" for n in ("wide", "tight", "scenario", "plain")}
    base = ["--gpus", "16", "--windows", "2", "--seed", "5"]
    assert main(["simulate", "--scenario", "clean", "--noise", "tight", *base,
                 "--output", str(paths["tight"])]) == 0
    assert main(["simulate", "--scenario", "clean", *base, "--output",
                 str(paths["scenario"])]) == 0
    assert main(["simulate", "--noise", "wide", *base, "--job", "sim-clean", "--output",
                 str(paths["wide"])]) == 0
    assert main(["simulate", *base, "--job", "sim-clean", "--output", str(paths["plain"])]) == 0
    text = {n: p.read_text() for n, p in paths.items()}
    assert text["scenario"] == text["wide"] and text["tight"] == text["plain"]
    assert text["wide"] != text["tight"]
    wide = scenarios.get("clean").config(16, 8, 2, 5)
    assert wide.node_jitter != SimConfig().node_jitter


def test_a_collective_step_carries_every_ranks_delays_and_busy_time_only_its_own():
    """A rank delayed in a step delays the step of all (the collective waits for it); its busy
    time stays its own. Independent ranks' steps carry only their own delays."""
    from hypertrace.sim.simulate import (
        burst_matrices,
        job_step_bursts,
        simulate_busy_counts,
        simulate_step_counts,
    )
    cfg = SimConfig(gpus=64, windows=8, seed=3, hiccup_prob=0.05, hiccup_nodes=2,
                    hiccup_windows=1)                  # one event per rack and window
    own, _ = burst_matrices(cfg)
    job, _ = job_step_bursts(cfg)
    assert np.all(job == job[:, :1])                       # the same on every rank
    hit = own.max(axis=1) > 0
    assert hit.any() and np.all(job[hit, 0] >= own[hit].max(axis=1) - 1e-12)
    racks = own[:, ::16]                                    # one column per rack of 2 nodes
    assert np.allclose(job[:, 0], 1 - np.prod(1 - racks, axis=1))   # independent racks combine
    steps = simulate_step_counts(cfg)
    assert np.all(steps.sum(axis=2) == steps.sum(axis=2)[:, :1])
    busy = simulate_busy_counts(cfg)
    spike_edge = np.searchsorted(buckets.LOWER_NS, 2.0 * 70e6)            # > 2x the 70 ms busy
    quiet = own[:, :].max(axis=0) == 0                      # ranks never hit themselves
    assert quiet.any() and busy[:, quiet, spike_edge:].sum() == 0
    assert steps[:, quiet, np.searchsorted(buckets.LOWER_NS, 2.0 * 100e6):].sum() > 0


def _steps_by_rank(cfg: SimConfig) -> dict[tuple[int, int], tuple]:
    """(window, rank) -> (step histogram counts, step sum µs, peer wait µs, steps)."""
    out = {}
    for nw in generate(cfg):
        w = (nw.start.ToNanoseconds() - cfg.first_start_ns) // int(cfg.window_seconds * 1e9)
        for p in nw.processes:
            out[(int(w), p.rank)] = (tuple(p.step_time.counts), p.steps.step_sum_us,
                                     p.steps.peer_wait_us, p.steps.steps)
    return out


def test_collective_ranks_time_the_same_steps_and_wait_for_a_delayed_peer():
    """A collective step ends on every rank together: every rank gets the same step histogram,
    and a pause on one node (a GC burst in window 1) is peer wait on every other node, not
    their own time."""
    from hypertrace.sim.simulate import Burst
    cfg = SimConfig(gpus=64, windows=3, seed=4, mode="collective",
                    bursts=(Burst("node-0002", (1,), 0.2, 6.0),))
    steps = _steps_by_rank(cfg)
    for w in range(3):
        assert len({steps[(w, r)][0] for r in range(64)}) == 1
        assert len({steps[(w, r)][1] for r in range(64)}) == 1
    other = [r for r in range(64) if r // 8 != 2]
    own = {w: np.median([(steps[(w, r)][1] - steps[(w, r)][2]) / steps[(w, r)][3]
                         for r in other]) for w in range(3)}
    peer = {w: np.median([steps[(w, r)][2] / steps[(w, r)][3] for r in other])
            for w in range(3)}
    assert peer[1] > 2 * peer[0]                     # they waited for node-0002's pauses
    assert own[1] == pytest.approx(own[0], rel=0.03)  # their own time did not move
    paused = [(steps[(1, r)][1] - steps[(1, r)][2]) / steps[(1, r)][3] for r in range(16, 24)]
    assert min(paused) > 1.3 * own[1]                # the paused node's own time holds them


def test_true_slowdown_is_in_step_terms_a_side_that_does_not_pace_the_step_costs_nothing():
    """Launches 12% slower where the GPU sets the pace (CPU 80 ms, GPU 90 ms per step): the
    rank's time to the step's end barely moves. 30% slower: the CPU side (104 ms) sets it, 15%
    over the others' 90.5 ms. In a launch-bound job (CPU 95 ms, GPU 80 ms) a 10% slower host is
    10% slower."""
    from hypertrace.sim.simulate import true_slowdown
    node = "node-0003"
    gpu_paced = SimConfig(gpus=64, windows=2, seed=7, busy_frac=0.8)
    slow = [true_slowdown(replace(gpu_paced, stragglers=(Straggler(node, f, where="host"),)))
            [24:32] for f in (1.12, 1.30)]
    assert np.all(slow[0] < 0.01)
    assert np.all(np.abs(slow[1] - 0.15) < 0.02)
    bound = replace(gpu_paced, busy_frac=0.95, gpu_frac=0.8,
                    stragglers=(Straggler(node, 1.10, where="host"),))
    assert np.all(np.abs(true_slowdown(bound)[24:32] - 0.10) < 0.02)


def test_true_step_without_evicted_nodes_is_the_slowest_remaining_ranks():
    """Collective: the slowest remaining rank's arrival plus the collective; independent: the
    slowest remaining rank's step (both 100 ms for the default healthy job)."""
    from hypertrace.sim.simulate import true_step_ms
    base = SimConfig(gpus=64, windows=4, seed=7,
                     stragglers=(Straggler("node-0003", 1.30, where="compute"),))
    for mode in ("collective", "independent"):
        cfg = replace(base, mode=mode)
        assert true_step_ms(cfg) == pytest.approx(0.9 * 130 + 0.5 + 9.5, rel=0.01)
        assert true_step_ms(cfg, ["node-0003"]) == pytest.approx(100.0, rel=0.01)


def test_paced_synchronizes_take_the_time_their_pace_allows_and_the_always_tier_window():
    """With paced_syncs the waiting synchronize calls are one per interval (sync_base_us +
    compute_us x the slowest rank's compute), in the always tier at ~20 calls/s, counted over
    the whole 10-s window: their time per second is a share of wall time (< 1), and the slowest
    rank's is the smallest."""
    cfg = SimConfig(gpus=16, windows=2, seed=3, step_ms=0, paced_syncs=True,
                    compute_us=50_000.0,
                    stragglers=(Straggler("node-0001", 1.10, gpus=(2,), where="compute"),))
    ws = list(generate(cfg))
    shares = {}
    for w in ws[:2]:                                  # window 0, both nodes
        for p in w.processes:
            sync = next(a for a in p.apis if a.api == "cudaStreamSynchronize")
            tier = next(t for t in p.overhead.tiers if t.api == "cudaStreamSynchronize")
            assert tier.tier == "always" and sync.count == pytest.approx(10.0 * 1e6 / 55_150,
                                                                        rel=0.25)
            shares[p.rank] = sync.sum_us / 1e6 / cfg.window_seconds
    assert all(0 < x < 1 for x in shares.values())
    assert min(shares, key=shares.get) == 10                    # node-0001 GPU 2
    assert np.median(list(shares.values())) - shares[10] == pytest.approx(0.09, abs=0.02)


def test_a_polling_handshake_moves_part_of_the_peer_wait_into_busy_time():
    """peer_spin: the share of every rank's wait for peers spent polling on CPU is measured as
    busy time; the parts still add up to the step."""
    from hypertrace.sim.simulate import step_model
    base = SimConfig(gpus=16, windows=2, seed=4)
    plain, spun = step_model(base), step_model(replace(base, peer_spin=0.25))
    assert np.allclose(spun.peer_wait, 0.75 * plain.peer_wait)
    assert np.allclose(spun.busy, plain.busy + 0.25 * plain.peer_wait)
    assert np.allclose(spun.busy + spun.gpu_wait + spun.peer_wait + spun.loader_wait, spun.step)
    with pytest.raises(ValueError, match="peer_spin"):
        SimConfig(peer_spin=1.5)
