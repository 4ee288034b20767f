"""`hypertrace predict`: the spike-probability table, and E[max] of N ranks from a recorded file."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hypertrace.analyzer.score import theory
from hypertrace.cli.main import main
from hypertrace.proto import wire
from hypertrace.sim.synthetic import job_windows


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_spike_table_reproduces_the_brief(capsys):
    doc = _json(capsys, ["predict", "--p", "0.04,0.005,1%", "--nodes", "64,512,100", "--json"])
    cell = {(r["p"], r["n"]): r["p_cluster"] for r in doc["spike_table"]}
    assert round(cell[(0.04, 64)], 3) == 0.927
    assert round(cell[(0.005, 512)], 3) == 0.923
    assert round(cell[(0.01, 100)], 3) == 0.634


def test_spike_table_as_text(capsys):
    assert main(["predict", "--p", "0.04,0.005", "--nodes", "64,512"]) == 0
    out = capsys.readouterr().out
    assert "92.7%" in out and "92.3%" in out
    assert out.splitlines()[1].split() == ["p", "per", "rank", "N=64", "N=512"]


@pytest.mark.parametrize("argv,needle", [
    (["predict", "--p", "0.5", "--nodes", "0"], "at least 1"),
    (["predict", "--p", "2", "--nodes", "8"], "outside [0, 1]"),
    (["predict", "--p", "x", "--nodes", "8"], "not a probability"),
    (["predict", "--nodes", "8"], "give --p"),
])
def test_bad_arguments_exit_2(capsys, argv, needle):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_histogram_prediction_matches_monte_carlo(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    with open(path, "w") as fh:
        wire.write_jsonl(job_windows(2, 4, 5, seed=3, samples=4000), fh)
    doc = _json(capsys, ["predict", "--histogram", str(path), "--nodes", "1,64,512,2048",
                         "--json"])
    h = doc["histogram"]
    assert h["rank"] == 0 and h["basis"] == "cudaLaunchKernel" and h["samples"] == 20_000
    preds = {r["n"]: r for r in h["predictions"]}
    assert preds[1]["expected_max_us"] == pytest.approx(h["mean_us"], rel=1e-3)
    assert preds[64]["expected_max_us"] < preds[512]["expected_max_us"] < \
        preds[2048]["expected_max_us"]
    # the same rank's merged histogram, sampled: E[max] agrees within 2%
    merged = sum(wire.unpack_histogram(p.apis[0].histogram).astype(float)
                 for w in wire.read_jsonl(path) for p in w.processes if p.rank == 0)
    for n in (64, 512):
        mc = theory.monte_carlo_max_us(merged, n, 2000, np.random.default_rng(n))
        assert preds[n]["expected_max_us"] == pytest.approx(mc, rel=0.02)


def test_histogram_prediction_choices_and_errors(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    with open(path, "w") as fh:
        wire.write_jsonl(job_windows(1, 2, 2, seed=4), fh)
    doc = _json(capsys, ["predict", "--histogram", str(path), "--nodes", "8", "--rank", "1",
                         "--api", "cudaStreamSynchronize", "--json"])
    assert doc["histogram"]["rank"] == 1 and doc["histogram"]["basis"] == "cudaStreamSynchronize"
    assert main(["predict", "--histogram", str(path), "--nodes", "8", "--rank", "7"]) == 2
    assert "--rank 7 is not in job" in capsys.readouterr().err
    assert main(["predict", "--histogram", str(path), "--nodes", "8", "--api", "nope"]) == 2
    assert "--api 'nope'" in capsys.readouterr().err
    assert main(["predict", "--histogram", str(tmp_path / "missing"), "--nodes", "8"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["predict", "--histogram", str(path), "--nodes", "8", "--p", "1%"]) == 0
    out = capsys.readouterr().out
    assert "E[max] us" in out and "N=8" in out
