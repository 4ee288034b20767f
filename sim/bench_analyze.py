"""`python -m hypertrace.sim.bench_analyze FILE`: ``hypertrace analyze FILE`` as a user runs it,
wall time and CPU, with and without workers validating ahead, optionally side by side with
another source tree.

Why: ``bench_ingest`` measures each phase's CPU in one process; ``analyze`` may also validate
a large ``.pb`` file in worker processes while its reader ingests (proto/validate_ahead.py). Its
time on a machine with a free core per worker is then about the reader's own CPU, which this
reports beside the wall time (on a busy machine the wall time also holds the wait for a core).

Each run is a fresh subprocess (so the interpreter's start and imports count) of the command
line's ``main(["analyze", FILE, ...])``, its table kept in memory. Sides, alternating per round:
``base`` (``--compare-with DIR``: a directory holding a ``hypertrace`` source tree, run without
``--workers``), ``workers 0`` and ``workers N`` of this tree (``--workers N``, default: what
``analyze`` picks). Exit status 1 when the sides' tables differ.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import resource
import subprocess
import sys
import time


def one_run(path: str, workers: str) -> dict:
    """``analyze`` in this process: wall, the reader's CPU, the workers' CPU, the report."""
    from hypertrace.cli.main import main
    argv = ["analyze", path] + (["--workers", workers] if workers else [])
    out = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    wall = time.perf_counter() - t
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    digest = hashlib.sha256(out.getvalue().encode()).hexdigest()[:16]
    return {"wall": wall, "reader": me.ru_utime + me.ru_stime,
            "workers": kids.ru_utime + kids.ru_stime, "rc": rc, "digest": digest}


def run_side(path: str, tree: str, workers: str) -> dict:
    from hypertrace.sim.bench_ingest import tree_env   # not in the measured subprocess:
    env = tree_env(tree)                               # its tree may lack the helper
    cmd = [sys.executable, os.path.abspath(__file__), path, "--run-of", workers or "-"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[1] == "--run-of":    # the measuring subprocess, which may
        workers = argv[2]                           # import another tree: nothing else here
        print(json.dumps(one_run(argv[0], "" if workers == "-" else workers)))
        return 0
    from hypertrace.sim.bench_ingest import file_parser
    ap = file_parser("python -m hypertrace.sim.bench_analyze", __doc__,
                     "also run the code of this source tree (without --workers)")
    ap.add_argument("--workers", default="", metavar="N",
                    help="the workers side's --workers (default: what analyze picks)")
    args = ap.parse_args(argv)
    sides = ([("base", os.path.abspath(args.compare_with), "")] if args.compare_with else []) \
        + [("workers 0", "", "0"), (f"workers {args.workers or 'default'}", "", args.workers)]
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in sides}
    for k in range(args.rounds):
        for label, tree, workers in sides:
            r = run_side(args.file, tree, workers)
            runs[label].append(r)
            print(f"{label} round {k + 1}: wall {r['wall']:.2f} s, reader CPU {r['reader']:.2f} s,"
                  f" workers CPU {r['workers']:.2f} s, exit {r['rc']}, report {r['digest']}",
                  flush=True)
    first = next(iter(runs))
    print(f"\n| side | wall, s | reader CPU, s | workers CPU, s | reader CPU / {first}'s |")
    print("|---|---:|---:|---:|---:|")
    med = {label: {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in ("wall", "reader",
                                                                        "workers")}
           for label, rs in runs.items()}
    for label, m in med.items():
        print(f"| {label} | {m['wall']:.2f} | {m['reader']:.2f} | {m['workers']:.2f} | "
              f"{m['reader'] / med[first]['reader']:.2f} |")
    digests = {r["digest"] for rs in runs.values() for r in rs}
    print(f"\n(medians of {args.rounds}) same report on every run: "
          f"{'yes' if len(digests) == 1 else 'NO'}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
