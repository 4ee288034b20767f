"""``make bench-storage``: the disk a live analyzer takes, as ``du`` sees it, per node-window.

What runs, per job size (``--gpus``, default 2,048 and 16,384):

1. ``hypertrace analyzer`` as a subprocess (:func:`hypertrace.sim.bench_scale.start_analyzer`),
   a fresh database, ``synchronous=FULL`` as deployed, and a short retention so that a run of
   minutes reaches the retention's steady state: raw windows kept ``--retention-s``, compacted
   into blocks ``--compact-after-s`` after they ended, a retention pass every
   ``--retention-every-s`` (``--summary-retention-days 0``: the windows follow the raw
   retention, not their 5-minute slot's summary).
2. Simulated agents over real gRPC (:mod:`hypertrace.sim.scale_load`), paced on the wall clock
   in 10-s windows as agents send them, one node 30% slow.
3. Every second: the bytes the database's files take on disk (``st_blocks * 512`` of the file,
   its ``-wal`` and ``-shm``: what ``du`` counts, free pages and the WAL included) and the
   node-windows the file holds (``windows`` and ``compacted`` rows). Per node-window at steady
   state: once the first windows have left the retention and a pass compacted and pruned, for
   ``--steady-s`` seconds; the mean and the worst sample.
4. The load stops and the analyzer gets SIGINT, as an operator stops it: the files after it
   exited.

Checks (exit status 1 when one fails): the worst steady-state sample at most ``--max-bytes``
(1,536 B) per node-window; the database file shrank after a retention pass (its size fell
below its earlier peak while the load went on: pages freed by pruning and compaction are given
back to the file system, not only kept for reuse).

``--compare-with REF`` runs the same load against the analyzer of another commit (a git ref,
exported with ``git archive``, or a directory holding a ``hypertrace`` source tree), base then
head per size, and prints the ratios. The checks apply to this tree's runs.

    python -m hypertrace.sim.bench_disk --gpus 2048,16384 --compare-with main
"""
from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hypertrace.sim.bench_scale import ScaleConfig, machine_info, make_pool, start_analyzer
from hypertrace.sim.scale_load import LoadProcesses, Plan, raise_fd_limit

GPUS_PER_NODE = 8
#: node-windows the file holds at steady state at least (the default retention follows): the
#: bytes that do not grow with the windows (the WAL up to its bound, the Engine snapshot, the
#: last page of each table and index, the -shm file) are shared by as many windows as in a job
#: of 2,048 nodes kept 5 minutes; under the default 6-h retention they are shared by hundreds
#: of times more
HELD_AT_LEAST = 15000
#: job sizes up to this many GPUs run base and head at the same time (the analyzers then take
#: a fraction of a core each); larger ones one after the other
PARALLEL_UP_TO_GPUS = 4096
#: the goal: what ``du`` shows of a live analyzer at steady state, per node-window
MAX_BYTES = 1536.0


@dataclass
class Sample:
    """One look at the files of a running analyzer."""

    t: float                  # seconds since the first window's end
    db: int                   # bytes on disk (st_blocks * 512) of the file, -wal, -shm
    wal: int
    shm: int
    held: int                 # node-windows in the file (windows + compacted)

    @property
    def total(self) -> int:
        return self.db + self.wal + self.shm


@dataclass
class DiskRun:
    side: str
    gpus: int
    samples: list[Sample] = field(default_factory=list)
    steady_from: float = 0.0
    after_exit: Sample | None = None
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    def steady(self) -> list[Sample]:
        return [s for s in self.samples if s.t >= self.steady_from and s.held]

    def per_window(self) -> tuple[float, float]:
        """(mean, worst) bytes per node-window over the steady-state samples."""
        v = np.array([s.total / s.held for s in self.steady()])
        return (float(v.mean()), float(v.max())) if len(v) else (float("nan"),) * 2

    def part(self, name: str) -> float:
        """Mean bytes per node-window at steady state of the file ``db``, ``wal`` or ``shm``."""
        v = [getattr(s, name) / s.held for s in self.steady()]
        return float(np.mean(v)) if v else float("nan")

    def shrank(self) -> tuple[int, int]:
        """(peak, lowest after it) of the database file (without WAL) while the load ran."""
        peak, low, best = 0, 0, (0, 0)
        for s in self.samples:
            if s.db > peak:
                peak, low = s.db, s.db
            low = min(low, s.db)
            if peak - low > best[0] - best[1]:
                best = (peak, low)
        return best if best != (0, 0) else (peak, peak)


