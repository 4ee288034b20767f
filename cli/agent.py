"""`hypertrace agent`: the node agent (normally run by systemd, see deploy/)."""
from __future__ import annotations

import argparse

from hypertrace.proto.settings import AGENT_CONFIG_PATH, fraction


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "agent", help="run the node agent: probe CUDA calls, stream windows to the analyzer",
        description="Find the training processes of jobs on this node, probe their CUDA "
                    "runtime/driver calls with eBPF uprobes under an overhead budget, and stream "
                    "fixed windows to the analyzer. Two tiers: synchronize, graph-launch and "
                    "step-marker calls (a few per step: they give the step time) and the "
                    "scheduler's run-queue evidence stay on all the time; launch calls "
                    "(thousands per step) are probed in one slice per sampled window, at the "
                    "same wall-clock moment on every node (derived from the window number, no "
                    "traffic), so the analyzer compares all ranks of a job at once. Every flag "
                    "can also be set in the config file (same name, underscores); flags "
                    "override the file.")
    # Defaults are None so "not given" is distinguishable from a value: the file's value (or the
    # documented default in daemon/config.py) applies then.
    p.add_argument("--analyzer", metavar="HOST:PORT", help="analyzer gRPC endpoint (required "
                   "here or in the config file)")
    p.add_argument("--window", type=float, metavar="SECONDS",
                   help="window length; match the analyzer's --window-seconds (default 10)")
    p.add_argument("--overhead-budget", type=fraction, metavar="F",
                   help="max fraction of a training process's time spent in probes: 0.005 "
                        "or 0.5%% (default 0.5%%)")
    p.add_argument("--config", metavar="FILE",
                   help=f"TOML config file (default {AGENT_CONFIG_PATH} when it exists)")
    p.add_argument("--spool-dir", metavar="DIR",
                   help="unsent windows and the window seq (default /var/lib/hypertrace/spool)")
    p.add_argument("--spool-max-mb", type=float, metavar="MB", help="spool bound (default 256)")
    p.add_argument("--node", help="node name in reports (default: host name)")
    p.add_argument("--agent-id", help="agent identity for acks/dedup (default: node name)")
    p.add_argument("--job-env", metavar="VAR[,VAR...]",
                   help="environment variables naming the job, in order; A:B joins several "
                        "(default HYPERTRACE_JOB,SLURM_JOB_ID,TORCHELASTIC_RUN_ID,"
                        "MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--max-slice-s", type=float, metavar="SECONDS",
                   help="longest launch-probe slice per sampled window; the account may afford "
                        "less. Use the same value on every node of a job: all slices start at "
                        "the same offset (default 2)")
    p.add_argument("--slice-guard-s", type=float, metavar="SECONDS",
                   help="keep slices this far from both window edges, so nodes whose clocks "
                        "differ by less still slice the same window (default 1; shrinks to a "
                        "quarter window for short windows)")
    p.add_argument("--always-share", type=float, metavar="F",
                   help="largest share of the budget the always-on tier (synchronize, graph "
                        "launch, step marker) may cost one process; APIs over it are probed in "
                        "slices instead (default 0.2)")
    p.add_argument("--probe-unattributed", action=argparse.BooleanOptionalAction, default=None,
                   help="also probe CUDA processes whose environment names no job (see "
                        "--job-env); off by default, so monitoring daemons and tools that map "
                        "libcuda are never probed (default off)")
    p.add_argument("--probe-cost-ns", type=float, metavar="NS",
                   help="CPU cost of one probed call (entry + return) in ns; 0 measures it "
                        "at start, which needs a C compiler (default 0)")
    p.add_argument("--min-samples", type=int, metavar="N",
                   help="shortest useful slice: one that yields this many launch-probe firings "
                        "of the busiest process; the cadence (one slice every k windows, k a "
                        "power of two) is set so such a slice fits the budget (default 1000)")
    p.add_argument("--scan-interval", type=float, metavar="SECONDS",
                   help="seconds between /proc scans (default 1)")
    p.add_argument("--nvml", action=argparse.BooleanOptionalAction, default=None,
                   help="read NVML GPU context when a driver exists (default on)")
    p.add_argument("--metrics-textfile", metavar="FILE.prom",
                   help="write the agent's own metrics (overhead, duty, spool, last ack) here "
                   "every window, for node_exporter's textfile collector (default: off)")
    p.add_argument("--backend", choices=["auto", "ebpf", "cupti"],
                   help="auto (default): eBPF uprobes where the host allows them, else windows "
                   "from in-process CUPTI backends only; ebpf: uprobes or fail; cupti: in-process "
                   "backends only (training started with `python -m hypertrace.daemon.cupti "
                   "-- ...`)")
    p.add_argument("--cupti-socket", metavar="PATH",
                   help="Unix socket for in-process CUPTI backends (default "
                   "/run/hypertrace/cupti.sock; \"\" = none)")
    tls = p.add_argument_group("transport security (mutual TLS; see `hypertrace certs --help`)")
    tls.add_argument("--tls-ca", metavar="PEM", help="CA that signed the analyzer's certificate")
    tls.add_argument("--tls-cert", metavar="PEM",
                     help="this agent's certificate (spiffe://hypertrace/agent/NODE)")
    tls.add_argument("--tls-key", metavar="PEM", help="its private key")
    tls.add_argument("--insecure", action="store_true", default=None,
                     help="plaintext, to an analyzer started with --insecure (tests only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys

    # The agent does no linear algebra, yet numpy's OpenBLAS starts a thread per core, each with
    # its own buffers, on import (15 on a 16-core GPU node). Set before numpy is first imported.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    from hypertrace.daemon.agent import run_agent
    from hypertrace.daemon.config import AgentConfig, ConfigError, load_config, require_transport

    if args.verbose == 0:          # a daemon should say what it found and sent
        logging.getLogger().setLevel(logging.INFO)
    overrides = {name: getattr(args, name, None) for name in AgentConfig.__dataclass_fields__}
    try:
        cfg = load_config(args.config, overrides)
        require_transport(cfg)
    except ConfigError as e:
        print(f"hypertrace agent: {e}", file=sys.stderr)
        return 2
    return run_agent(cfg)
