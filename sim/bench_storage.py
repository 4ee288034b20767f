"""Bytes at rest per node-window, table by table, side by side with schemas 3 and 4, and the
steady-state disk of a 16,384-GPU job under the default retention, modelled from those rates.
(``make bench-storage`` measures the disk of a live analyzer instead: sim/bench_disk.py.)

A job (``--gpus``, ``--windows``; one node 10% slow, wide noise) is stored and scored live
through ``Analyzer.ingest`` / ``flush`` as the server does, Engine snapshots included. Then:

1. Where the bytes go once the windows are compacted into epoch blocks (schemas 5 and 6,
   what ``Storage.compact`` does in the retention pass): SQLite's own page accounting (``dbstat``)
   per table and index, per node-window.
2. Side by side, the same windows in the schema-3 layout (a WITHOUT ROWID table, 4-KB pages,
   plain zlib level 1), one payload each as schema 4 keeps them (a rowid table, 16-KB pages,
   zlib with the preset dictionary: this file before its compaction) and in blocks; and the
   payload codecs on a sample of them, epoch blocks included.
3. The retention pass summarises the history's whole 5-minute slots (reading the blocks):
   bytes per GPU-slot.
4. The steady state of a 16,384-GPU job (2,048 nodes) under the default retention, from those
   measured rates: 6 h of raw windows in blocks with their rows, the few minutes not yet
   compacted, their score rows, 30 days of summaries, verdict changes and scored epochs, the
   snapshot (scaled by GPUs), and the WAL's high-water mark between two prunes.

Exit status 1 when the steady state exceeds ``--max-gb`` (20) or a node-window at rest exceeds
``--max-window-bytes`` (1,200: the goal; BENCHMARKS.md says how far blocks get), as measured.
Printed beside it: the figure at 16,384 GPUs, where the per-epoch rows (score rows, scored
epochs) are shared by 2,048 nodes' windows instead of the benchmark's.

    python -m hypertrace.sim.bench_storage --gpus 2048 --windows 70
"""
from __future__ import annotations

import argparse
import sqlite3
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

TARGET_GPUS = 16384
GPUS_PER_NODE = 8
WINDOW_S = 10
RAW_HOURS = 6.0
SUMMARY_DAYS = 30.0


def _by_table(db: Path, used: bool = False) -> dict[str, int]:
    """Bytes of pages per table or index (SQLite's dbstat), the WAL checkpointed first; ``used``:
    without the pages' unused space (what a small table grows by at scale, where its last,
    mostly empty 16-KB page would otherwise count as if it were full)."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        col = "pgsize - unused" if used else "pgsize"
        return {name: int(size) for name, size in conn.execute(
            f"SELECT name, SUM({col}) FROM dbstat GROUP BY name")}
    finally:
        conn.close()


def _per_epoch(name: str) -> bool:
    """Tables and indexes whose rows follow the scored epochs, not the windows: score rows
    (the implicated GPUs plus 64 per epoch) and the scored epochs."""
    return "scores" in name or name.startswith(("epochs", "sqlite_autoindex_epochs"))


def _at_target_gpus(sizes: dict[str, int], used: dict[str, int], windows: int, epochs: int,
                    nodes: int) -> float:
    """Bytes at rest per node-window as they would be with ``nodes`` nodes per epoch: the
    per-epoch rows (their used bytes: at scale their pages fill) shared by that many nodes'
    windows instead of the benchmark's; everything else (blocks, the windows' rows, verdict
    changes, the snapshot, which follow the windows or the GPUs) as measured."""
    rest = sum(v for k, v in sizes.items() if not _per_epoch(k))
    per_epoch = sum(v for k, v in used.items() if _per_epoch(k))
    return rest / windows + per_epoch / max(epochs, 1) / nodes


def _windows_bytes(sizes: dict[str, int]) -> int:
    """The windows' bytes: the windows table and its indexes, and once compacted the blocks
    and the compacted windows' rows with their indexes and sources."""
    return sum(v for k, v in sizes.items() if k.startswith((
        "windows", "sqlite_autoindex_windows", "compacted", "window_sources",
        "sqlite_autoindex_window_sources")) or k in ("sqlite_sequence", "blocks"))


