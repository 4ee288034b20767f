"""The analyzer's gRPC server over real localhost gRPC with a real SQLite file.

Ingest acks and stores, duplicates are acked as such and not re-ingested, a restarted analyzer
resumes its history, reports name the injected straggler, and the CLI errors are clear.
"""
from __future__ import annotations

import dataclasses
import socket
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypertrace.analyzer.ingest.server import Analyzer, ServerError
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.sim.simulate import SimConfig, Straggler, generate

SMALL = SimConfig(gpus=32, gpus_per_node=8, windows=5, seed=3,
                  stragglers=(Straggler("node-0002", 1.3),))


def start_server(db: Path, listen: str = "127.0.0.1:0", flush_interval: float = 0.0,
                 tls=None) -> tuple[AnalyzerServer, str]:
    """An analyzer on a free port with the database ``db``; returns (server, "127.0.0.1:PORT").
    Plaintext (``insecure``) unless ``tls`` files are given (tests/test_tls.py)."""
    storage = Storage.open(db, synchronous="NORMAL")
    analyzer = Analyzer(storage, ScoringConfig())
    analyzer.resume()
    server = AnalyzerServer(analyzer, ServerOptions(listen=listen, flush_interval=flush_interval,
                                                    shutdown_grace_s=0.5, tls=tls,
                                                    insecure=tls is None))
    port = server.start()
    return server, f"127.0.0.1:{port}"


def stop_server(server: AnalyzerServer) -> None:
    server.stop()
    server.analyzer.storage.close()


def send(target: str, windows: list[pb.NodeWindow]) -> list[pb.Ack]:
    with grpc.insecure_channel(target) as ch:
        return list(pb_grpc.IngestStub(ch).Stream(iter(windows), timeout=30))


def healthy(target: str) -> bool:
    with grpc.insecure_channel(target) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""),
                                                    timeout=10)
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def analyzer(tmp_path):
    server, target = start_server(tmp_path / "analyzer.db")
    yield server, target
    stop_server(server)


def test_ingest_acks_every_window_after_storing_it(analyzer):
    server, target = analyzer
    windows = list(generate(SMALL))
    acks = send(target, windows)
    assert [(a.agent_id, a.seq) for a in acks] == [(w.agent_id, w.seq) for w in windows]
    assert not any(a.duplicate for a in acks)
    assert server.analyzer.storage.count_windows() == len(windows)
    assert healthy(target)


def test_duplicate_window_is_acked_as_duplicate_and_not_reingested(analyzer):
    server, target = analyzer
    windows = list(generate(SMALL))[:4]
    send(target, windows)
    again = send(target, windows[:2])
    assert [a.duplicate for a in again] == [True, True]
    assert server.analyzer.storage.count_windows() == 4
    with grpc.insecure_channel(target) as ch:
        jobs = pb_grpc.QueryStub(ch).ListJobs(pb.ListJobsRequest(), timeout=10)
    assert jobs.jobs[0].windows == 4     # the engine saw each window once


def test_a_duplicate_key_with_other_content_is_refused_not_acked(analyzer):
    """(agent_id, seq) alone used to decide: a second simulation run with the same ids was acked
    entirely as duplicates and nothing of it stored."""
    server, target = analyzer
    first = list(generate(SMALL))[:2]
    send(target, first)
    other = pb.NodeWindow()
    other.CopyFrom(first[1])
    other.processes[0].rank = 99                       # same key, other content
    with pytest.raises(grpc.RpcError) as err:
        send(target, [other])
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "other content" in err.value.details() and "agent_id" in err.value.details()
    stored = {s.seq: s.message() for s in server.analyzer.storage.iter_windows()}
    assert stored[first[1].seq] == first[1]            # the first copy stays, untouched
    assert [a.duplicate for a in send(target, first)] == [True, True]   # a true replay is fine


