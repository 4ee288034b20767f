"""``make bench-restart``: an analyzer restarted on a long history reaches the live verdicts, in
seconds and bounded memory.

A job's windows (``--gpus``, ``--windows``, one node 10% slow, wide noise) go into a real SQLite
file through ``Analyzer.ingest``, as the server stores them, with the live scoring pass after
every window period. The live analyzer stores its Engine snapshot once, ``--snapshot-seconds``
less one window period before the history ends, and goes down just before its next snapshot
would have been due: the worst moment for a restart (the most windows follow the snapshot).

The windows that ended more than ``COMPACT_AFTER_S`` before it went down are then compacted
into blocks, as its retention passes would have done (``--no-compact``: not).

Then, side by side in one run, each in a fresh spawned process on the same file:

* **from the snapshot** (this code): load it, replay the windows stored after it;
* **full replay** (the analyzer before snapshots, and the fallback when a snapshot cannot be
  used): replay every stored window.

Printed per restart: windows replayed, wall time from the process's spawn to its first scoring
pass done (imports included), peak RSS, and whether every GPU's verdict is the live one.
Exit status 1 when a restart's verdicts differ from live, when a replay held more than
``--max-pending`` epochs, or when the restart from the snapshot misses ``--max-seconds`` or
``--max-rss-mb`` (the goals: 15 s and 1 GB with an hour of 16,384-GPU history).

Why the history's length barely matters to the snapshot restart: it replays only the windows
since the snapshot (at most ``--snapshot-seconds`` of them, 6,144 windows at 16,384 GPUs and 30
s) and loads a state whose size follows the GPUs, not the hours. ``--windows`` shorter than an
hour therefore measures the same restart; the full replay grows with the history, and its
per-window cost is printed to extrapolate it.

``--older-windows``: an older history before the live windows, written straight into the
file as the retention passes would have left it (compacted blocks, their rows, scored epochs
and score rows; :func:`_older_history`): 55 minutes of 16,384 GPUs in about 5 minutes here,
where storing and scoring them live, then compacting them, would take about an hour and a half.
It measures what the restart from the snapshot pays for a long history (the file it opens), not
the full replay (not run then).

    python -m hypertrace.sim.bench_restart --gpus 16384 --windows 30
    python -m hypertrace.sim.bench_restart --gpus 16384 --windows 30 --older-windows 330
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

#: An hour of windows of one node (10-s windows).
HOUR_WINDOWS = 360


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


def _history(cfg, chunk: int, skip: int = 0):
    """``cfg``'s job for ``cfg.windows`` windows, simulated ``chunk`` windows at a time: each
    chunk is the same simulated job (the same slow node and noise), moved on in time, with the
    agents' sequence numbers continuing. The simulator draws a whole run's counts at once, so
    an hour of 16,384 GPUs in one piece would not fit in memory. ``skip``: begin that many
    windows after the job's start (the older ones are :func:`_older_history`'s)."""
    import dataclasses

    from hypertrace.sim.simulate import generate
    win_ns = int(round(cfg.window_seconds * 1e9))
    done = skip
    while done < skip + cfg.windows:
        n = min(chunk, skip + cfg.windows - done)
        part = dataclasses.replace(cfg, windows=n, start_ns=cfg.first_start_ns + done * win_ns)
        for w in generate(part):
            w.seq += done
            yield w
        done += n


def _older_history(db: Path, cfg, older: int) -> tuple[int, float]:
    """Write ``older`` windows per node of history straight into the file, before the live
    ones, as the retention passes would have left them: compacted, one block per epoch, with
    their rows in ``compacted``. Simulating, storing and compacting them one by one would take
    most of an hour here; so the first epoch is simulated and compacted once, and every later
    epoch's block is a copy of it under that epoch's window ids (``blocks.with_ids``), its rows
    keyed and timed as that epoch's windows (agent and node, seq, end). Only the restart's
    reads of the file are measured with it: a window of a copied block decodes to the first
    epoch's window, so the full replay is not run on such a history. Returns (the windows
    written, seconds)."""
    import dataclasses
    import sqlite3

    from hypertrace.analyzer.store import blocks
    from hypertrace.analyzer.store.storage import Storage, window_digest
    from hypertrace.sim.simulate import generate
    t0 = time.monotonic()
    win_ns = int(round(cfg.window_seconds * 1e9))
    Storage.open(db, synchronous="NORMAL").close()            # the schema
    first = list(generate(dataclasses.replace(cfg, windows=1, start_ns=cfg.first_start_ns)))
    data = [w.SerializeToString() for w in first]
    template = blocks.encode(list(enumerate(data)))
    digests = [window_digest(d) for d in data]
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.executemany("INSERT INTO window_sources (id, agent_id, node) VALUES (?, ?, ?)",
                     [(j + 1, w.agent_id, w.node) for j, w in enumerate(first)])
    sources = list(range(1, len(first) + 1))
    wid = 0
    for k in range(older):
        shift = k * win_ns
        ids = list(range(wid + 1, wid + 1 + len(first)))
        end = max(w.end.ToNanoseconds() for w in first) + shift
        conn.execute("BEGIN")
        block = conn.execute("INSERT INTO blocks (end_ns, data) VALUES (?, ?)",
                             (end, blocks.with_ids(template, ids))).lastrowid
        conn.executemany(
            "INSERT INTO compacted (id, source, seq, end_ns, received_after_ns, late, block, "
            "digest) VALUES (?, ?, ?, ?, 0, 0, ?, ?)",
            [(i, src, w.seq + k, w.end.ToNanoseconds() + shift, block, d)
             for i, w, d, src in zip(ids, first, digests, sources)])
        conn.execute("COMMIT")
        wid = ids[-1]
    # the live windows' ids go on after these (the windows table's AUTOINCREMENT)
    conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('windows', ?)", (wid,))
    conn.close()
    return wid, time.monotonic() - t0


def _older_results(db: Path, older: int, win_ns: int) -> None:
    """The older history's scored epochs and score rows, as many per epoch as the live first
    epoch's (copied from it under the older epochs' numbers): what they add to the file."""
    import sqlite3
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    (first,) = conn.execute("SELECT MIN(epoch) FROM epochs").fetchone()
    for table in ("epochs", "scores"):
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        sel = ", ".join("epoch - ?" if c == "epoch" else "created_ns - ?" if c == "created_ns"
                        else c for c in cols)
        for d in range(1, older + 1):
            conn.execute(f"INSERT INTO {table} SELECT {sel} FROM {table} WHERE epoch = ?",
                         (d, d * win_ns, first))
    conn.execute("COMMIT")
    conn.close()


def _verdicts(report) -> dict[tuple[str, str], str]:
    return {(n.node, g.gpu): g.verdict for j in report.jobs for n in j.nodes for g in n.gpus}


def _restart(db: Path, now_ns: int, use_snapshot: bool, out) -> None:
    """A fresh analyzer on ``db``: resume, score, and put (replayed, epochs held at most,
    verdicts, whether it started from the snapshot, seconds to resume and score, peak RSS MB)
    on ``out``. Logging stays quiet: the benchmark times the work, not the log lines."""
    import logging
    logging.getLogger("hypertrace").setLevel(logging.ERROR)
    t0 = time.monotonic()
    from hypertrace.analyzer.ingest.server import Analyzer
    from hypertrace.analyzer.store.storage import Storage
    storage = Storage.open(db, synchronous="NORMAL")
    a = Analyzer(storage)
    n = a.resume(use_snapshot=use_snapshot)
    a.flush(now_ns)
    work = time.monotonic() - t0
    out.put((n, a.replay_pending_max, _verdicts(a.report()), a.resumed_from_snapshot, work,
             _rss_mb()))
    storage.close()


def _run_restart(db: Path, now_ns: int, use_snapshot: bool) -> tuple:
    """One restart in a fresh spawned process (not forked: a forked child's peak RSS counts the
    parent's pages it touches); returns _restart's tuple plus the wall time from the spawn."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    t0 = time.monotonic()
    child = ctx.Process(target=_restart, args=(db, now_ns, use_snapshot, out))
    child.start()
    got = out.get()
    wall = time.monotonic() - t0
    child.join()
    return (*got, wall)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_restart",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=30,
                    help="windows per node stored and scored live (360: an hour)")
    ap.add_argument("--older-windows", type=int, default=0,
                    help="windows per node of older history before the live ones, written "
                         "straight into the file as compacted blocks (330 with --windows 30: "
                         "an hour in all); implies --no-full-replay")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--snapshot-seconds", type=float, default=30.0)
    ap.add_argument("--max-pending", type=int, default=4)
    ap.add_argument("--max-seconds", type=float, default=15.0,
                    help="goal for the restart from the snapshot, spawn to first scoring pass")
    ap.add_argument("--max-rss-mb", type=float, default=1024.0)
    ap.add_argument("--chunk-windows", type=int, default=30,
                    help="generate the history this many windows at a time (the simulator holds "
                         "a chunk's counts in memory: 30 windows of 16,384 GPUs take ~5 GB)")
    ap.add_argument("--no-full-replay", action="store_true",
                    help="skip the full replay (it grows with the history)")
    ap.add_argument("--no-compact", action="store_true",
                    help="leave every window stored one by one (by default those that ended "
                         "more than COMPACT_AFTER_S before the analyzer stopped are compacted "
                         "into blocks, as its retention passes would have done)")
    args = ap.parse_args(argv)
    import logging
    logging.getLogger("hypertrace").setLevel(logging.ERROR)

    from hypertrace.analyzer.ingest.server import Analyzer
    from hypertrace.analyzer.store.storage import COMPACT_AFTER_S, Storage
    from hypertrace.sim import scenarios

    cfg = scenarios.get("host-10").config(args.gpus, windows=args.windows, seed=args.seed)
    win_ns = int(cfg.window_seconds * 1e9)
    chunk = min(args.windows, args.chunk_windows)
    snap_ns = int(args.snapshot_seconds * 1e9)
    older = args.older_windows
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "history.db"
        n_older, t_older = _older_history(db, cfg, older) if older else (0, 0.0)
        storage = Storage.open(db, synchronous="NORMAL")
        # one snapshot, taken one window period after the previous one was due: the analyzer
        # then goes down just before the next (the most windows to replay after a restart)
        live = Analyzer(storage, snapshot_seconds=0)
        t0 = time.monotonic()
        n = 0
        last_flush = snap_at = None
        passes: list[float] = []          # seconds of each live scoring pass
        snap_pass: list[float] = []       # the one that also took the snapshot
        for w in _history(cfg, chunk, skip=older):
            live.ingest(w)
            n += 1
            end = w.end.ToNanoseconds()
            if snap_at is None:
                snap_at = end + max(0, args.windows * win_ns - snap_ns)
            if last_flush is None or end - last_flush >= win_ns:   # the live pass, per window
                take = end >= snap_at and storage.snapshot() is None
                live.snapshot_seconds = args.snapshot_seconds if take else 0
                tf = time.monotonic()
                live.flush(end)
                (snap_pass if take else passes).append(time.monotonic() - tf)
                last_flush = end
        live.snapshot_seconds = 0                  # the live analyzer goes down here
        live.flush(last_flush + win_ns)
        live_verdicts = _verdicts(live.report())
        t1 = time.monotonic()
        if older:
            _older_results(db, older, win_ns)
        snap = storage.snapshot()
        compacted, t_compact = 0, 0.0
        if not args.no_compact:        # what the retention passes did while the job ran
            tc = time.monotonic()
            compacted = storage.compact(last_flush + win_ns - int(COMPACT_AFTER_S * 1e9))
            t_compact = time.monotonic() - tc
        storage.close()
        on_disk = sum(f.stat().st_size for f in (db, db.with_name(db.name + "-wal"))
                      if f.exists())
        now = last_flush + 10 * win_ns
        runs = [("from the snapshot", _run_restart(db, now, True))]
        if not args.no_full_replay and not older:
            runs.append(("full replay", _run_restart(db, now, False)))
    nodes = args.gpus // cfg.gpus_per_node
    if older:
        print(f"older history: {older} windows per node ({n_older:,} node-windows, "
              f"{older * cfg.window_seconds / 60:.0f} min) written straight into the file as "
              f"compacted blocks in {t_older:.0f} s (copies of the first epoch's block), with "
              f"their scored epochs and score rows")
    print(f"live history: {args.gpus:,} GPUs x {args.windows} windows = {n:,} node-windows "
          f"({on_disk / 2**20:.0f} MB of SQLite with the older history, "
          f"{on_disk / (n + n_older):,.0f} B per node-window with its scores, verdicts and "
          f"snapshot), stored and scored live in {t1 - t0:.0f} s; "
          f"{compacted:,} of them compacted into blocks (ended more than "
          f"{COMPACT_AFTER_S:g} s before the analyzer stopped) in {t_compact:.0f} s")
    if snap is not None:
        print(f"last snapshot: {len(snap.state) / 2**20:.1f} MB compressed, taken "
              f"{(last_flush - snap.created_ns) / 1e9:.0f} s before the live analyzer stopped "
              f"(every {args.snapshot_seconds:g} s); the scoring pass that took it: "
              f"{snap_pass[0]:.2f} s, the others {statistics.median(passes):.2f} s (median)")
    print(f"{'restart':18s} {'replayed':>9s} {'held':>5s} {'resume+score':>13s} "
          f"{'spawn to done':>14s} {'peak RSS':>9s}  verdicts")
    ok = True
    for name, (replayed, held, verdicts, from_snap, work, rss, wall) in runs:
        same = verdicts == live_verdicts
        ok &= same and held <= args.max_pending
        print(f"{name:18s} {replayed:>9,} {held:>5} {work:>12.1f}s {wall:>13.1f}s "
              f"{rss:>6.0f} MB  {'same as live' if same else 'DIFFERENT from live'}"
              f"{'' if from_snap or name != 'from the snapshot' else ' (NO SNAPSHOT USED)'}")
    _, (replayed, _, _, from_snap, _, rss, wall) = runs[0][0], runs[0][1]
    ok &= from_snap
    if len(runs) == 2:
        full = runs[1][1]
        per_window = full[4] / max(full[0], 1)
        hour = per_window * nodes * HOUR_WINDOWS
        print(f"side by side: the full replay took {full[6] / wall:.1f}x the snapshot restart "
              f"here; at {per_window * 1e3:.2f} ms per window it would take {hour:.0f} s for an "
              f"hour of this job ({nodes * HOUR_WINDOWS:,} windows); the snapshot restart does "
              f"not grow with the history")
    goal = wall <= args.max_seconds and rss <= args.max_rss_mb
    print(f"goal: restart from the snapshot <= {args.max_seconds:g} s and <= "
          f"{args.max_rss_mb:.0f} MB RSS: {'met' if goal else 'MISSED'} ({wall:.1f} s, "
          f"{rss:.0f} MB)")
    ok &= goal
    stragglers = sorted({k[0] for k, v in live_verdicts.items() if v == "straggler"})
    print(f"live stragglers: {len(stragglers)} nodes {stragglers[:8]}"
          f"{' ...' if len(stragglers) > 8 else ''}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
