"""The job series' reports are rebuilt under a share of the scoring process's time: a job
whose report is costly refreshes less often than ``refresh_s``, a cheap one every ``refresh_s``
(analyzer/report/metrics.py, "Cost"). The clock is the collector's own, stepped by the test: the
rule is about the seconds a report took, so the test sets them."""
from __future__ import annotations

from hypertrace.analyzer.report.metrics import REPORT_SHARE, JobCollector
from hypertrace.proto import hypertrace_pb2 as pb


class _Job:
    """One job whose report takes ``cost_s`` on the collector's clock, scored anew each look."""

    def __init__(self, cost_s: float):
        self.now = 0.0
        self.cost_s = cost_s
        self.scored = 0
        self.built_at: list[float] = []

    def jobs(self) -> list[tuple[str, int]]:
        self.scored += 1                       # a new epoch scored between any two scrapes
        return [("j", self.scored)]

    def report(self, job_id: str) -> pb.JobReport:
        self.built_at.append(self.now)
        self.now += self.cost_s
        return pb.JobReport(job_id=job_id, windows=self.scored)


def _scrapes(cost_s: float, every_s: float, until_s: float) -> list[float]:
    job = _Job(cost_s)
    c = JobCollector(job.jobs, job.report, lambda _: {}, refresh_s=15.0, clock=lambda: job.now)
    while job.now < until_s:
        (snap,) = c.snapshots()
        assert snap.report.job_id == "j"
        job.now += every_s
    return job.built_at


def test_a_cheap_report_refreshes_every_refresh_interval():
    built = _scrapes(cost_s=0.2, every_s=5.0, until_s=100.0)
    gaps = [b - a for a, b in zip(built, built[1:])]
    assert built[0] == 0.0 and gaps and all(15.0 <= g < 20.5 for g in gaps), gaps


def test_a_costly_report_refreshes_no_sooner_than_its_share_allows():
    """A 2-s report (a 131,072-GPU job's) waits 2 / REPORT_SHARE = 40 s, not 15."""
    built = _scrapes(cost_s=2.0, every_s=5.0, until_s=200.0)
    gaps = [b - a for a, b in zip(built, built[1:])]
    assert gaps and all(2.0 / REPORT_SHARE <= g < 2.0 / REPORT_SHARE + 7.5 for g in gaps), gaps
