"""`hypertrace report`: ask a running analyzer for its report.

Exit status: 0 no straggler, 3 stragglers reported, 1 analyzer unreachable or failing (the
message says how to fix it), 2 bad usage or an unknown job.
"""
from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="print the straggler report of a running analyzer",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--analyzer", required=True, metavar="HOST:PORT",
                   help="the analyzer's gRPC address")
    p.add_argument("--job", default="", help="only this job (default: every job)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds to wait for the analyzer (default 10)")
    p.set_defaults(func=run)


def fetch_report(target: str, job: str = "", timeout: float = 10.0):
    """GetReport from ``target``; raises grpc.RpcError as-is."""
    import grpc

    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc

    with grpc.insecure_channel(target) as channel:
        return pb_grpc.QueryStub(channel).GetReport(pb.ReportRequest(job_id=job), timeout=timeout,
                                                    wait_for_ready=True)


def run(args: argparse.Namespace) -> int:
    import grpc

    from hypertrace.analyzer.report_format import exit_status, report_to_json, report_to_table

    if args.timeout <= 0:
        print("hypertrace report: --timeout must be > 0 seconds", file=sys.stderr)
        return 2
    try:
        report = fetch_report(args.analyzer, args.job, args.timeout)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.NOT_FOUND:
            print(f"hypertrace report: {exc.details()}", file=sys.stderr)
            return 2
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            print(f"hypertrace report: analyzer {args.analyzer} unreachable ({code.name}) within "
                  f"{args.timeout:g}s; check that `hypertrace analyzer --listen {args.analyzer}` "
                  "is running and reachable from here (firewall, host name), or raise --timeout",
                  file=sys.stderr)
            return 1
        print(f"hypertrace report: analyzer {args.analyzer} failed: {code.name}: {exc.details()}",
              file=sys.stderr)
        return 1
    if args.format == "json":
        print(report_to_json(report))
    else:
        print(report_to_table(report))
    return exit_status(report)
