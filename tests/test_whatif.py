"""The what-if prediction on step times: evicting a slow node predicts the step the remaining
ranks run at.

Simulated windows carry per-rank step statistics (step sums, waits, step-time histograms); the
simulator knows each rank's true time to the step's end (:func:`~hypertrace.sim.simulate.
true_step_ms`). These tests run the real simulator and the real Engine, and read the report a
user would read.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import report_to_table
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.cli.main import main
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import write_jsonl
from hypertrace.sim import scenarios
from hypertrace.sim.simulate import SimConfig, Straggler, generate

BASE = dict(gpus=256, gpus_per_node=8, windows=6, seed=5)


def _report(cfg: SimConfig, **scoring) -> pb.Report:
    engine = Engine(ScoringConfig(**scoring))
    for w in generate(cfg):
        engine.ingest(w)
    engine.flush(None)
    return build_report(engine, now_ns=0)


@pytest.fixture(scope="module")
def slow() -> pb.Report:
    return _report(SimConfig(**BASE, stragglers=(Straggler("node-0013", 1.10),)))


@pytest.fixture(scope="module")
def clean() -> pb.Report:
    return _report(SimConfig(**BASE))


def test_simulated_windows_carry_step_times():
    w = next(generate(SimConfig(gpus=8, gpus_per_node=8, windows=1, seed=1)))
    h = w.processes[0].step_time
    assert h.scheme == 1 and 50 <= sum(h.counts) <= 150          # ~100 steps of ~100 ms
    assert SimConfig(gpus=8, windows=1).step_ms == 100.0
    off = next(generate(SimConfig(gpus=8, gpus_per_node=8, windows=1, seed=1, step_ms=0)))
    assert not off.processes[0].HasField("step_time")
    # the step draws have their own stream: the API histograms do not move
    assert list(off.processes[0].apis) == list(w.processes[0].apis)


def test_evicting_a_10pct_slow_node_predicts_a_gain_close_to_10pct(slow):
    job = slow.jobs[0]
    assert [n.node for n in job.nodes if n.verdict == "straggler"] == ["node-0013"]
    c = job.cluster
    # a collective job: the measured step, less what the slow node's own time adds
    assert c.basis.startswith("step.own")
    assert list(c.evicted_nodes) == ["node-0013"]
    assert c.step_time_after_eviction_us < c.step_time_now_us
    assert 0.05 < c.predicted_gain < 0.15
    assert c.predicted_gain == pytest.approx(c.step_time_now_us / c.step_time_after_eviction_us
                                             - 1.0)
    assert 90_000 < c.step_time_after_eviction_us < 125_000          # ~100 ms steps


@pytest.mark.parametrize("mode", ["collective", "independent"])
@pytest.mark.parametrize("scenario,gpus", [("gpu-slow", 64), ("cpu-hog", 256), ("host-10", 256)])
def test_the_step_after_eviction_is_the_remaining_ranks_true_step(scenario, gpus, mode):
    """Within 5% of the step the ranks that stay really run at (spikes left out), in both
    modes, with the catalog's wide noise; E[max] of per-step histograms read 19-31% high on an
    H200 and several times the step at 512 simulated ranks."""
    from hypertrace.sim.simulate import true_step_ms
    cfg = replace(scenarios.get(scenario).config(gpus, 8, 10, seed=31), mode=mode)
    job = _report(cfg).jobs[0]
    c = job.cluster
    assert c.evicted_nodes and job.mode == mode
    assert c.basis.startswith("step.own" if mode == "collective" else "step.time")
    now, after = true_step_ms(cfg), true_step_ms(cfg, c.evicted_nodes)
    assert c.step_time_after_eviction_us / 1e3 == pytest.approx(after, rel=0.05)
    assert c.step_time_now_us / 1e3 == pytest.approx(now, rel=0.05)
    assert c.predicted_gain == pytest.approx(now / after - 1.0, abs=0.05)


@pytest.mark.parametrize("spread,gpus", [("2x", 64), ("3x", 512)])
def test_the_what_if_of_a_jittered_collective_is_the_expected_last_arrival(spread, gpus):
    """Ranks whose own time varies 17% from step to step on its own, and steps that spread 2x
    or 3x together, one rank 15% of a step slower: each step waits for its slowest draw, so
    evicting the slow rank shortens the step by less than its mean lead. Within 5% of the
    remaining ranks' true step, where the ranks' mean lead read 8.6% short on an H100."""
    from hypertrace.sim.simulate import true_step_ms
    base = scenarios.get(f"jitter-{spread}").config(gpus, 8, 10, seed=31)
    cfg = replace(base, mode="collective", own_sigma=scenarios.JITTER_OWN_SIGMA,
                  busy_sigma=scenarios.JITTER_OWN_SIGMA)
    job = _report(cfg).jobs[0]
    c = job.cluster
    assert c.evicted_nodes and job.mode == "collective"
    now, after = true_step_ms(cfg), true_step_ms(cfg, c.evicted_nodes)
    assert c.step_time_after_eviction_us / 1e3 == pytest.approx(after, rel=0.05)
    lead = cfg.step_ms * 0.15
    assert (now - after) < 0.7 * lead                   # the truth itself: far less than the lead
    assert c.step_time_now_us - c.step_time_after_eviction_us < 0.7 * lead * 1e3


def test_clean_job_predicts_no_gain(clean):
    c = clean.jobs[0].cluster
    assert c.basis.startswith("step.own") and not c.evicted_nodes
    assert c.step_time_now_us == c.step_time_after_eviction_us and c.predicted_gain == 0.0
    assert c.spike_probability == 0.0


def test_a_slow_launcher_whose_gpu_sets_the_pace_is_not_convicted_and_gains_nothing():
    # a slow host whose GPU work is normal (deep queue) does not lengthen the step: not a
    # straggler under the 5% contract, and evicting it would gain nothing
    cfg = SimConfig(**BASE, stragglers=(Straggler("node-0013", 1.10, where="host"),))
    job = _report(cfg).jobs[0]
    assert [n.node for n in job.nodes if n.verdict == "straggler"] == []
    assert job.cluster.predicted_gain == 0.0 and not job.cluster.evicted_nodes


def test_spike_rates_come_from_steps_and_stragglers_are_not_spikes():
    cfg = scenarios.get("gc-spikes").config(gpus=128, windows=8, seed=0, wide=False)
    gc = _report(cfg).jobs[0]
    # a collective step ends with its last rank: every rank's steps hold the GCs of all 16 nodes
    # (each in its GC window 1 in 4, 5% of its steps): 1 - 0.95^4 = 18.5% of the job's steps
    rates = sorted(g.spike_rate for n in gc.nodes for g in n.gpus)
    assert 0.12 < rates[0] <= rates[-1] < 0.25
    assert gc.mode == "collective" and gc.cluster.spike_basis.startswith("measured")
    assert gc.cluster.spike_probability == pytest.approx(sum(rates) / len(rates), rel=0.02)
    assert "share of steps" in gc.cluster.basis
    ind = _report(replace(cfg, mode="independent"), job_mode="independent").jobs[0]
    rates = sorted(g.spike_rate for n in ind.nodes for g in n.gpus)
    assert 0.005 < rates[len(rates) // 2] < 0.03        # each rank only its own GC windows
    assert ind.cluster.spike_basis.startswith("model") and "independent" in ind.cluster.spike_basis
    assert 0.5 < ind.cluster.spike_probability < 1.0    # 1 - (1 - p)^128
    big = _report(SimConfig(gpus=128, gpus_per_node=8, windows=4, seed=2,
                            stragglers=(Straggler("node-0003", 1.30),))).jobs[0]
    assert max(g.spike_rate for n in big.nodes for g in n.gpus) == 0.0
    assert big.cluster.spike_probability == 0.0 and big.cluster.predicted_gain > 0.15


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_spike_probability_of_a_clean_collective_job_is_the_share_of_spiked_steps(seed):
    """Measured, not multiplied: with the same hiccups and tails, seeds agree with the truth.

    The simulated job has rack hiccups (fixed rate) and a Pareto step tail; the truth is the
    share of the job's steps that any of those delays (the simulator's own event list). The
    measure counts the spikes drawn, so it may differ from that expectation by the binomial
    noise of the steps' count: three standard errors."""
    from hypertrace.sim.simulate import job_step_bursts, step_model
    cfg = replace(SimConfig(gpus=256, gpus_per_node=8, windows=16, seed=seed), hiccup_prob=0.02,
                  step_tail_prob=0.005, step_tail_scale=2.0)
    bursts = job_step_bursts(cfg)                     # None: no hiccup in this seed
    frac = bursts[0][:, 0] if bursts is not None else np.zeros(cfg.windows)
    steps = step_model(cfg).steps[:, 0]
    truth = float(((1 - (1 - frac) * (1 - cfg.step_tail_prob)) * steps).sum() / steps.sum())
    c = _report(cfg).jobs[0].cluster
    noise = 3.0 * float(np.sqrt(truth * (1.0 - truth) / steps.sum()))
    assert c.spike_probability == pytest.approx(truth, abs=max(noise, 0.002))
    assert c.spike_probability < 0.2                 # not 1 - (1 - p)^256, which reads ~1


