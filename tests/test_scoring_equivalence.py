"""Engine.flush and the report give the same verdicts, score rows and report as the scoring
code they were recorded from (tests/data/scoring_golden.json.gz), equal within float rounding.

Why: the scoring path is rewritten for speed, and detection results must not move without fresh
held-out seeds. The golden values were computed by the scoring code before that work; any
change to verdicts, kept score rows or report fields fails here. Regenerate only for an
intended change of results: ``python -m tests.test_scoring_equivalence --write`` (from the
repository root, with the package installed).
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import sys
from pathlib import Path

import pytest

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.report_format import report_to_json
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.sim import scenarios
from hypertrace.sim.simulate import generate
from hypertrace.sim.synthetic import job_windows, node_name

GOLDEN = Path(__file__).parent / "data" / "scoring_golden.json.gz"

#: name -> (scenario, GPUs, windows, seed): signals, kinds, labeled groups, independent ranks,
#: and one ~2k-GPU job with wide noise (hundreds of flagged cells, most implicating nobody)
SIM_CASES = {
    "cpu-hog-128": ("cpu-hog", 128, 6, 3),
    "gpu-slow-128": ("gpu-slow", 128, 6, 1),
    "mixed-kinds-256": ("mixed-kinds", 256, 5, 2),
    "pipeline-8-512": ("pipeline-8", 512, 5, 4),
    "host-10-2048": ("host-10", 2048, 4, 7),
}


def _windows(case: str) -> list:
    if case == "synthetic-10apis-2048":     # the bench's windows: all 10 APIs, one node slow
        return job_windows(256, 8, 3, slow={node_name(42): 1.10}, seed=5, all_apis=True)
    name, gpus, windows, seed = SIM_CASES[case]
    return list(generate(scenarios.get(name).config(gpus, windows=windows, seed=seed)))


CASES = sorted(SIM_CASES) + ["synthetic-10apis-2048"]


def snapshot(case: str) -> dict:
    """Every epoch's verdicts and kept score rows, and the final report, as plain JSON."""
    engine = Engine(ScoringConfig())
    epochs = []
    windows = _windows(case)
    by_epoch: dict[int, list] = {}
    for w in windows:
        by_epoch.setdefault(engine.epoch_of(w), []).append(w)
    for epoch in sorted(by_epoch):               # one flush per epoch, as the live server does
        for w in by_epoch[epoch]:
            engine.ingest(w)
        for r in engine.flush(None):
            epochs.append({
                "job": r.job_id, "epoch": r.epoch,
                "verdicts": sorted([list(k) + [v] for k, v in r.verdicts.items()]),
                "rows": [{k: (sorted([e, list(v)] for e, v in val.items())
                              if k == "evidence" else val)
                          for k, val in dataclasses.asdict(row).items()} for row in r.rows]})
    return {"epochs": epochs, "report": json.loads(report_to_json(build_report(engine, now_ns=0)))}


def _same(a, b, path: str = "") -> None:
    if isinstance(a, float) or isinstance(b, float):
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            assert math.isnan(fa) and math.isnan(fb), f"{path}: {a!r} != {b!r}"
        else:
            assert math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys differ"
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths {len(a)} != " \
                                                           f"{len(b) if isinstance(b, list) else b}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def golden() -> dict:
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("case", CASES)
def test_scores_verdicts_and_report_equal_the_recorded_ones(golden, case):
    got = json.loads(json.dumps(snapshot(case)))     # the same JSON round trip as the fixture
    want = golden[case]
    assert any(v[2] != "healthy" for e in want["epochs"] for v in e["verdicts"]) or \
        case.startswith("pipeline")                  # a pipeline's stages differ by design
    _same(want["epochs"], got["epochs"], f"{case}.epochs")
    _same(want["report"], got["report"], f"{case}.report")


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.parent.mkdir(exist_ok=True)
    data = {case: snapshot(case) for case in CASES}
    with gzip.open(GOLDEN, "wt") as f:
        json.dump(data, f, sort_keys=True)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
