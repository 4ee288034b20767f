"""The query side of the CLI (`report`, `jobs`): one way to name the analyzer, its TLS flags, one
channel, and one wording for each error a user meets."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

#: The largest answer a client accepts (bytes): a report of every job of a 16k-GPU cluster runs
#: to megabytes, over gRPC's 4 MB default.
MAX_ANSWER_BYTES = 256 * 1024 * 1024


def add_analyzer_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--analyzer", required=True, metavar="HOST:PORT",
                   help="the analyzer's gRPC address")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds to wait for the answer (default 10); a refused connection "
                   "fails at once")
    tls = p.add_argument_group("transport security (mutual TLS)")
    tls.add_argument("--tls-ca", metavar="PEM", help="CA that signed the analyzer's certificate")
    tls.add_argument("--tls-cert", metavar="PEM", help="your certificate, role reader or admin "
                     "(`hypertrace certs issue --role reader --name YOU`)")
    tls.add_argument("--tls-key", metavar="PEM", help="its private key")
    tls.add_argument("--insecure", action="store_true",
                     help="plaintext, to an analyzer started with --insecure (tests only)")


def call(target: str, method: Callable[[Any], Any], tls: Any = None, insecure: bool = False,
         timeout: float = 10.0) -> Any:
    """``method(stub)`` on a Query stub of ``target``; raises grpc.RpcError as-is,
    TransportError without TLS files or ``insecure``. A refused connection fails at once
    (no wait_for_ready): an analyzer that is down should say so, not wait out the timeout."""
    from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
    from hypertrace.proto.transport import open_channel

    options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
    with open_channel(target, tls, insecure, options) as channel:
        return method(pb_grpc.QueryStub(channel))


def run_query(args: argparse.Namespace, name: str, method: Callable[[Any], Any]) -> tuple[int, Any]:
    """(exit status, answer): 0 and the answer, or 1/2 after printing why (the message names
    the fix). ``name`` is the subcommand, for the messages."""
    import grpc

    from hypertrace.proto.transport import TransportError, diagnose, tls_files

    if args.timeout <= 0:
        print(f"hypertrace {name}: --timeout must be > 0 seconds", file=sys.stderr)
        return 2, None
    tls = None
    try:
        tls = tls_files(args.tls_ca, args.tls_cert, args.tls_key)
        if tls is not None:
            tls.check()
        return 0, call(args.analyzer, method, tls, args.insecure, args.timeout)
    except TransportError as exc:
        print(f"hypertrace {name}: {exc}", file=sys.stderr)
        return 2, None
    except grpc.RpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
            print(f"hypertrace {name}: {exc.details()}", file=sys.stderr)
            return 2, None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            print(f"hypertrace {name}: analyzer {args.analyzer} does not answer this request "
                  f"(an older version?): {exc.details()}", file=sys.stderr)
            return 1, None
        found = diagnose(exc, args.analyzer, tls)
        if found.config_error:
            print(f"hypertrace {name}: {found}", file=sys.stderr)
            return 2, None
        hint = ", or raise --timeout" if code == grpc.StatusCode.DEADLINE_EXCEEDED else ""
        print(f"hypertrace {name}: {found}{hint}", file=sys.stderr)
        return 1, None
