"""Cross-sections built in threads ahead of the scoring (analyzer/build_ahead.py) are the ones
built in turn: the same cross-sections in the same order, and ``Engine.flush`` with them gives
the same results and leaves the same state. Real simulated windows of two jobs."""
from __future__ import annotations

import pickle

import pytest

from hypertrace.analyzer.build_ahead import built_in_order
from hypertrace.analyzer.engine import Engine
from hypertrace.sim.simulate import SimConfig, Straggler, generate


@pytest.fixture(scope="module")
def engine_blob() -> bytes:
    """An Engine holding several pending epochs of two jobs, one with a straggler."""
    engine = Engine()
    for cfg in (SimConfig(gpus=64, windows=6, seed=5, stragglers=(Straggler("node-0003", 1.3),)),
                SimConfig(gpus=32, windows=5, seed=6, job_id="other-job")):
        for w in generate(cfg):
            engine.ingest(w)
    assert engine.pending_epochs() >= 10
    return pickle.dumps(engine)


@pytest.mark.parametrize("ahead", [1, 2, 5, 50])
def test_cross_sections_built_ahead_are_the_ones_built_in_turn(engine_blob, ahead):
    accs = [acc for job in pickle.loads(engine_blob)._jobs.values()
            for _, acc in sorted(job.pending.items())]
    in_turn = [pickle.dumps(acc.build()) for acc in accs]
    assert [pickle.dumps(cs) for cs in built_in_order(accs, ahead)] == in_turn


@pytest.mark.parametrize("ahead", [1, 2, 3])
def test_flush_with_builds_ahead_scores_as_without(engine_blob, ahead):
    plain, threaded = pickle.loads(engine_blob), pickle.loads(engine_blob)
    want = plain.flush(None)
    got = threaded.flush(None, build_ahead=ahead)
    assert [(r.job_id, r.epoch) for r in got] == [(r.job_id, r.epoch) for r in want]
    assert pickle.dumps(got) == pickle.dumps(want)
    assert pickle.dumps(threaded.export_state()) == pickle.dumps(plain.export_state())
    assert threaded.pending_epochs() == 0
    for job in plain.job_ids():
        a, b = plain.report(job), threaded.report(job)
        a.ClearField("generated")
        b.ClearField("generated")
        assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
