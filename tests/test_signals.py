"""The scored signals end to end through the real Engine, on hand-built windows shaped like the
GPU harness's: 8 ranks, one per node (each rank's agent is its own "node"), one window per rank
per epoch, with scheduler evidence, step statistics and launch/sync latencies.

The faults are the ones measured on the H200: a CPU hog on rank 5's core (run-queue share up,
launch latency unchanged), rank 5's GPU doing more work per step in a collective job (its waits on
its own GPU grow, it waits least for its peers), and a slow rank in an independent job.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import report_to_json, report_to_table
from hypertrace.analyzer.score import registry, signals
from hypertrace.analyzer.score.config import ConfigError, ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.proto import buckets, wire
from hypertrace.proto import hypertrace_pb2 as pb

RANKS = 8
SLOW = 5
WINDOW_S = 10.0
T0_S = 1_700_000_000.0


@dataclass
class Rank:
    """What one rank does in one window (times in ms, shares of wall time)."""

    step_ms: float = 100.0
    busy_ms: float = 70.0
    gpu_wait_ms: float = 20.0
    peer_wait_ms: float = 10.0
    runq_share: float = 0.002
    runq_p50_us: float = 20.0
    steps: int = 100
    launches: int = 5000
    attached_s: float = 2.0
    launch_us: float = 8.0
    spread: float = 0.01            # relative sd of each step around its rank's value
    sm_clock: int | None = None
    refused: str = ""               # step inference refused this window: no step values
    pcie_replays: int | None = None


def _hist_ns(values_ns: np.ndarray) -> pb.Histogram:
    return wire.pack_histogram(buckets.histogram_of_ns(np.asarray(values_ns, dtype=np.float64)))


def _process(rank: int, r: Rank, rng: np.random.Generator) -> pb.ProcessWindow:
    p = pb.ProcessWindow(job_id="job", rank=rank, local_rank=0, gpu_index=0, pid=1000 + rank,
                         gpu_kind="NVIDIA H200")
    if r.launches:
        p.apis.append(wire.api_stats_from_ns(
            "cudaLaunchKernel", rng.lognormal(math.log(r.launch_us * 1e3), 0.2, r.launches)))
    sync = rng.normal(r.gpu_wait_ms * 1e6, r.gpu_wait_ms * 1e6 * r.spread, r.steps).clip(1e3)
    p.apis.append(wire.api_stats_from_ns("cudaDeviceSynchronize", sync))
    p.apis.append(pb.ApiStats(api="hypertrace_step", count=0, histogram=pb.Histogram(scheme=1)))
    step = rng.normal(r.step_ms * 1e6, r.step_ms * 1e6 * r.spread, r.steps)
    busy = rng.normal(r.busy_ms * 1e6, r.busy_ms * 1e6 * r.spread, r.steps)
    if r.refused:
        p.steps.CopyFrom(pb.StepStats(source="", refused=r.refused, steps=0))
    else:
        p.step_time.CopyFrom(_hist_ns(step))
        p.steps.CopyFrom(pb.StepStats(
            source="marker", steps=r.steps, busy_time=_hist_ns(busy),
            gpu_wait_us=float(sync.sum() / 1e3),
            peer_wait_us=float(r.peer_wait_ms * 1e3 * r.steps),
            step_sum_us=float(step.sum() / 1e3)))
    waits = max(int(r.runq_share * WINDOW_S * 1e9 / (r.runq_p50_us * 1e3)), 1)
    p.sched.CopyFrom(pb.SchedStats(
        runq_ns=int(r.runq_share * WINDOW_S * 1e9), offcpu_ns=int(r.peer_wait_ms * 1e6 * r.steps),
        involuntary_switches=waits // 2, voluntary_switches=r.steps, window_s=WINDOW_S,
        runq_latency=_hist_ns(np.full(waits, r.runq_p50_us * 1e3))))
    p.overhead.CopyFrom(pb.Overhead(sampled=r.attached_s > 0, attached_s=r.attached_s,
                                    budget=0.005))
    if r.sm_clock is not None:
        p.nvml.sm_clock_mhz = r.sm_clock
        p.nvml.max_sm_clock_mhz = 1980
    if r.pcie_replays is not None:
        p.nvml.pcie_replay_count = r.pcie_replays
    return p


def windows(epochs: int, rank_of, seed: int = 0, ranks: int = RANKS,
            process=None) -> list[pb.NodeWindow]:
    """``rank_of(epoch, rank, rng) -> Rank``; one window per rank per epoch, each its own node.
    ``process(rank, what rank_of gave, rng) -> ProcessWindow`` builds each (default: this
    module's)."""
    rng = np.random.default_rng(seed)
    build = process or _process
    out = []
    for e in range(epochs):
        start = int((T0_S + e * WINDOW_S) * 1e9)
        for k in range(ranks):
            w = pb.NodeWindow(version=1, agent_id=f"agent-{k}", node=f"node-{k}", seq=e + 1)
            w.start.FromNanoseconds(start)
            w.end.FromNanoseconds(start + int(WINDOW_S * 1e9))
            w.processes.append(build(k, rank_of(e, k, rng), rng))
            wire.validate_window(w)
            out.append(w)
    return out


def run(ws: list[pb.NodeWindow], cfg: ScoringConfig = ScoringConfig()) -> tuple[Engine, list]:
    e = Engine(cfg)
    for w in ws:
        e.ingest(w)
    return e, e.flush(None)


def verdicts(engine: Engine) -> dict[int, str]:
    job = build_report(engine, now_ns=0).jobs[0]
    return {g.rank: g.verdict for n in job.nodes for g in n.gpus}


def gpu(engine: Engine, rank: int) -> pb.GpuReport:
    job = build_report(engine, now_ns=0).jobs[0]
    return next(g for n in job.nodes for g in n.gpus if g.rank == rank)


def convicted(results) -> set[int]:
    """Ranks any epoch flagged through an implicating finding."""
    return {r.rank for res in results for r in res.rows if r.implicates}


# ---- (a) CPU hog -------------------------------------------------------------------------------

def test_cpu_hog_is_convicted_by_run_queue_share_with_the_cpu_contention_cause():
    def rank_of(e, k, rng):
        if k == SLOW and e >= 2:          # the hog starts mid-run; the launch latency stays
            return Rank(runq_share=0.4, runq_p50_us=2900.0, busy_ms=95.0, peer_wait_ms=0.5,
                        launches=3000)
        return Rank(runq_share=rng.uniform(0.001, 0.003), peer_wait_ms=rng.uniform(9, 11))
    engine, results = run(windows(8, rank_of))
    v = verdicts(engine)
    assert v[SLOW] == "straggler"
    assert {r: x for r, x in v.items() if r != SLOW} == {r: "healthy" for r in range(8) if r != 5}
    assert convicted(results) == {SLOW}
    g = gpu(engine, SLOW)
    runq = next(f for f in g.findings if f.api == "sched.runq")
    assert runq.unit == "share" and runq.value_us == pytest.approx(0.4)
    assert runq.direction == "high"
    # the launch latency did not move, so no launch finding convicted it
    assert not any(f.api == "cudaLaunchKernel" for f in g.findings)
    cause = g.probable_cause
    assert re.match(r"run-queue wait 40% of wall time vs 0\.[23]% job median \(p50 latency "
                    r"(2\.9|3\.0) ms\): CPU contention", cause), cause
    assert "arrives last at the collective" in cause
    rep = build_report(engine, now_ns=0).jobs[0]
    assert rep.mode == "collective" and rep.windows_sampled == 8


# ---- (b) GPU side in a collective job ----------------------------------------------------------

@pytest.mark.parametrize("factor", [1.3, 2.0])
def test_gpu_side_straggler_in_collective_mode_waits_longest_on_its_gpu(factor):
    def rank_of(e, k, rng):
        if k == SLOW:                     # more GPU work: longer own-GPU waits, arrives last
            return Rank(gpu_wait_ms=20.0 * factor, peer_wait_ms=0.5,
                        runq_share=rng.uniform(0.001, 0.003))
        # victims wait for rank 5 at the CPU-side collective
        return Rank(peer_wait_ms=0.5 + 20.0 * (factor - 1) + rng.uniform(-0.5, 0.5),
                    gpu_wait_ms=20.0 * rng.uniform(0.98, 1.02),
                    runq_share=rng.uniform(0.001, 0.003))
    engine, results = run(windows(6, rank_of, seed=1))
    v = verdicts(engine)
    assert v[SLOW] == "straggler"
    assert all(v[k] == "healthy" for k in range(RANKS) if k != SLOW)
    assert convicted(results) == {SLOW}
    rep = build_report(engine, now_ns=0).jobs[0]
    assert rep.mode == "collective"
    cause = gpu(engine, SLOW).probable_cause
    assert re.match(rf"waits {20 * factor:.1f} ms per step on its own GPU vs (19\.9|20\.0|20\.1) "
                    r"ms job median, no CPU contention \(run-queue wait 0\.\d% of wall time\): "
                    r"GPU side", cause), cause


def test_peer_wait_alone_never_convicts():
    """Rank 5 waits far longer for its peers than anyone: it is a victim, not the straggler."""
    def rank_of(e, k, rng):
        return Rank(peer_wait_ms=40.0 if k == SLOW else rng.uniform(9, 11))
    engine, results = run(windows(6, rank_of, seed=2))
    assert verdicts(engine)[SLOW] == "healthy"
    rows = [r for res in results for r in res.rows if r.rank == SLOW]
    assert rows and "step.peer_wait" in {r.api for r in rows}
    assert not any(r.implicates for r in rows)   # a victim: its own time per step is the shortest
    assert not any(r.implicates for r in rows)


# ---- (c) independent mode ----------------------------------------------------------------------

def test_slow_rank_in_independent_mode_is_convicted_by_its_step_time():
    offsets = np.random.default_rng(3).uniform(-0.03, 0.03, RANKS)

    def rank_of(e, k, rng):
        f = 1.3 if k == SLOW else 1.0 + offsets[k]
        return Rank(step_ms=100.0 * f, busy_ms=70.0 * f, peer_wait_ms=0.0,
                    launches=int(5000 / f), runq_share=rng.uniform(0.001, 0.003))
    engine, results = run(windows(6, rank_of, seed=3))
    rep = build_report(engine, now_ns=0).jobs[0]
    assert rep.mode == "independent"
    v = verdicts(engine)
    assert v[SLOW] == "straggler"
    assert all(v[k] == "healthy" for k in range(RANKS) if k != SLOW)
    apis = {r.api for res in results for r in res.rows if r.rank == SLOW and r.implicates}
    assert {"step.time", "step.own", "launch.rate"} <= apis
    cause = gpu(engine, SLOW).probable_cause
    # the explanation (its CPU-side work grew) leads; the symptoms follow
    assert cause.startswith("own work 8") and "the rank itself is slower" in cause, cause
    assert "steps take 1" in cause and "own time 1" in cause


def test_equal_step_times_are_not_convicted_in_collective_mode():
    """Forced collective: a long step is no finding by itself; what counts is the rank's own
    time (its step less its wait for peers), the same as everybody's here."""
    def rank_of(e, k, rng):
        return Rank(step_ms=130.0 if k == SLOW else 100.0, peer_wait_ms=30.0 if k == SLOW else 0.0,
                    launches=5000)
    engine, results = run(windows(6, rank_of, seed=4), ScoringConfig(job_mode="collective"))
    assert build_report(engine, now_ns=0).jobs[0].mode == "collective"
    assert verdicts(engine)[SLOW] == "healthy"
    assert any(r.api == "step.time" and not r.implicates for res in results for r in res.rows)


# ---- (d) clean, noisy ----------------------------------------------------------------------------

@pytest.mark.parametrize("collective", [True, False])
def test_clean_noisy_job_convicts_nobody_over_20_epochs(collective):
    def rank_of(e, k, rng):
        step = 100.0 if collective else 100.0 * rng.uniform(0.97, 1.03)
        return Rank(step_ms=step, busy_ms=70.0 * rng.uniform(0.97, 1.03),
                    gpu_wait_ms=20.0 * rng.uniform(0.97, 1.03),
                    peer_wait_ms=10.0 * rng.uniform(0.7, 1.3), runq_share=rng.uniform(0.0, 0.01),
                    runq_p50_us=rng.uniform(10, 60), launches=int(rng.uniform(4800, 5200)),
                    spread=0.03)
    engine, results = run(windows(20, rank_of, seed=5 + collective))
    assert len(results) == 20
    assert all("straggler" not in res.verdicts.values() for res in results)
    assert set(verdicts(engine).values()) <= {"healthy", "suspect"}
    # a single epoch may flag a rank whose noise lands 5% off a low median; persistence is what
    # keeps that from convicting, so the flags must stay rare
    flags = [(res.epoch, r.rank) for res in results for r in res.rows if r.implicates]
    assert len(set(flags)) <= 0.05 * 20 * RANKS


# ---- (e) edge cases ----------------------------------------------------------------------------

def test_identical_values_mad_zero_score_nothing_and_one_outlier_still_flags():
    def same(e, k, rng):
        return Rank(runq_share=0.0, spread=0.0, peer_wait_ms=10.0)
    engine, results = run(windows(4, same))
    assert set(verdicts(engine).values()) == {"healthy"}
    assert all(not res.rows or all(np.isfinite(r.robust_z) for r in res.rows) for res in results)

    def one_hog(e, k, rng):           # it arrives last: its own time per step grew
        return Rank(runq_share=0.3 if k == SLOW else 0.0, spread=0.0,
                    peer_wait_ms=0.5 if k == SLOW else 10.0)
    engine, _ = run(windows(4, one_hog))
    assert verdicts(engine)[SLOW] == "straggler"


def test_run_queue_wait_that_the_steps_do_not_show_does_not_convict():
    """A rank whose threads wait 7% of wall time for a CPU while its steps are the job's (the
    wait hides behind GPU work): reported as CPU contention, never a straggler. Without step
    data the share alone still convicts (test_refused_step_inference_...)."""
    def rank_of(e, k, rng):
        return Rank(runq_share=0.07 if k == SLOW else rng.uniform(0.0015, 0.0035),
                    peer_wait_ms=rng.uniform(9, 11))
    engine, results = run(windows(6, rank_of, seed=31))
    assert set(verdicts(engine).values()) == {"healthy"}
    runq = [r for res in results for r in res.rows if r.api == "sched.runq"]
    assert runq and all(r.rank == SLOW and r.direction == "high" for r in runq)
    assert not any(r.implicates for r in runq)
    assert convicted(results) == set()


def test_run_queue_below_the_absolute_gate_is_not_a_finding():
    """3% of wall time on the run queue vs 0.2%: a huge ratio, but under min_effect of wall
    time, so not CPU contention worth a finding."""
    def rank_of(e, k, rng):
        return Rank(runq_share=0.03 if k == SLOW else rng.uniform(0.0015, 0.0025))
    _, results = run(windows(5, rank_of, seed=7))
    assert not [r for res in results for r in res.rows if r.api == "sched.runq"]


def test_too_few_steps_are_not_scored():
    def rank_of(e, k, rng):
        return Rank(steps=2, busy_ms=200.0 if k == SLOW else 70.0,
                    gpu_wait_ms=60.0 if k == SLOW else 20.0, launches=0, attached_s=0.0)
    engine, results = run(windows(5, rank_of, seed=8))
    assert not [r for res in results for r in res.rows if r.api.startswith("step.")]
    assert verdicts(engine)[SLOW] != "straggler"
    assert build_report(engine, now_ns=0).jobs[0].mode == ""


def test_sched_evidence_covering_too_little_time_is_not_scored():
    def rank_of(e, k, rng):
        return Rank(runq_share=0.5 if k == SLOW else 0.002)
    ws = windows(4, rank_of, seed=9)
    for w in ws:
        w.processes[0].sched.window_s = 0.5          # under sched_min_seconds
    _, results = run(ws)
    assert not [r for res in results for r in res.rows if r.api == "sched.runq"]


def test_mode_inference_and_override():
    cfg = ScoringConfig()
    p50 = np.full(8, 100.0)
    has = np.ones(8, bool)
    assert signals.infer_mode(p50, has, cfg) == "collective"
    p50[SLOW] = 130.0                      # one rank apart: collectives equalize every rank
    assert signals.infer_mode(p50, has, cfg) == "independent"
    assert signals.infer_mode(p50, np.zeros(8, bool), cfg) == ""
    assert signals.infer_mode(p50, has, ScoringConfig(job_mode="collective")) == "collective"
    with pytest.raises(ConfigError, match="job_mode"):
        ScoringConfig(job_mode="both")


def test_one_rank_far_off_makes_a_large_job_independent_but_edge_noise_does_not():
    """64 ranks with mean steps: 63 that agree and one 25% slower with as many steps is an
    independent job (98% agree, above the 95% share); a collective's ranks a few percent apart,
    the most a window's edges explain (5.3% measured on an H100), stay a collective."""
    cfg = ScoringConfig()
    rng = np.random.default_rng(3)
    mean = 100.0 * (1 + rng.normal(0, 0.004, 64))
    steps, spread, has = np.full(64, 120.0), np.full(64, 0.6), np.ones(64, bool)
    assert signals.infer_mode(mean, has, cfg, steps, spread) == "collective"
    mean[5] = 125.0
    assert signals.infer_mode(mean, has, cfg, steps, spread) == "independent"
    mean[5] = 106.0                        # off, but within what its edges and the floor allow
    assert signals.infer_mode(mean, has, cfg, steps, spread) == "collective"
    mean[5], steps[5] = 125.0, 6.0         # far off with 6 steps: two edge steps explain it
    assert signals.infer_mode(mean, has, cfg, steps, spread) == "collective"


def test_throttled_sm_clock_is_convicted_and_names_nvml_reasons():
    def rank_of(e, k, rng):
        return Rank(sm_clock=1100 if k == SLOW else int(rng.integers(1960, 1981)))
    ws = windows(5, rank_of, seed=10)
    for w in ws:
        if w.node == f"node-{SLOW}":
            w.processes[0].nvml.clock_event_reasons = 0x40
    engine, results = run(ws)
    assert verdicts(engine)[SLOW] == "straggler" and convicted(results) == {SLOW}
    cause = gpu(engine, SLOW).probable_cause
    assert cause.startswith("SM clock at 56% of its maximum vs 99% job median: throttled GPU")
    assert "hardware thermal slowdown" in cause


def test_marker_is_not_scored_as_an_api_and_graph_launches_count_as_launches():
    cfg = ScoringConfig()
    assert cfg.api_kind("hypertrace_step") == "marker"
    assert cfg.api_kind("cudaGraphLaunch") == "launch"
    _, results = run(windows(3, lambda e, k, rng: Rank()))
    assert not [r for res in results for r in res.rows if r.api == "hypertrace_step"]


def test_report_table_and_json_show_mode_sampling_and_units():
    def rank_of(e, k, rng):
        return Rank(runq_share=0.4 if k == SLOW else 0.002, runq_p50_us=2900.0,
                    peer_wait_ms=0.5 if k == SLOW else 10.0)
    engine, _ = run(windows(5, rank_of, seed=11))
    rep = build_report(engine, now_ns=0)
    text = report_to_table(rep)
    assert "windows scored (5 with a full launch cross-section), mode collective" in text
    row = next(x for x in text.splitlines() if x.startswith(f"node-{SLOW}"))
    assert "run-queue wait 40% of time vs 0.2%" in row
    js = report_to_json(rep)
    assert '"mode": "collective"' in js and '"windows_sampled": 5' in js
    assert '"unit": "share"' in js


# ---- (f) what-if on busy time --------------------------------------------------------------------

def test_what_if_predicts_the_measured_step_less_the_slow_ranks_lead():
    """Collective job: a step ends when the last rank has done its own work and waited for its
    own GPU, then a 0.5-ms collective. The slow rank arrives at 104 + 20 ms, the others at
    80 + 20 ms: the job steps at 124.5 ms now, and at 100.5 ms without the slow rank (the
    slowest remaining rank's arrival plus the collective)."""
    busy_ms, slow_ms, wait_ms, coll_ms = 80.0, 104.0, 20.0, 0.5
    step_ms = slow_ms + wait_ms + coll_ms

    def rank_of(e, k, rng):
        b = slow_ms if k == SLOW else busy_ms
        return Rank(busy_ms=b, gpu_wait_ms=wait_ms, runq_share=0.4 if k == SLOW else 0.002,
                    spread=0.02, steps=200, step_ms=step_ms,
                    peer_wait_ms=step_ms - b - wait_ms)
    engine, _ = run(windows(8, rank_of, seed=12))
    c = build_report(engine, now_ns=0).jobs[0].cluster
    assert c.basis.startswith("step.own: the job's step measured now")
    assert list(c.evicted_nodes) == [f"node-{SLOW}"]
    assert c.step_time_now_us == pytest.approx(step_ms * 1e3, rel=0.01)
    assert c.step_time_after_eviction_us == pytest.approx((busy_ms + wait_ms + coll_ms) * 1e3,
                                                          rel=0.02)
    assert c.predicted_gain == pytest.approx(step_ms / (busy_ms + wait_ms + coll_ms) - 1.0,
                                             abs=0.02)


# ---- (g) launch latency needs the steps' corroboration; sync low never convicts alone -----------

def _independent(slow_launch: dict[int, float], slow_busy: dict[int, float] | None = None,
                 sync_low: dict[int, float] | None = None, refused: bool = False,
                 wait_ms: float = 20.0):
    """Independent ranks (own step times, no peer wait): per rank a launch p50 factor, a busy
    factor and an own-GPU wait factor; ``wait_ms`` a typical rank's wait for its GPU per step
    (20 of 90 ms: GPU-paced; a few ms: launch-bound)."""
    offsets = np.random.default_rng(21).uniform(-0.03, 0.03, RANKS)

    def rank_of(e, k, rng):
        b = (slow_busy or {}).get(k, 1.0)
        w = (sync_low or {}).get(k, 1.0)
        f = 1.0 + offsets[k]
        return Rank(step_ms=(70.0 * b + wait_ms * w) * f / 0.9, busy_ms=70.0 * b * f,
                    gpu_wait_ms=wait_ms * w * f, peer_wait_ms=0.0,
                    launch_us=8.0 * slow_launch.get(k, 1.0) * rng.uniform(0.99, 1.01),
                    runq_share=rng.uniform(0.001, 0.003),
                    refused="no periodic call: too few intervals" if refused else "")
    return rank_of


def test_slow_launches_that_do_not_lengthen_the_step_do_not_convict():
    """As measured on an H200 (independent mode): ranks 1 and 2 launch 17-31% slower and wait
    0.44-0.48x as long in cudaDeviceSynchronize, with the job's step time: healthy."""
    rank_of = _independent({1: 1.25, 2: 1.3}, sync_low={1: 0.45, 2: 0.45})
    engine, results = run(windows(6, rank_of, seed=21))
    assert build_report(engine, now_ns=0).jobs[0].mode == "independent"
    assert set(verdicts(engine).values()) == {"healthy"}
    assert convicted(results) == set()
    rows = [r for res in results for r in res.rows if r.rank in (1, 2)]
    launch = [r for r in rows if r.api == "cudaLaunchKernel" and r.stat == "p50"]
    sync = [r for r in rows if r.api == "cudaDeviceSynchronize" and r.stat == "p50"]
    assert launch and all(r.direction == "high" and r.ratio > 1.15 for r in launch)
    assert sync and all(r.direction == "low" for r in sync)      # still reported, as support
    assert not any(r.implicates for r in launch + sync)


def test_slow_launches_with_longer_own_work_convict():
    rank_of = _independent({SLOW: 1.25}, slow_busy={SLOW: 1.2})
    engine, results = run(windows(6, rank_of, seed=22))
    assert verdicts(engine)[SLOW] == "straggler"
    assert convicted(results) == {SLOW}
    assert any(r.api == "cudaLaunchKernel" and r.implicates and r.rank == SLOW
               for res in results for r in res.rows)


def test_without_step_data_a_launch_bound_ranks_slow_launches_convict():
    """No step data (every window refused), ranks that hardly wait for their GPUs (2 of 72 ms):
    a host 25% slower at launching costs its pace about that much, and its launches convict it;
    the cause quotes the launch numbers."""
    rank_of = _independent({SLOW: 1.25}, refused=True, wait_ms=2.0)
    engine, results = run(windows(6, rank_of, seed=23))
    assert build_report(engine, now_ns=0).jobs[0].mode == ""
    assert verdicts(engine)[SLOW] == "straggler" and convicted(results) == {SLOW}
    cause = gpu(engine, SLOW).probable_cause
    assert cause.startswith("slow cudaLaunchKernel (cudaLaunchKernel p50 10."), cause


def test_arrives_last_alone_never_convicts():
    """Collective job: rank 5's sync waits shortest (it arrives last), nothing else moves."""
    def rank_of(e, k, rng):
        return Rank(gpu_wait_ms=5.0 if k == SLOW else 20.0 * rng.uniform(0.98, 1.02),
                    runq_share=rng.uniform(0.001, 0.003))
    engine, results = run(windows(6, rank_of, seed=24))
    assert verdicts(engine)[SLOW] == "healthy"
    low = [r for res in results for r in res.rows
           if r.rank == SLOW and r.api == "cudaDeviceSynchronize" and r.stat == "p50"]
    assert low and all(r.direction == "low" and not r.implicates for r in low)


# ---- (h) the cause leads with the strongest convicting signal, NVML after it -------------------

def _gpu_plus_30(pcie=None):
    """Collective job, 36 ms steps; rank 5 does 30% more GPU work (waits 18 ms per step on its
    GPU vs 4.8 ms) and shares its CPU a little more (run-queue 32% vs 26%: 6 points, just over
    the 5-point gate). Numbers of the H200 run."""
    def rank_of(e, k, rng):
        p = None if pcie is None else pcie(e, k)
        if k == SLOW:
            return Rank(step_ms=36.0, busy_ms=17.5, gpu_wait_ms=18.0, peer_wait_ms=0.5,
                        runq_share=0.32, runq_p50_us=60.0, pcie_replays=p)
        return Rank(step_ms=36.0, busy_ms=17.5, gpu_wait_ms=4.8 * rng.uniform(0.98, 1.02),
                    peer_wait_ms=13.7 + rng.uniform(-0.3, 0.3),
                    runq_share=0.26 + rng.uniform(-0.01, 0.01), runq_p50_us=50.0,
                    pcie_replays=p)
    return rank_of


def test_cause_leads_with_the_signal_strongest_relative_to_its_gate():
    engine, results = run(windows(6, _gpu_plus_30(), seed=25))
    assert verdicts(engine)[SLOW] == "straggler" and convicted(results) == {SLOW}
    imp = {r.api: r for res in results for r in res.rows if r.rank == SLOW
           and (r.implicates or r.api == "step.gpu_wait")}
    assert {"sched.runq", "step.gpu_wait", "step.own"} <= set(imp)
    assert not imp["step.gpu_wait"].implicates      # it explains; own time and run-queue convict
    assert imp["sched.runq"].strength == pytest.approx(0.06 / 0.05, rel=0.2)
    assert imp["step.gpu_wait"].strength == pytest.approx(13.2 / 1.8, rel=0.1)
    cause = gpu(engine, SLOW).probable_cause
    assert re.match(r"waits 18\.0 ms per step on its own GPU vs 4\.[789] ms job median: GPU side",
                    cause), cause
    assert "GPU side" in cause.split(";")[0]
    assert re.search(r"; also: run-queue wait 32% of wall time vs 2[67]% \(CPU contention\)",
                     cause), cause
    assert "NVML" not in cause


def test_a_pcie_replay_counter_that_does_not_move_is_not_named():
    """Every GPU's counter reads 1 (cumulative since boot; here the ranks share one GPU)."""
    engine, _ = run(windows(6, _gpu_plus_30(lambda e, k: 1), seed=26))
    cause = gpu(engine, SLOW).probable_cause
    assert cause.startswith("waits 18.0 ms per step") and "PCIe" not in cause, cause


def test_a_growing_pcie_replay_counter_is_named_after_the_convicting_signal():
    engine, _ = run(windows(6, _gpu_plus_30(lambda e, k: 1 + 40 * e if k == SLOW else 1),
                            seed=27))
    cause = gpu(engine, SLOW).probable_cause
    assert cause.startswith("waits 18.0 ms per step"), cause
    nvml = cause.index("NVML: PCIe replay counter at 201")
    assert nvml > cause.index("GPU side")


def test_nvml_follows_launch_evidence_when_no_signal_convicts():
    def rank_of(e, k, rng):
        r = _independent({SLOW: 1.3}, refused=True, wait_ms=2.0)(e, k, rng)
        r.pcie_replays = 5 * e if k == SLOW else 0
        return r
    engine, _ = run(windows(6, rank_of, seed=28))
    cause = gpu(engine, SLOW).probable_cause
    assert cause.startswith("slow cudaLaunchKernel") and "; NVML: PCIe replay counter at 25" \
        in cause, cause


# ---- (i) a window whose step inference was refused ---------------------------------------------

def test_refused_step_inference_gives_no_step_values_and_sched_still_scores():
    def rank_of(e, k, rng):
        if k == SLOW:
            return Rank(refused="no regular periodic call", runq_share=0.4, runq_p50_us=2900.0)
        return Rank(runq_share=rng.uniform(0.001, 0.003))
    ws = windows(5, rank_of, seed=29)
    engine, results = run(ws)
    assert verdicts(engine)[SLOW] == "straggler" and convicted(results) == {SLOW}
    rows = [r for res in results for r in res.rows if r.rank == SLOW]
    assert {r.api for r in rows if r.implicates} == {"sched.runq"}
    assert not [r for r in rows if r.api.startswith("step.")]
    assert all(k == "sched.runq" or not k.startswith("step.")
               for r in rows for k in r.evidence)
    # the epoch's step values for that GPU are NaN, the others' finite
    from hypertrace.analyzer.score.cross_section import EpochAccumulator
    acc = EpochAccumulator("job", 0)
    for k, w in enumerate(ws[:RANKS]):
        acc.add_process(k, w.processes[0], w.end.ToNanoseconds())
    cs = acc.build()
    sig = signals.score_signals(cs, ScoringConfig(), [np.arange(RANKS)], np.zeros(RANKS),
                                registry.SIGNALS)
    assert np.isnan(sig.busy_us[SLOW]) and np.isnan(sig.step_us[SLOW])
    assert np.isfinite(np.delete(sig.busy_us, SLOW)).all()
    for name in ("step.busy", "step.time", "step.gpu_wait", "step.peer_wait"):
        assert not sig.by_name[name].scored[SLOW] and np.isnan(sig.by_name[name].value[SLOW])
    assert sig.by_name["sched.runq"].scored[SLOW] and sig.by_name["sched.runq"].high[SLOW]


def test_a_collective_ranks_own_pauses_are_not_its_own_time_per_step():
    """One node pauses in 20% of its steps (a GC burst, window 1). Every rank's steps are
    delayed, the others wait for it, and its own mean time per step is far above the job's;
    but a pause is a spike, not a slow rank: step.own leaves it out (the busy steps beyond
    1.5x the rank's median) and does not flag the node."""
    from hypertrace.sim.simulate import Burst, SimConfig, generate
    cfg = SimConfig(gpus=64, windows=3, seed=4, mode="collective",
                    bursts=(Burst("node-0002", (1,), 0.2, 6.0),))
    e = Engine(ScoringConfig())
    for w in generate(cfg):
        e.ingest(w)
    results = e.flush(now_ns=2**62)
    assert len(results) == 3
    own_rows = [r for res in results for r in res.rows
                if r.api == "step.own" and r.node == "node-0002" and r.direction == "high"]
    assert own_rows == []
