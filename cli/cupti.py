"""`hypertrace cupti`: the in-process CUPTI backend, for nodes where eBPF is not allowed.

    hypertrace cupti run [--socket PATH] [--analyzer HOST:PORT] -- CMD [ARGS...]
    hypertrace cupti pause  [--pid PID] [--socket PATH]
    hypertrace cupti resume [--pid PID] [--socket PATH]

``run`` starts CMD with the backend started in each of its Python processes (the same as
``python -m hypertrace.daemon.cupti -- CMD``); each connects to the node agent's socket and
hands it a window every window. Put it in front of the training command: ``hypertrace cupti run
-- torchrun --nproc-per-node 8 train.py``.

``pause`` asks the agent to make the backend of PID (default: every process you may control)
unsubscribe from CUPTI, so that a profiler (torch.profiler, Nsight Systems) can take CUPTI's one
subscriber slot; ``resume`` undoes it. In code, ``hypertrace.daemon.cupti.pause()`` and
``resume()`` do the same for the calling process.

Exit status: 0 done, 1 no agent on the socket, 2 usage error or nothing to control.
"""
from __future__ import annotations

import argparse
import sys

from hypertrace.proto.local import DEFAULT_SOCKET


def register(subparsers) -> None:
    p = subparsers.add_parser("cupti", help="the in-process CUPTI backend: run a command under "
                              "it, pause or resume it", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cupti_command", metavar="ACTION", required=True)
    run_p = sub.add_parser("run", help="run CMD with the backend in its Python processes")
    run_p.add_argument("--socket", help=f"the agent's socket (default {DEFAULT_SOCKET})")
    run_p.add_argument("--analyzer", metavar="HOST:PORT",
                       help="with no agent on the node, send to this analyzer directly")
    run_p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    run_p.set_defaults(func=run)
    for name, pause in (("pause", True), ("resume", False)):
        c = sub.add_parser(name, help=f"{name} the backend of a process (through the agent)")
        c.add_argument("--pid", type=int, default=0, help="the process (default: all yours)")
        c.add_argument("--socket", default=DEFAULT_SOCKET,
                       help=f"the agent's socket (default {DEFAULT_SOCKET})")
        c.set_defaults(func=control, pause=pause)


def run(args: argparse.Namespace) -> int:
    from hypertrace.daemon.cupti.__main__ import main as run_main
    argv = []
    if args.socket:
        argv += ["--socket", args.socket]
    if args.analyzer:
        argv += ["--analyzer", args.analyzer]
    return run_main(argv + list(args.command))


def control(args: argparse.Namespace) -> int:
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.proto import local
    try:
        sock = local.connect(args.socket, timeout_s=5.0)
    except OSError as exc:
        print(f"no agent listens on {args.socket} ({exc.strerror or exc}); is hypertrace-agent "
              "running with cupti_socket set?", file=sys.stderr)
        return 1
    with sock:
        local.send(sock, pb.LocalMessage(control=pb.LocalControl(pause=args.pause,
                                                                 pid=args.pid)))
        reply = local.recv(sock)
    if reply is None or reply.WhichOneof("body") != "done":
        print("the agent did not answer", file=sys.stderr)
        return 1
    if reply.done.error:
        print(reply.done.error, file=sys.stderr)
        return 2
    verb = "paused" if args.pause else "resumed"
    print(f"{verb}: {', '.join(f'pid {p}' for p in reply.done.pids)}")
    return 0
