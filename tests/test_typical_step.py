"""An independent rank's steps are read without their spikes (signals._typical_step): through
the real Engine on simulated windows whose steps are spread 3x (p90/p10), as jittered loops'
are. Every quantile of such steps moves with a second mode, so a node whose steps a hiccup
delays in three of five windows must not be convicted, while a GPU doing 15% more work must."""
from __future__ import annotations

import math

import numpy as np

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import EpochAccumulator
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.score.signals import STEP_SPIKE_CUT, _typical_step
from hypertrace.sim.simulate import Burst, SimConfig, Straggler, generate

SIGMA_3X = math.log(3.0) / (2 * 1.2815515655446004)      # lognormal p90/p10 = 3


def _jittered(**kw) -> SimConfig:
    return SimConfig(gpus=128, windows=6, seed=11, mode="independent", step_ms=25.0,
                     step_sigma=SIGMA_3X, busy_sigma=SIGMA_3X, **kw)


def _stragglers(cfg: SimConfig) -> set[str]:
    e = Engine(ScoringConfig())
    for w in generate(cfg):
        e.ingest(w)
    return {node for r in e.flush() for (node, _), v in r.verdicts.items() if v == "straggler"}


def test_a_node_whose_steps_hiccup_in_three_of_five_windows_is_not_convicted():
    """A fifth of node-0003's steps (and calls) 4x slower in windows 1, 2 and 4: its step p50
    moves ~14% there (what convicted it when own time was read from the p50); its typical step
    does not."""
    hiccup = Burst("node-0003", (1, 2, 4), frac=0.2, scale=4.0)
    assert _stragglers(_jittered(bursts=(hiccup,))) == set()


def test_a_gpu_doing_more_work_is_still_convicted_among_3x_spread_steps():
    slow = Straggler("node-0005", 1.0 + 0.15 / 0.9, gpus=(2,), where="compute")
    assert _stragglers(_jittered(stragglers=(slow,))) == {"node-0005"}


def test_the_typical_step_is_the_mean_without_the_steps_from_twice_the_peers_median_on():
    """100 steps of 20 ms and 10 of 100 ms: the mean is 27.3 ms, the typical step 20 ms (the
    cut steps' sum read from the histogram's midpoints: within 10 x a half bucket, 3%)."""
    from hypertrace.proto import buckets, wire
    from hypertrace.proto import hypertrace_pb2 as pb
    steps_ns = np.r_[np.full(100, 20e6), np.full(10, 100e6)]
    p = pb.ProcessWindow(job_id="j", rank=0, gpu_index=0, pid=1)
    p.step_time.CopyFrom(wire.pack_histogram(buckets.histogram_of_ns(steps_ns)))
    acc = EpochAccumulator("j", 1)
    acc.add_process(0, p)
    h = acc.build().step_time
    mean = np.array([steps_ns.sum() / 1e3 / steps_ns.size])
    got = _typical_step(h, h.quantiles_us([0.5])[:, 0], h.total(), mean, [np.arange(1)],
                        ScoringConfig())
    assert STEP_SPIKE_CUT == 2.0
    assert abs(got[0] - 20_000.0) / 20_000.0 < 0.03, got
    # without a histogram: the p50 (here none either, the mean)
    assert _typical_step(None, np.array([np.nan]), np.array([0.0]), mean, [np.arange(1)],
                         ScoringConfig())[0] == mean[0]
