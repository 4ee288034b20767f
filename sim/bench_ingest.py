"""`python -m hypertrace.sim.bench_ingest FILE`: the phases of ``hypertrace analyze FILE``, CPU
seconds, optionally side by side with another source tree.

Phases: parse (read the recorded windows), validate (``proto.wire.validate_window``, as
``analyze`` and the server run it), ingest (``Engine.ingest``), score (``Engine.flush``), report
(``Engine.report`` and the table). Each run is a fresh subprocess on one core (``taskset -c 0``
when available), so the two sides meet the same interpreter start and the same machine noise.

``--compare-with DIR`` alternates runs of the code imported from DIR (a directory holding a
``hypertrace`` source tree, e.g. ``git archive`` of another commit) and of this tree, prints
each phase's median and the ratio, and checks that both produced the same report (its bytes,
less the generated time). Exit status 1 when they differ.

Make the file with ``hypertrace simulate --gpus 16384 --windows 4 --seed 3 --straggler
node-0042:1.2 --output w16k.pb`` (BENCHMARKS.md, "Recorded windows").
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

from hypertrace.analyzer.report.job_report import build_report

PHASES = ("parse", "validate", "ingest", "score", "report")


def phases(path: str) -> dict:
    """CPU seconds of each phase over ``path``, and a digest of the report (this process)."""
    from hypertrace.analyzer.report.report_format import report_to_table
    from hypertrace.analyzer.score.engine import Engine
    from hypertrace.proto import records, wire

    clock = time.process_time
    out: dict = {}
    t = clock()
    if hasattr(records, "read_windows_sized"):
        windows = list(records.read_windows_sized(path))
    else:                                     # a tree from before sized records
        windows = [(w, None) for w in records.read_windows(path)]
    out["parse"], t = clock() - t, clock()
    for w, size in windows:
        wire.validate_window(w, encoded_size=size)
    out["validate"], t = clock() - t, clock()
    engine = Engine()
    for w, _ in windows:
        engine.ingest(w)
    out["ingest"], t = clock() - t, clock()
    engine.flush(None)
    out["score"], t = clock() - t, clock()
    report = build_report(engine)
    report_to_table(report)
    out["report"] = clock() - t
    report.ClearField("generated")
    out["digest"] = hashlib.sha256(report.SerializeToString(deterministic=True)).hexdigest()[:16]
    out["windows"] = len(windows)
    return out


def tree_env(tree: str) -> dict[str, str]:
    """The environment of a subprocess that imports the code of ``tree`` ("" = this one)."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([tree] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def file_parser(prog: str, doc: str, compare_help: str) -> argparse.ArgumentParser:
    """The arguments of a side-by-side benchmark of one recorded file (this one's and
    bench_analyze's)."""
    ap = argparse.ArgumentParser(prog=prog, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="recorded windows (.pb or JSON lines)")
    ap.add_argument("--compare-with", metavar="DIR", default="", help=compare_help)
    ap.add_argument("--rounds", type=int, default=3)
    return ap


def run_side(path: str, tree: str) -> dict:
    """One fresh subprocess measuring ``path`` with the code of ``tree`` ("" = this one)."""
    env = tree_env(tree)
    # run as a file, so that DIR's tree (which may lack this module) is what gets imported
    cmd = [sys.executable, os.path.abspath(__file__), "--phases-of", path]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0"] + cmd
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _line(label: str, r: dict) -> str:
    return f"{label}: " + ", ".join(f"{k} {r[k]:.2f}" for k in PHASES) + \
        f" (s, {r['windows']} windows, report {r['digest']})"


def main(argv: list[str] | None = None) -> int:
    ap = file_parser("python -m hypertrace.sim.bench_ingest", __doc__,
                     "alternate with the code of this source tree and print the ratios")
    ap.add_argument("--phases-of", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phases_of:                        # the measuring subprocess
        print(json.dumps(phases(args.file)))
        return 0
    sides = [("base", os.path.abspath(args.compare_with)), ("head", "")] if args.compare_with \
        else [("head", "")]
    runs: dict[str, list[dict]] = {label: [] for label, _ in sides}
    for k in range(args.rounds):
        for label, tree in sides:
            r = run_side(args.file, tree)
            runs[label].append(r)
            print(_line(f"{label} round {k + 1}", r), flush=True)
    med = {label: {p: sorted(r[p] for r in rs)[len(rs) // 2] for p in PHASES}
           for label, rs in runs.items()}
    print("\n| phase | " + " | ".join(f"{label}, s (median)" for label in runs)
          + (" | head/base |" if args.compare_with else " |"))
    print("|---|" + "---:|" * (len(runs) + (1 if args.compare_with else 0)))
    for p in PHASES + ("total",):
        vals = {label: (sum(m.values()) if p == "total" else m[p]) for label, m in med.items()}
        ratio = f" {vals['head'] / vals['base']:.2f} |" if args.compare_with else ""
        print(f"| {p} | " + " | ".join(f"{v:.2f}" for v in vals.values()) + " |" + ratio)
    digests = {r["digest"] for rs in runs.values() for r in rs}
    print(f"\nsame report on every run: {'yes' if len(digests) == 1 else 'NO'}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
