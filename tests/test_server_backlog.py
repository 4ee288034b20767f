"""A burst of new streams while the server's event loop is busy: every stream is acked.

grpc.aio takes new calls from grpc one per turn of the event loop; the calls that arrive
meanwhile wait in grpc's queue of pending calls, and grpc cancels calls at random once that
queue is longer than ``grpc.server.max_pending_requests`` (1,000 by default). Agents open a
stream per window in the seconds after each window end, so the analyzer sets that limit
(``ServerOptions.max_pending_streams``) far above any fleet's burst. Real gRPC on localhost,
a real SQLite file; the loop is kept busy by a blocking callback on it while the streams open.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
from grpc import aio

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import STREAM_METHOD
from hypertrace.sim.simulate import SimConfig, generate

WINDOW = next(iter(generate(SimConfig(gpus=8, gpus_per_node=8, windows=2, seed=11))))


def _server(db: Path, **options) -> tuple[AnalyzerServer, str]:
    storage = Storage.open(db, synchronous="NORMAL")
    analyzer = Analyzer(storage, ScoringConfig())
    server = AnalyzerServer(analyzer, ServerOptions(listen="127.0.0.1:0", flush_interval=0.0,
                                                    shutdown_grace_s=0.5, insecure=True,
                                                    **options))
    return server, f"127.0.0.1:{server.start()}"


async def _one(channel: aio.Channel, payload: bytes, written: "_Count") -> str:
    """Open a stream, send the window, read its ack: 'OK' or the status code's name."""
    call = channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                 response_deserializer=pb.Ack.FromString)()
    try:
        await call.write(payload)
        written.add()
        ack = await call.read()
        await call.done_writing()
        return "OK" if ack is not aio.EOF and ack.seq == WINDOW.seq else "no ack"
    except grpc.RpcError as exc:
        return exc.code().name


class _Count:
    """Streams written so far; the blocked loop waits for all of them."""

    def __init__(self, want: int):
        self._n, self._want, self._lock = 0, want, threading.Lock()
        self.all = threading.Event()

    def add(self) -> None:
        with self._lock:
            self._n += 1
            if self._n >= self._want:
                self.all.set()


def _burst(server: AnalyzerServer, target: str, streams: int, busy_s: float) -> dict[str, int]:
    """Block the server's loop until ``streams`` streams, opened on one connection, have
    written their window (at most ``busy_s``), then count their outcomes."""
    payload = WINDOW.SerializeToString()
    written = _Count(streams)

    def busy() -> None:
        written.all.wait(busy_s)      # the streams are sent meanwhile; grpc queues them
        time.sleep(0.5)               # the last ones reach the server

    async def run() -> dict[str, int]:
        async with aio.insecure_channel(target) as ch:
            await ch.channel_ready()
            server._loop.call_soon_threadsafe(busy)
            tasks = [asyncio.ensure_future(_one(ch, payload, written))
                     for _ in range(streams)]
            outcomes = await asyncio.gather(*tasks)
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o] = counts.get(o, 0) + 1
        return counts

    return asyncio.run(run())


def test_burst_beyond_grpc_default_backlog_is_all_acked(tmp_path):
    server, target = _server(tmp_path / "a.db")
    try:
        counts = _burst(server, target, streams=1500, busy_s=10.0)
    finally:
        server.stop()
        server.analyzer.storage.close()
    assert counts == {"OK": 1500}


def test_streams_beyond_the_pending_limit_are_cancelled(tmp_path):
    """The limit is what decides: with a queue of 8, a burst of 64 loses streams."""
    server, target = _server(tmp_path / "b.db", max_pending_streams=8)
    try:
        counts = _burst(server, target, streams=64, busy_s=10.0)
    finally:
        server.stop()
        server.analyzer.storage.close()
    assert counts.get("OK", 0) < 64
    assert set(counts) <= {"OK", "CANCELLED", "INTERNAL", "RESOURCE_EXHAUSTED", "UNAVAILABLE"}
