"""Do acks wait behind the Engine's feed? Ack latency while the analyzer feeds a burst to its Engine.

Why: the ack path never takes the Engine's lock, but it shares the GIL with the thread that feeds
stored windows to the Engine (every second, seconds of Python after a 16,384-agent burst) and
scores them. An event loop that comes back from its sockets must get the GIL back each time; with
Python's default 5 ms switch interval a CPU-bound thread holds it that long at every turn, so
acks can queue behind the feed. The analyzer hands the GIL over every ``FEED_YIELD_EVERY``
windows of the feed and runs with a 0.5 ms switch interval (analyzer/ingest/server.py).

What runs: an analyzer server **subprocess** (real gRPC, real SQLite, no scoring) whose Engine
queue is refilled with ``--feed`` windows every ``--every`` seconds (what a burst leaves to feed);
this process sends windows one at a time on one stream, each after the previous ack, and times
each ack. Two settings alternate, the analyzer's and Python's defaults (no hand-over, 5 ms), over
``--rounds`` rounds; the table gives the ack latency percentiles of each, and the windows fed.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hypertrace.sim.bench_scale import machine_info
from hypertrace.sim.demo import stop_process
from hypertrace.sim.simulate import SimConfig, generate

SETTINGS = {"analyzer": (None, None), "python defaults": (10**9, 0.005)}


def serve(db: str, yield_every: int | None, switch_s: float | None, feed: int,
          every: float) -> None:
    """The server side: an AnalyzerServer whose Engine queue is refilled periodically."""
    from hypertrace.analyzer.ingest import server as srv
    from hypertrace.analyzer.store.storage import Storage

    if yield_every is not None:
        srv.FEED_YIELD_EVERY = yield_every
    if switch_s is not None:
        srv.SWITCH_INTERVAL_S = switch_s
    windows = list(generate(SimConfig(gpus=feed * 8, gpus_per_node=8, windows=1, seed=3)))
    analyzer = srv.Analyzer(Storage.open(db))
    server = srv.AnalyzerServer(analyzer, srv.ServerOptions(
        listen="127.0.0.1:0", insecure=True, flush_interval=0, retention_hours=0))
    port = server.start()
    print(port, flush=True)
    fed = 0
    try:
        while True:
            time.sleep(every)
            now = time.time_ns()
            analyzer._inbox.extend((w, b"", 0, now) for w in windows)
            fed += len(windows)
    finally:
        server.stop()


def measure(target: str, seconds: float) -> np.ndarray:
    """Ack latency (s) of windows sent one at a time on one stream for ``seconds``."""
    import queue

    import grpc

    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.proto.wire import STREAM_METHOD

    ch = grpc.insecure_channel(target)
    grpc.channel_ready_future(ch).result(timeout=30)
    call = ch.stream_stream(STREAM_METHOD, request_serializer=None,
                            response_deserializer=pb.Ack.FromString)
    base = next(iter(generate(SimConfig(gpus=8, gpus_per_node=8, windows=1, seed=9))))
    q: queue.SimpleQueue = queue.SimpleQueue()

    def requests():
        while (item := q.get()) is not None:
            yield item

    acks = call(requests())
    lat: list[float] = []
    end = time.monotonic() + seconds
    seq = 0
    while time.monotonic() < end:
        seq += 1
        base.seq = seq
        base.agent_id = "ack-probe"
        t = time.perf_counter()
        q.put(base.SerializeToString())
        next(acks)
        lat.append(time.perf_counter() - t)
    q.put(None)
    for _ in acks:
        pass
    ch.close()
    return np.array(lat)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_ack_wait",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--feed", type=int, default=2048, help="windows fed per refill")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between refills")
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve", nargs=2, metavar=("YIELD", "SWITCH"), help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        y, s = args.serve
        serve(args.db, None if y == "-" else int(y), None if s == "-" else float(s),
              args.feed, args.every)
        return 0
    print(f"== machine: {machine_info()}", flush=True)
    print(f"== {args.feed} windows fed to the Engine every {args.every:g} s; one probe stream, "
          f"{args.seconds:g} s per run, {args.rounds} rounds alternating", flush=True)
    lats: dict[str, list[np.ndarray]] = {k: [] for k in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="hypertrace-ackwait-") as tmp:
        for k in range(args.rounds):
            for name, (y, s) in SETTINGS.items():
                db = Path(tmp) / f"{k}-{name.replace(' ', '-')}.db"
                proc = subprocess.Popen(
                    [sys.executable, "-m", "hypertrace.sim.bench_ack_wait", "--serve",
                     "-" if y is None else str(y), "-" if s is None else str(s),
                     "--db", str(db), "--feed", str(args.feed), "--every", str(args.every)],
                    stdout=subprocess.PIPE, text=True)
                try:
                    assert proc.stdout is not None
                    port = int(proc.stdout.readline())
                    time.sleep(args.every + 1.0)            # the first feed under way
                    lat = measure(f"127.0.0.1:{port}", args.seconds)
                finally:
                    stop_process(proc)
                lats[name].append(lat)
                print(f"{name} round {k + 1}: {len(lat)} acks, p50 {np.median(lat) * 1e3:.1f} "
                      f"ms, p99 {np.percentile(lat, 99) * 1e3:.1f} ms, max "
                      f"{lat.max() * 1e3:.1f} ms", flush=True)
    print("\n| setting | acks | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|")
    for name, runs in lats.items():
        a = np.concatenate(runs)
        print(f"| {name} | {len(a)} | {np.median(a) * 1e3:.1f} | "
              f"{np.percentile(a, 99) * 1e3:.1f} | {a.max() * 1e3:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
