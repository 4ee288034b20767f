"""`hypertrace jobs`: the jobs a running analyzer knows, with their GPUs, nodes, windows and the
time of their newest window.

Exit status: 0, 1 analyzer unreachable or failing, 2 bad usage (TLS files, a refused role).
"""
from __future__ import annotations

import argparse
import json

from hypertrace.cli.client import add_analyzer_flags, run_query


def register(subparsers) -> None:
    p = subparsers.add_parser("jobs", help="list the jobs a running analyzer knows",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_analyzer_flags(p)
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hypertrace.proto import hypertrace_pb2 as pb

    rc, answer = run_query(args, "jobs",
                           lambda stub: stub.ListJobs(pb.ListJobsRequest(), timeout=args.timeout))
    if rc:
        return rc
    rows = [{"job_id": j.job_id, "gpus": j.gpus, "nodes": j.nodes, "windows": j.windows,
             "last_window": j.last_window.ToJsonString() if j.HasField("last_window") else ""}
            for j in answer.jobs]
    if args.format == "json":
        print(json.dumps({"jobs": rows}, indent=2))
        return 0
    if not rows:
        print("no jobs yet")
        return 0
    width = max(len("JOB"), *(len(r["job_id"]) for r in rows))
    print(f"{'JOB':<{width}}  {'GPUS':>6}  {'NODES':>5}  {'WINDOWS':>7}  NEWEST WINDOW")
    for r in rows:
        print(f"{r['job_id']:<{width}}  {r['gpus']:>6}  {r['nodes']:>5}  {r['windows']:>7}  "
              f"{r['last_window']}")
    return 0
