"""`python -m hypertrace.sim.bench_analyze FILE`: ``hypertrace analyze FILE`` as a user runs it,
wall time and CPU, with and without workers reading ahead, optionally side by side with
another source tree.

Why: ``bench_ingest`` measures each phase's CPU in one process; ``analyze`` reads a large
``.pb`` file with worker processes that validate and accumulate its windows while the reader
registers GPUs and scores (analyzer/scale/validate_ahead.py). Its time depends on how the work divides
between them and on free cores, so this reports the reader's and the workers' CPU beside the
wall time (on a busy machine the wall time also holds the wait for a core).

Each run is a fresh subprocess (so the interpreter's start and imports count: "command" is its
wall time from start to exit, "wall" the time in ``main``) of the command line's
``main(["analyze", FILE, ...])``, its table kept in memory. "workers CPU" is the CPU of the
run's other processes (validation workers, their forkserver), reaped by this process as their
subreaper. "first chunk" is when the reader took the workers' first chunk and "after the last
chunk" the time left once it had ingested their last (scoring the last epoch, the report, its
table): the start and the tail that no worker can take off the reader. Sides, alternating per
round:
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


class _ChunkClock:
    """When the reader took its first and its last prepared chunk (``Engine.ingest_prepared``),
    without importing the Engine before ``analyze`` does (its import is part of the start):
    the method is wrapped as the module is first imported, in whichever tree is measured."""

    MODULE = "hypertrace.analyzer.score.engine"

    def __init__(self, t0: float):
        self.t0 = t0
        self.first: float | None = None
        self.last_done: float | None = None

    def find_spec(self, name, path=None, target=None):
        if name != self.MODULE:
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load, clock = spec.loader.exec_module, self

        def exec_module(module):
            load(module)
            ingest = getattr(module.Engine, "ingest_prepared", None)
            if ingest is None:
                return

            def timed(engine, prepared):
                if clock.first is None:
                    clock.first = time.perf_counter() - clock.t0
                out = ingest(engine, prepared)
                clock.last_done = time.perf_counter() - clock.t0
                return out
            module.Engine.ingest_prepared = timed
        spec.loader.exec_module = exec_module
        return spec


def one_run(path: str, workers: str) -> dict:
    """``analyze`` in this process: wall, the reader's CPU, its children's CPU (not the
    validation workers': they are the forkserver's children), the report; ``first``: when the
    reader took the workers' first chunk, ``tail``: the time after it ingested their last
    (scoring what is left, the report, its table), both from ``main``'s start (NaN without
    workers)."""
    clock = _ChunkClock(0.0)
    sys.meta_path.insert(0, clock)
    from hypertrace.cli.main import main
    argv = ["analyze", path] + (["--workers", workers] if workers else [])
    out = io.StringIO()
    t = clock.t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    wall = time.perf_counter() - t
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    digest = hashlib.sha256(out.getvalue().encode()).hexdigest()[:16]
    nan = float("nan")
    return {"wall": wall, "reader": me.ru_utime + me.ru_stime,
            "workers": kids.ru_utime + kids.ru_stime, "rc": rc, "digest": digest,
            "first": nan if clock.first is None else clock.first,
            "tail": nan if clock.last_done is None else wall - clock.last_done}


def adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``),
    so that the CPU of a run's validation workers and their forkserver, which outlive the run's
    own process by a moment, is counted in this process's children's usage once reaped."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_orphans(timeout_s: float = 10.0) -> None:
    """Wait for the adopted orphans of the last run (its forkserver ends once the run did)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


def run_side(path: str, tree: str, workers: str, adopted: bool = False) -> dict:
    """One measured run. Adds ``command``: the wall time of the whole command (interpreter
    start and imports too), and, when ``adopted`` (:func:`adopt_orphans`), ``workers``: the
    CPU of every other process of the run (the validation workers, their forkserver)."""
    from hypertrace.sim.bench_ingest import tree_env  # not in the measured subprocess:
    env = tree_env(tree)                               # its tree may lack the helper
    cmd = [sys.executable, os.path.abspath(__file__), path, "--run-of", workers or "-"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    command = time.perf_counter() - t
    r = json.loads(done.stdout.strip().splitlines()[-1])
    r["command"] = command
    if adopted:
        _reap_orphans()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        tree_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        r["workers"] = max(tree_cpu - r["reader"], 0.0)
    return r


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
    adopted = adopt_orphans()
    nan = float("nan")
    for k in range(args.rounds):
        for label, tree, workers in sides:
            r = run_side(args.file, tree, workers, adopted)
            runs[label].append(r)
            print(f"{label} round {k + 1}: command {r['command']:.2f} s, wall {r['wall']:.2f} s, "
                  f"reader CPU {r['reader']:.2f} s, workers CPU {r['workers']:.2f} s, first "
                  f"chunk {r.get('first', nan):.2f} s, tail {r.get('tail', nan):.2f} s, exit "
                  f"{r['rc']}, report {r['digest']}", flush=True)
    first = next(iter(runs))
    keys = ("command", "wall", "reader", "workers", "first", "tail")
    med = {label: {k: sorted(r.get(k, nan) for r in rs)[len(rs) // 2] for k in keys}
           for label, rs in runs.items()}
    print(f"\n| side | command, s | wall in main(), s | reader CPU, s | workers CPU, s | "
          f"first chunk, s | after the last chunk, s | command / {first}'s | "
          f"reader CPU / {first}'s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, m in med.items():
        print(f"| {label} | {m['command']:.2f} | {m['wall']:.2f} | {m['reader']:.2f} | "
              f"{m['workers']:.2f} | {m['first']:.2f} | {m['tail']:.2f} | "
              f"{m['command'] / med[first]['command']:.2f} | "
              f"{m['reader'] / med[first]['reader']:.2f} |")
    if not adopted:
        print("(workers CPU: only the run's own children; this system cannot adopt orphans)")
    digests = {r["digest"] for rs in runs.values() for r in rs}
    print(f"\n(medians of {args.rounds}) same report on every run: "
          f"{'yes' if len(digests) == 1 else 'NO'}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
