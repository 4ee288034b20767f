"""The collector measures and the daemon runs it: nothing under collector/ imports the daemon,
not even inside a function (one window loop, in daemon/, drives both probe backends)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_the_collector_imports_nothing_of_the_daemon():
    files = sorted((ROOT / "collector").rglob("*.py"))
    assert len(files) > 20, "collector/ not found"
    bad = {str(f.relative_to(ROOT)): m for f in files for m in _imports(f)
           if m == "hypertrace.daemon" or m.startswith("hypertrace.daemon.")}
    assert not bad, f"collector modules import the daemon: {bad}"
