"""One quantile never convicts alone: the whole-distribution shift (analyzer/score/shift.py)."""
from dataclasses import replace

import numpy as np
import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import Hists
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.score.shift import pooled_deciles, shift_ratios
from hypertrace.sim import scenarios, simulate
from hypertrace.sim.simulate import SimConfig, Straggler


def _hists(cfg: SimConfig, api: str = "cudaLaunchKernel") -> Hists:
    counts = simulate.simulate_counts(cfg)[api].sum(axis=0).astype(np.float64)   # (G, B)
    return Hists(np.ascontiguousarray(counts.T), 0)


def test_a_slow_host_shifts_its_whole_distribution_by_its_factor():
    cfg = SimConfig(gpus=64, windows=4, seed=3, step_ms=0,
                    stragglers=(Straggler("node-0002", 1.10, where="host"),))
    r = shift_ratios(_hists(cfg), np.arange(64), pooled_deciles(_hists(cfg)))
    slow, rest = r[16:24], np.delete(r, np.arange(16, 24))
    # (the pooled reference holds the slow host too, an eighth of it: ~1% of bias, plus each
    # node's own jitter)
    assert np.all(np.abs(slow - 1.10) < 0.03), slow
    assert np.all(np.abs(rest - 1.0) < 0.03), rest
    assert slow.min() > rest.max() + 0.05


def test_a_different_kernel_mix_moves_the_p50_not_the_shift():
    cfg = SimConfig(gpus=64, windows=4, seed=3, step_ms=0, mix_share=0.47)
    h = _hists(cfg)
    p50 = h.quantiles_us([0.5])[:, 0]
    pooled = Hists(h.counts_t.sum(axis=1, keepdims=True), 0).quantiles_us([0.5])[0, 0]
    ratio = p50 / pooled
    assert ratio.max() / ratio.min() > 1.3               # the p50s spread between the modes
    shift = shift_ratios(h, np.arange(64), pooled_deciles(h, np.arange(64)))
    assert shift.max() / shift.min() < 1.06 and np.all(np.abs(shift - 1.0) < 0.04)


def test_each_gpus_shift_and_the_whole_class_reference_do_not_depend_on_what_is_read_with_them():
    # the engine reads the flagged GPUs and the flagged hosts' GPUs in one call, and the pooled
    # reference of a whole class by a matrix-vector product: the same numbers as one by one
    cfg = SimConfig(gpus=64, windows=4, seed=3, step_ms=0,
                    stragglers=(Straggler("node-0002", 1.10, where="host"),))
    h = _hists(cfg)
    ref = pooled_deciles(h)
    by_columns = pooled_deciles(h, np.arange(64))
    assert ref.cut == by_columns.cut and np.array_equal(ref.deciles, by_columns.deciles)
    assert np.array_equal(ref.whole, by_columns.whole)
    cols = np.array([3, 17, 16, 18, 19, 40])
    together = shift_ratios(h, cols, ref)
    alone = np.concatenate([shift_ratios(h, cols[i:i + 1], ref) for i in range(cols.size)])
    assert np.array_equal(together, alone)


def test_a_gpu_without_samples_has_no_shift():
    h = Hists(np.zeros((5, 3)), 40)
    h.counts_t[2, :2] = 100
    r = shift_ratios(h, np.arange(3), pooled_deciles(h))
    assert np.isfinite(r[:2]).all() and np.isnan(r[2])