def _cluster_text(report) -> str:
    """The what-if paragraph, unwrapped (the table wraps it at 100 columns)."""
    text = report_to_table(report)
    return " ".join(text[text.index("cluster:"):].split("spike rate per GPU")[0].split())


def test_table_shows_the_what_if_line(slow, clean):
    line = _cluster_text(slow)
    assert "expected step" in line and " ms now" in line
    assert "ms after evicting node-0013 (predicted gain +" in line
    line = _cluster_text(clean)
    assert "no straggler to evict" in line and "after evicting" not in line


def test_predict_uses_step_times_of_simulated_windows(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    with open(path, "w") as fh:
        write_jsonl(generate(scenarios.get("gc-spikes").config(gpus=16, windows=8, seed=1)), fh)
    assert main(["predict", "--histogram", str(path), "--nodes", "1,64,512,2048",
                 "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["histogram"]
    assert h["basis"] == "step_time" and 90_000 < h["p50_us"] < 110_000
    emax = [r["expected_max_us"] for r in h["predictions"]]
    assert emax == sorted(emax) and emax[-1] > 2 * emax[0]   # GC spikes dominate large jobs
    p = [r["p_cluster_spike"] for r in h["predictions"]]
    assert p == sorted(p) and p[-1] > 0.9


def test_a_one_node_job_never_gets_an_eviction_prediction():
    """Evicting the only node leaves no job to predict a step time for (it used to say NaN)."""
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.score.engine import Engine
    from hypertrace.sim import simulate
    from hypertrace.sim.simulate import SimConfig, Straggler
    cfg = SimConfig(gpus=8, windows=8, seed=2,
                    stragglers=(Straggler("node-0000", 1.6, where="cpu", gpus=(5,)),))
    e = Engine(ScoringConfig())
    for w in simulate.generate(cfg):
        e.ingest(w)
    e.flush(now_ns=2**62)
    job = build_report(e).jobs[0]
    assert job.nodes[0].verdict == "straggler"          # the slow GPU is still named
    c = job.cluster
    assert list(c.evicted_nodes) == []
    assert c.predicted_gain == 0.0 and c.step_time_after_eviction_us == c.step_time_now_us > 0
    assert "no eviction predicted" in c.basis


def test_the_step_curve_passes_through_the_measured_what_if_and_grows_with_the_job():
    """analyzer/whatif_curve.step_curve: at the job's own size it is the measured what-if (now,
    after); more ranks draw a slower maximum from the ranks' own times, fewer a faster one; and
    after evicting the slow rank the curve lies below the one with it."""
    from hypertrace.analyzer.report import whatif_curve
    rows = np.arange(8)
    own = np.array([100.0, 101, 99, 102, 100, 98, 130, 101])
    epochs = [(rows, np.full(8, 50), np.full(8, 131.0), own)]
    evict = rows == 6
    curve = whatif_curve.step_curve(epochs, rows, evict, True, 131.0, 103.0)
    at = {n: (a, b) for n, a, b in curve}
    assert at[8] == pytest.approx((131.0, 103.0))
    sizes = sorted(at)
    assert all(at[m][0] >= at[n][0] for n, m in zip(sizes, sizes[1:]))
    assert all(a >= b for a, b in at.values())
    assert at[1][0] < at[8][0]


def test_independent_ranks_that_wait_off_cpu_keep_their_pace_in_the_what_if():
    """Ranks that wait for nobody but spend most of each step off-CPU outside CUDA (a loop
    that sleeps, a queue it waits on) read that time as a wait, so their own time is a tenth of
    their step. Their step is still their pace: the what-if must not take every step for a
    spike (it predicted 0.02 ms for a stand-in loop of 8-ms steps)."""
    from hypertrace.sim.simulate import true_step_ms
    cfg = replace(scenarios.get("gpu-slow").config(64, 8, 10, seed=31), mode="independent")
    engine = Engine(ScoringConfig())
    for w in generate(cfg):
        for p in w.processes:
            if p.HasField("steps") and p.steps.steps:
                p.steps.peer_wait_us = 0.9 * p.steps.step_sum_us
        engine.ingest(w)
    engine.flush(None)
    job = build_report(engine, now_ns=0).jobs[0]
    c = job.cluster
    assert job.mode == "independent" and c.evicted_nodes
    now, after = true_step_ms(cfg), true_step_ms(cfg, c.evicted_nodes)
    assert c.step_time_now_us / 1e3 == pytest.approx(now, rel=0.05)
    assert c.step_time_after_eviction_us / 1e3 == pytest.approx(after, rel=0.05)