_V3_DDL = """
CREATE TABLE windows (agent_id TEXT NOT NULL, seq INTEGER NOT NULL, node TEXT NOT NULL,
    start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, received_ns INTEGER NOT NULL,
    payload BLOB NOT NULL, late INTEGER NOT NULL DEFAULT 0, codec INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, seq)) WITHOUT ROWID;
CREATE INDEX windows_end ON windows (end_ns);
"""


def _schema3_copy(src: Path, dst: Path) -> None:
    """The windows of ``src`` as schema 3 stored them: same rows, plain zlib-1 payloads."""
    from hypertrace.analyzer.store.storage import decode_payload
    conn = sqlite3.connect(dst, isolation_level=None)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(_V3_DDL)
    conn.execute("BEGIN")
    old = sqlite3.connect(src)
    for row in old.execute("SELECT agent_id, seq, node, start_ns, end_ns, received_ns, "
                           "payload, late, codec FROM windows ORDER BY id"):
        raw = decode_payload(bytes(row[6]), int(row[8]))
        conn.execute("INSERT INTO windows VALUES (?,?,?,?,?,?,?,?,1)",
                     (*row[:6], zlib.compress(raw, 1), row[7]))
    old.close()
    conn.execute("COMMIT")
    conn.close()


def _histograms(p):
    """Every histogram of a process window (the counts that make up most of a payload)."""
    for a in p.apis:
        yield a.histogram
    if p.HasField("step_time"):
        yield p.step_time
    if p.HasField("sched") and p.sched.HasField("runq_latency"):
        yield p.sched.runq_latency
    if p.HasField("steps") and p.steps.HasField("busy_time"):
        yield p.steps.busy_time


def _codecs(windows: list) -> list[tuple[str, float, float]]:
    """(codec, mean bytes per window, µs per window) for the same windows: what the stored
    payload could be, down to the floor of its histogram counts compressed alone."""
    from hypertrace.analyzer.store.storage import encode_payload
    from hypertrace.proto import hypertrace_pb2 as pb
    raws = [w.SerializeToString() for w in windows]
    rest, counts = [], []
    for w in windows:
        m = pb.NodeWindow()
        m.CopyFrom(w)
        c: list[int] = []
        for p in m.processes:
            for h in _histograms(p):
                c.extend(h.counts)
                del h.counts[:]
        rest.append(m.SerializeToString())
        counts.append(pb.Histogram(counts=c).SerializeToString())
    out = []
    from hypertrace.analyzer.store import blocks
    by_end: dict[int, list[tuple[int, bytes]]] = {}
    for i, (w, raw) in enumerate(zip(windows, raws)):
        by_end.setdefault(w.end.ToNanoseconds(), []).append((i, raw))
    t = time.perf_counter()
    blobs = [blocks.encode(g) for g in by_end.values()]
    block_s = time.perf_counter() - t
    block_b = sum(len(b) for b in blobs)
    # the block's streams (analyzer/store/blocks.py, "Layout"): their lengths follow the magic
    streams = [sum(x) for x in zip(*(struct.unpack_from("<4I", b, 3) for b in blobs))]
    for name, fn, data in (
            ("wire bytes", lambda b: b, raws),
            ("zlib 1 (schema 3)", lambda b: zlib.compress(b, 1), raws),
            ("zlib 9", lambda b: zlib.compress(b, 9), raws),
            ("zlib 1 + dictionary (schema 4)", encode_payload, raws),
            ("  of which the counts alone, zlib 9", lambda b: zlib.compress(b, 9), counts),
            ("  the rest, zlib 1 + dictionary", encode_payload, rest)):
        t = time.perf_counter()
        size = sum(len(fn(b)) for b in data)
        out.append((name, size / len(data), (time.perf_counter() - t) / len(data) * 1e6))
    n = sum(len(g) for g in by_end.values())
    out.append((f"epoch blocks, {n / len(by_end):.0f} windows each", block_b / n,
                block_s / n * 1e6))
    for name, size in zip(("index and messages", "doubles", "integers", "counts"), streams):
        out.append((f"  of which {name}", size / n, 0.0))
    return out


