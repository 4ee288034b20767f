"""`make bench-cluster`: what the cluster mode costs per window, side by side with one analyzer.

Two parts, one run:

1. **In process, one core's CPU time (``time.process_time``):** a scoring worker's work per
   window (parse the stored bytes, the duplicate check, ``Engine.ingest``; what a takeover
   replays too) and per scored epoch, at 16,384 GPUs (2,048 nodes x 8), with the two probed APIs
   the scoring tests use and with all ten an agent sends. The replay of one hour of that job
   follows: 737,280 windows at the measured cost.
2. **End to end, real processes on localhost:** the same windows of a smaller job (``--nodes`` x
   8 GPUs, ``--windows`` epochs, one node 30% slow) streamed by the agents' own uplink
   (sim/simulate.py ``stream_windows``) into (a) ``hypertrace analyzer`` (SQLite,
   ``synchronous=FULL``) and (b) a 3-node NATS JetStream cluster (sim/nats_cluster.py, R3) behind
   one ``hypertrace analyzer-edge`` with one ``hypertrace analyzer-worker``. Each process's CPU
   time is read from ``/proc/PID/stat`` around the stream and around the report that scores
   everything (both score only on request: ``--flush-interval 0``), so the client's own cost is
   not counted. The table gives CPU µs per window of each process and their ratio to the single
   analyzer.

Checks (exit 1 when one fails): every window acked in both modes, and the cluster's report names
the same stragglers with the same verdict per node as the single analyzer's.

Needs ``nats-server`` (apt-get install nats-server) and nats-py (the ``cluster`` extra).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypertrace.sim.nats_cluster import CLI, CliProcess

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def in_process() -> list[tuple[str, float, float, float]]:
    """(APIs, worker µs per window, ms per scored epoch, replay seconds per hour) at 16k GPUs."""
    from hypertrace.analyzer.scale.cluster.partition import PartitionScorer
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.sim.synthetic import job_windows
    out = []
    for all_apis in (False, True):
        raws = [w.SerializeToString()
                for w in job_windows(2048, 8, 3, job_id="big", all_apis=all_apis)]
        scorer = PartitionScorer(0, ScoringConfig())
        t = time.process_time()
        for seq, raw in enumerate(raws, start=1):
            w = pb.NodeWindow.FromString(raw)
            scorer.window(seq, w, w.end.ToNanoseconds())
        per_window = (time.process_time() - t) / len(raws)
        t = time.process_time()
        scored = scorer.tick(len(raws) + 1, 2**62).results
        per_epoch = (time.process_time() - t) / len(scored)
        out.append(("all 10" if all_apis else "2", per_window * 1e6, per_epoch * 1e3,
                    per_window * 2048 * 360))
    return out


def _report(target: str) -> dict:
    out = subprocess.run(CLI + ["report", "--analyzer", target, "--insecure", "--format", "json",
                                "--all-nodes", "--timeout", "120"],
                         capture_output=True, text=True, timeout=180)
    if out.returncode not in (0, 3):
        raise RuntimeError(f"report from {target} failed: {out.stderr}")
    return json.loads(out.stdout)


def _verdicts(report: dict) -> dict[str, str]:
    return {n["node"]: n["verdict"] for j in report["jobs"] for n in j["nodes"]}


def end_to_end(nodes: int, windows: int, tmp: Path) -> tuple[dict, list[str]]:
    """CPU seconds per process and phase in both modes, and the failed checks."""
    import dataclasses

    from hypertrace.sim import nats_cluster
    from hypertrace.sim.simulate import (
        SimConfig,
        Straggler,
        generate,
        live_start_ns,
        stream_windows,
    )
    cfg = SimConfig(gpus=nodes * 8, gpus_per_node=8, windows=windows, seed=11,
                    stragglers=(Straggler("node-0003", 1.3),))
    cfg = dataclasses.replace(cfg, start_ns=live_start_ns(cfg, time.time_ns()))
    wins = list(generate(cfg))
    failed: list[str] = []
    cpu: dict[str, dict[str, float]] = {"n": {"windows": len(wins)}}

    single = CliProcess(["analyzer", "--listen", "127.0.0.1:0", "--insecure", "--flush-interval",
                      "0", "--db", str(tmp / "single.db")], r"listening on \S+:(\d+)",
                     tmp / "analyzer.log")
    try:
        target = f"127.0.0.1:{single.match.group(1)}"
        c0, t0 = cpu_s(single.proc.pid), time.monotonic()
        res = stream_windows(wins, target, str(tmp / "spool-single"), timeout=600)
        c1, t1 = cpu_s(single.proc.pid), time.monotonic()
        one = _report(target)
        c2 = cpu_s(single.proc.pid)
        cpu["analyzer"] = {"ingest": c1 - c0, "report": c2 - c1, "wall": t1 - t0}
        if res.pending:
            failed.append(f"single analyzer: {res.pending} windows not acked")
    finally:
        single.stop()

    cluster = nats_cluster.NatsCluster(tmp / "nats", 8).start()
    procs: list[CliProcess] = []
    try:
        flags = ["--nats-servers", ",".join(cluster.urls), "--partitions", "8"]
        edge = CliProcess(["analyzer-edge", "--listen", "127.0.0.1:0", "--insecure",
                        "--report-timeout-s", "120"] + flags, r"listening on \S+:(\d+)",
                       tmp / "edge.log")
        procs.append(edge)
        worker = CliProcess(["analyzer-worker", "--flush-interval", "0", "--worker-id", "w1"] + flags,
                         r"analyzer-worker \S+ running", tmp / "worker.log")
        procs.append(worker)
        target = f"127.0.0.1:{edge.match.group(1)}"
        pids = {"edge": edge.proc.pid, "worker": worker.proc.pid,
                "nats (3 servers)": [p.pid for p in cluster.procs.values()]}

        def sample() -> dict[str, float]:
            return {k: sum(cpu_s(x) for x in v) if isinstance(v, list) else cpu_s(v)
                    for k, v in pids.items()}
        time.sleep(3)                        # the worker takes its leases
        s0, t0 = sample(), time.monotonic()
        res = stream_windows(wins, target, str(tmp / "spool-cluster"), timeout=600)
        s1, t1 = sample(), time.monotonic()
        many = _report(target)
        s2 = sample()
        for k in pids:
            cpu[k] = {"ingest": s1[k] - s0[k], "report": s2[k] - s1[k], "wall": t1 - t0}
        if res.pending:
            failed.append(f"cluster: {res.pending} windows not acked")
        if _verdicts(many) != _verdicts(one):
            failed.append("the cluster's node verdicts differ from the single analyzer's")
        if "straggler" not in _verdicts(many).values():
            failed.append("no straggler found (node-0003 is 30% slow)")
    finally:
        for p in procs:
            p.stop()
        cluster.stop()
    return cpu, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_cluster",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=256, help="nodes of 8 GPUs end to end (256)")
    ap.add_argument("--windows", type=int, default=6, help="epochs end to end (6)")
    args = ap.parse_args(argv)
    from hypertrace.sim import nats_cluster
    why = nats_cluster.missing()
    if why:
        print(f"bench-cluster: needs {why}", file=sys.stderr)
        return 2

    print("== 1. a scoring worker in process, 16,384 GPUs (2,048 nodes x 8), one core CPU time")
    print(f"{'APIs':>7} {'µs / window':>12} {'ms / epoch':>11} {'replay of 1 h, s':>17}")
    for apis, us, ms, replay in in_process():
        print(f"{apis:>7} {us:>12.0f} {ms:>11.0f} {replay:>17.0f}")

    tmp = Path(tempfile.mkdtemp(prefix="hypertrace-bench-cluster-"))
    try:
        cpu, failed = end_to_end(args.nodes, args.windows, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = cpu.pop("n")["windows"]
    base = cpu["analyzer"]["ingest"]
    print(f"\n== 2. end to end: {args.nodes} nodes x 8 GPUs x {args.windows} windows = {n:.0f} "
          "windows over gRPC (the agents' uplink), CPU of each process")
    print(f"{'process':>18} {'ingest µs/window':>17} {'vs analyzer':>12} {'report CPU s':>13} "
          f"{'ack wall s':>11}")
    for name, c in cpu.items():
        print(f"{name:>18} {c['ingest'] / n * 1e6:>17.0f} {c['ingest'] / base:>11.2f}x "
              f"{c['report']:>13.2f} {c['wall']:>11.1f}")
    total = sum(c["ingest"] for k, c in cpu.items() if k != "analyzer")
    print(f"{'cluster, all':>18} {total / n * 1e6:>17.0f} {total / base:>11.2f}x")
    for f in failed:
        print(f"CHECK FAILED: {f}")
    print("checks: " + ("all passed" if not failed else f"{len(failed)} failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
