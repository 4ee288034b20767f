"""A GPU whose agent stopped sending is ``no_data``: not convicted, not in the what-if, never
proposed for eviction. The real Engine on simulated windows, the report a user reads, and the
eviction policy that reads it."""
from __future__ import annotations

import pytest

from hypertrace.analyzer.evict.policy import EvictPolicy, judge
from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import EXIT_OK, exit_status, report_to_table
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.sim.simulate import Dropout, SimConfig, Straggler, generate

SLOW = "node-0005"


def _engine(cfg: SimConfig) -> tuple[Engine, list]:
    e = Engine(ScoringConfig())
    for w in generate(cfg):
        e.ingest(w)
    return e, sorted(e.flush(now_ns=2**62), key=lambda r: r.epoch)


@pytest.fixture(scope="module")
def stopped():
    """A node 30% slow (convicted), whose agent stops after window 6 of 12."""
    cfg = SimConfig(gpus=128, windows=12, seed=4, stragglers=(Straggler(SLOW, 1.30),),
                    dropouts=(Dropout(SLOW, 6, 12),))
    return _engine(cfg)


def test_a_stopped_agents_node_is_no_data_after_clear_m_scored_windows(stopped):
    _, results = stopped
    clear_m = ScoringConfig().clear_m
    mine = [{v for (n, _), v in r.verdicts.items() if n == SLOW} for r in results]
    assert mine[5] == {"straggler"}                         # convicted while it sent
    assert all(not m for m in mine[6:6 + clear_m - 1])      # silent: no verdict this epoch
    assert all(m == {"no_data"} for m in mine[6 + clear_m - 1:])


def test_the_report_shows_it_as_no_data_and_keeps_it_out_of_the_what_if(stopped):
    e, _ = stopped
    job = build_report(e).jobs[0]
    node = next(n for n in job.nodes if n.node == SLOW)
    assert node.verdict == "no_data" and {g.verdict for g in node.gpus} == {"no_data"}
    assert node.probable_cause.startswith("no data")
    assert all(g.probable_cause.startswith("no data") for g in node.gpus)
    c = job.cluster
    assert SLOW not in c.evicted_nodes and not c.evicted_nodes
    assert c.predicted_gain == 0.0 and c.step_time_now_us == c.step_time_after_eviction_us
    assert " 120 ranks" in c.basis                            # 16 nodes less the silent one
    assert exit_status(build_report(e)) == EXIT_OK
    assert not any(v.propose for v in judge(job, EvictPolicy()))
    table = report_to_table(build_report(e), flagged_only=True)
    assert SLOW in table and "no_data" in table and "no data: no window from its agent" in table


def test_its_verdict_comes_back_with_its_windows():
    """The agent sends again: the node's state was kept, so it is a straggler at once."""
    cfg = SimConfig(gpus=128, windows=14, seed=4, stragglers=(Straggler(SLOW, 1.30),),
                    dropouts=(Dropout(SLOW, 5, 10),))
    e, results = _engine(cfg)
    mine = [{v for (n, _), v in r.verdicts.items() if n == SLOW} for r in results]
    assert mine[9] == {"no_data"} and mine[10] == {"straggler"}
    assert [n.verdict for n in build_report(e).jobs[0].nodes if n.node == SLOW] == ["straggler"]


def test_a_registered_gpu_not_yet_scored_is_not_no_data():
    """No data means it stopped: a GPU seen only in the pending epoch has no verdict yet."""
    e = Engine(ScoringConfig())
    for w in generate(SimConfig(gpus=64, windows=1, seed=2)):
        e.ingest(w)
    assert {g.verdict for n in build_report(e).jobs[0].nodes for g in n.gpus} == {"insufficient_data"}
