"""``make bench-restart``: an analyzer restarted on a long history reaches the live verdicts, in
bounded memory.

A job's windows (``--gpus``, ``--windows``, one node 10% slow, wide noise) go into a real SQLite
file through ``Analyzer.ingest``, as the server stores them, with the live scoring pass after
every window period. Then a fresh Analyzer opens the file and replays it (``resume``), and the
two reports are compared GPU by GPU. Printed: windows, the replay's time and peak RSS growth,
the most epochs held in memory during the replay, whether the verdicts match, and the bytes
on disk per node-window (database and WAL, with the scores and verdicts stored beside). Exit status 1
when they differ or more than ``--max-pending`` epochs were held.

    python -m hypertrace.sim.bench_restart --gpus 4096 --windows 120
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path


def _rss_mb() -> float:
    """This process's peak RSS in MB: VmHWM, which starts afresh with the process image (the
    rusage maximum is kept across exec, so a spawned child would report its parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _verdicts(report) -> dict[tuple[str, str], str]:
    return {(n.node, g.gpu): g.verdict for j in report.jobs for n in j.nodes for g in n.gpus}


def _restart(db: Path, now_ns: int, out) -> None:
    """A fresh analyzer on ``db``: replay, score, and put (replayed, epochs held at most,
    verdicts, peak RSS MB before the replay and at the end) on ``out``."""
    from hypertrace.analyzer.server import Analyzer
    from hypertrace.analyzer.storage import Storage
    before = _rss_mb()
    storage = Storage.open(db, synchronous="NORMAL")
    a = Analyzer(storage)
    n = a.resume()
    a.flush(now_ns)
    out.put((n, a.replay_pending_max, _verdicts(a.report()), before, _rss_mb()))
    storage.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_restart",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=120)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-pending", type=int, default=4)
    args = ap.parse_args(argv)
    import logging
    logging.getLogger("hypertrace").setLevel(logging.ERROR)

    from hypertrace.analyzer.server import Analyzer
    from hypertrace.analyzer.storage import Storage
    from hypertrace.sim import scenarios
    from hypertrace.sim.simulate import generate

    cfg = scenarios.get("host-10").config(args.gpus, windows=args.windows, seed=args.seed)
    win_ns = int(cfg.window_seconds * 1e9)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "history.db"
        storage = Storage.open(db, synchronous="NORMAL")
        live = Analyzer(storage)
        t0 = time.monotonic()
        n = 0
        last_flush = None
        for w in generate(cfg):
            live.ingest(w)
            n += 1
            end = w.end.ToNanoseconds()
            if last_flush is None or end - last_flush >= win_ns:   # the live pass, per window
                live.flush(end)
                last_flush = end
        live.flush(last_flush + 10 * win_ns)
        live_verdicts = _verdicts(live.report())
        t1 = time.monotonic()
        storage.close()
        on_disk = sum(f.stat().st_size for f in (db, db.with_name(db.name + "-wal"))
                      if f.exists())
        size_mb = on_disk / 2**20
        # the restart in a fresh process of its own (spawned, not forked: a forked child's peak
        # RSS counts the parent's pages it touches, and read 112 or 470 MB for the same work)
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=_restart, args=(db, last_flush + 10 * win_ns, out))
        child.start()
        replayed, held, restarted_verdicts, rss0, rss1 = out.get()
        child.join()
        t2 = time.monotonic()
    same = live_verdicts == restarted_verdicts
    print(f"history: {args.gpus:,} GPUs x {args.windows} windows = {n:,} node-windows "
          f"({size_mb:.0f} MB of SQLite, {on_disk / n:,.0f} B per node-window with its scores "
          f"and verdicts), stored and scored live in {t1 - t0:.0f} s")
    print(f"restart: replayed {replayed:,} windows in {t2 - t1:.1f} s, at most {held} epochs held "
          f"in memory (limit {args.max_pending}); the restarted process's peak RSS "
          f"{rss1:.0f} MB ({rss0:.0f} MB before its replay)")
    stragglers = sorted({k[0] for k, v in restarted_verdicts.items() if v == "straggler"})
    print(f"verdicts: {'the same as live' if same else 'DIFFERENT from live'} for all "
          f"{len(restarted_verdicts):,} GPUs; stragglers {stragglers}")
    ok = same and held <= args.max_pending
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
