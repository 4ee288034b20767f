"""`make bench-flood`: one agent key floods the analyzer with new job ids; how long the honest
job's report and the job list take after it, with the per-node quotas and without.

A real analyzer over localhost gRPC (plaintext: the quotas then key on the node a window
claims, as they key on the certificate's node over TLS) with a real SQLite file. An honest job
of ``--nodes`` nodes (one 20% slow) sends its windows; then one node sends ``--flood`` windows,
each of ``--jobs-per-window`` new job ids (every window on a stream of its own, as a refusal
ends a stream; a window past the quota only in part is stored without the refused jobs'
entries). Printed per mode: windows refused whole, jobs the analyzer holds, seconds of the
honest report and of the job list (the best of three), and the peak RSS growth of the process.

Exits 1 when, with the quotas, the honest report takes a second or more, the jobs held exceed
the honest job plus ``max_jobs_per_node``, or the slow node is not convicted.

    python -m hypertrace.sim.bench_flood --flood 200 --jobs-per-window 64
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(quotas: bool, nodes: int, flood: int, jobs_per_window: int) -> dict:
    import grpc

    from hypertrace.analyzer.ingest.quotas import QuotaSettings
    from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions, make_analyzer
    from hypertrace.analyzer.store.storage import Storage
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.proto.wire import STREAM_METHOD
    from hypertrace.sim.simulate import SimConfig, Straggler, generate
    cfg = SimConfig(gpus=nodes * 8, gpus_per_node=8, windows=6, seed=11,
                    stragglers=(Straggler("node-0001", 1.2),))
    honest = list(generate(cfg))
    rss0 = _rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        storage = Storage.open(Path(tmp) / "flood.db", synchronous="NORMAL")
        analyzer = make_analyzer(storage)
        server = AnalyzerServer(analyzer, ServerOptions(
            listen="127.0.0.1:0", insecure=True, flush_interval=0.0, shutdown_grace_s=0.5,
            retention_hours=0, quotas=QuotaSettings() if quotas else None))
        port = server.start()
        refused = 0
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = ch.stream_stream(STREAM_METHOD, request_serializer=None,
                                        response_deserializer=pb.Ack.FromString)
                list(call(iter([w.SerializeToString() for w in honest]), timeout=120))
                base = next(w for w in honest if w.node == "node-0002")
                for k in range(flood):
                    w = pb.NodeWindow()
                    w.CopyFrom(base)
                    w.seq = 10_000 + k
                    proto = w.processes[0]
                    del w.processes[:]
                    for j in range(jobs_per_window):
                        p = w.processes.add()
                        p.CopyFrom(proto)
                        p.job_id = f"flood-{k}-{j}"
                    try:
                        list(call(iter([w.SerializeToString()]), timeout=60))
                    except grpc.RpcError:
                        refused += 1
            report_s, list_s = [], []
            for _ in range(3):
                t0 = time.perf_counter()
                report = analyzer.report(cfg.job_id)
                report_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                jobs = analyzer.list_jobs()
                list_s.append(time.perf_counter() - t0)
            convicted = {n.node for n in report.jobs[0].nodes if n.verdict == "straggler"}
        finally:
            server.stop()
            analyzer.close()
            storage.close()
    return {"refused": refused, "jobs": len(jobs.jobs), "report_s": min(report_s),
            "list_s": min(list_s), "rss_mb": _rss_mb() - rss0,
            "slow_convicted": convicted == {"node-0001"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_flood",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8, help="nodes of the honest job (8 GPUs each)")
    ap.add_argument("--flood", type=int, default=100, help="flood windows")
    ap.add_argument("--jobs-per-window", type=int, default=64, help="new job ids per window")
    args = ap.parse_args(argv)
    import logging
    logging.getLogger("hypertrace").setLevel(logging.CRITICAL)   # every refusal would log
    from hypertrace.analyzer.ingest.quotas import MAX_JOBS_PER_NODE
    print(f"flood: {args.flood} windows x {args.jobs_per_window} new job ids from one node; "
          f"honest job of {args.nodes} nodes")
    print(f"{'quotas':<8} {'refused':>8} {'jobs held':>10} {'report s':>9} {'list s':>8} "
          f"{'RSS +MB':>8}  slow node convicted")
    ok = True
    for quotas in (True, False):
        r = run(quotas, args.nodes, args.flood, args.jobs_per_window)
        print(f"{'on' if quotas else 'off':<8} {r['refused']:>8} {r['jobs']:>10} "
              f"{r['report_s']:>9.3f} {r['list_s']:>8.3f} {r['rss_mb']:>8.0f}  "
              f"{'yes' if r['slow_convicted'] else 'NO'}")
        if quotas:
            ok = (r["report_s"] < 1.0 and r["jobs"] <= 1 + MAX_JOBS_PER_NODE
                  and r["slow_convicted"])
    print("PASS" if ok else "FAIL: with the quotas the report must answer in under 1 s, the "
          "jobs held stay within the quota and the slow node is convicted")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
