"""What the Ingest transport costs per window: the sync gRPC server against grpc.aio, side by side.

Why: at 16k GPUs a previous profile put about a sixth of the analyzer's CPU in the kernel, mostly
thread switches (about 24 per window), and the rest of the sync server's cost inside the
interpreter. The sync server hands every message between threads twice (grpc's polling thread
wakes the stream's worker for each received window, and again when its ack is sent), and the
store's group commit adds a third wait. A grpc.aio server runs every stream on one event loop.
Whether that pays enough to rewrite the analyzer's server on it is measured here, with the rest
of a window's work held equal, before anyone rewrites it.

Each side is a server **subprocess** whose Ingest handler parses the window, stores it durably in
a real :class:`~hypertrace.analyzer.store.storage.Storage` (SQLite, ``synchronous=FULL``, group commit,
payload compression) and acks it after the commit, so exactly-once holds on both:

* ``sync``: ``grpc.server`` with a thread pool, a worker thread per stream (the analyzer's
  layout until it moved to grpc.aio);
* ``aio``: ``grpc.aio.server``, one event loop; accepted windows wait on the loop and go to
  the store's thread in groups, one commit each (the analyzer's ``_StoreQueue``).

No validation and no Engine: both are the same Python on either side. The load generator (this
process, :class:`hypertrace.sim.scale_load.Sender`) sends each epoch's windows of every node at once
on ``--streams`` shared streams (``--streams 0``: as agents do, a connection per node and a
stream per window, closed at its ack), as fast as it can, and waits for every ack. The
server's CPU (``/proc/PID/stat``, all threads) over the measured epochs divided by the windows
gives CPU per window. The sides alternate (sync, aio, sync, ...) so they meet the same noise.

Exit status 1 when a window was not acked and stored exactly once on either side.
"""
from __future__ import annotations

import argparse
import asyncio
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import AsyncIterator, Iterator

import numpy as np

from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import INGEST_SERVICE
from hypertrace.sim.bench_scale import ScaleConfig, machine_info, make_pool, read_proc
from hypertrace.sim.demo import stop_process
from hypertrace.sim.scale_load import Sender, WindowPool, WorkerSpec

MODES = ("sync", "aio")
#: ``--streams 0``: each window's stream closes right after its ack, so every window opens a
#: stream of its own (the heaviest pattern for the server; agents now keep theirs open).
_STREAM_PER_WINDOW_IDLE_S = 0.0


def _ack(w: pb.NodeWindow, new: bool) -> pb.Ack:
    return pb.Ack(agent_id=w.agent_id, seq=w.seq, duplicate=not new)


