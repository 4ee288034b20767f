"""Workload groups: peer classes and whole-group deviations (analyzer/score/imbalance.py), and the
engine end to end on a simulated pipeline job."""
from dataclasses import replace

import numpy as np
import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import exit_status, report_to_table
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.score.imbalance import ImbalanceTracker, group_deviations, peer_classes
from hypertrace.sim import scenarios, simulate


def test_peer_classes_split_by_kind_and_group_and_fold_small_groups():
    kinds = np.array([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    names = ["", "stage0", "stage1"]
    groups = np.array([1, 1, 1, 1, 2, 2, 2, 0, 1, 1, 1, 1])
    classes, labels = peer_classes(kinds, groups, names, min_gpus=4)
    got = {lab + f"@{kinds[c[0]]}": c.tolist() for c, lab in zip(classes, labels)}
    # stage1 has only 3 GPUs of kind 0: it joins kind 0's ungrouped rest (GPU 7)
    assert got == {"stage0@0": [0, 1, 2, 3], "@0": [4, 5, 6, 7], "stage0@1": [8, 9, 10, 11]}


def test_no_groups_is_one_class():
    classes, labels = peer_classes(np.zeros(5, int), np.zeros(5, int), [""], min_gpus=4)
    assert [c.tolist() for c in classes] == [[0, 1, 2, 3, 4]] and labels == [""]


def test_group_deviation_against_the_median_of_group_medians():
    values = np.array([100.0] * 12 + [113.0] * 4)
    classes = [np.arange(0, 4), np.arange(4, 8), np.arange(8, 12), np.arange(12, 16)]
    labels = ["s0", "s1", "s2", "s3"]
    found = group_deviations(values, classes, labels, "step.own", "us", 4, 0.05)
    assert [(d.group, d.gpus, round(d.ratio, 3)) for d in found] == [("s3", 4, 1.13)]
    # below the minimum effect, or an ungrouped class: nothing reported
    assert group_deviations(np.array([100.0] * 12 + [104.0] * 4), classes, labels,
                            "x", "us", 4, 0.05) == []
    assert group_deviations(values, classes, ["s0", "s1", "s2", ""], "x", "us", 4, 0.05) == []


def test_imbalance_is_reported_only_after_consecutive_epochs():
    t = ImbalanceTracker.empty()
    v = np.array([100.0] * 4 + [120.0] * 4)
    d = group_deviations(v, [np.arange(4), np.arange(4, 8)], ["a", "b"], "s", "us", 4, 0.05)
    t.update(d)
    t.update(d)
    assert t.persistent(3) == []
    t.update(d)
    assert [x.group for x in t.persistent(3)] == ["b"]
    t.update([])
    assert t.persistent(1) == []


def _report(cfg, scoring: ScoringConfig = ScoringConfig()):
    e = Engine(scoring)
    for w in simulate.generate(cfg):
        e.ingest(w)
    e.flush(now_ns=2**62)
    return build_report(e)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_pipeline_stage_that_does_more_work_is_imbalance_not_a_straggler(seed):
    """8 stages of 4 nodes; the last does 13% more work. With the stages named, no GPU is a
    straggler and the last stage is reported as imbalance; unnamed, its nodes are convicted
    (which is why the agent reads the stage from the job's environment)."""
    # tight noise: the stage mechanism alone (the benchmark runs it with wide noise)
    cfg = scenarios.get("pipeline-8").config(gpus=256, seed=seed, windows=10, wide=False)
    report = _report(cfg)
    job = report.jobs[0]
    assert all(g.verdict != "straggler" for n in job.nodes for g in n.gpus)
    assert exit_status(report) == 0
    last = {d.signal: d for d in job.imbalance if d.group == "stage7"}
    assert "step.own" in last and 1.10 <= last["step.own"].ratio <= 1.16, job.imbalance
    assert {d.group for d in job.imbalance} == {"stage7"}
    assert "imbalance: group stage7 (32 GPUs)" in report_to_table(report)

    # unnamed, and launching the same kernels per step (only each one slower): nothing tells
    # the stage from 4 slow hosts, and they are convicted (why the agent reads the stage from
    # the job's environment)
    unnamed = _report(replace(cfg, stage_labels=False)).jobs[0]
    convicted = {n.node for n in unnamed.nodes if n.verdict == "straggler"}
    assert convicted == {"node-0028", "node-0029", "node-0030", "node-0031"}
    assert not unnamed.imbalance


@pytest.mark.parametrize("seed", [0, 1])
def test_an_unnamed_stage_that_launches_other_kernels_is_found_and_reported_as_imbalance(seed):
    """No labels, but the last stage launches 30% more kernels per step (its loss head): the
    analyzer finds the group by launches per step, compares its GPUs among themselves, and
    reports the stage as imbalance; no GPU is convicted."""
    cfg = scenarios.get("pipeline-8-unlabeled").config(gpus=256, seed=seed, windows=10,
                                                      wide=False)
    job = _report(cfg, ScoringConfig(auto_groups=True)).jobs[0]
    assert all(g.verdict != "straggler" for n in job.nodes for g in n.gpus)
    groups = {d.group for d in job.imbalance}
    assert len(groups) == 1 and next(iter(groups)).startswith("auto-2 (")
    own = next(d for d in job.imbalance if d.signal == "step.own")
    assert own.gpus == 32 and 1.10 <= own.ratio <= 1.16


def test_launches_per_step_split_only_where_programs_differ():
    from hypertrace.analyzer.score.auto_groups import SPLIT_GAP, calls_per_step, partition
    # calls per step = calls per attached second x the typical step
    cps = calls_per_step(np.array([1000.0, 100.0, 1000.0]), np.array([1.0, 1.0, 0.0]),
                         np.array([100_000.0, 100_000.0, 100_000.0]))
    assert cps[0] == pytest.approx(100.0) and np.isnan(cps[1]) and np.isnan(cps[2])
    rng = np.random.default_rng(3)
    one = 1000.0 * (1 + rng.normal(0, 0.02, 64))              # one program, 2% noise
    assert partition(one, min_gpus=4) is None
    two = one.copy()
    two[56:] *= 1.0 + 2 * SPLIT_GAP                            # the last 8 launch 30% more
    codes = partition(two, min_gpus=4)
    assert codes is not None and set(codes[56:]) == {1} and set(codes[:56]) == {0}
    assert partition(two, min_gpus=9) is None                  # a part too small: no groups
    two[3] = np.nan                                            # not read this epoch
    assert partition(two, min_gpus=4)[3] == -1


def test_found_groups_are_adopted_only_after_persist_k_epochs_and_keep_their_names():
    from hypertrace.analyzer.score.auto_groups import AutoGroups
    cps = np.r_[np.full(24, 1000.0), np.full(8, 1400.0)]
    rows = np.arange(32)
    g = AutoGroups()
    for epoch in range(3):
        assert not g.active
        g.update(rows, cps * (1 + 0.001 * epoch), min_gpus=4, persist_k=3, n_rows=32)
    assert g.active and list(g.codes[24:]) == [1] * 8 and g.names[1].startswith("auto-2 (~1,40")
    names = list(g.names)
    g.update(rows, cps * 1.01, min_gpus=4, persist_k=3, n_rows=32)
    assert g.names == names                                    # same partition, same names
    g.update(rows, np.full(32, 1000.0), min_gpus=4, persist_k=3, n_rows=32)
    assert g.active and g.names == names                       # one uniform epoch: kept


def test_an_epoch_is_scored_by_the_partition_it_read_before_the_partition_is_adopted():
    """The stage's GPUs must never be compared with the whole job, not even in the epochs
    before the partition persisted (they convicted healthy last-stage GPUs there)."""
    from hypertrace.analyzer.score.auto_groups import AutoGroups
    cps = np.r_[np.full(24, 1000.0), np.full(8, 1400.0)]
    rows = np.arange(32)
    g = AutoGroups()
    assert g.scoring() is None
    g.update(rows, cps, min_gpus=4, persist_k=3, n_rows=32)
    assert not g.active                                        # not adopted, not reported
    codes, names = g.scoring()
    assert list(codes[24:]) == [1] * 8 and list(codes[:24]) == [0] * 24 and len(names) == 2
    g.update(rows, np.full(32, 1000.0), min_gpus=4, persist_k=3, n_rows=32)
    assert g.scoring() is None                                 # a uniform epoch, none adopted
    g.forget(np.array([30, 31]))
    for _ in range(3):
        g.update(rows, cps, min_gpus=4, persist_k=3, n_rows=32)
    g.forget(np.array([31]))                                   # a retired row has no group
    assert g.codes[31] == -1 and g.scoring()[0][31] == -1



@pytest.mark.parametrize("gpus,seed", [(64, 0), (512, 1)])
def test_an_unnamed_stage_without_step_data_is_a_possible_pipeline_never_convicted(gpus, seed):
    """No labels and no step records: the stages are found by launches per second (a stage
    that launches more per step launches more per second at the pipeline's pace); the last
    stage is reported, in words, as a possible pipeline stage; no GPU is convicted, neither by
    its launch latency nor by its synchronize time (the heavy stage is the one the job waits
    for)."""
    cfg = scenarios.get("pipeline-8-unlabeled-nostep").config(gpus=gpus, seed=seed,
                                                             windows=8, wide=False)
    assert cfg.step_ms == 0 and not cfg.stage_labels
    report = _report(cfg)
    job = report.jobs[0]
    assert job.mode == ""
    assert all(g.verdict != "straggler" for n in job.nodes for g in n.gpus)
    stage = gpus // 8
    found = [d for d in job.imbalance if d.gpus == stage]
    assert found and all("possible pipeline stage" in d.group for d in found), job.imbalance
    text = report_to_table(report)
    assert "possible pipeline: group auto-2" in text and "may be a pipeline" in text, text
    assert "none is convicted as a whole" in text


def test_without_step_data_or_groups_its_last_stage_is_reported_but_not_convicted():
    """The same job with automatic grouping off: its last stage's launches read 12-16% slower
    than the job's, but its ranks wait for their GPUs 12% of their
    time, which hides that much CPU work (signals.launch_effect): no conviction (it used to
    convict the stage, which the launch-rate groups prevented). Only the groups name it as a
    possible pipeline stage."""
    cfg = scenarios.get("pipeline-8-unlabeled-nostep").config(gpus=64, seed=0, windows=8,
                                                             wide=False)
    job = _report(cfg, ScoringConfig(auto_groups=False)).jobs[0]
    assert {n.node for n in job.nodes if n.verdict == "straggler"} == set()
    assert not job.imbalance


def test_stage_shaped_groups_are_whole_hosts_that_launch_more_than_the_largest():
    from hypertrace.analyzer.score.auto_groups import stage_shaped
    hosts = np.repeat(np.arange(8), 4)                 # 8 hosts of 4 GPUs
    rates = np.r_[np.full(28, 1000.0), np.full(4, 1300.0)]
    codes = np.r_[np.zeros(28, int), np.ones(4, int)]
    assert stage_shaped(codes, rates, hosts)           # the last host launches more: a stage
    # a group that launches less than the rest could be slow hosts of an independent job
    assert not stage_shaped(codes, np.r_[np.full(28, 1000.0), np.full(4, 800.0)], hosts)
    # a host split between groups is not a stage
    split = codes.copy()
    split[26:28] = 1
    assert not stage_shaped(split, np.r_[np.full(26, 1000.0), np.full(6, 1300.0)], hosts)
    # halves: the half that launches more is the reference, the other launches less
    halves = np.r_[np.zeros(16, int), np.ones(16, int)]
    assert not stage_shaped(halves, np.r_[np.full(16, 1000.0), np.full(16, 1300.0)], hosts)
    codes[:2] = -1                                     # GPUs not read this epoch are ignored
    assert stage_shaped(codes, rates, hosts)


def test_a_slow_group_of_an_independent_job_without_steps_is_not_a_stage():
    """Without step data, launch rates split 4 slow hosts off (they launch 30% less per
    second): not stage-shaped, so no group is made and nothing hides them as imbalance."""
    from hypertrace.analyzer.score.auto_groups import AutoGroups, launch_rates
    rates = launch_rates(np.r_[np.full(28, 2000.0), np.full(4, 1400.0)], np.full(32, 2.0))
    hosts = np.repeat(np.arange(8), 4)
    g = AutoGroups()
    for _ in range(3):
        g.update(np.arange(32), rates, min_gpus=4, persist_k=3, n_rows=32, hosts=hosts)
    assert g.scoring() is None and not g.active
    faster = launch_rates(np.r_[np.full(28, 2000.0), np.full(4, 2600.0)], np.full(32, 2.0))
    for _ in range(3):
        g.update(np.arange(32), faster, min_gpus=4, persist_k=3, n_rows=32, hosts=hosts)
    assert g.active and g.names[1].startswith("auto-2 (~1,300 launches/s, possible pipeline")
