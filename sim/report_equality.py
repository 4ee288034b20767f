"""`python -m hypertrace.sim.report_equality FILE... --compare-with DIR`: are the reports of this
source tree the same as those of another, on the same recorded windows?

Why: a change that only makes the report or the ingest faster must leave every verdict, number
and line of the report as it was (the detection results are tuned on held-out seeds). This
runs each tree in a fresh subprocess over each file, both ways ``analyze`` ingests (window by
window, ``Engine.ingest``; in prepared chunks, ``Engine.ingest_prepared``, where the tree has
it), scores everything and compares digests of: the report's deterministic bytes (its
``generated`` time fixed), the table, the ``-v`` table, the ``--only-flagged`` table, the JSON
with its keys sorted (the order of a map's keys in JSON is not fixed), and each job's own
report. Exit status 1 when anything differs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

from hypertrace.analyzer.report.job_report import build_report

#: What is compared, in the order of each digest list.
PARTS = ("report bytes", "table", "-v table", "--only-flagged table", "JSON", "per-job reports")
#: Windows per prepared chunk: smaller than the workers' 256, so that small files hold several.
CHUNK = 64


def digests(paths: list[str]) -> dict[str, list[str]]:
    """``{"FILE (mode)": [digest per part]}`` with this process's code."""
    from hypertrace.analyzer.report.report_format import report_to_json, report_to_table
    from hypertrace.analyzer.score import engine as engine_module
    from hypertrace.proto import records

    modes = ["window by window"]
    if hasattr(engine_module, "prepare_windows"):
        modes.append("prepared chunks")
    out: dict[str, list[str]] = {}
    for path in paths:
        windows = list(records.read_windows(path))
        for mode in modes:
            engine = engine_module.Engine()
            if mode == "window by window":
                for w in windows:
                    engine.ingest(w)
            else:
                for i in range(0, len(windows), CHUNK):
                    engine.ingest_prepared(engine_module.prepare_windows(
                        windows[i:i + CHUNK], engine.config.window_ns))
            engine.flush(None)
            report = build_report(engine, now_ns=1)
            jobs = b"".join(build_report(engine, job, now_ns=1).SerializeToString(deterministic=True)
                            for job in engine.job_ids())
            parts = [report.SerializeToString(deterministic=True),
                     report_to_table(report).encode(),
                     report_to_table(report, verbose=True).encode(),
                     report_to_table(report, flagged_only=True).encode(),
                     json.dumps(json.loads(report_to_json(report)), sort_keys=True).encode(),
                     jobs]
            out[f"{os.path.basename(path)} ({mode})"] = [
                hashlib.sha256(p).hexdigest()[:16] for p in parts]
    return out


def tree_digests(paths: list[str], tree: str) -> dict[str, list[str]]:
    """:func:`digests` in a fresh subprocess that imports the code of ``tree`` ("" = this)."""
    from hypertrace.sim.bench_ingest import tree_env
    cmd = [sys.executable, os.path.abspath(__file__), "--digests-of", *paths]
    done = subprocess.run(cmd, env=tree_env(tree), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--digests-of"]:          # the subprocess, which may import another tree
        print(json.dumps(digests(argv[1:])))
        return 0
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.report_equality",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", metavar="FILE", help="recorded windows (.pb or JSON lines)")
    ap.add_argument("--compare-with", metavar="DIR", required=True,
                    help="a directory holding a hypertrace source tree (git archive of a commit)")
    args = ap.parse_args(argv)
    paths = [os.path.abspath(f) for f in args.files]
    base = tree_digests(paths, os.path.abspath(args.compare_with))
    head = tree_digests(paths, "")
    differ = 0
    for key, theirs in head.items():
        ours = base.get(key)
        if ours is None:
            print(f"{key}: not in the other tree (it cannot ingest this way)")
            continue
        bad = [part for part, a, b in zip(PARTS, ours, theirs) if a != b]
        differ += bool(bad)
        print(f"{key}: {'DIFFERENT: ' + ', '.join(bad) if bad else 'the same'}")
    print(f"\n{len(head)} reports compared, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