def test_report_names_the_straggler_and_stores_verdicts(analyzer):
    server, target = analyzer
    send(target, list(generate(SMALL)))
    with grpc.insecure_channel(target) as ch:
        report = pb_grpc.QueryStub(ch).GetReport(pb.ReportRequest(job_id="sim-job"), timeout=30)
    stragglers = [n.node for j in report.jobs for n in j.nodes if n.verdict == "straggler"]
    assert stragglers == ["node-0002"]
    stored = server.analyzer.storage.verdicts("sim-job")
    assert {(node, v) for _, _, node, _, v in stored if v == "straggler"} == \
        {("node-0002", "straggler")}


def test_unknown_job_is_not_found_and_server_keeps_serving(analyzer):
    _, target = analyzer
    with grpc.insecure_channel(target) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.QueryStub(ch).GetReport(pb.ReportRequest(job_id="nope"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "nope" in err.value.details()
    assert healthy(target)


def test_restart_resumes_history_from_the_database(tmp_path):
    db = tmp_path / "analyzer.db"
    windows = list(generate(SMALL))
    server, target = start_server(db)
    send(target, windows[: len(windows) // 2])
    stop_server(server)

    server, target = start_server(db)          # a fresh Engine, same database
    try:
        acks = send(target, windows)           # the agents replay everything after the restart
        assert sum(a.duplicate for a in acks) == len(windows) // 2
        assert server.analyzer.storage.count_windows() == len(windows)
        with grpc.insecure_channel(target) as ch:
            q = pb_grpc.QueryStub(ch)
            jobs = q.ListJobs(pb.ListJobsRequest(), timeout=10)
            report = q.GetReport(pb.ReportRequest(), timeout=30)
        assert jobs.jobs[0].windows == len(windows)
        assert jobs.jobs[0].gpus == SMALL.gpus
        assert [n.node for n in report.jobs[0].nodes if n.verdict == "straggler"] == ["node-0002"]
    finally:
        stop_server(server)


def test_background_flush_scores_complete_epochs_without_a_query(tmp_path):
    server, target = start_server(tmp_path / "a.db", flush_interval=0.05)
    try:
        send(target, list(generate(SMALL)))    # the simulated epochs lie far in the past
        deadline = time.monotonic() + 20
        while server.analyzer.storage.verdicts() == [] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {e for _, e, *_ in server.analyzer.storage.verdicts()}, "nothing was scored"
    finally:
        stop_server(server)


def test_port_already_taken_is_a_clear_error(analyzer, tmp_path):
    _, target = analyzer
    storage = Storage.open(tmp_path / "other.db")
    try:
        other = AnalyzerServer(Analyzer(storage), ServerOptions(listen=target, insecure=True))
        with pytest.raises(ServerError, match="port is taken"):
            other.start()
    finally:
        storage.close()
    assert healthy(target)


def test_analyzer_cli_rejects_unwritable_db_and_bad_config(tmp_path, capsys):
    from hypertrace.cli.main import main
    assert main(["analyzer", "--listen", "127.0.0.1:0", "--db", "/nonexistent-dir/x.db",
                 "--insecure"]) == 2
    assert "does not exist" in capsys.readouterr().err
    cfg = tmp_path / "a.toml"
    cfg.write_text("z_treshold = 4.0\n")
    assert main(["analyzer", "--config", str(cfg), "--db", str(tmp_path / "x.db")]) == 2
    assert "z_treshold" in capsys.readouterr().err
    cfg.write_text("min_effect = 7.0\n")
    assert main(["analyzer", "--config", str(cfg), "--db", str(tmp_path / "x.db")]) == 2
    assert "min_effect" in capsys.readouterr().err


def test_analyzer_cli_settings_precedence(tmp_path):
    import argparse

    from hypertrace.cli.analyzer import resolve_settings
    cfg = tmp_path / "a.toml"
    cfg.write_text('retention_hours = 72\nz_threshold = 4.0\nwindow_seconds = 5.0\n')
    args = argparse.Namespace(config=str(cfg), listen=None, db=None, retention_hours=None,
                              flush_interval=None, synchronous=None, max_workers=None,
                              z_threshold=3.0, window_seconds=None)
    server, scoring = resolve_settings(args)
    assert server["retention_hours"] == 72
    assert scoring == {"z_threshold": 3.0, "window_seconds": 5.0}   # flag beats file
    assert dataclasses.asdict(ScoringConfig.from_mapping(scoring))["z_threshold"] == 3.0


def test_report_cli_exit_statuses(analyzer, capsys):
    from hypertrace.cli.main import main
    _, target = analyzer
    send(target, list(generate(dataclasses.replace(SMALL, stragglers=()))))
    assert main(["report", "--analyzer", target, "--insecure"]) == 0
    slow = list(generate(dataclasses.replace(SMALL, job_id="slow-job")))
    for w in slow:                  # other agents: (agent_id, seq) is the dedup key
        w.agent_id = "other-" + w.agent_id
    send(target, slow)
    assert main(["report", "--analyzer", target, "--insecure", "--job", "slow-job", "--format", "json"]) == 3
    assert '"node-0002"' in capsys.readouterr().out
    assert main(["report", "--analyzer", target, "--insecure", "--job", "missing"]) == 2
    assert main(["report", "--analyzer", f"127.0.0.1:{free_port()}", "--insecure", "--timeout", "0.5"]) == 1
    assert "unreachable" in capsys.readouterr().err


def test_acks_do_not_wait_for_the_engine(analyzer):
    """A report or a scoring pass holds the Engine's lock; ingest must still ack (after the
    store) meanwhile, and the next report must see the window."""
    server, target = analyzer
    windows = list(generate(SMALL))
    send(target, windows[:8])
    with server.analyzer._lock:                       # as a long report would
        acks = send(target, windows[8:12])
    assert len(acks) == 4 and server.analyzer.storage.count_windows() == 12
    assert server.analyzer.list_jobs().jobs[0].windows == 12


def test_reports_list_at_most_100_healthy_nodes_unless_all_are_asked_for(tmp_path, capsys):
    cfg = SimConfig(gpus=1024, gpus_per_node=8, windows=4, seed=3,
                    stragglers=(Straggler("node-0100", 1.3),))
    server, target = start_server(tmp_path / "big.db")
    try:
        send(target, list(generate(cfg)))
        with grpc.insecure_channel(target) as ch:
            stub = pb_grpc.QueryStub(ch)
            short = stub.GetReport(pb.ReportRequest(), timeout=60).jobs[0]
            full = stub.GetReport(pb.ReportRequest(all_nodes=True), timeout=60).jobs[0]
        assert len(full.nodes) == 128 and full.healthy_nodes_omitted == 0
        assert sum(n.verdict == "healthy" for n in short.nodes) == 100
        assert short.healthy_nodes_omitted == len(full.nodes) - len(short.nodes)
        assert "node-0100" in {n.node for n in short.nodes if n.verdict == "straggler"}
        from hypertrace.cli.main import main
        main(["report", "--analyzer", target, "--insecure"])
        assert "more healthy nodes not listed" in capsys.readouterr().out
    finally:
        stop_server(server)


def test_open_agent_streams_need_no_worker_thread_each(tmp_path):
    """Agents keep their stream open after the ack (the uplink's idle close). With a single
    worker thread, 20 such streams open at once each get their window stored and acked."""
    storage = Storage.open(tmp_path / "analyzer.db", synchronous="NORMAL")
    server = AnalyzerServer(Analyzer(storage, ScoringConfig()),
                            ServerOptions(listen="127.0.0.1:0", flush_interval=0,
                                          shutdown_grace_s=0.5, insecure=True, max_workers=1))
    target = f"127.0.0.1:{server.start()}"
    release = threading.Event()

    def held_open(w: pb.NodeWindow):
        yield w
        release.wait(30)

    windows = list(generate(SMALL))
    try:
        with grpc.insecure_channel(target) as ch:
            stub = pb_grpc.IngestStub(ch)
            calls = [stub.Stream(held_open(w), timeout=20) for w in windows]
            acks = [next(call) for call in calls]            # every stream still open
            release.set()
            for call in calls:
                assert list(call) == []
        assert [(a.agent_id, a.seq, a.duplicate) for a in acks] == [
            (w.agent_id, w.seq, False) for w in windows]
        assert storage.count_windows() == len(windows)
    finally:
        release.set()
        stop_server(server)
