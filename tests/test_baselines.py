"""Baseline rules (mean ± 3σ, NVRx-style relative score) on real simulated windows."""
import numpy as np
import pytest

from hypertrace.sim.baselines import NVRX_THRESHOLD, BaselineDetector, flag_rule
from hypertrace.sim.simulate import SimConfig, Straggler, generate


def test_mean3sigma_rule_uses_the_tail_that_means_slow():
    v = np.array([10.0] * 30 + [10.1, 9.9, 15.0])
    assert flag_rule("mean3sigma", v, "launch")[-1] and flag_rule("mean3sigma", v, "launch").sum() == 1
    assert not flag_rule("mean3sigma", v, "sync").any()
    assert flag_rule("mean3sigma", np.r_[v[:-1], 4.0], "sync")[-1]


def test_nvrx_score_is_fastest_over_own_median_below_075():
    v = np.array([10.0, 10.5, 13.0, 14.0])          # 10/13 = 0.77 kept, 10/14 = 0.71 flagged
    assert flag_rule("nvrx", v, "launch").tolist() == [False, False, False, True]
    assert 10 / 13 > NVRX_THRESHOLD > 10 / 14
    assert not flag_rule("nvrx", v, "sync").any()   # waits are others' work: not scored


def test_unknown_rule_is_a_clear_error():
    with pytest.raises(ValueError, match="known: mean3sigma, nvrx"):
        BaselineDetector("zscore")


def _stragglers(rule, cfg):
    d = BaselineDetector(rule)
    for w in generate(cfg):
        d.ingest(w)
    results = d.flush()
    assert [r.epoch for r in results] == sorted(r.epoch for r in results)
    return sorted({n for r in results for (n, _), v in r.verdicts.items() if v == "straggler"})


def test_both_baselines_convict_a_grossly_slow_node_with_persistence():
    cfg = SimConfig(gpus=128, windows=5, seed=3, stragglers=(Straggler("node-0005", 1.6),))
    assert _stragglers("mean3sigma", cfg) == ["node-0005"]
    assert _stragglers("nvrx", cfg) == ["node-0005"]


def test_persistence_is_applied_two_slow_windows_do_not_convict():
    cfg = SimConfig(gpus=128, windows=5, seed=3,
                    stragglers=(Straggler("node-0005", 1.6, flap_on=2, flap_off=3),))
    assert _stragglers("nvrx", cfg) == []


def test_insufficient_samples_are_not_scored():
    cfg = SimConfig(gpus=64, windows=3, seed=1, duty=0.00001,
                    stragglers=(Straggler("node-0001", 1.6),))
    d = BaselineDetector("nvrx")
    for w in generate(cfg):
        d.ingest(w)
    verdicts = {v for r in d.flush() for v in r.verdicts.values()}
    assert verdicts == {"insufficient_data"}
