"""bench-detect on small jobs: metrics, acceptance checks and the CLI, end to end."""
from dataclasses import replace

import pytest

from hypertrace.sim import bench_detect as bd


def test_run_one_scores_the_same_windows_with_every_method():
    r = bd.run_one("host-20", gpus=64, windows=5, seed=1001)
    assert set(r.first_flag) == set(bd.METHODS) and len(r.truth) == 1
    node, onset = next(iter(r.truth.items()))
    assert r.first_flag["hypertrace"] == {node: 2}         # convicted at the 3rd window (k=3)
    s = bd.summarize([r], "hypertrace")
    assert (s.precision, s.recall, s.false_nodes, s.latency_windows) == (1.0, 1.0, 0, [3])


def test_summary_counts_false_nodes_per_node_hour():
    r = bd.RunResult("clean", 64, 0, windows=360, nodes=8, window_seconds=10.0, truth={},
                     first_flag={"hypertrace": {"node-0001": 5}})
    s = bd.summarize([r], "hypertrace")
    assert s.precision == 0.0 and s.recall is None and s.node_hours == 8.0
    assert s.fp_per_1k_node_h == 125.0


def test_quick_cli_prints_table_and_checks(capsys, tmp_path):
    out = tmp_path / "raw.json"
    rc = bd.main(["--quick", "--sizes", "64", "--scenario", "clean", "--scenario", "collective",
                  "--workers", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and out.exists()
    assert "| collective | 64 |" in text and "hypertrace P" in text
    assert "PASS  collective: recall 1.0" in text
    assert "hypertrace >= nvrx" in text


def test_bad_arguments_are_clear(capsys):
    assert bd.main(["--scenario", "nope"]) == 2
    assert "unknown scenario" in capsys.readouterr().err
    assert bd.main(["--quick", "--sizes", "99"]) == 2
    assert "matches no size" in capsys.readouterr().err


def test_depth_runs_are_pooled_without_counting_a_seed_twice():
    def run(gpus, seed, found):
        return bd.RunResult("launch-5", gpus, seed, windows=16, nodes=gpus // 8,
                            window_seconds=10.0, truth={"node-0001": 0},
                            slowdown={"node-0001": 0.052},
                            first_flag={m: ({"node-0001": 2} if found else {})
                                        for m in bd.METHODS})
    table = {("launch-5", 64): [run(64, 1000, True)], ("launch-5", 2048): [run(2048, 1000, True)]}
    deep = {("launch-5", 64): [run(64, 1000, True), run(64, 1001, False)]}
    checks = {text: (ok, figs) for text, ok, figs in bd.acceptance(table, deep)}
    ok, figs = checks["launch-5: recall >= 0.95 within 12 windows (table + depth runs)"]
    assert not ok and "over 3 runs" in figs and "R@12 0.667" in figs    # 64/1000 once, + 2048
    assert "table alone: R@12 1.000 over 2" in figs
    alone = {t: ok for t, ok, _ in bd.acceptance(table)}
    assert alone["launch-5: recall >= 0.95 within 12 windows"]          # without depth runs


def test_quick_clean_bar_has_no_node_window_floor_and_latency_reads_in_seconds():
    clean = bd.RunResult("clean", 64, 0, windows=12, nodes=8, window_seconds=10.0, truth={},
                         first_flag={m: {} for m in bd.METHODS})
    slow = bd.RunResult("gpu-slow", 64, 0, windows=12, nodes=8, window_seconds=10.0,
                        truth={"node-0001": 0}, slowdown={"node-0001": 0.33},
                        first_flag={m: {"node-0001": 2} for m in bd.METHODS})
    groups = {("clean", 64): [clean], ("gpu-slow", 64): [slow]}
    full = {t: ok for t, ok, _ in bd.acceptance(groups)}
    assert not full["clean: zero false stragglers (nodes and GPUs) over >= 10,000 node-windows"]
    quick = {t: (ok, f) for t, ok, f in bd.acceptance(groups, min_node_windows=0,
                                                         min_clean_node_windows=0)}
    assert quick["clean: zero false stragglers (nodes and GPUs) (quick run: no node-window "
                 "floor)"][0]
    ok, figs = quick["gpu-slow: recall 1.0 within 3 windows (truly >= 27% slow) and within 12 "
                     "(truly >= 5%), precision >= 0.99"]
    assert ok and "median 3 max 3 windows" in figs


def test_verdicts_are_judged_by_true_slowdown_healthy_gray_and_naturally_slow():
    """A conviction of healthy hardware (under 3%) is false; of a node 3-5% slow, gray (neither
    false nor required); of healthy hardware truly 5% or more slow, natural (right); a GPU truly
    20% slow on a healthy node makes its node's verdict right."""
    r = bd.RunResult("clean", 64, 0, windows=12, nodes=8, window_seconds=10.0, truth={},
                     slowdown={"node-0002": 0.04, "node-0003": 0.07},
                     first_flag={"hypertrace": {"node-0001": 1, "node-0002": 1, "node-0003": 1,
                                                "node-0004": 1}},
                     flag_slowdown={"hypertrace": {"node-0004": 0.2}},
                     false_gpus={"hypertrace": 8})
    s = bd.summarize([r], "hypertrace")
    assert (s.false_nodes, s.gray, s.natural, s.false_gpus) == (1, 1, 2, 8)
    assert s.fp_per_1k_node_h == pytest.approx(1000.0 / (8 * 12 * 10 / 3600))
    # below-gate scenarios judge their own injected node like a healthy one
    r2 = bd.RunResult("collective-2", 64, 0, windows=12, nodes=8, window_seconds=10.0,
                      truth={"node-0001": 0}, first_flag={"hypertrace": {"node-0001": 3}})
    assert bd.summarize([r2], "hypertrace").false_nodes == 1
    assert bd.summarize([replace(r2, scenario="launch-3")], "hypertrace").false_nodes == 0


def test_new_faults_are_convicted_in_three_windows_from_the_always_on_signals():
    """The simulated sched and step fields reach the engine's signals: a CPU hog (launch latency
    unchanged) and a slow GPU in a collective job are each convicted at the third window."""
    for name in ("cpu-hog", "gpu-slow"):
        r = bd.run_one(name, gpus=64, windows=5, seed=1001, methods=("hypertrace",))
        node = next(iter(r.truth))
        assert r.first_flag["hypertrace"] == {node: 2}, name


def test_launch_tier_is_sampled_in_every_window_at_the_default_cadence():
    from hypertrace.sim import scenarios
    from hypertrace.sim.simulate import sampled_windows
    for name in scenarios.CATALOG:
        assert sampled_windows(scenarios.get(name).config(gpus=64, windows=6, seed=3)).all()


def _checks(groups) -> dict[str, tuple[bool, str]]:
    return {t: (ok, f) for t, ok, f in bd.acceptance(groups, min_node_windows=0,
                                                      min_clean_node_windows=0)}


def test_a_recovered_node_convicted_again_or_late_to_clear_fails_the_run():
    def run(windows: list[int], final: str) -> bd.RunResult:
        return bd.RunResult("recover-hiccup", 64, 0, windows=16, nodes=8, window_seconds=10.0,
                            truth={"node-0001": 0}, slowdown={"node-0001": 0.2},
                            first_flag={m: {"node-0001": 2} for m in bd.METHODS},
                            straggler_windows={"node-0001": windows},
                            final_verdicts={"node-0001": final})
    name = ("recover-hiccup: cleared within clear_m windows of its fault's end, not convicted "
            "again by its one slow window, healthy at the end")
    from hypertrace.analyzer.score.config import ScoringConfig
    healthy_at = 4 + ScoringConfig().clear_m          # the fault's last window is 4
    on_time, late = list(range(2, healthy_at)), list(range(2, healthy_at + 1))
    assert _checks({("recover-hiccup", 64): [run(on_time, "healthy")]})[name][0]
    assert not _checks({("recover-hiccup", 64): [run(late, "healthy")]})[name][0]
    assert not _checks({("recover-hiccup", 64): [run([2, 3, 4, 10, 11], "healthy")]})[name][0]
    assert not _checks({("recover-hiccup", 64): [run([2, 3, 4], "straggler")]})[name][0]


def test_a_fault_convicted_after_window_6_or_a_biased_what_if_fails_the_run():
    def run(at: int, whatif) -> bd.RunResult:
        return bd.RunResult("host-10", 64, 0, windows=16, nodes=8, window_seconds=10.0,
                            truth={"node-0001": 0}, slowdown={"node-0001": 0.1},
                            first_flag={m: {"node-0001": at} for m in bd.METHODS},
                            whatif=whatif)
    by6 = "every injected fault truly >= 5% slow convicted within 6 windows (intermittent aside)"
    wi = ("what-if: the step after eviction within 5% of the remaining ranks' true step (spikes "
          "left out, the job's measured noise kept) in every run that evicts")
    good = _checks({("host-10", 64): [run(5, (110.0, 110.0, 103.0, 100.0))]})
    assert good[by6][0] and good[wi][0]
    late = _checks({("host-10", 64): [run(6, (110.0, 110.0, 106.0, 100.0))]})
    assert not late[by6][0] and not late[wi][0] and "6.0%" in late[wi][1]
    # the job measured 6% over the model now: the remaining ranks keep that noise after
    noisy = _checks({("host-10", 64): [run(5, (116.6, 110.0, 106.0, 100.0))]})
    assert noisy[wi][0], noisy[wi][1]


def test_loops_as_they_run_need_recall_within_6_windows_and_no_false_straggler():
    """The scenarios of WITHIN_WINDOWS (jitter-2x: 6): a truly slow injected node convicted at
    window 7 fails the bar, and so does a false straggler beside an in-time conviction."""
    def run(first, extra=None):
        flags = {"node-0001": first, **(extra or {})}
        return bd.RunResult("jitter-2x", 64, 0, windows=12, nodes=8, window_seconds=10.0,
                            truth={"node-0001": 0}, slowdown={"node-0001": 0.15},
                            first_flag={m: flags for m in bd.METHODS})
    text = ("jitter-2x: recall 1.0 within 6 windows (truly >= 5% slow), no false straggler")
    for result, passes in ((run(5), True), (run(6), False), (run(2, {"node-0004": 3}), False)):
        checks = {t: (ok, f) for t, ok, f in bd.acceptance({("jitter-2x", 64): [result]},
                                                            min_node_windows=0,
                                                            min_clean_node_windows=0)}
        assert checks[text][0] is passes, checks[text][1]
    assert "recall 1.0 within 3 windows" not in " ".join(
        t for t, _, _ in bd.acceptance({("jitter-2x", 64): [run(2)]}))


def test_an_unlabelled_pipeline_without_steps_must_be_named_a_possible_pipeline():
    """_stage_found: without step data the imbalance must name the stage a possible pipeline
    stage; with step data any imbalance of the stage's size counts."""
    from hypertrace.analyzer.score.auto_groups import NO_STEP_NAME
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.sim import scenarios
    cfg = scenarios.get("pipeline-8-unlabeled-nostep").config(64, 8, 2, 0)
    plain = pb.Report(jobs=[pb.JobReport(imbalance=[pb.GroupImbalance(
        group="auto-2 (~1,300 launches/step)", gpus=8, ratio=1.13)])])
    named = pb.Report(jobs=[pb.JobReport(imbalance=[pb.GroupImbalance(
        group=f"auto-2 (~1,300 launches/s, {NO_STEP_NAME})", gpus=8, ratio=1.13)])])
    assert not bd._stage_found(plain, cfg) and bd._stage_found(named, cfg)
    assert bd._stage_found(plain, replace(cfg, step_ms=100.0))
