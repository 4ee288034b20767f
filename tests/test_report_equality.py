"""`python -m hypertrace.sim.report_equality` in miniature: the same code gives the same reports
both ways it ingests, and a tree whose table differs is caught."""
from __future__ import annotations

from pathlib import Path

from hypertrace.analyzer.report import report_format
from hypertrace.proto import records
from hypertrace.sim import report_equality
from hypertrace.sim.simulate import SimConfig, Straggler, generate

ROOT = Path(report_format.__file__).resolve().parents[1]     # this checkout's package


def _tree(tmp_path: Path, name: str, extra: str = "") -> str:
    """A directory whose ``hypertrace`` package is this checkout's (plus ``extra`` code)."""
    pkg = tmp_path / name / "hypertrace"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__path__ = [{str(ROOT)!r}]\n{extra}")
    return str(pkg.parent)


def test_the_same_code_gives_the_same_reports_and_a_changed_table_is_caught(tmp_path, capsys):
    path = tmp_path / "w.pb"
    cfg = SimConfig(gpus=64, gpus_per_node=8, windows=4, seed=3,
                    stragglers=(Straggler("node-0002", 1.3),))
    with records.open_for_write(str(path)) as fh:
        records.write_windows(generate(cfg), fh, binary=True)
    same = _tree(tmp_path, "same")
    assert report_equality.main([str(path), "--compare-with", same]) == 0
    out = capsys.readouterr().out
    assert "w.pb (window by window): the same" in out and "w.pb (prepared chunks): the same" in out
    changed = _tree(tmp_path, "changed", (
        "from hypertrace.analyzer.report import report_format as _rf\n"
        "_table = _rf.report_to_table\n"
        "_rf.report_to_table = lambda *a, **k: _table(*a, **k) + ' '\n"))
    assert report_equality.main([str(path), "--compare-with", changed]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT: table, -v table, --only-flagged table" in out
    assert "report bytes" not in out.split("DIFFERENT")[1].splitlines()[0]
