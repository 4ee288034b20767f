"""Adding a signal: its own module and one line in analyzer/score/registry.py
(docs/design.md, "Adding a signal"). The worked example is the loader wait per step: the time a
rank's idle waits were ended by its own loader workers (StepStats.loader_wait_us, which the
agents already send). Below, ``LOADER_WAIT`` is written exactly as its module
(analyzer/score/loader_wait.py) would be, and registered the way its registry line would;
nothing else of the analyzer is touched, and the signal is measured from the windows, scored,
convicts, leads the probable cause, and is named in the table, the JSON and the series.

It is not shipped in the registry: scoring a new signal changes reports, which needs its own
design note and fresh held-out seeds (docs/design.md).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_signals import SLOW, Rank, _process, gpu, run, windows

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import report_to_json, report_to_table
from hypertrace.analyzer.score import registry
from hypertrace.analyzer.score.cross_section import Input
from hypertrace.analyzer.score.signal import Measured, Signal, SignalInputs, duration_text

# ---- what analyzer/score/loader_wait.py would hold -------------------------------------------

INPUT = "loader_wait_us"


def _loader_wait_us(p):
    return p.steps.loader_wait_us if p.HasField("steps") else None


def _measure(i: SignalInputs) -> Measured | None:
    """Per step, the time the rank waited for its input pipeline; gated like the other waits
    (``min_effect`` of the job's median step)."""
    if i.wait_gate is None:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        per_step = np.where(i.steps > 0, i.extra[INPUT] / np.maximum(i.steps, 1), np.nan)
    return Measured(per_step, i.step_ok, None, i.wait_gate)


LOADER_WAIT = Signal(
    "step.loader_wait", "us", "per_step", "loader wait per step",
    {"high": "waits longer for its input pipeline per step than the job: slow data loading",
     "low": "waits less for its input pipeline than the job: not a problem by itself"},
    measure=_measure,
    # a wait the steps do not show is not a straggler
    implicate=lambda s, i: s.high & i.steps_moved,
    cause=lambda ev: (f"waits {duration_text(ev['step.loader_wait'][0])} per step for its input "
                      f"pipeline vs {duration_text(ev['step.loader_wait'][1])} job median: slow "
                      "data loading (loader workers short of CPU, slow storage or decoding)"),
    brief="loader wait {v} per step vs {m}", tier=0, explains=True,
    inputs=(Input(INPUT, _loader_wait_us),))

# ---- its registry line -------------------------------------------------------------------------


@pytest.fixture
def with_loader_wait(monkeypatch):
    monkeypatch.setattr(registry, "SIGNALS", registry.SIGNALS + (LOADER_WAIT,))


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


def test_a_registered_signal_is_measured_scored_and_leads_the_cause(with_loader_wait):
    engine, results = run(_loader_windows())
    rows = [r for res in results for r in res.rows if r.api == "step.loader_wait"]
    assert {r.rank for r in rows if r.implicates} == {SLOW}
    slow = next(r for r in rows if r.rank == SLOW)
    assert slow.unit == "us" and slow.stat == "per_step"
    assert slow.value_us == pytest.approx(30e3, rel=0.01)
    g = gpu(engine, SLOW)
    assert g.verdict == "straggler"
    assert g.probable_cause.startswith("waits 30.0 ms per step for its input pipeline vs 1.0 ms")
    finding = next(f for f in g.findings if f.api == "step.loader_wait")
    assert finding.meaning == LOADER_WAIT.meanings["high"]
    report = build_report(engine, now_ns=0)
    assert "loader wait per step" in report_to_table(report, verbose=True)
    nodes = json.loads(report_to_json(report))["jobs"][0]["nodes"]
    series = {s["signal"] for n in nodes for s in n["series"]}
    assert "step.loader_wait" in series        # the flagged node's leading signal over time


def test_without_its_registry_line_the_same_windows_know_nothing_of_it():
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
        assert s.label and s.unit in ("us", "share", "hz", "ratio"), s.name
        assert registry.by_name(s.name) is s
