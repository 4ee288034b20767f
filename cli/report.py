"""`hypertrace report`: ask a running analyzer for its report.

Exit status: 0 no straggler, 3 stragglers reported, 1 analyzer unreachable or failing (the
message says how to fix it), 2 bad usage or an unknown job.
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from hypertrace.cli.client import add_analyzer_flags, call, run_query

if TYPE_CHECKING:
    from hypertrace.proto.transport import TlsFiles


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="print the straggler report of a running analyzer",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_analyzer_flags(p)
    p.add_argument("--job", default="", help="only this job (default: every job)")
    add_output_flags(p)
    p.add_argument("--all-nodes", action="store_true",
                   help="list every healthy node too (default: at most 100 per job; "
                   "--format html always asks for every node)")
    p.set_defaults(func=run)


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """--format, -o and --only-flagged: the same for every command that prints a report."""
    p.add_argument("--format", choices=("table", "json", "html"), default="table",
                   help="table: one row per node, at most 100 columns (-v: one row per GPU); "
                   "json: the full report; html: one offline page (heatmap of nodes x time, "
                   "a panel per convicted node, the what-if, spikes, the evidence; use -o)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of "
                   "to stdout")
    p.add_argument("--only-flagged", action="store_true",
                   help="leave out healthy nodes and GPUs (every format)")


def fetch_report(target: str, job: str = "", timeout: float = 10.0,
                 tls: "TlsFiles | None" = None, insecure: bool = False,
                 all_nodes: bool = False):
    """GetReport from ``target`` over mutual TLS with ``tls`` (plaintext only with
    ``insecure``); raises grpc.RpcError as-is, TransportError without either."""
    from hypertrace.proto import hypertrace_pb2 as pb
    request = pb.ReportRequest(job_id=job, all_nodes=all_nodes)
    return call(target, lambda stub: stub.GetReport(request, timeout=timeout), tls, insecure,
                timeout)


def run(args: argparse.Namespace) -> int:
    from hypertrace.proto import hypertrace_pb2 as pb

    # the page folds the healthy nodes into a band itself, and needs them all to draw it as
    # `analyze --format html` does
    request = pb.ReportRequest(job_id=args.job,
                               all_nodes=args.all_nodes or args.format == "html")
    rc, report = run_query(args, "report",
                           lambda stub: stub.GetReport(request, timeout=args.timeout))
    if rc:
        return rc
    return emit(report, args, "report")


def emit(report, args: argparse.Namespace, command: str) -> int:
    """Write the rendered report to ``--output`` or stdout; the report's exit status, or 2 when
    the file cannot be written."""
    from hypertrace.analyzer.report.report_format import exit_status
    out = render(report, args)
    if not out.endswith("\n"):
        out += "\n"
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(out)
        except OSError as exc:
            print(f"hypertrace {command}: cannot write {args.output}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(out)
    return exit_status(report)


def render(report, args: argparse.Namespace) -> str:
    """The report in ``--format``, with ``--only-flagged`` and ``-v`` applied (report and
    analyze share it)."""
    from hypertrace.analyzer.report.report_format import (
        only_flagged,
        report_to_json,
        report_to_table,
    )
    if args.format == "json":
        return report_to_json(only_flagged(report) if args.only_flagged else report)
    if args.format == "html":
        from hypertrace.analyzer.report.report_html import report_to_html
        return report_to_html(only_flagged(report) if args.only_flagged else report)
    return report_to_table(report, verbose=getattr(args, "verbose", 0) > 0,
                           flagged_only=args.only_flagged)
