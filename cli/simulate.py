"""`hypertrace simulate`: realistic windows of a training job with injected stragglers.

Writes proto3-JSON lines (``--output``, ``-`` for stdout) or streams them to an analyzer as real
agents would (``--analyzer``: one uplink with its own spool per node). The model (lognormal body,
Pareto tail, per-node jitter, collective synchronize waits) is documented in
``hypertrace.sim.simulate``. Same ``--seed``, same windows.

Example: hypertrace simulate --gpus 2048 --gpus-per-node 8 --straggler node-0042:1.10 \\
             --windows 8 --seed 7 --output w.jsonl
         hypertrace simulate --scenario collective --gpus 512 --seed 3 --output c.jsonl
         hypertrace simulate --list-scenarios

Every window carries the always-on signals (scheduler evidence, steps); the launch APIs only
in the windows the coordinated slice schedule samples (``--cadence``).

``--scenario NAME`` builds the job from the catalog (``hypertrace.sim.scenarios``; the seed
also picks which node is slow); ``--straggler`` adds more slow nodes on top.
"""
from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="generate simulated agent windows (to a file or an analyzer)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=128, help="GPUs in the job (default 128)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="default 8")
    p.add_argument("--straggler", action="append", default=[], metavar="NODE:FACTOR",
                   help="slow node, e.g. node-0042:1.10 for 10%% slower launches (repeatable)")
    p.add_argument("--windows", type=int, default=8, help="windows per node (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window-seconds", type=float, default=10.0)
    p.add_argument("--job", default=None, help="job id (default sim-job, or sim-SCENARIO)")
    p.add_argument("--scenario", metavar="NAME", help="a catalog scenario (see --list-scenarios)")
    p.add_argument("--mode", choices=("collective", "independent"), default=None,
                   help="collective (default: a collective ends every step, so step times are "
                        "equal and the straggler waits least) or independent (own step times)")
    p.add_argument("--cadence", type=int, default=None, metavar="K",
                   help="launch tier sampled every K-th window, the same windows on every agent "
                        "(default 1: every window, as at the default budget)")
    p.add_argument("--pipeline-stages", type=int, default=None, metavar="N",
                   help="N pipeline stages of whole nodes whose last stage does --stage-load more "
                        "work by design; windows name each rank's stage (ProcessWindow.group), "
                        "as an agent does with HYPERTRACE_PIPELINE_STAGES (default 1: none)")
    p.add_argument("--stage-load", type=float, default=None, metavar="F",
                   help="the last stage's extra work with --pipeline-stages (default 0.13)")
    p.add_argument("--noise", choices=("tight", "wide"), default=None,
                   help="wide: persistent host and GPU spreads of 0.5-1.5%% (Gaussian or "
                        "Student-t), idle synchronize calls and rack hiccups, drawn from the seed "
                        "(some healthy hardware is then truly slow); tight: the simulator's "
                        "defaults (default: wide with --scenario, as in bench-detect; tight "
                        "without)")
    p.add_argument("--list-scenarios", action="store_true",
                   help="print the scenario catalog and exit")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--output", metavar="FILE",
                     help="write the windows: FILE.jsonl JSON lines ('-' = stdout), FILE.pb "
                     "binary length-delimited records (about 200x faster to read back); .gz "
                     "compresses either")
    out.add_argument("--analyzer", metavar="HOST:PORT",
                     help="stream to a running analyzer as real agents would, one connection "
                     "per simulated node: with mutual TLS (--pki) or in plaintext (--insecure)")
    p.add_argument("--pki", metavar="DIR",
                   help="with --analyzer: the CA folder of `hypertrace certs init`; each "
                   "simulated node gets an agent certificate of its own from it (in a temporary "
                   "folder), as the analyzer requires")
    p.add_argument("--insecure", action="store_true",
                   help="with --analyzer: plaintext, to an analyzer started with --insecure "
                   "(tests only)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="with --analyzer: seconds to wait for every ack (default 120)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from hypertrace.sim import scenarios
    from hypertrace.sim.simulate import SimConfig, generate, live_start_ns, parse_straggler

    if args.list_scenarios:
        print(scenarios.describe())
        return 0
    if not (args.output or args.analyzer):
        print("hypertrace simulate: one of --output FILE.jsonl or --analyzer HOST:PORT is "
              "required (or --list-scenarios)", file=sys.stderr)
        return 2
    try:
        extra = tuple(parse_straggler(s) for s in args.straggler)
        if args.scenario:
            cfg = scenarios.get(args.scenario).config(args.gpus, args.gpus_per_node,
                                                      args.windows, args.seed,
                                                      args.window_seconds,
                                                      wide=args.noise != "tight")
            cfg = dataclasses.replace(cfg, stragglers=cfg.stragglers + extra,
                                      job_id=args.job or cfg.job_id)
        else:
            cfg = SimConfig(gpus=args.gpus, gpus_per_node=args.gpus_per_node,
                            windows=args.windows, seed=args.seed,
                            window_seconds=args.window_seconds, job_id=args.job or "sim-job",
                            stragglers=extra)
            if args.noise == "wide":
                cfg = scenarios.wide_noise(cfg)
        over = {k: v for k, v in (("mode", args.mode), ("cadence", args.cadence),
                                  ("pipeline_stages", args.pipeline_stages),
                                  ("stage_load", args.stage_load)) if v is not None}
        cfg = dataclasses.replace(cfg, **over) if over else cfg
    except ValueError as exc:
        print(f"hypertrace simulate: {exc}", file=sys.stderr)
        return 2
    from hypertrace.cli.progress import Progress

    progress = Progress("simulate", "windows", cfg.n_nodes * cfg.windows)

    def counted():
        for w in generate(cfg):
            if getattr(args, "pki", None) and args.analyzer:
                w.agent_id = f"{w.node}/sim"     # what an agent/NODE certificate may send
            yield w
            progress.add()
        progress.close()

    if args.output:
        from hypertrace.proto.records import is_binary_name, open_for_write, write_windows
        binary = is_binary_name(args.output)
        if args.output == "-":
            n = write_windows(counted(), sys.stdout.buffer, binary=False)
        else:
            import os
            partial = f"{args.output}.partial"        # renamed when complete: an interrupted
            try:                                      # run leaves no empty or cut file
                with open_for_write(partial, gz=args.output.endswith(".gz")) as fh:
                    n = write_windows(counted(), fh, binary)
                os.replace(partial, args.output)
            except OSError as exc:
                print(f"hypertrace simulate: cannot write {args.output}: {exc}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                if os.path.exists(partial):
                    os.unlink(partial)
                print("hypertrace simulate: interrupted; nothing written", file=sys.stderr)
                return 130
            print(f"wrote {n} windows ({cfg.n_nodes} nodes x {cfg.windows} windows, "
                  f"{cfg.gpus} GPUs) to {args.output}", file=sys.stderr)
        return 0

    import tempfile
    from pathlib import Path

    from hypertrace.sim.simulate import stream_windows

    if bool(args.pki) == bool(args.insecure):
        print("hypertrace simulate: --analyzer needs --pki DIR (mutual TLS, a certificate per "
              "simulated node from the CA in DIR) or --insecure (an analyzer started with "
              "--insecure)", file=sys.stderr)
        return 2
    if args.pki and not (Path(args.pki) / "ca.key").exists():
        print(f"hypertrace simulate: no CA in {args.pki}; pass the folder of `hypertrace certs "
              "init`", file=sys.stderr)
        return 2
    cfg = dataclasses.replace(cfg, start_ns=live_start_ns(cfg, time.time_ns()))
    with tempfile.TemporaryDirectory(prefix="hypertrace-sim-") as tmp:
        tls_for = _node_certificates(Path(args.pki), Path(tmp) / "pki") if args.pki else None
        try:
            res = stream_windows(counted(), args.analyzer, str(Path(tmp) / "spool"),
                                 timeout=args.timeout, tls_for=tls_for)
        except RuntimeError as exc:
            print(f"hypertrace simulate: {exc}", file=sys.stderr)
            return 1
    if res.refused or res.rejected or res.pending:
        why = (res.refused or (f"{res.rejected} refused as invalid (the analyzer's log and "
                               "this command's say why)" if res.rejected else
                               "is the analyzer running there?"))
        print(f"hypertrace simulate: {res.acked} of {res.windows} windows acked by "
              f"{args.analyzer}; {why}", file=sys.stderr)
        return 1
    print(f"streamed {res.windows} windows from {cfg.n_nodes} simulated agents to "
          f"{args.analyzer} ({res.acked} acked, {res.duplicates} duplicates)", file=sys.stderr)
    return 0


def _node_certificates(ca_dir, out):
    """tls_for(node): an agent certificate for each simulated node, issued from the CA in
    ``ca_dir`` into ``out`` on first use (cli/certs.py)."""
    from hypertrace.cli.certs import issue
    from hypertrace.proto.transport import TlsFiles
    made: dict[str, TlsFiles] = {}

    def tls_for(node: str) -> TlsFiles:
        if node not in made:
            bundle = issue(ca_dir, out / f"agent-{node}", "agent", node,
                           [f"URI:spiffe://hypertrace/agent/{node}"], days=1)
            made[node] = TlsFiles(str(bundle / "ca.crt"), str(bundle / "agent.crt"),
                                  str(bundle / "agent.key"))
        return made[node]
    return tls_for