def on_disk(path: Path) -> int:
    """Bytes a file takes on disk, as ``du`` counts them (0: no such file)."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def held_windows(db: Path) -> int:
    """Node-windows in the file, read on a read-only connection (a few ms; 0 when busy)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error:
        return 0
    try:
        return int(conn.execute("SELECT (SELECT COUNT(*) FROM windows) + "
                                "(SELECT COUNT(*) FROM compacted)").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


def sample(db: Path, t: float) -> Sample:
    return Sample(t, on_disk(db), on_disk(Path(f"{db}-wal")), on_disk(Path(f"{db}-shm")),
                  held_windows(db))


def export_tree(ref: str, into: Path) -> str:
    """A directory whose ``hypertrace`` is the source tree of ``ref`` (a directory holding one
    already, or a git ref exported with ``git archive``): what the base analyzer imports."""
    if Path(ref).is_dir():
        return str(Path(ref).resolve())
    repo = Path(__file__).resolve().parent.parent
    tree = into / "hypertrace"
    tree.mkdir(parents=True)
    archive = into / "tree.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "-C", str(repo), "archive", ref], stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree)
    archive.unlink()
    return str(into)


def run_disk(side: str, cfg: ScaleConfig, retention_s: float, compact_after_s: float,
             every_s: float, steady_s: float, workdir: Path) -> DiskRun:
    """One live analyzer under paced load until ``steady_s`` into its steady state; then
    SIGINT. See the module docstring."""
    run = DiskRun(side, cfg.gpus)
    pool_file = workdir / "pool.pickle"
    make_pool(cfg).save(str(pool_file))
    win_s = cfg.window_seconds
    # steady state: the first windows left the retention, and a pass since pruned them
    run.steady_from = retention_s + max(compact_after_s, win_s) + 2 * every_s + win_s
    paced = int(np.ceil((run.steady_from + steady_s) / win_s)) + 1
    rng = np.random.default_rng(cfg.seed)
    delays = rng.uniform(0.0, cfg.spread_seconds * 1e9, cfg.nodes).astype(np.int64)
    order = [int(i) for i in np.argsort(delays, kind="stable")]
    proc, target, db = start_analyzer(cfg, workdir)
    gen = None
    try:
        gen = LoadProcesses(target, str(pool_file), order, delays, 1, False, cfg.streams,
                            1.0, cfg.channels)
        win_ns = int(win_s * 1e9)
        plan = Plan(0, paced, 0, win_ns, 0)
        gen.connect(plan)
        first = (time.time_ns() + win_ns // 2) // win_ns
        plan = replace(plan, first_epoch=first, ack_timeout_s=120.0)
        gen.start(plan)
        t0 = (first + 1) * win_ns / 1e9           # the first window's end
        stop_at = t0 + paced * win_s
        last_print = 0.0
        while time.time() < stop_at:
            time.sleep(1.0 - (time.time() % 1.0))
            s = sample(db, time.time() - t0)
            run.samples.append(s)
            if s.t - last_print >= 30:
                last_print = s.t
                print(f"    {side} {run.gpus:,}: t={s.t:5.0f} s  du {s.total / 1e6:7.2f} MB (wal "
                         f"{s.wal / 1e6:.2f})  {s.held:,} node-windows  "
                         f"{s.total / max(s.held, 1):,.0f} B each"
                         + ("  [steady]" if s.t >= run.steady_from else ""), flush=True)
        for r in gen.results(timeout=180.0):
            if isinstance(r, str):
                run.errors.append(r)
            else:
                run.sent += int((r.sent_ns > 0).sum())
                run.errors.extend(r.errors)
    finally:
        if gen is not None:
            gen.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    run.after_exit = sample(db, time.time() - t0)
    return run


def describe(r: DiskRun) -> list[str]:
    mean, worst = r.per_window()
    peak, low = r.shrank()
    ex = r.after_exit
    return [f"{r.gpus:>7,} {r.side:5s} {mean:>9,.0f} B {worst:>9,.0f} B "
            f"{r.part('db'):>8,.0f} {r.part('wal'):>8,.0f} {r.part('shm'):>6,.0f} "
            f"{peak / 1e6:>9.2f} {low / 1e6:>9.2f} "
            f"{(ex.total / ex.held if ex and ex.held else float('nan')):>10,.0f} B"]


HEADER = (f"{'GPUs':>7s} {'side':5s} {'mean/nw':>11s} {'worst/nw':>11s} {'db':>8s} {'wal':>8s} "
          f"{'shm':>6s} {'peak MB':>9s} {'low MB':>9s} {'after exit':>12s}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_disk", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="2048,16384", help="job sizes, comma-separated")
    ap.add_argument("--retention-s", type=float, default=0.0,
                    help="the analyzer's raw retention in seconds (default: enough that the "
                    f"file holds {HELD_AT_LEAST:,} node-windows, at least 300 s)")
    ap.add_argument("--compact-after-s", type=float, default=10.0)
    ap.add_argument("--retention-every-s", type=float, default=10.0)
    ap.add_argument("--steady-s", type=float, default=60.0,
                    help="seconds sampled at steady state (default 60)")
    ap.add_argument("--max-bytes", type=float, default=MAX_BYTES,
                    help=f"goal per node-window at steady state (default {MAX_BYTES:g})")
    ap.add_argument("--compare-with", default="", metavar="REF",
                    help="also run the analyzer of this git ref (or directory holding a "
                    "hypertrace tree), base then head per size")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.gpus.split(",") if x.strip()]
    print(f"== machine: {machine_info()}", flush=True)
    print(f"== analyzer: --compact-after-s {args.compact_after_s:g} --retention-every-s "
          f"{args.retention_every_s:g} --summary-retention-days 0; synchronous=FULL; 10-s "
          f"windows; steady state sampled {args.steady_s:g} s", flush=True)
    raise_fd_limit()
    runs: list[DiskRun] = []
    with tempfile.TemporaryDirectory(prefix="hypertrace-disk-") as tmp:
        sides = [("head", "")]
        if args.compare_with:
            base = export_tree(args.compare_with, Path(tmp) / "base-tree")
            sides.insert(0, ("base", base))
            print(f"== base: {args.compare_with}; head: this tree", flush=True)
        for gpus in sizes:
            nodes = gpus // GPUS_PER_NODE
            retention = args.retention_s or max(300.0, 10.0 * np.ceil(HELD_AT_LEAST / nodes))
            flags = ("--retention-hours", f"{retention / 3600:.6f}", "--compact-after-s",
                     f"{args.compact_after_s:g}", "--retention-every-s",
                     f"{args.retention_every_s:g}", "--summary-retention-days", "0")

            def one(side: str, path: str, gpus: int = gpus, retention: float = retention,
                    flags: tuple = flags) -> DiskRun:
                work = Path(tmp) / f"{side}-{gpus}"
                work.mkdir()
                cfg = ScaleConfig(nodes=gpus // GPUS_PER_NODE, blast_epochs=0, seed=args.seed,
                                  analyzer_path=path, analyzer_args=flags)
                r = run_disk(side, cfg, retention, args.compact_after_s,
                             args.retention_every_s, args.steady_s, work)
                if r.errors:
                    print(f"    {side}: load errors: {r.errors[:3]}", flush=True)
                print("    " + describe(r)[0], flush=True)
                return r

            together = gpus <= PARALLEL_UP_TO_GPUS and len(sides) > 1
            print(f"== {gpus:,} GPUs ({nodes:,} nodes), raw retention {retention:g} s; "
                  + ("base and head at the same time" if together else
                     " then ".join(s for s, _ in sides)), flush=True)
            if together:
                with ThreadPoolExecutor(len(sides)) as ex:
                    runs.extend(ex.map(lambda sp: one(*sp), sides))
            else:
                runs.extend(one(side, path) for side, path in sides)
    print("\nper node-window (nw) at steady state, as du counts (file + WAL + shm; db, wal, "
          "shm: mean per nw); database file peak and lowest after it while loaded; all files "
          "after SIGINT:")
    print(HEADER)
    for r in runs:
        for line in describe(r):
            print(line)
    ok = True
    by = {(r.side, r.gpus): r for r in runs}
    if args.compare_with:
        print("\nhead / base (mean, worst per node-window):")
        for gpus in sizes:
            b, h = by[("base", gpus)], by[("head", gpus)]
            (bm, bw), (hm, hw) = b.per_window(), h.per_window()
            print(f"{gpus:>7,} GPUs: {hm / bm:.3f}x, {hw / bw:.3f}x")
    print("\nchecks (this tree):")
    for gpus in sizes:
        h = by[("head", gpus)]
        _, worst = h.per_window()
        peak, low = h.shrank()
        checks = [(f"{gpus:,} GPUs: worst steady-state sample {worst:,.0f} B <= "
                   f"{args.max_bytes:,.0f} B per node-window", worst <= args.max_bytes),
                  (f"{gpus:,} GPUs: the database file shrank after retention (peak "
                   f"{peak / 1e6:.2f} MB, then {low / 1e6:.2f} MB)", low < peak),
                  (f"{gpus:,} GPUs: every window sent without error", not h.errors)]
        for what, passed in checks:
            print(f"  {'ok  ' if passed else 'FAIL'} {what}")
            ok &= passed
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
