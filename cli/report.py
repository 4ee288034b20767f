"""`hypertrace report`: ask a running analyzer for its report.

Exit status: 0 no straggler, 3 stragglers reported, 1 analyzer unreachable or failing (the
message says how to fix it), 2 bad usage or an unknown job.
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypertrace.proto.transport import TlsFiles


#: The largest report a client accepts (bytes).
MAX_REPORT_BYTES = 256 * 1024 * 1024


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="print the straggler report of a running analyzer",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--analyzer", required=True, metavar="HOST:PORT",
                   help="the analyzer's gRPC address")
    p.add_argument("--job", default="", help="only this job (default: every job)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--all-nodes", action="store_true",
                   help="list every healthy node too (default: at most 100 per job)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds to wait for the analyzer (default 10)")
    tls = p.add_argument_group("transport security (mutual TLS)")
    tls.add_argument("--tls-ca", metavar="PEM", help="CA that signed the analyzer's certificate")
    tls.add_argument("--tls-cert", metavar="PEM", help="your certificate, role reader or admin "
                     "(`hypertrace certs issue --role reader --name YOU`)")
    tls.add_argument("--tls-key", metavar="PEM", help="its private key")
    tls.add_argument("--insecure", action="store_true",
                     help="plaintext, to an analyzer started with --insecure (tests only)")
    p.set_defaults(func=run)


def fetch_report(target: str, job: str = "", timeout: float = 10.0,
                 tls: "TlsFiles | None" = None, insecure: bool = False,
                 all_nodes: bool = False):
    """GetReport from ``target`` over mutual TLS with ``tls`` (plaintext only with
    ``insecure``); raises grpc.RpcError as-is, TransportError without either."""
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
    from hypertrace.proto.transport import open_channel

    # a report of every job of a 16k-GPU cluster runs to megabytes, over gRPC's 4 MB default
    options = [("grpc.max_receive_message_length", MAX_REPORT_BYTES)]
    with open_channel(target, tls, insecure, options) as channel:
        request = pb.ReportRequest(job_id=job, all_nodes=all_nodes)
        return pb_grpc.QueryStub(channel).GetReport(request, timeout=timeout,
                                                    wait_for_ready=True)


def run(args: argparse.Namespace) -> int:
    import grpc

    from hypertrace.analyzer.report_format import exit_status, report_to_json, report_to_table
    from hypertrace.proto.transport import TransportError, tls_files

    if args.timeout <= 0:
        print("hypertrace report: --timeout must be > 0 seconds", file=sys.stderr)
        return 2
    try:
        tls = tls_files(args.tls_ca, args.tls_cert, args.tls_key)
        report = fetch_report(args.analyzer, args.job, args.timeout, tls, args.insecure,
                              args.all_nodes)
    except TransportError as exc:
        print(f"hypertrace report: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.NOT_FOUND:
            print(f"hypertrace report: {exc.details()}", file=sys.stderr)
            return 2
        if code == grpc.StatusCode.PERMISSION_DENIED:
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
