"""Without step data, the rank the job waits for convicts by its synchronize time: through the
real Engine, on hand-built windows of 8 ranks (one per node) that carry launch and synchronize
latencies, scheduler evidence and probe tiers, and no step records (an agent that found no
step). The synchronize API is in the always tier, so its calls count over the whole window.

The rule (analyzer/score/sync_share.py): the job's median share of wall time in synchronize calls
less the rank's is at least ``min_effect``, its waits are shorter across the board (the deciles
of its synchronize time), and it keeps the job's launch pace.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from test_signals import WINDOW_S, run, verdicts
from test_signals import windows as signals_windows

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import report_to_table
from hypertrace.analyzer.score import sync_share
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import EpochAccumulator
from hypertrace.proto import buckets, wire
from hypertrace.proto import hypertrace_pb2 as pb

RANKS = 8
SLOW = 5
ATTACHED_S = 2.0


@dataclass
class Rank:
    """One rank's window: its waiting synchronize calls (count, median wait in ms), the idle
    ones that find the stream done, and its launches (count over ``ATTACHED_S``)."""

    waits: int = 200
    wait_ms: float = 10.0
    idle: int = 300
    launches: int = 5000
    tail: int = 0                   # waits of 0.1-0.3 s (its own hiccups: a heavy tail)
    steps: bool = False             # the agent found the steps (50 ms each)


def _process(rank: int, r: Rank, rng: np.random.Generator) -> pb.ProcessWindow:
    p = pb.ProcessWindow(job_id="job", rank=rank, local_rank=0, gpu_index=0, pid=1000 + rank,
                         gpu_kind="NVIDIA H200")
    p.apis.append(wire.api_stats_from_ns(
        "cudaLaunchKernel", rng.lognormal(math.log(8e3), 0.2, r.launches)))
    sync = np.concatenate((rng.lognormal(math.log(r.wait_ms * 1e6), 0.2, r.waits),
                           rng.lognormal(math.log(8e3), 0.2, r.idle),
                           rng.uniform(1e8, 3e8, r.tail)))
    p.apis.append(wire.api_stats_from_ns("cudaStreamSynchronize", sync))
    if r.steps:
        step = rng.normal(50e6, 0.5e6, r.waits)
        p.step_time.CopyFrom(wire.pack_histogram(buckets.histogram_of_ns(step)))
        p.steps.CopyFrom(pb.StepStats(
            source="inferred:cudaStreamSynchronize", steps=r.waits,
            busy_time=wire.pack_histogram(buckets.histogram_of_ns(step - r.wait_ms * 1e6)),
            gpu_wait_us=r.waits * r.wait_ms * 1e3, peer_wait_us=0.0,
            step_sum_us=float(step.sum() / 1e3)))
    p.sched.CopyFrom(pb.SchedStats(runq_ns=int(0.002 * WINDOW_S * 1e9), window_s=WINDOW_S,
                                   voluntary_switches=r.waits))
    p.overhead.CopyFrom(pb.Overhead(
        sampled=True, attached_s=ATTACHED_S, budget=0.005,
        tiers=[pb.ApiTier(api="cudaLaunchKernel", tier="sliced",
                          rate_hz=r.launches / ATTACHED_S),
               pb.ApiTier(api="cudaStreamSynchronize", tier="always",
                          rate_hz=(r.waits + r.idle) / WINDOW_S)]))
    return p


def windows(epochs: int, rank_of, seed: int = 0, ranks: int = RANKS) -> list[pb.NodeWindow]:
    """test_signals' windows of this module's processes (the same 10-s window, one node each)."""
    return signals_windows(epochs, rank_of, seed, ranks, process=_process)


def share_rows(results, rank: int) -> list:
    return [r for res in results for r in res.rows
            if r.rank == rank and r.api == sync_share.SIGNAL]


def healthy(rng: np.random.Generator, wait_ms: float = 10.0) -> Rank:
    return Rank(wait_ms=wait_ms * rng.uniform(0.97, 1.03))


def test_the_rank_everybody_waits_for_is_convicted_by_its_synchronize_time():
    """Its waits 0.3x the job's: the others wait ~14% of their time for it (200 waits of 10 ms
    against 3 ms in a 10-s window)."""
    def rank_of(e, k, rng):
        return Rank(wait_ms=3.0) if k == SLOW else healthy(rng)
    engine, results = run(windows(5, rank_of, seed=1))
    assert build_report(engine, now_ns=0).jobs[0].mode == ""              # no step data
    v = verdicts(engine)
    assert v[SLOW] == "straggler" and all(v[k] == "healthy" for k in v if k != SLOW), v
    rows = share_rows(results, SLOW)
    assert rows and all(r.direction == "low" and r.implicates for r in rows)
    # its effect in step terms: the time per second the job waits for it
    assert all(0.12 <= r.step_share <= 0.16 for r in rows), [r.step_share for r in rows]
    job = build_report(engine, now_ns=0).jobs[0]
    cause = next(g for n in job.nodes for g in n.gpus if g.rank == SLOW).probable_cause
    assert cause.startswith("spends 6.") and "the rank the others wait for" in cause, cause
    assert "shorter across the board" in cause and "no step data" in cause, cause
    assert "synchronize time" in report_to_table(build_report(engine, now_ns=0))


def test_a_two_percent_slow_rank_is_not_convicted_though_its_waits_are_far_shorter():
    """Waits of 2 ms, the slow rank's 1.6 ms (0.8x: its wait shrinks faster than its work
    grows): the job waits 200 x 0.4 ms per 10 s for it, 0.8% of its time, under the 5% gate."""
    def rank_of(e, k, rng):
        return Rank(wait_ms=1.6) if k == SLOW else healthy(rng, 2.0)
    engine, results = run(windows(6, rank_of, seed=2))
    assert verdicts(engine)[SLOW] == "healthy"
    assert not any(r.implicates for r in share_rows(results, SLOW))


def test_fewer_waits_of_the_same_length_are_not_a_rank_the_job_waits_for():
    """Half the waiting calls, each as long as the job's (and as many calls in all: more of them
    find the stream idle): a low share, an unmoved shape."""
    def rank_of(e, k, rng):
        return Rank(waits=100, idle=400) if k == SLOW else healthy(rng)
    engine, results = run(windows(6, rank_of, seed=3))
    rows = share_rows(results, SLOW)
    assert rows and all(r.direction == "low" and not r.implicates for r in rows)
    assert verdicts(engine)[SLOW] == "healthy"


def test_a_rank_that_runs_ahead_of_the_job_is_fast_not_waited_for():
    """Without steps, 24 ranks that synchronize in step but one: the fast rank waits less but
    makes 30% more waiting calls (it runs ahead); the waited-for rank of a collective
    synchronizes as often as the others."""
    def rank_of(e, k, rng):
        return Rank(wait_ms=3.0, waits=260, launches=6500) if k == SLOW else healthy(rng)
    engine, results = run(windows(6, rank_of, seed=4, ranks=24))
    rows = share_rows(results, SLOW)
    assert rows and all(r.direction == "low" and not r.implicates for r in rows)
    assert verdicts(engine)[SLOW] == "healthy"


def test_a_rank_without_the_job_s_heavy_tail_is_not_waited_for():
    """Every other rank has ten waits of 0.1-0.3 s among its 500 calls (its own hiccups: half
    of its synchronize time); one rank drew none. Waits from 8x the peers' 10th percentile of
    synchronize time on are spikes, left out, so its share matches the job's."""
    def rank_of(e, k, rng):
        return Rank() if k == SLOW else Rank(wait_ms=10.0 * rng.uniform(0.97, 1.03), tail=10)
    engine, results = run(windows(6, rank_of, seed=5))
    assert not any(r.implicates for r in share_rows(results, SLOW))
    assert all(v == "healthy" for v in verdicts(engine).values())