def serve_sync(db: str, workers: int) -> None:
    """A worker thread per stream, the store called in it (the analyzer's former layout)."""
    import grpc

    storage = Storage.open(db)

    def stream(requests: Iterator[bytes], context) -> Iterator[pb.Ack]:
        for raw in requests:
            w = pb.NodeWindow.FromString(raw)
            yield _ack(w, storage.add_window(w, raw))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    handler = grpc.stream_stream_rpc_method_handler(
        stream, request_deserializer=None, response_serializer=pb.Ack.SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(INGEST_SERVICE, {"Stream": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def serve_aio(db: str, workers: int) -> None:
    """One event loop for every stream; accepted windows stored in groups by the analyzer's own
    store queue (analyzer/ingest/server.py: one hop to the store's thread per group)."""
    import grpc

    from hypertrace.analyzer.ingest.checks import Refused
    from hypertrace.analyzer.ingest.server import Analyzer, _StoreQueue

    storage = Storage.open(db)
    pool = futures.ThreadPoolExecutor(max_workers=1)     # one group at a time
    store = _StoreQueue(Analyzer(storage), pool, None)

    async def stream(requests: AsyncIterator[bytes], context) -> AsyncIterator[pb.Ack]:
        async for raw in requests:
            w = pb.NodeWindow.FromString(raw)
            new = await store.store(w, raw)
            if isinstance(new, Refused):
                await context.abort(new.code, new.details)
                return
            yield _ack(w, new)

    async def run() -> None:
        server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(
            stream, request_deserializer=None, response_serializer=pb.Ack.SerializeToString)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(INGEST_SERVICE, {"Stream": handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(run())


async def _drive(target: str, pid: int, pool: WindowPool, nodes: int, streams: int,
                 warmup: int, epochs: int) -> tuple[float, int, int, list[str]]:
    """Send every epoch's windows at once and wait for their acks; (the server's CPU seconds
    over the measured epochs, windows acked, duplicate acks, errors)."""
    spec = WorkerSpec(0, target, "", tuple(range(nodes)), (0,) * nodes, not streams, streams,
                      _STREAM_PER_WINDOW_IDLE_S, channels=min(4, max(1, streams)))
    sender = Sender(spec, nodes * (warmup + epochs))
    await sender.connect()
    cpu0 = 0.0
    for e in range(warmup + epochs):
        if e == warmup:
            cpu0 = read_proc(pid).cpu_s
        end = time.time_ns() // 10**9 * 10**9
        for node in range(nodes):
            sender.send(node, e * nodes + node, pool.window(node, e + 1, end - 10**10, end))
        if not await sender.wait_acked(e * nodes, (e + 1) * nodes, timeout=300):
            break
    if not streams:
        await asyncio.sleep(1.0)         # the last streams' closes reach the server
    cpu = read_proc(pid).cpu_s - cpu0
    await sender.close(30.0)
    return cpu, int((sender.ack_ns > 0).sum()), int(sender.duplicate.sum()), sender.errors


def run_side(mode: str, workdir: Path, pool: WindowPool, nodes: int, streams: int,
             warmup: int, epochs: int) -> tuple[float, bool]:
    """One server of ``mode``: (CPU ms per window over the measured epochs, exactly once).
    ``streams`` 0: every node has its own connection and a stream per window, closed at its
    ack; the CPU is then read once the last streams closed."""
    db = workdir / f"{mode}.db"
    workers = streams + 16 if streams else 2 * nodes + 64
    proc = subprocess.Popen([sys.executable, "-m", "hypertrace.sim.bench_transport", "--serve",
                             mode, "--db", str(db), "--workers", str(workers)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        cpu, acked, dups, errors = asyncio.run(_drive(f"127.0.0.1:{port}", proc.pid, pool,
                                                      nodes, streams, warmup, epochs))
    finally:
        stop_process(proc)
    sent = nodes * (warmup + epochs)
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0]
    once = acked == stored == sent and dups == 0 and not errors
    return cpu * 1e3 / (nodes * epochs), once


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_transport",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048, help="windows per epoch (default 2048)")
    ap.add_argument("--streams", type=int, default=32,
                    help="shared streams (default 32); 0: one connection per node and a stream "
                    "per window, as agents send")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up epochs per side")
    ap.add_argument("--epochs", type=int, default=3, help="measured epochs per side")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating")
    ap.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=64, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        (serve_sync if args.serve == "sync" else serve_aio)(args.db, args.workers)
        return 0

    print(f"== machine: {machine_info()}", flush=True)
    pool = make_pool(ScaleConfig(nodes=args.nodes, pool_nodes=min(256, args.nodes),
                                  pool_windows=1))
    how = (f"{args.streams} shared streams" if args.streams
           else "one connection per node, a stream per window")
    print(f"== {args.nodes} windows per epoch on {how}, sent at once; "
          f"{args.warmup} warm-up + {args.epochs} measured epochs per side; SQLite "
          "synchronous=FULL", flush=True)
    ms: dict[str, list[float]] = {m: [] for m in MODES}
    ok = True
    with tempfile.TemporaryDirectory(prefix="hypertrace-transport-") as tmp:
        for k in range(args.rounds):
            for mode in MODES:
                (Path(tmp) / f"{mode}-{k}").mkdir()
                cpu_ms, once = run_side(mode, Path(tmp) / f"{mode}-{k}", pool, args.nodes,
                                        args.streams, args.warmup, args.epochs)
                ms[mode].append(cpu_ms)
                ok &= once
                print(f"{mode} round {k + 1}: {cpu_ms:.3f} ms server CPU per window, exactly "
                      f"once {'yes' if once else 'NO'}", flush=True)
    med = {m: float(np.median(v)) for m, v in ms.items()}
    print("\n| server | CPU per window, ms (median) | range |\n|---|---:|---|")
    for m in MODES:
        print(f"| {m} | {med[m]:.3f} | {min(ms[m]):.3f}-{max(ms[m]):.3f} |")
    # (a tiny run can read 0 ms: the kernel counts CPU time in clock ticks)
    ratio = f"{med['aio'] / med['sync']:.3f}" if med["sync"] > 0 else "n/a (sync read 0 ms)"
    print(f"\naio/sync {ratio}; every run exactly once: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
