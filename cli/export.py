"""`hypertrace export`: stored windows out of the analyzer's database, as the file that
`hypertrace analyze` and `predict --histogram` read (JSON lines, or binary records for .pb).

    hypertrace export --db /var/lib/hypertrace-analyzer/analyzer.db --job 1234 -o job.jsonl.gz

Run it on the analyzer's host (SQLite in WAL mode: the analyzer may keep running). Only the
job's processes are kept in each window. ``-o -`` writes to stdout; a name ending in .gz is
gzipped. Exit status: 0, 2 bad usage (no database, no such job).
"""
from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("export", help="stored windows of a job as JSON lines",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="hypertrace-analyzer.db", help="the analyzer's database")
    p.add_argument("--job", required=True, help="the job id")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="where to write: FILE.jsonl JSON lines (- for stdout), FILE.pb binary "
                   "records (about 200x faster for analyze to read); .gz compresses either")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from hypertrace.analyzer.store.storage import Storage, StorageError
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.proto.records import is_binary_name, open_for_write, write_windows

    if not Path(args.db).exists():
        print(f"hypertrace export: no database {args.db}; pass the analyzer's --db",
              file=sys.stderr)
        return 2
    try:
        # no integrity check: export reads what it can of a damaged file too
        storage = Storage.open(args.db, synchronous="NORMAL", check=False)
    except StorageError as exc:
        print(f"hypertrace export: {exc}", file=sys.stderr)
        return 2
    tmp = None if args.output == "-" else f"{args.output}.partial"
    n = 0
    try:
        binary = is_binary_name(args.output)
        out = sys.stdout.buffer if tmp is None else open_for_write(
            tmp, gz=args.output.endswith(".gz"))
        try:
            for sw in storage.iter_windows():
                w = sw.message()
                mine = [p for p in w.processes if p.job_id == args.job]
                if not mine:
                    continue
                if len(mine) != len(w.processes):
                    kept = pb.NodeWindow()
                    kept.CopyFrom(w)
                    del kept.processes[:]
                    kept.processes.extend(mine)
                    w = kept
                n += write_windows((w,), out, binary)
        finally:
            if out is not sys.stdout.buffer:
                out.close()
            else:
                out.flush()
    except KeyboardInterrupt:
        if tmp:
            Path(tmp).unlink(missing_ok=True)       # no half-written file left behind
        return 130
    finally:
        storage.close()
    if n == 0:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        print(f"hypertrace export: no stored window of job {args.job[:64]!r} in {args.db}",
              file=sys.stderr)
        return 2
    if tmp:
        os.replace(tmp, args.output)
    print(f"exported {n:,} windows of job {args.job} to {args.output}", file=sys.stderr)
    return 0
