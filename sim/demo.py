"""`make demo`: the whole pipeline on one machine, over real gRPC on localhost.

1. start ``hypertrace analyzer`` as a subprocess on a free port with a temporary database;
2. stream simulated agents (one uplink with its own spool per node) for a 16-node x 8-GPU job in
   which one node launches 30% slower;
3. once every window is acked, run ``hypertrace report`` and print it;
4. check that the report names exactly the slow node (exit 1 if not);
5. write the HTML report (``hypertrace report --format html``) to ``demo-report.html`` (``--html``)
   and print its path;
6. stop everything it started, also on errors and Ctrl-C.

The analyzer runs with ``--flush-interval 0``: the simulated windows all arrive within a second,
and scoring only when the report is asked for guarantees that every node's window of an epoch is
in before that epoch is scored (a live analyzer waits ``grace_seconds`` for that instead).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from hypertrace.sim.simulate import SimConfig, Straggler, generate, live_start_ns, stream_windows

CLI = [sys.executable, "-m", "hypertrace.cli.main"]


def start_analyzer(db: str, timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    """Start an analyzer on a free localhost port; returns (process, "127.0.0.1:PORT")."""
    proc = subprocess.Popen(
        CLI + ["analyzer", "--listen", "127.0.0.1:0", "--db", db, "--flush-interval", "0",
               "--insecure"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on (\S+):(\d+)", line)
        if m:
            return proc, f"127.0.0.1:{m.group(2)}"
    stop_process(proc)
    raise RuntimeError("the analyzer did not start; run `hypertrace analyzer --listen "
                       "127.0.0.1:0 --db /tmp/x.db --insecure` by hand to see why")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def flagged_nodes(report_json: str) -> list[str]:
    """Nodes whose verdict is ``straggler`` in a report's JSON."""
    data = json.loads(report_json)
    return sorted(n["node"] for j in data.get("jobs", []) for n in j.get("nodes", [])
                  if n.get("verdict") == "straggler")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--slow-node", default="node-0011")
    ap.add_argument("--factor", type=float, default=1.30)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--html", default="demo-report.html", metavar="FILE",
                    help="where the HTML report goes (default: demo-report.html here)")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="hypertrace-demo-")
    proc: subprocess.Popen | None = None
    try:
        cfg = SimConfig(gpus=args.nodes * args.gpus_per_node, gpus_per_node=args.gpus_per_node,
                        windows=args.windows, seed=args.seed,
                        stragglers=(Straggler(args.slow_node, args.factor),))
        cfg = dataclasses.replace(cfg, start_ns=live_start_ns(cfg, time.time_ns()))
        proc, target = start_analyzer(os.path.join(tmp, "analyzer.db"))
        print(f"== analyzer on {target} (pid {proc.pid})\n== streaming {cfg.n_nodes} simulated "
              f"agents x {cfg.windows} windows, {cfg.gpus} GPUs, {args.slow_node} "
              f"{args.factor:g}x slower", flush=True)
        res = stream_windows(generate(cfg), target, os.path.join(tmp, "spool"), timeout=120)
        if res.pending:
            print(f"demo: {res.pending} windows were not acked", file=sys.stderr)
            return 1
        print(f"== {res.acked} windows acked; hypertrace report --analyzer {target}\n", flush=True)
        table = subprocess.run(CLI + ["report", "--analyzer", target, "--insecure"], text=True,
                               capture_output=True, timeout=60)
        print(table.stdout, end="")
        if table.returncode not in (0, 3):
            print(table.stderr, file=sys.stderr)
            return 1
        js = subprocess.run(CLI + ["report", "--analyzer", target, "--insecure", "--format", "json"],
                            text=True, capture_output=True, timeout=60)
        found = flagged_nodes(js.stdout)
        if found == [args.slow_node]:
            print(f"\n== OK: the report names {args.slow_node}, the injected slow node, and no "
                  "other\n   (exit status 3: stragglers reported)")
            log = subprocess.run(CLI + ["evict", "--db", os.path.join(tmp, "analyzer.db"), "log"],
                                 text=True, capture_output=True, timeout=60)
            print("\n== hypertrace evict log (the default policy is a dry-run: proposed, "
                  "recorded, nothing done)\n" + log.stdout, end="")
            if log.returncode != 0 or args.slow_node not in log.stdout:
                print(f"demo: no dry-run proposal for {args.slow_node}\n{log.stderr}",
                      file=sys.stderr)
                return 1
            page = subprocess.run(CLI + ["report", "--analyzer", target, "--insecure",
                                         "--format", "html", "-o", args.html],
                                  text=True, capture_output=True, timeout=60)
            if page.returncode not in (0, 3):
                print(f"demo: the HTML report was not written\n{page.stderr}", file=sys.stderr)
                return 1
            print("\n== HTML report (open it in a browser; it works offline):\n"
                  f"{os.path.abspath(args.html)}")
            return 0
        print(f"\n== FAILED: expected exactly [{args.slow_node}] as straggler, got {found}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    finally:
        if proc is not None:
            stop_process(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
