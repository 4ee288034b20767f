"""`hypertrace analyze FILE.jsonl`: offline scoring through the same Engine, exit statuses, and
clear errors for bad files and bad windows."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hypertrace.cli.main import main
from hypertrace.proto import wire
from hypertrace.sim.synthetic import job_windows


def _write(path, windows) -> str:
    with open(path, "w") as fh:
        wire.write_jsonl(windows, fh)
    return str(path)


@pytest.fixture(scope="module")
def slow_file(tmp_path_factory) -> str:
    return _write(tmp_path_factory.mktemp("a") / "slow.jsonl",
                  job_windows(32, 8, 6, slow={"node-0013": 1.10}, seed=21))


def test_json_names_the_slow_node_and_exits_3(slow_file, capsys):
    assert main(["analyze", slow_file, "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    nodes = doc["jobs"][0]["nodes"]
    assert [n["node"] for n in nodes if n["verdict"] == "straggler"] == ["node-0013"]
    assert doc["jobs"][0]["cluster"]["evicted_nodes"] == ["node-0013"]


def _first_row(out: str) -> str:
    lines = out.splitlines()
    return lines[next(i for i, x in enumerate(lines) if x.startswith("NODE ")) + 1]


def test_table_is_the_default(slow_file, capsys):
    """One row per node, worst first, the evidence in words, within 100 columns."""
    assert main(["analyze", slow_file]) == 3
    out = capsys.readouterr().out
    row = _first_row(out).split()
    assert row[:3] == ["node-0013", "straggler", "host"]
    assert " ".join(row[3:8]) == f"launch p50 {row[5]} job median" and row[5].endswith("x")
    assert max(len(x) for x in out.splitlines()) <= 100
    assert "cause node-0013:" in out


def test_verbose_table_has_a_row_per_gpu_and_only_flagged_drops_the_healthy(slow_file, capsys):
    assert main(["analyze", slow_file, "-v", "--only-flagged"]) == 3
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("NODE "))
    assert lines[head].split()[:4] == ["NODE", "GPU", "RANK", "VERDICT"]
    rows = [x.split() for x in lines[head + 1:] if x.startswith("node-")]
    assert len(rows) == 8 and {r[0] for r in rows} == {"node-0013"}
    assert max(len(x) for x in lines) <= 100
    assert main(["analyze", slow_file, "--only-flagged", "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert [n["node"] for n in doc["jobs"][0]["nodes"]] == ["node-0013"]
    assert doc["jobs"][0]["healthy_nodes_omitted"] >= 1


def test_clean_file_exits_0(tmp_path, capsys):
    path = _write(tmp_path / "clean.jsonl", job_windows(32, 8, 6, seed=22))
    assert main(["analyze", path, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(n["verdict"] != "straggler" for n in doc["jobs"][0]["nodes"])


def test_scoring_flags_change_the_rules(slow_file, capsys):
    # with an 8-window persistence requirement nothing can be a straggler in 6 windows
    assert main(["analyze", slow_file, "--persist-k", "8", "--persist-n", "8"]) == 0
    assert main(["analyze", slow_file, "--persist-k", "9", "--persist-n", "8"]) == 2
    assert "persist_k" in capsys.readouterr().err


def test_missing_file_is_exit_2_with_the_fix(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "JSON-lines" in err


def test_bad_json_line_is_exit_2_naming_the_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    good = wire.window_to_json(job_windows(1, 1, 1, seed=1)[0])
    path.write_text(good + "\n{not json\n")
    assert main(["analyze", str(path)]) == 2
    assert f"{path}:2" in capsys.readouterr().err


def test_invalid_window_is_exit_2_naming_the_field(tmp_path, capsys):
    ws = job_windows(2, 2, 1, seed=1)
    ws[1].processes[0].apis[0].count += 1               # count disagrees with its histogram
    path = _write(tmp_path / "inv.jsonl", ws)
    assert main(["analyze", path]) == 2
    err = capsys.readouterr().err
    assert "window 2" in err and "processes[0].apis[0].count" in err


def test_unknown_job_is_exit_2(slow_file, capsys):
    assert main(["analyze", slow_file, "--job", "other"]) == 2
    assert "unknown job 'other'" in capsys.readouterr().err


def test_console_script_runs(slow_file):
    r = subprocess.run([sys.executable, "-m", "hypertrace.cli.main", "analyze", slow_file],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "node-0013" in r.stdout
