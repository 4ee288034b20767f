"""`hypertrace nodes`: the agents a running analyzer hears from, and which are down.

One row per node: up or down (down: no window ended in the last 1.5 windows: the agent is
stopped, cannot reach the analyzer, or its node is down), when its newest window ended, the
agent's version, its backend (ebpf or cupti) and how its uprobes attach (uprobe_multi or perf).
After an analyzer restart the nodes of the windows stored in the last hour are listed, their
version unknown (-) until their next window.

Exit status: 0 every node up, 3 some node down, 1 analyzer unreachable or failing, 2 bad usage
(TLS files, a refused role).
"""
from __future__ import annotations

import argparse
import json
import time

from hypertrace.cli.client import add_analyzer_flags, run_query

#: Exit status when some node is down (as `report` exits 3 on a straggler).
EXIT_DOWN = 3


def register(subparsers) -> None:
    p = subparsers.add_parser("nodes", help="list the agents a running analyzer hears from, "
                              "and which are down", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_analyzer_flags(p)
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--down", action="store_true", help="list only the nodes that are down")
    p.set_defaults(func=run)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def run(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from hypertrace.proto import hypertrace_pb2 as pb

    rc, answer = run_query(args, "nodes",
                           lambda stub: stub.ListNodes(pb.ListNodesRequest(),
                                                       timeout=args.timeout))
    if rc:
        return rc
    nodes = [n for n in answer.nodes if n.down or not args.down]
    status = EXIT_DOWN if any(n.down for n in answer.nodes) else 0
    if args.format == "json":
        out = MessageToDict(answer, preserving_proto_field_name=True,
                            always_print_fields_with_no_presence=True)
        out["nodes"] = [MessageToDict(n, preserving_proto_field_name=True,
                                      always_print_fields_with_no_presence=True) for n in nodes]
        print(json.dumps(out, indent=2))
        return status
    if not answer.nodes:
        print("no agent has sent a window yet")
        return status
    now = time.time()
    rows = [(n.node, "down" if n.down else "up",
             _age(max(0.0, now - n.last_window_end.ToNanoseconds() / 1e9)),
             n.agent_version or "-", n.agent_backend or "-", n.probe_mode or "-",
             str(n.windows)) for n in nodes]
    header = ("NODE", "STATE", "LAST WINDOW", "VERSION", "BACKEND", "PROBES", "WINDOWS")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    for cells in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    down = sum(1 for n in answer.nodes if n.down)
    print(f"{len(answer.nodes)} nodes, {down} down (no window for {answer.down_after_windows:g} "
          f"windows of {answer.window_seconds:g} s)")
    return status