def _load_blocks(tree: str):
    """The blocks module of another source tree (the repository root of an older commit, e.g.
    ``git archive 63cbb34 | tar -x -C DIR``), loaded beside this one."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("base_blocks",
                                                  Path(tree) / "analyzer" / "blocks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _compare_blocks(windows: list, tree: str, rounds: int) -> list[tuple[str, float, float, float]]:
    """Side by side on the same epochs, alternating base and head ``rounds`` times: (side, bytes
    per window, encode ms per window, decode ms per window) of the epoch blocks, each block
    decoded by its own side's code and checked to give back its windows' exact bytes."""
    from hypertrace.analyzer.store import blocks
    sides = {"base": _load_blocks(tree), "head": blocks}
    by_end: dict[int, list[tuple[int, bytes]]] = {}
    for i, w in enumerate(windows):
        by_end.setdefault(w.end.ToNanoseconds(), []).append((i, w.SerializeToString()))
    tally = {name: [0, 0.0, 0.0, 0] for name in sides}
    for _ in range(rounds):
        for group in by_end.values():
            for name, mod in sides.items():
                t = time.process_time()
                blob = mod.encode(group)
                te = time.process_time() - t
                t = time.process_time()
                back = mod.decode(blob)
                td = time.process_time() - t
                if back != dict(group):
                    raise AssertionError(f"{name}: a block did not give back its windows")
                r = tally[name]
                r[0] += len(blob)
                r[1] += te
                r[2] += td
                r[3] += len(group)
    return [(name, b / n, te / n * 1e3, td / n * 1e3) for name, (b, te, td, n) in tally.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_storage",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=70,
                    help="windows per node (at least 60: two whole 5-minute slots)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-gb", type=float, default=20.0)
    ap.add_argument("--max-window-bytes", type=float, default=1200.0)
    ap.add_argument("--compare-with", metavar="DIR", default="",
                    help="also compare this tree's epoch blocks side by side with those of the "
                         "source tree in DIR (an older commit's repository root): bytes, encode "
                         "and decode CPU on the same windows, alternated")
    ap.add_argument("--rounds", type=int, default=3, help="--compare-with: rounds of each side")
    args = ap.parse_args(argv)
    import logging
    logging.getLogger("hypertrace").setLevel(logging.ERROR)

    from hypertrace.analyzer.ingest.server import RETENTION_EVERY_S, Analyzer
    from hypertrace.analyzer.store import summaries
    from hypertrace.analyzer.store.storage import (
        COMPACT_AFTER_S,
        PAGE_SIZE,
        WAL_CHECKPOINT_PAGES,
        WAL_LIMIT_BYTES,
        Storage,
    )
    from hypertrace.sim import scenarios
    from hypertrace.sim.simulate import generate

    cfg = scenarios.get("host-10").config(args.gpus, windows=args.windows, seed=args.seed)
    win_ns = int(cfg.window_seconds * 1e9)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "now.db"
        storage = Storage.open(db, synchronous="NORMAL")
        live = Analyzer(storage)                  # snapshots every 60 s of the job's time
        t0 = time.monotonic()
        n = 0
        last = None
        sample = []
        for w in generate(cfg):
            live.ingest(w)
            if len(sample) < 2000:
                sample.append(w)
            n += 1
            end = w.end.ToNanoseconds()
            if last is None or end - last >= win_ns:
                live.flush(end)
                last = end
        live.flush(last + 10 * win_ns)
        t1 = time.monotonic()
        snap = storage.snapshot()
        epochs = len(storage.epochs(live.report().jobs[0].job_id))
        verdict_rows = len(storage.verdicts())
        storage.close()
        # the windows one payload each (schema 4: the empty tables of compacted windows are
        # schema 5's and 6's), then the same file once compacted into blocks
        loose = {k: v for k, v in _by_table(db).items() if not k.startswith((
            "compacted", "window_sources", "sqlite_autoindex_window_sources"))}
        v3 = Path(tmp) / "schema3.db"
        _schema3_copy(db, v3)
        v3_windows = _windows_bytes(_by_table(v3))
        storage = Storage.open(db, synchronous="NORMAL")
        tc = time.process_time()
        compacted = storage.compact(last + 10 * win_ns)
        t_compact = time.process_time() - tc
        storage.close()
        sizes = _by_table(db)
        used = _by_table(db, used=True)
        # summaries of every whole slot of the history, read from the blocks
        storage = Storage.open(db, synchronous="NORMAL")
        ts = time.process_time()
        slots = summaries.summarize_before(storage, last + 10 * win_ns, live.config)
        t_sum = time.process_time() - ts
        storage.close()
        after = _by_table(db, used=True)
    total = sum(sizes.values())
    windows_b = _windows_bytes(sizes)
    loose_windows = _windows_bytes(loose)
    # rows that follow the epochs (score rows: the implicated GPUs plus 64 per epoch) or the
    # GPUs (verdict changes), not the windows: scaled by what they follow
    scores_b = sum(v for k, v in used.items() if "scores" in k)
    verdicts_b = sum(v for k, v in used.items() if k.startswith("verdicts"))
    epochs_b = sum(v for k, v in used.items() if _per_epoch(k) and "scores" not in k)
    summary_b = sum(v for k, v in after.items() if "summaries" in k)
    gpu_slots = slots and args.gpus * slots
    print(f"history: {args.gpus:,} GPUs x {args.windows} windows = {n:,} node-windows, stored "
          f"and scored live in {t1 - t0:.0f} s; {epochs} epochs, {verdict_rows:,} verdict "
          f"changes")
    print("\nwhere the bytes go (dbstat, WAL checkpointed):")
    print(f"{'table or index':34s} {'bytes':>12s} {'per node-window':>16s}")
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        if size >= 4096 * 4:
            print(f"{name:34s} {size:>12,} {size / n:>14,.0f} B")
    print(f"{'all':34s} {total:>12,} {total / n:>14,.0f} B")
    print(f"\ncompaction: {compacted:,} windows into blocks in {t_compact:.1f} s of CPU "
          f"({t_compact / max(compacted, 1) * 1e3:.2f} ms per window)")
    print("\nthe windows (table, indexes, blocks), side by side (same windows):")
    print(f"{'layout':58s} {'per node-window':>16s} {'vs schema 4':>12s}")
    for name, b in (("schema 3: WITHOUT ROWID, 4-KB pages, zlib-1", v3_windows),
                    ("schema 4: rowid table, 16-KB pages, zlib+dict per window",
                     loose_windows),
                    ("schema 6: compacted into epoch blocks, with their rows", windows_b)):
        print(f"{name:58s} {b / n:>14,.0f} B {b / loose_windows:>11.2f}x")
    loose_total = sum(loose.values())
    print(f"{'everything at rest, schema 4 layout':58s} {loose_total / n:>14,.0f} B")
    print(f"{'everything at rest, schema 6 (compacted)':58s} {total / n:>14,.0f} B "
          f"{total / loose_total:>11.2f}x")
    print(f"\nthe payload, {len(sample):,} windows of {cfg.gpus_per_node} GPUs:")
    print(f"{'codec':40s} {'bytes':>8s} {'µs':>7s}")
    for name, size, us in _codecs(sample):
        print(f"{name:40s} {size:>8,.0f} {us:>7.0f}")
    if args.compare_with:
        cmp = _compare_blocks(sample, args.compare_with, args.rounds)
        print(f"\nepoch blocks side by side ({len(sample):,} windows, {args.rounds} rounds "
              f"alternated; base = {args.compare_with}):")
        print(f"{'side':6s} {'B per window':>13s} {'encode ms':>10s} {'decode ms':>10s}")
        for name, b, te, td in cmp:
            print(f"{name:6s} {b:>13,.0f} {te:>10.2f} {td:>10.2f}")
        (_, b0, e0, d0), (_, b1, e1, d1) = cmp
        print(f"{'head/base':10s} {b1 / b0:>9.3f}x {e1 / e0:>9.2f}x {d1 / d0:>9.2f}x")
    if not slots:
        print("\nno whole 5-minute slot in the history: pass --windows 60 or more")
        return 1
    per_slot = summary_b / gpu_slots
    print(f"\nsummaries: {slots} slot(s) x {args.gpus:,} GPUs in {t_sum:.1f} s "
          f"of CPU ({t_sum / (n * 1.0) * 1e3:.2f} ms per window, read from blocks), "
          f"{summary_b:,} B of pages: {per_slot:.1f} B per GPU-slot")
    # steady state of a 16,384-GPU job
    nodes = TARGET_GPUS // GPUS_PER_NODE
    raw_windows = nodes * RAW_HOURS * 3600 / WINDOW_S
    epochs_day = 86400 / WINDOW_S
    snap_target = (len(snap.state) if snap is not None else 0) * TARGET_GPUS / args.gpus
    epochs_raw = RAW_HOURS * 3600 / WINDOW_S
    parts = [
        ("raw windows, 6 h, in blocks, with their rows", windows_b / n * raw_windows),
        # compacted once COMPACT_AFTER_S old, by a retention pass every RETENTION_EVERY_S
        ("windows not yet compacted (3 min, one payload each)",
         loose_windows / n * nodes * (COMPACT_AFTER_S + RETENTION_EVERY_S) / WINDOW_S),
        ("score rows, 6 h (per epoch, as measured)", scores_b / epochs * epochs_raw),
        ("summaries, 30 days", per_slot * TARGET_GPUS * SUMMARY_DAYS * 86400 / 300),
        # verdict changes follow the raw retention once summarised; each GPU keeps besides its
        # current verdict and the one it entered the next slot to summarise with
        ("verdict changes, 6 h (per GPU-epoch) + 2 per GPU",
         verdicts_b / epochs / args.gpus * TARGET_GPUS * epochs_raw
         + 2 * TARGET_GPUS * verdicts_b / max(verdict_rows, 1)),
        ("scored epochs, 30 days", epochs_b / epochs * epochs_day * SUMMARY_DAYS),
        ("Engine snapshot (per GPU)", snap_target),
        # the WAL is checkpointed every WAL_CHECKPOINT_PAGES and cut back to WAL_LIMIT_BYTES;
        # one transaction larger than that (a snapshot) makes it grow to its size meanwhile
        ("WAL high-water mark", max(WAL_LIMIT_BYTES, snap_target)
         + WAL_CHECKPOINT_PAGES * PAGE_SIZE),
    ]
    steady = sum(b for _, b in parts)
    print(f"\nsteady state of a {TARGET_GPUS:,}-GPU job ({nodes:,} nodes), default retention "
          f"(raw {RAW_HOURS:g} h, summaries {SUMMARY_DAYS:g} days), from the rates above:")
    for name, b in parts:
        print(f"  {name:50s} {b / 1e9:>7.3f} GB")
    print(f"  {'total':50s} {steady / 1e9:>7.3f} GB  (goal {args.max_gb:g} GB)")
    if snap is not None:
        print(f"(the snapshot here: {len(snap.state):,} B for {args.gpus:,} GPUs; the verdict "
              f"changes follow how often verdicts change: this scenario's rate)")
    at_rest = total / n
    at_target = _at_target_gpus(sizes, used, n, epochs, nodes)
    ok_disk = steady / 1e9 <= args.max_gb
    ok_window = at_rest <= args.max_window_bytes
    print(f"\nper node-window at rest: {at_rest:,.0f} B measured ({args.gpus:,} GPUs); "
          f"{at_target:,.0f} B at {TARGET_GPUS:,} GPUs (the per-epoch rows, score rows and "
          f"scored epochs, shared by {nodes:,} nodes instead of {n // max(epochs, 1):,}; the "
          f"rest as measured)")
    print(f"\ngoal: steady state <= {args.max_gb:g} GB: {'met' if ok_disk else 'MISSED'}; "
          f"<= {args.max_window_bytes:,.0f} B per node-window at rest: "
          f"{'met' if ok_window else 'MISSED'} ({at_rest:,.0f} B measured, "
          f"{at_target:,.0f} B at {TARGET_GPUS:,} GPUs)")
    print("PASS" if ok_disk and ok_window else "FAIL")
    return 0 if ok_disk and ok_window else 1


if __name__ == "__main__":
    sys.exit(main())