def test_ranks_that_do_not_synchronize_in_step_are_not_a_collective():
    """Each rank makes its own number of synchronize calls (an independent job, its GPUs
    spread 6%): a shorter wait does not mean anybody waits for it, and nothing is convicted."""
    def rank_of(e, k, rng):
        r = Rank(wait_ms=3.0) if k == SLOW else healthy(rng)
        r.waits = int(200 * (1.0 + 0.03 * (k - 3.5)))
        return r
    engine, results = run(windows(5, rank_of, seed=11))
    rows = share_rows(results, SLOW)
    assert rows and all(r.direction == "low" and not r.implicates for r in rows)
    assert verdicts(engine)[SLOW] == "healthy"


def test_in_an_independent_job_the_rule_does_not_apply():
    """The same pattern read as an independent job (job_mode) is not scored: nobody waits for
    anybody there."""
    def rank_of(e, k, rng):
        return Rank(wait_ms=3.0) if k == SLOW else healthy(rng)
    engine, results = run(windows(5, rank_of, seed=6), ScoringConfig(job_mode="independent"))
    assert not share_rows(results, SLOW) and verdicts(engine)[SLOW] == "healthy"


def test_with_step_data_the_steps_decide_not_the_synchronize_time():
    """The same waits with step records (equal steps, the slow rank's own time no longer): no
    synchronize-share finding at all; its shorter waits stay what they were, support."""
    def rank_of(e, k, rng):
        r = Rank(wait_ms=3.0) if k == SLOW else healthy(rng)
        r.steps = True
        return r
    engine, results = run(windows(5, rank_of, seed=6))
    assert build_report(engine, now_ns=0).jobs[0].mode != ""
    assert not share_rows(results, SLOW) and verdicts(engine)[SLOW] == "healthy"


