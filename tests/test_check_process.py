"""Window checks in worker processes (analyzer/scale/check_process.py), over real localhost gRPC.

A server whose windows are checked by checker processes answers every input (valid windows,
windows with a bad process entry, junk bytes, oversize messages, an unknown version, a clock far
ahead, mutated real windows) exactly as a server that checks them on its event loop, and stores
the same bytes; a checker killed mid-run is replaced and the next windows are still checked;
stop() leaves no checker behind.
"""
from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import grpc

from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions, make_analyzer
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import MAX_WINDOW_BYTES
from hypertrace.sim.simulate import SimConfig, generate

WINDOWS = list(generate(SimConfig(gpus=32, gpus_per_node=8, windows=3, seed=7)))


def _inputs() -> list[bytes]:
    """Good windows and every kind of bad one, in a fixed order."""
    out = [w.SerializeToString() for w in WINDOWS[:6]]
    bad_entry = pb.NodeWindow()
    bad_entry.CopyFrom(WINDOWS[6])
    bad_entry.processes[1].apis[0].count += 3          # its histogram no longer adds up
    out.append(bad_entry.SerializeToString())
    version = pb.NodeWindow()
    version.CopyFrom(WINDOWS[7])
    version.version = 99
    out.append(version.SerializeToString())
    ahead = pb.NodeWindow()
    ahead.CopyFrom(WINDOWS[8])
    ahead.seq = 1000
    ahead.end.FromNanoseconds(time.time_ns() + 3600 * 10**9)
    out.append(ahead.SerializeToString())
    out += [b"\xff\xfe junk", b"\x00" * (MAX_WINDOW_BYTES + 1)]
    rng = random.Random(5)
    seed = WINDOWS[9].SerializeToString()
    for k in range(40):                                 # mutated real windows
        b = bytearray(seed)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        m = pb.NodeWindow()
        try:
            m.ParseFromString(bytes(b))
            m.seq = 2000 + k                            # each its own (agent, seq)
            out.append(m.SerializeToString())
        except Exception:
            out.append(bytes(b))
    out.append(WINDOWS[0].SerializeToString())          # a duplicate
    return out


def _server(db: Path, checkers: int, engine_process: bool = False
            ) -> tuple[AnalyzerServer, str]:
    st = Storage.open(db, synchronous="NORMAL")
    a = make_analyzer(st, ScoringConfig(), engine_process=engine_process)
    server = AnalyzerServer(a, ServerOptions(listen="127.0.0.1:0", flush_interval=0.0,
                                             shutdown_grace_s=0.5, insecure=True,
                                             retention_hours=0, checker_processes=checkers))
    return server, f"127.0.0.1:{server.start()}"


def _stop(server: AnalyzerServer) -> None:
    server.stop()
    server.analyzer.close()
    server.analyzer.storage.close()


def _answer(target: str, raw: bytes) -> tuple:
    """What the server answers to one message on a stream of its own."""
    with grpc.insecure_channel(target) as ch:
        call = ch.stream_stream("/hypertrace.v1.Ingest/Stream", request_serializer=None,
                                response_deserializer=pb.Ack.FromString)
        try:
            return ("ack",) + tuple(a.SerializeToString() for a in call(iter([raw]), timeout=30))
        except grpc.RpcError as exc:      # (how far ahead a clock is depends on when it is read)
            return (exc.code().name, re.sub(r"is [\d,]+ s ahead", "is N s ahead", exc.details()))


def _stored(server: AnalyzerServer) -> list[tuple]:
    return sorted((sw.agent_id, sw.seq, sw.payload) for sw in
                  server.analyzer.storage.iter_windows())


def test_checker_processes_answer_and_store_as_the_event_loop_does(tmp_path):
    """Also with the Engine in its worker, where the loop parses only the checked window's
    header: the same acks, refusals, stored bytes and report."""
    inputs = _inputs()
    results = {}
    for checkers, engine_process in ((0, False), (2, False), (2, True)):
        server, target = _server(tmp_path / f"{checkers}{engine_process}.db", checkers,
                                 engine_process)
        try:
            assert (server._checkers is not None) == bool(checkers)
            answers = [_answer(target, raw) for raw in inputs]
            report = server.analyzer.report()
            report.ClearField("generated")
            results[checkers, engine_process] = (answers, _stored(server),
                                                 report.SerializeToString(deterministic=True))
        finally:
            _stop(server)
    loop = results[0, False]
    kinds = {a[0] for a in loop[0]}
    assert {"ack", "INVALID_ARGUMENT"} <= kinds                   # both kinds were exercised
    assert any(pb.Ack.FromString(a[1]).rejected_processes for a in loop[0] if a[0] == "ack")
    for other in (results[2, False], results[2, True]):
        for raw, a, b in zip(inputs, loop[0], other[0]):
            assert a == b, raw[:40]
        assert other[1] == loop[1]
        assert other[2] == loop[2]


def test_a_killed_checker_is_replaced(tmp_path):
    server, target = _server(tmp_path / "a.db", 1)
    try:
        first = server._checkers.pids[0]
        assert _answer(target, WINDOWS[0].SerializeToString())[0] == "ack"
        os.kill(first, signal.SIGKILL)
        time.sleep(0.2)
        answers = [_answer(target, w.SerializeToString()) for w in WINDOWS[1:4]]
        assert [a[0] for a in answers] == ["ack"] * 3
        assert server._checkers.pids[0] not in (None, first)
        assert server.analyzer.storage.count_windows() == 4
        assert server.analyzer.metrics.registry.get_sample_value(
            "hypertrace_worker_restarts_total", {"worker": "checker"}) == 1
    finally:
        _stop(server)


def test_stop_leaves_no_checker_behind(tmp_path):
    server, target = _server(tmp_path / "a.db", 2)
    pids = list(server._checkers.pids)
    assert _answer(target, WINDOWS[0].SerializeToString())[0] == "ack"
    _stop(server)
    for pid in pids:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        else:
            assert not Path(f"/proc/{pid}").exists(), f"checker {pid} outlived the server"
