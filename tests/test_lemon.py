"""Lemon nodes: a node convicted in lemon_jobs distinct jobs within lemon_days is marked in the
report and the metrics, and proposed for a long drain that a human decides. Real parts: the
audit trail in a real SQLite file, the Engine's reports of simulated jobs, the analyzer's gRPC
server over mutual TLS and its /metrics endpoint."""
from __future__ import annotations

import time
import urllib.request

import grpc
import pytest
from test_evict_flight import serve_slow_job

from hypertrace.analyzer.evict.audit import Audit
from hypertrace.analyzer.evict.backends import NoBackend
from hypertrace.analyzer.evict.evictor import Evictor
from hypertrace.analyzer.evict.policy import EvictPolicy
from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.settings import ConfigError
from hypertrace.proto.transport import channel_credentials
from hypertrace.sim.simulate import SimConfig, Straggler, generate

NOW = 1_800_000_000 * 10**9
DAY = 24 * 3600 * 10**9
SLOW = SimConfig(gpus=256, gpus_per_node=8, windows=8, seed=3,
                 stragglers=(Straggler("node-0013", 1.3),))


@pytest.fixture(scope="module")
def slow_job() -> pb.JobReport:
    e = Engine(ScoringConfig())
    for w in generate(SLOW):
        e.ingest(w)
    e.flush()
    return build_report(e, "sim-job").jobs[0]


def _as(job: pb.JobReport, job_id: str) -> pb.JobReport:
    out = pb.JobReport()
    out.CopyFrom(job)
    out.job_id = job_id
    return out


def test_three_jobs_in_a_week_make_a_lemon_that_goes_to_a_human_once(tmp_path, slow_job):
    audit = Audit(tmp_path / "a.db")
    ev = Evictor(EvictPolicy(), audit, NoBackend())
    ev.review(_as(slow_job, "job-a"), NOW)
    ev.review(_as(slow_job, "job-b"), NOW + DAY)
    assert ev.lemons(NOW + DAY) == {}
    assert [p.state for p in audit.proposals()] == ["dry_run", "dry_run"]
    ev.review(_as(slow_job, "job-c"), NOW + 2 * DAY)
    assert ev.lemons(NOW + 2 * DAY) == {"node-0013": 3}
    lemon = [p for p in audit.proposals() if p.state == "needs_human"]
    assert len(lemon) == 1 and lemon[0].job_id == "job-c" and lemon[0].node == "node-0013"
    assert lemon[0].reason.startswith("lemon: convicted in 3 distinct jobs within 7 days")
    assert "long drain" in lemon[0].reason and lemon[0].evidence["lemon_jobs"] == 3
    ev.review(_as(slow_job, "job-d"), NOW + 3 * DAY)          # still a lemon: no second one
    assert sum(p.state == "needs_human" for p in audit.proposals()) == 1
    assert ev.lemons(NOW + 3 * DAY) == {"node-0013": 4}
    # the same job again is not another job; convictions older than lemon_days are forgotten
    assert ev.lemons(NOW + 3 * DAY + 8 * DAY) == {}


def test_the_same_job_over_and_over_is_no_lemon(tmp_path, slow_job):
    ev = Evictor(EvictPolicy(), Audit(tmp_path / "a.db"), NoBackend())
    for k in range(5):
        ev.review(slow_job, NOW + k * 10**9)
    assert ev.lemons(NOW + 5 * 10**9) == {}
    assert not any(p.state == "needs_human" for p in ev.audit.proposals())


def test_lemon_settings_are_checked():
    with pytest.raises(ConfigError, match="lemon_jobs"):
        EvictPolicy(lemon_jobs=1)
    with pytest.raises(ConfigError, match="lemon_days"):
        EvictPolicy(lemon_days=0)


def test_a_lemon_is_marked_in_the_report_and_the_metrics(tmp_path, pki):
    db = tmp_path / "a.db"
    storage = Storage.open(db, synchronous="NORMAL")
    audit = Audit(db)
    now = time.time_ns()
    audit.convicted(["node-0013"], "earlier-1", now - 2 * DAY)   # two jobs this week ...
    audit.convicted(["node-0013"], "earlier-2", now - DAY)
    audit.convicted(["node-0020"], "earlier-1", now - 2 * DAY)   # one: no lemon
    evictor = Evictor(EvictPolicy(), audit, NoBackend())
    analyzer = Analyzer(storage, ScoringConfig(), evictor=evictor)
    server, target = serve_slow_job(analyzer, pki, flush_interval=0.0)   # ... and this one
    try:
        with grpc.secure_channel(target, channel_credentials(pki.files("reader", "ops"))) as ch:
            report = pb_grpc.QueryStub(ch).GetReport(pb.ReportRequest(all_nodes=True),
                                                     timeout=120)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                    timeout=60) as resp:
            scraped = resp.read().decode()
    finally:
        server.stop()
        analyzer.close()
        storage.close()
    lemons = {n.node: n.lemon_jobs for j in report.jobs for n in j.nodes if n.lemon_jobs}
    assert lemons == {"node-0013": 3}
    assert 'hypertrace_node_lemon_jobs{node="node-0013"} 3.0' in scraped
    assert 'node="node-0020"' not in scraped
    from hypertrace.analyzer.report.report_format import report_to_table
    assert "straggler, lemon (3 jobs)" in report_to_table(report)
