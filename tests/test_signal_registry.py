"""Adding a signal: its own module and one line in analyzer/score/registry.py
(docs/design.md, "Adding a signal"). The worked example is the loader wait per step
(analyzer/score/loader.py): the time a rank's idle waits were ended by its own loader workers
(StepStats.loader_wait_us). With its registry line the signal is measured from the windows,
scored, convicts, leads the probable cause, and is named in the table, the JSON and the series;
without it, the same windows know nothing of it.
"""
from __future__ import annotations

import json

import pytest
from test_signals import SLOW, Rank, _process, gpu, run, windows

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import report_to_json, report_to_table
from hypertrace.analyzer.score import registry
from hypertrace.analyzer.score.loader import LOADER_WAIT, LOADER_WORKERS


@pytest.fixture
def without_loader_signals(monkeypatch):
    monkeypatch.setattr(registry, "SIGNALS", tuple(
        s for s in registry.SIGNALS if s not in (LOADER_WAIT, LOADER_WORKERS)))


def _loader_windows(epochs: int = 6) -> list:
    """Independent ranks; rank SLOW waits 30 ms per step for its loader, and its step is that
    much longer; the others wait 1 ms."""
    def rank_of(_e, k, _rng):
        return Rank(step_ms=130.0, busy_ms=70.0) if k == SLOW else Rank(step_ms=100.0)

    def process(k, r, rng):
        p = _process(k, r, rng)
        p.steps.loader_wait_us = (30.0 if k == SLOW else 1.0) * 1e3 * p.steps.steps
        return p
    return windows(epochs, rank_of, process=process)


def test_a_registered_signal_is_measured_scored_and_leads_the_cause():
    engine, results = run(_loader_windows())
    rows = [r for res in results for r in res.rows if r.api == "step.loader_wait"]
    assert {r.rank for r in rows if r.implicates} == {SLOW}
    slow = next(r for r in rows if r.rank == SLOW)
    assert slow.unit == "us" and slow.stat == "per_step"
    assert slow.value_us == pytest.approx(30e3, rel=0.01)
    g = gpu(engine, SLOW)
    assert g.verdict == "straggler"
    assert g.probable_cause.startswith("waits 30.0 ms per step for its data loader vs 1.0 ms")
    finding = next(f for f in g.findings if f.api == "step.loader_wait")
    assert finding.meaning == LOADER_WAIT.meanings["high"]
    report = build_report(engine, now_ns=0)
    assert "loader wait per step" in report_to_table(report, verbose=True)
    nodes = json.loads(report_to_json(report))["jobs"][0]["nodes"]
    series = {s["signal"] for n in nodes for s in n["series"]}
    assert "step.loader_wait" in series        # the flagged node's leading signal over time


def test_without_its_registry_line_the_same_windows_know_nothing_of_it(without_loader_signals):
    engine, results = run(_loader_windows())
    assert not any(r.api == "step.loader_wait" for res in results for r in res.rows)
    assert all(f.api != "step.loader_wait" for f in gpu(engine, SLOW).findings)


def test_every_registered_signal_is_whole():
    """What each report path reads of a signal is there: a meaning for both tails, a label, a
    known unit, and the names are unique."""
    names = [s.name for s in registry.SIGNALS]
    assert len(names) == len(set(names))
    for s in registry.SIGNALS:
        assert set(s.meanings) == {"high", "low"}, s.name
        assert s.label and s.unit in ("us", "share", "hz", "ratio", "count"), s.name
        assert registry.by_name(s.name) is s
