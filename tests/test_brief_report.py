"""Job reports with ``brief=True`` (``job_report``), which the evictor and the metrics read.

Every node with a flagged GPU is the same message as in the full report; every other node is
there by name and verdict alone; the job's own fields and its prediction are the same; so the
evictor's policy judges it the same and the metrics' series are the same.
"""
from __future__ import annotations

from hypertrace.analyzer.evict.policy import EvictPolicy, judge
from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.metrics import gpu_series
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.simulate import SimConfig, Straggler, generate

CFG = SimConfig(gpus=96, gpus_per_node=8, windows=12, seed=21,
                stragglers=(Straggler("node-0003", 1.4), Straggler("node-0007", 1.25)))


def _reports() -> tuple[pb.JobReport, pb.JobReport]:
    e = Engine(ScoringConfig())
    for w in generate(CFG):
        e.ingest(w)
    e.flush(None)
    full = build_report(e, "sim-job", now_ns=1).jobs[0]
    brief = build_report(e, "sim-job", now_ns=1, brief=True).jobs[0]
    return full, brief


def test_flagged_nodes_whole_the_others_by_name():
    full, brief = _reports()
    flagged = [n for n in full.nodes if n.verdict in ("straggler", "suspect")]
    assert [n.node for n in flagged if n.verdict == "straggler"] == ["node-0003", "node-0007"]
    assert len(flagged) < len(full.nodes)                   # healthy nodes to leave out
    assert [(n.node, n.verdict) for n in brief.nodes] == [(n.node, n.verdict) for n in full.nodes]
    for f, b in zip(full.nodes, brief.nodes):
        if f.verdict in ("straggler", "suspect"):
            assert b == f
        else:
            assert not b.gpus and not b.window_ratios and not b.scope
    rest_full, rest_brief = pb.JobReport(), pb.JobReport()
    rest_full.CopyFrom(full)
    rest_brief.CopyFrom(brief)
    rest_full.ClearField("nodes")
    rest_brief.ClearField("nodes")
    assert rest_brief == rest_full                          # prediction, CDFs, counts, history


def test_the_evictor_and_the_metrics_read_the_same_from_it():
    full, brief = _reports()
    policy = EvictPolicy()
    assert judge(brief, policy) == judge(full, policy)
    assert judge(full, policy)                              # there was something to judge
    assert gpu_series(brief, {}, 64) == gpu_series(full, {}, 64)