def _stragglers(cfg: SimConfig) -> set[str]:
    e = Engine(ScoringConfig())
    for w in simulate.generate(cfg):
        e.ingest(w)
    e.flush(now_ns=2**62)
    return {n.node for n in build_report(e).jobs[0].nodes if n.verdict == "straggler"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_mix_jobs_convict_nobody_even_without_step_data(seed):
    """Without steps, launch latency convicts on its own: that is where a p50 between two modes
    used to convict 5-11 healthy GPUs per job."""
    cfg = replace(scenarios.get("kernel-mix").config(gpus=256, seed=seed, windows=10),
                  step_ms=0, mix_share=0.47)
    assert _stragglers(cfg) == set()


def test_a_slow_host_is_still_convicted_when_its_shift_backs_the_p50():
    cfg = SimConfig(gpus=128, windows=10, seed=4, step_ms=0,
                    stragglers=(Straggler("node-0005", 1.05, where="host"),))
    assert _stragglers(cfg) == {"node-0005"}


def test_a_launch_finding_quotes_all_the_time_its_host_adds_to_a_step():
    """The CPU issues a step's work in 80 ms, the GPU works 90 ms. A host 30% slower at
    launching issues it in 104 ms: its own time per step grows by about 14 ms of a 100-ms step.
    The finding and the cause quote that, not the time inside the launch calls (about 0.3% of
    a step). A host 12% slower in the same job issues its work in 90 ms: the GPU still sets the
    pace, its steps grow under 1%, and it is not convicted."""
    cfg = SimConfig(gpus=128, windows=8, seed=3, busy_frac=0.8,
                    stragglers=(Straggler("node-0005", 1.30, where="host"),))
    e = Engine(ScoringConfig())
    for w in simulate.generate(cfg):
        e.ingest(w)
    e.flush(now_ns=2**62)
    node = next(n for n in build_report(e).jobs[0].nodes if n.node == "node-0005")
    assert node.verdict == "straggler"
    f = next(f for f in node.gpus[0].findings if f.api == "cudaLaunchKernel" and f.stat == "p50")
    assert f.HasField("step_share") and 0.11 <= f.step_share <= 0.17, f
    assert "of a step" in node.probable_cause
    # without step data there is no step to express it in: the field stays unset
    bare = Engine(ScoringConfig())
    for w in simulate.generate(replace(cfg, step_ms=0)):
        bare.ingest(w)
    bare.flush(now_ns=2**62)
    node = next(n for n in build_report(bare).jobs[0].nodes if n.node == "node-0005")
    assert not any(f.HasField("step_share") for f in node.gpus[0].findings)
    assert "of a step" not in node.probable_cause
    assert _stragglers(replace(cfg, stragglers=(Straggler("node-0005", 1.12,
                                                          where="host"),))) == set()


def test_a_hiccup_is_cut_off_as_a_spike_while_a_true_slowdown_still_shifts():
    """A rack's hiccup puts 20% of a GPU's calls 5x slower: every decile above the 20th moves,
    but those calls lie above twice the peers' median and are cut off before the deciles are
    read. A 6%-slow host is not cut: its whole body moved."""
    hit = simulate.Burst("node-0001", (0, 1, 2, 3), frac=0.20, scale=5.0)
    cfg = SimConfig(gpus=64, windows=4, seed=3, step_ms=0, bursts=(hit,),
                    stragglers=(Straggler("node-0003", 1.06, where="host"),))
    h = _hists(cfg)
    r = shift_ratios(h, np.arange(64), pooled_deciles(h))
    hiccup, slow = r[8:16], r[24:32]
    assert np.all(hiccup < 1.03), hiccup
    assert np.all(slow > 1.04), slow
    p80 = h.quantiles_us([0.8])[:, 0]
    assert np.median(p80[8:16]) > 1.5 * np.median(p80)      # the raw upper deciles did move


def test_a_gpu_mostly_above_the_cut_is_slow_not_spiking():
    """More than half of its calls above twice the peers' median: the GPU is that slow (2.5x),
    and its shift is read from all of its calls against all of the peers'."""
    cfg = SimConfig(gpus=64, windows=4, seed=3, step_ms=0,
                    stragglers=(Straggler("node-0002", 2.5, gpus=(0,), where="host"),))
    h = _hists(cfg)
    r = shift_ratios(h, np.arange(64), pooled_deciles(h))
    assert 2.3 < r[16] < 2.7 and np.all(np.abs(np.delete(r, 16) - 1.0) < 0.04)