def test_always_tier_calls_count_over_the_window_sliced_ones_over_the_slice():
    """measure(): 200 calls of 10 ms in the always tier over a 10-s window are 20% of wall
    time; the same calls counted in a 2-s slice are 100%. The shares come from bucket
    midpoints, within a bucket's width."""
    rng = np.random.default_rng(7)
    acc = EpochAccumulator("job", 1)
    for row, tier in enumerate(("always", "sliced")):
        p = _process(row, Rank(idle=0), rng)
        p.overhead.tiers[1].tier = tier
        acc.add_process(row, p)
    cs = acc.build()
    got = sync_share.measure(cs, ScoringConfig(), [np.arange(2)])
    assert cs.always_s["cudaStreamSynchronize"].tolist() == [WINDOW_S, 0.0]
    assert got.share[0] == pytest.approx(0.2, rel=0.07)
    assert got.share[1] == pytest.approx(1.0, rel=0.07)
    assert got.calls.tolist() == [200, 200]


def test_spikes_are_left_out_of_the_share():
    """Four GPUs wait 200 x 10 ms; one of them also has ten waits of 0.1-0.3 s (as much time
    again): they are beyond the spike cut, so its share is the others'."""
    rng = np.random.default_rng(9)
    acc = EpochAccumulator("job", 1)
    for row in range(4):
        acc.add_process(row, _process(row, Rank(idle=0, tail=10 if row == 0 else 0), rng))
    got = sync_share.measure(acc.build(), ScoringConfig(), [np.arange(4)])
    assert got.share[0] == pytest.approx(np.median(got.share[1:]), rel=0.05)
    assert got.calls[0] == 210


def test_the_always_tier_seconds_survive_a_worker_s_accumulator():
    """EpochAccumulator.extend (a worker process's accumulator merged into the job's) keeps
    the always-tier seconds, renumbered to the job's rows."""
    rng = np.random.default_rng(8)
    part = EpochAccumulator("job", 1)
    part.add_process(0, _process(0, Rank(), rng))
    whole = EpochAccumulator("job", 1)
    whole.add_process(0, _process(0, Rank(), rng))
    whole.extend(part, np.array([3]))
    cs = whole.build()
    assert cs.rows.tolist() == [0, 3]
    assert cs.always_s["cudaStreamSynchronize"].tolist() == [WINDOW_S, WINDOW_S]


@pytest.mark.parametrize("slow_has_steps", [True, False])
def test_in_a_job_where_some_ranks_have_steps_only_those_without_are_judged_so(slow_has_steps):
    """Ranks 4-7 report steps (their agents found them), 0-3 do not; the ranks without steps
    are compared by their synchronize time among themselves, the others are judged by their
    steps. Rank 5 (with steps) or rank 2 (without) is the one everybody waits for."""
    slow = SLOW if slow_has_steps else 2

    def rank_of(e, k, rng):
        r = Rank(wait_ms=3.0) if k == slow else healthy(rng)
        r.steps = k >= 4
        return r
    engine, results = run(windows(5, rank_of, seed=10))
    rows = share_rows(results, slow)
    if slow_has_steps:
        assert not rows and verdicts(engine)[slow] == "healthy"
    else:
        assert rows and all(r.implicates for r in rows)
        assert verdicts(engine)[slow] == "straggler"


def test_a_launch_ratio_within_its_group_s_noise_costs_no_pace():
    """Without steps a GPU's launch p50 over its group's stands for its whole CPU side
    (signals.launch_effect), less the group's own spread of launch p50s: a GPU 6% slower at
    launching among peers that spread about 3% has no effect of ``min_effect``; one 12% slower
    among the same peers has, and a tight group leaves the 6% one its full 6%."""
    from hypertrace.analyzer.score.signals import LAUNCH_NOISE_SIGMAS, launch_effect
    rng = np.random.default_rng(3)
    spread = 0.03
    peers = 1.0 + spread * rng.standard_normal(63)
    group = [np.arange(64)]
    no_wait = np.zeros(64)                       # a launch-bound group: no slack hides the excess

    def effect_of(ratio: float, peer_ratios: np.ndarray) -> float:
        p50 = 7.0 * np.r_[peer_ratios, ratio]
        return float(launch_effect(p50, no_wait, group, min_effect=0.05,
                                   noise_sigmas=LAUNCH_NOISE_SIGMAS)[-1])
    assert LAUNCH_NOISE_SIGMAS > 0
    assert effect_of(1.06, peers) < 0.05
    assert effect_of(1.12, peers) >= 0.05
    tight = 1.0 + 0.002 * rng.standard_normal(63)
    assert effect_of(1.06, tight) == pytest.approx(0.06, abs=0.005)
