"""The runtime keeps its layers, read from the source: every import of every module, those made
inside functions too (the AST, not what happens to be loaded).

- no import cycles among hypertrace's modules;
- the analyzer's folders import only downward, along the path of a window: score < store <
  report < evict < ingest < scale (docs/design.md, "The path of a window");
- score/ is pure: nothing from ingest, store, report, evict or scale, and no grpc, sqlite3,
  multiprocessing, subprocess, socket or file access through pathlib;
- the agent, the analyzer and the wire package (daemon, collector, analyzer, proto) never import
  the simulators (hypertrace.sim) or the tests; in the CLI only `simulate` may;
- the analyzer never imports the agent (daemon, collector): a central analyzer host needs no bcc.

Then, as before, what a process really loads: the analyzer without the agent's modules, and the
default analyzer and the CLI without the cluster mode's NATS client.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("analyzer", "cli", "collector", "daemon", "proto", "sim")
#: The analyzer's folders, lowest first: a folder imports only from those before it.
ANALYZER_ORDER = ("score", "store", "report", "evict", "ingest", "scale")
#: What scoring never imports (top-level names and hypertrace packages).
SCORE_FORBIDDEN = ("grpc", "sqlite3", "multiprocessing", "subprocess", "socket", "pathlib",
                   "concurrent.futures.process", "hypertrace.analyzer.ingest", "hypertrace.analyzer.store",
                   "hypertrace.analyzer.report", "hypertrace.analyzer.evict",
                   "hypertrace.analyzer.scale", "hypertrace.daemon", "hypertrace.collector",
                   "hypertrace.cli", "hypertrace.sim")
#: CLI modules that may import the simulators.
CLI_SIM_ALLOWED = ("hypertrace.cli.simulate",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "hypertrace." + ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {module_name(p): p for top in TOPS for p in (ROOT / top).rglob("*.py")}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Every module ``path`` imports, at any depth of its code: hypertrace modules by their
    full name (``from pkg import mod`` names the module), anything else by its full dotted
    name; relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(full if full in known else base)
    return out


def resolve(name: str, known: set[str]) -> str | None:
    """The hypertrace module ``name`` is, or is inside; None for anything else."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> hypertrace modules it imports, module -> everything it imports)."""
    mods = source_modules()
    known = set(mods)
    raw = {m: imports_of(p, m, known) for m, p in mods.items()}
    graph = {m: {r for i in imps if (r := resolve(i, known)) and r != m} for m, imps in raw.items()}
    return graph, raw


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def analyzer_folder(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["hypertrace", "analyzer"] and len(parts) > 2 and parts[2] in ANALYZER_ORDER:
        return parts[2]
    return None


def violations() -> list[str]:
    """Every broken rule of the module docstring, one line each."""
    graph, raw = import_graph()
    out = [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    for mod in sorted(graph):
        top = mod.split(".")[1]
        folder = analyzer_folder(mod)
        for dep in sorted(graph[mod]):
            dep_folder = analyzer_folder(dep)
            if (folder and dep_folder
                    and ANALYZER_ORDER.index(dep_folder) > ANALYZER_ORDER.index(folder)):
                out.append(f"{mod} imports {dep}: analyzer/{folder} is below "
                           f"analyzer/{dep_folder}")
        if folder == "score":
            for name in sorted(raw[mod]):
                if any(name == f or name.startswith(f + ".") for f in SCORE_FORBIDDEN):
                    out.append(f"{mod} imports {name}: score/ is pure (no I/O, no processes, "
                               "nothing above it)")
        runtime = top in ("daemon", "collector", "analyzer", "proto")
        for name in sorted(raw[mod]):
            sim = name == "hypertrace.sim" or name.startswith("hypertrace.sim.")
            tests = name.split(".")[0] in ("tests", "conftest", "fakecuda_build")
            if (runtime and (sim or tests)) or (top == "cli" and sim
                                                and mod not in CLI_SIM_ALLOWED):
                out.append(f"{mod} imports {name}: the runtime never imports the simulators "
                           "or the tests")
            if top in ("analyzer", "proto") and name.startswith(("hypertrace.daemon",
                                                                 "hypertrace.collector")):
                out.append(f"{mod} imports {name}: the analyzer runs without the agent's code")
    return out


def test_the_source_keeps_its_layers():
    found = violations()
    assert not found, "layering broken:\n" + "\n".join(found)


def test_the_checker_sees_an_upward_import_inside_a_function(tmp_path, monkeypatch):
    """An import hidden in a function of score/ is found: the checker reads the AST."""
    mods = source_modules()
    target = mods["hypertrace.analyzer.score.theory"]
    spliced = target.read_text() + ("\n\ndef _sneaky():\n"
                                    "    from hypertrace.analyzer.report import causes\n"
                                    "    return causes\n")
    real = Path.read_text

    def read_text(self, *args, **kwargs):
        return spliced if self == target else real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "read_text", read_text)
    found = violations()
    assert any("score.theory imports hypertrace.analyzer.report.causes" in f for f in found)


def test_the_checker_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def _all_analyzer_modules(exclude: tuple[str, ...] = ()) -> list[str]:
    return sorted(m for m in source_modules() if m.startswith("hypertrace.analyzer.")
                  and not m.startswith(exclude))


def test_the_runtime_analyzer_imports_neither_daemon_nor_collector():
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in _all_analyzer_modules(
                ("hypertrace.analyzer.scale.cluster",)))
            + "bad = sorted(m for m in sys.modules if m.startswith(('hypertrace.daemon', "
              "'hypertrace.collector', 'hypertrace.sim')))\n"
              "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the analyzer imports the agent's modules: {out.stdout}"


def test_the_agent_and_the_cli_do_not_import_the_simulators():
    code = ("import sys\n"
            "import hypertrace.cli.main, hypertrace.daemon.agent, hypertrace.daemon.uplink\n"
            "import hypertrace.collector.governor, hypertrace.collector.steps\n"
            "print(','.join(sorted(m for m in sys.modules if m.startswith('hypertrace.sim'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"runtime code imports hypertrace.sim: {out.stdout}"


def test_the_default_analyzer_and_the_cli_need_no_nats_client():
    """nats-py is the cluster mode's dependency only (the `cluster` extra): building the CLI
    and running the single-process analyzer import neither it nor the cluster mode."""
    code = ("import sys\n"
            "import hypertrace.cli.main, hypertrace.analyzer.scale.serving\n"
            "hypertrace.cli.main.build_parser()\n"
            + "".join(f"import {m}\n" for m in _all_analyzer_modules(
                ("hypertrace.analyzer.scale.cluster",)))
            + "print(','.join(sorted(m for m in sys.modules if m == 'nats' or "
              "m.startswith(('nats.', 'hypertrace.analyzer.scale.cluster')))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the default path imports the cluster mode: {out.stdout}"
